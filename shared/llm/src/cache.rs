//! Response cache for chat and embedding backends.
//!
//! Keys are the sha256 (hex) of a canonical JSON of everything that shapes the reply: backend,
//! resolved model, messages, sampling parameters, stop sequences, response format (with the full
//! schema) and `top_logprobs`. Only successes are stored. A chat request is cacheable when its
//! policy is not [`CachePolicy::Bypass`] and it is deterministic (temperature unset or 0, or a
//! seed set) or the caller opted in with [`CachePolicy::OptIn`]. Embedding requests are cacheable
//! unless bypassed.
//!
//! Lookups go to memory (moka) first, then to the optional SQLite file. Identical requests in
//! flight at the same time are coalesced into one backend call (moka `try_get_with`); the callers
//! that waited get the reply marked `cached = true`. A hit carries
//! `usage = Usage { cache_hits: 1, .. zero }`.

use std::future::Future;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::OptionalExtension;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use crate::clock::Clock;
use crate::types::{
    CachePolicy, ChatModel, ChatRequest, ChatResponse, EmbeddingModel, EmbeddingRequest, EmbeddingResponse, LlmError,
    ResponseFormat, Usage,
};

/// Cache settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheConfig {
    /// Maximum entries kept in memory.
    pub capacity: u64,
    /// SQLite file for a persistent cache; `None` keeps the cache in memory only.
    pub sqlite_path: Option<PathBuf>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self { capacity: 10_000, sqlite_path: None }
    }
}

/// The cache could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("response cache: {0}")]
pub struct CacheError(pub String);

/// Whether a chat request may be served from or stored in the cache.
pub fn is_cacheable(request: &ChatRequest) -> bool {
    match request.cache {
        CachePolicy::Bypass => false,
        CachePolicy::OptIn => true,
        CachePolicy::Auto => request.temperature.is_none_or(|t| t == 0.0) || request.seed.is_some(),
    }
}

/// Canonical JSON: object keys sorted, no whitespace. Independent of serde_json's map ordering.
pub fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, out);
                }
                out.push(']');
            }
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => out.push_str(&value.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn format_key_part(format: &ResponseFormat) -> Value {
    match format {
        ResponseFormat::Text => json!("text"),
        ResponseFormat::JsonSchema { name, schema } => {
            json!({"json_schema": {"name": name, "schema": schema}})
        }
        ResponseFormat::Choice(options) => json!({"choice": options}),
    }
}

/// Cache key of a chat request for `backend`, with `default_model` standing in for an unset model.
pub fn chat_cache_key(backend: &str, default_model: &str, request: &ChatRequest) -> String {
    let model = request.model.as_deref().filter(|m| !m.is_empty()).unwrap_or(default_model);
    let canonical = canonical_json(&json!({
        "v": 1,
        "kind": "chat",
        "backend": backend,
        "model": model,
        "messages": request.messages,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "max_tokens": request.max_tokens,
        "stop": request.stop,
        "response_format": format_key_part(&request.response_format),
        "top_logprobs": request.top_logprobs,
    }));
    sha256_hex(&canonical)
}

/// Cache key of an embedding request.
pub fn embedding_cache_key(backend: &str, default_model: &str, request: &EmbeddingRequest) -> String {
    let model = request.model.as_deref().filter(|m| !m.is_empty()).unwrap_or(default_model);
    let canonical = canonical_json(&json!({
        "v": 1,
        "kind": "embedding",
        "backend": backend,
        "model": model,
        "texts": request.texts,
    }));
    sha256_hex(&canonical)
}

/// Cache key of one text's embedding: backend, resolved model and the text. Batches share
/// entries text by text, so a re-run with the texts in other batches embeds nothing.
pub fn embedding_text_key(backend: &str, model: &str, text: &str) -> String {
    sha256_hex(&canonical_json(
        &json!({"v": 2, "kind": "embedding_text", "backend": backend, "model": model, "text": text}),
    ))
}

#[derive(Debug, Clone)]
enum Stored {
    Chat(Arc<ChatResponse>),
    Embedding(Arc<EmbeddingResponse>),
}

/// SQLite form of [`Stored`] (written).
#[derive(Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
enum StoredRef<'a> {
    Chat(&'a ChatResponse),
    Embedding(&'a EmbeddingResponse),
}

/// SQLite form of [`Stored`] (read).
#[derive(Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
enum StoredOwned {
    Chat(ChatResponse),
    Embedding(EmbeddingResponse),
}

impl Stored {
    fn to_json(&self) -> serde_json::Result<String> {
        match self {
            Stored::Chat(r) => serde_json::to_string(&StoredRef::Chat(r)),
            Stored::Embedding(r) => serde_json::to_string(&StoredRef::Embedding(r)),
        }
    }

    fn from_json(text: &str) -> serde_json::Result<Self> {
        Ok(match serde_json::from_str::<StoredOwned>(text)? {
            StoredOwned::Chat(r) => Stored::Chat(Arc::new(r)),
            StoredOwned::Embedding(r) => Stored::Embedding(Arc::new(r)),
        })
    }
}

struct SqliteStore {
    conn: Arc<Mutex<rusqlite::Connection>>,
}

impl SqliteStore {
    fn open(path: &Path) -> Result<Self, CacheError> {
        let err = |e: rusqlite::Error| CacheError(format!("sqlite {}: {e}", path.display()));
        let conn = rusqlite::Connection::open(path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(err)?;
        // WAL lets several processes share one cache file; an in-memory or read-only database may
        // refuse it, which is fine.
        let _ = conn.query_row("PRAGMA journal_mode=WAL", [], |_| Ok(()));
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS llm_cache (
                 key TEXT PRIMARY KEY,
                 value TEXT NOT NULL,
                 created_at INTEGER NOT NULL
             )",
        )
        .map_err(err)?;
        Ok(Self { conn: Arc::new(Mutex::new(conn)) })
    }

    async fn get(&self, key: &str) -> Option<Stored> {
        let conn = self.conn.clone();
        let key = key.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            conn.query_row("SELECT value FROM llm_cache WHERE key = ?1", [key], |row| row.get::<_, String>(0))
                .optional()
        })
        .await;
        match read {
            Ok(Ok(Some(text))) => match Stored::from_json(&text) {
                Ok(stored) => Some(stored),
                Err(e) => {
                    warn!(error = %e, "unreadable sqlite cache entry, ignoring");
                    None
                }
            },
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                warn!(error = %e, "sqlite cache read failed");
                None
            }
            Err(e) => {
                warn!(error = %e, "sqlite cache read task failed");
                None
            }
        }
    }

    async fn put(&self, key: &str, value: &Stored) {
        let text = match value.to_json() {
            Ok(text) => text,
            Err(e) => {
                warn!(error = %e, "cannot serialise cache entry");
                return;
            }
        };
        let conn = self.conn.clone();
        let key = key.to_owned();
        let created_at = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or_default();
        let write = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            conn.execute(
                "INSERT OR REPLACE INTO llm_cache (key, value, created_at) VALUES (?1, ?2, ?3)",
                rusqlite::params![key, text, created_at],
            )
        })
        .await;
        match write {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => warn!(error = %e, "sqlite cache write failed"),
            Err(e) => warn!(error = %e, "sqlite cache write task failed"),
        }
    }
}

/// The store behind the cached wrappers: memory, then optionally SQLite. Cheap to clone; clones
/// share entries, so one cache can back a chat and an embedding wrapper.
#[derive(Clone)]
pub struct ResponseCache {
    memory: moka::future::Cache<String, Stored>,
    sqlite: Option<Arc<SqliteStore>>,
}

impl std::fmt::Debug for ResponseCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCache")
            .field("entries", &self.memory.entry_count())
            .field("sqlite", &self.sqlite.is_some())
            .finish()
    }
}

impl ResponseCache {
    /// A memory-only cache holding at most `capacity` entries.
    pub fn in_memory(capacity: u64) -> Self {
        Self { memory: moka::future::Cache::new(capacity), sqlite: None }
    }

    /// Open a cache per `config` (creating the SQLite file and table when a path is given).
    pub fn open(config: &CacheConfig) -> Result<Self, CacheError> {
        let sqlite = config.sqlite_path.as_deref().map(SqliteStore::open).transpose()?.map(Arc::new);
        Ok(Self { memory: moka::future::Cache::new(config.capacity), sqlite })
    }

    /// Entries in memory (approximate: moka counts lazily).
    pub fn memory_entries(&self) -> u64 {
        self.memory.entry_count()
    }

    /// Drop every in-memory entry (SQLite entries stay).
    pub fn clear_memory(&self) {
        self.memory.invalidate_all();
    }

    /// Memory, then SQLite (a SQLite hit is kept in memory).
    async fn lookup(&self, key: &str) -> Option<Stored> {
        if let Some(stored) = self.memory.get(key).await {
            return Some(stored);
        }
        let stored = self.sqlite.as_ref()?.get(key).await?;
        self.memory.insert(key.to_owned(), stored.clone()).await;
        Some(stored)
    }

    /// Keep an entry in memory and SQLite.
    async fn store(&self, key: String, value: Stored) {
        if let Some(sqlite) = &self.sqlite {
            sqlite.put(&key, &value).await;
        }
        self.memory.insert(key, value).await;
    }

    /// Memory, then SQLite, then `fetch` (coalesced per key). Returns the value and whether this
    /// call ran `fetch` (a fresh backend reply rather than a cache hit).
    async fn get_or_fetch<Fut>(
        &self,
        key: String,
        deadline: Option<Instant>,
        fetch: impl FnOnce() -> Fut,
    ) -> Result<(Stored, bool), LlmError>
    where
        Fut: Future<Output = Result<Stored, LlmError>>,
    {
        let fetched = AtomicBool::new(false);
        let init = async {
            if let Some(store) = &self.sqlite
                && let Some(stored) = store.get(&key).await
            {
                debug!(key = %&key[..12], "sqlite cache hit");
                return Ok(stored);
            }
            let stored = fetch().await?;
            fetched.store(true, Ordering::SeqCst);
            if let Some(store) = &self.sqlite {
                store.put(&key, &stored).await;
            }
            Ok::<_, LlmError>(stored)
        };
        let lookup = self.memory.try_get_with(key.clone(), init);
        let result = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), lookup).await.map_err(|_| LlmError::DeadlineExceeded)?,
            None => lookup.await,
        };
        let stored = result.map_err(|e| (*e).clone())?;
        Ok((stored, fetched.load(Ordering::SeqCst)))
    }
}

fn hit_usage() -> Usage {
    Usage { cache_hits: 1, ..Usage::default() }
}

/// A [`ChatModel`] that answers repeated requests from a [`ResponseCache`].
pub struct CachedChat<M: ?Sized> {
    inner: Arc<M>,
    cache: ResponseCache,
}

impl<M: ?Sized> Clone for CachedChat<M> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), cache: self.cache.clone() }
    }
}

impl<M: ChatModel + ?Sized> CachedChat<M> {
    pub fn new(inner: Arc<M>, cache: ResponseCache) -> Self {
        Self { inner, cache }
    }

    /// Wrap with a fresh memory-only cache of the default capacity.
    pub fn in_memory(inner: Arc<M>) -> Self {
        Self::new(inner, ResponseCache::in_memory(CacheConfig::default().capacity))
    }

    pub fn cache(&self) -> &ResponseCache {
        &self.cache
    }

    pub fn inner(&self) -> &Arc<M> {
        &self.inner
    }
}

#[async_trait::async_trait]
impl<M: ChatModel + ?Sized> ChatModel for CachedChat<M> {
    fn backend(&self) -> &str {
        self.inner.backend()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    fn supports_logprobs(&self) -> bool {
        self.inner.supports_logprobs()
    }

    fn structured_output(&self, model: &str) -> Option<&'static str> {
        self.inner.structured_output(model)
    }

    async fn context_tokens(&self, model: &str) -> Option<u32> {
        self.inner.context_tokens(model).await
    }

    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        if !is_cacheable(&request) {
            return self.inner.chat(request).await;
        }
        let key = chat_cache_key(self.inner.backend(), self.inner.default_model(), &request);
        let deadline = request.deadline;
        let inner = &self.inner;
        let (stored, fetched) = self
            .cache
            .get_or_fetch(key, deadline, || async move { inner.chat(request).await.map(|r| Stored::Chat(Arc::new(r))) })
            .await?;
        let Stored::Chat(response) = stored else {
            return Err(LlmError::MalformedReply("cache entry is not a chat response".into()));
        };
        let mut response = Arc::unwrap_or_clone(response);
        if !fetched {
            response.cached = true;
            response.usage = hit_usage();
        }
        Ok(response)
    }
}

/// An [`EmbeddingModel`] that answers repeated batches from a [`ResponseCache`].
pub struct CachedEmbed<E: ?Sized> {
    inner: Arc<E>,
    cache: ResponseCache,
}

impl<E: ?Sized> Clone for CachedEmbed<E> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), cache: self.cache.clone() }
    }
}

impl<E: EmbeddingModel + ?Sized> CachedEmbed<E> {
    pub fn new(inner: Arc<E>, cache: ResponseCache) -> Self {
        Self { inner, cache }
    }

    pub fn in_memory(inner: Arc<E>) -> Self {
        Self::new(inner, ResponseCache::in_memory(CacheConfig::default().capacity))
    }

    pub fn cache(&self) -> &ResponseCache {
        &self.cache
    }
}

#[async_trait::async_trait]
impl<E: EmbeddingModel + ?Sized> EmbeddingModel for CachedEmbed<E> {
    fn backend(&self) -> &str {
        self.inner.backend()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    /// Text by text: the texts found in the cache are not sent; the others go to the backend in
    /// one call (each distinct text once) and are stored one entry a text.
    async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError> {
        if request.cache == CachePolicy::Bypass || request.texts.is_empty() {
            return self.inner.embed(request).await;
        }
        let model =
            request.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| self.inner.default_model().into());
        let keys: Vec<String> =
            request.texts.iter().map(|t| embedding_text_key(self.inner.backend(), &model, t)).collect();
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; keys.len()];
        let mut answered_by = String::new();
        for (i, key) in keys.iter().enumerate() {
            if let Some(Stored::Embedding(hit)) = self.cache.lookup(key).await
                && let Some(v) = hit.vectors.first()
            {
                vectors[i] = Some(v.clone());
                answered_by.clone_from(&hit.model);
            }
        }
        let mut missing: Vec<usize> = Vec::new();
        for i in (0..keys.len()).filter(|i| vectors[*i].is_none()) {
            if !missing.iter().any(|m| request.texts[*m] == request.texts[i]) {
                missing.push(i);
            }
        }
        let usage = if missing.is_empty() {
            hit_usage()
        } else {
            let fetch = EmbeddingRequest {
                texts: missing.iter().map(|i| request.texts[*i].clone()).collect(),
                model: request.model.clone(),
                cache: request.cache,
                deadline: request.deadline,
            };
            let fetched = self.inner.embed(fetch).await?;
            if fetched.vectors.len() != missing.len() {
                return Err(LlmError::MalformedReply(format!(
                    "{} vectors for {} texts",
                    fetched.vectors.len(),
                    missing.len()
                )));
            }
            answered_by.clone_from(&fetched.model);
            for (m, v) in missing.iter().zip(fetched.vectors) {
                let entry = EmbeddingResponse {
                    vectors: vec![v.clone()],
                    model: fetched.model.clone(),
                    usage: Usage::default(),
                };
                self.cache.store(keys[*m].clone(), Stored::Embedding(Arc::new(entry))).await;
                for (i, text) in request.texts.iter().enumerate() {
                    if vectors[i].is_none() && *text == request.texts[*m] {
                        vectors[i] = Some(v.clone());
                    }
                }
            }
            fetched.usage
        };
        Ok(EmbeddingResponse {
            vectors: vectors.into_iter().map(Option::unwrap_or_default).collect(),
            model: answered_by,
            usage,
        })
    }
}

/// A cached vector with the time it was stored.
type VectorEntry = (Instant, Arc<Vec<f32>>);

/// Embedding vectors by [`embedding_text_key`], in memory, bounded (least recently used evicted)
/// and expiring after a time to live on an injected [`Clock`]: the convergence cascade's cache of
/// draft embeddings.
pub struct VectorCache {
    clock: Arc<dyn Clock>,
    ttl: Duration,
    entries: Mutex<lru::LruCache<String, VectorEntry>>,
}

impl std::fmt::Debug for VectorCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorCache").field("len", &self.len()).finish_non_exhaustive()
    }
}

impl VectorCache {
    /// At most `capacity` vectors (at least one), each kept for `ttl`.
    pub fn new(clock: Arc<dyn Clock>, capacity: usize, ttl: Duration) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self { clock, ttl, entries: Mutex::new(lru::LruCache::new(capacity)) }
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, lru::LruCache<String, VectorEntry>> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A live entry (refreshing its recency); an expired entry is removed.
    pub fn get(&self, key: &str) -> Option<Arc<Vec<f32>>> {
        let now = self.clock.now();
        let mut entries = self.entries();
        match entries.get(key) {
            Some((at, v)) if now.saturating_duration_since(*at) < self.ttl => Some(v.clone()),
            Some(_) => {
                entries.pop(key);
                None
            }
            None => None,
        }
    }

    pub fn insert(&self, key: String, vector: Arc<Vec<f32>>) {
        let now = self.clock.now();
        self.entries().put(key, (now, vector));
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Message;

    fn request() -> ChatRequest {
        ChatRequest {
            messages: vec![Message::system("judge"), Message::user("is it good?")],
            temperature: Some(0.0),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn cacheability_rules() {
        let r = |temperature: Option<f32>, seed: Option<u64>, cache: CachePolicy| ChatRequest {
            temperature,
            seed,
            cache,
            ..ChatRequest::default()
        };
        assert!(is_cacheable(&r(None, None, CachePolicy::Auto)));
        assert!(is_cacheable(&r(Some(0.0), None, CachePolicy::Auto)));
        assert!(!is_cacheable(&r(Some(0.7), None, CachePolicy::Auto)));
        assert!(is_cacheable(&r(Some(0.7), Some(1), CachePolicy::Auto)));
        assert!(is_cacheable(&r(Some(0.7), None, CachePolicy::OptIn)));
        assert!(!is_cacheable(&r(Some(0.0), Some(1), CachePolicy::Bypass)));
        assert!(!is_cacheable(&r(None, None, CachePolicy::Bypass)));
    }

    #[test]
    fn same_request_same_key() {
        let a = chat_cache_key("openai", "m", &request());
        let b = chat_cache_key("openai", "m", &request());
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        // Fields outside the key (policy, deadline) do not change it.
        let mut c = request();
        c.cache = CachePolicy::OptIn;
        c.deadline = Some(Instant::now());
        assert_eq!(a, chat_cache_key("openai", "m", &c));
    }

    #[test]
    fn default_model_resolution_in_key() {
        let mut named = request();
        named.model = Some("m".into());
        assert_eq!(chat_cache_key("openai", "m", &request()), chat_cache_key("openai", "m", &named));
        assert_ne!(chat_cache_key("openai", "m", &request()), chat_cache_key("openai", "other", &request()));
        assert_ne!(chat_cache_key("openai", "m", &request()), chat_cache_key("local", "m", &request()));
    }

    #[test]
    fn every_parameter_changes_the_key() {
        let base = chat_cache_key("b", "m", &request());
        let variants: [fn(&mut ChatRequest); 8] = [
            |r| r.messages.push(Message::user("more")),
            |r| r.temperature = None,
            |r| r.top_p = Some(0.9),
            |r| r.seed = Some(1),
            |r| r.max_tokens = Some(5),
            |r| r.stop = vec!["x".into()],
            |r| r.top_logprobs = Some(2),
            |r| r.response_format = ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        ];
        for (i, change) in variants.iter().enumerate() {
            let mut r = request();
            change(&mut r);
            assert_ne!(base, chat_cache_key("b", "m", &r), "variant {i}");
        }
    }

    #[test]
    fn schema_is_part_of_the_key_and_canonical() {
        let with = |schema: Value| {
            let mut r = request();
            r.response_format = ResponseFormat::JsonSchema { name: "s".into(), schema };
            chat_cache_key("b", "m", &r)
        };
        let a = with(json!({"type": "object", "properties": {"a": {"type": "string"}}}));
        let b = with(json!({"type": "object", "properties": {"a": {"type": "integer"}}}));
        assert_ne!(a, b);
        // Key order inside the schema does not matter.
        let mut map = serde_json::Map::new();
        map.insert("properties".into(), json!({"a": {"type": "string"}}));
        map.insert("type".into(), json!("object"));
        assert_eq!(a, with(Value::Object(map)));
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let mut map = serde_json::Map::new();
        map.insert("b".into(), json!([{"z": 1, "a": null}]));
        map.insert("a".into(), json!("x\"y"));
        assert_eq!(canonical_json(&Value::Object(map)), r#"{"a":"x\"y","b":[{"a":null,"z":1}]}"#);
    }

    #[test]
    fn embedding_keys() {
        let r = |texts: &[&str]| EmbeddingRequest {
            texts: texts.iter().map(|t| t.to_string()).collect(),
            ..EmbeddingRequest::default()
        };
        assert_eq!(embedding_cache_key("b", "m", &r(&["a", "b"])), embedding_cache_key("b", "m", &r(&["a", "b"])));
        assert_ne!(embedding_cache_key("b", "m", &r(&["a", "b"])), embedding_cache_key("b", "m", &r(&["b", "a"])));
    }

    #[test]
    fn vector_cache_hits_expire_and_evict() {
        let ttl = Duration::from_secs(300);
        let clock = Arc::new(crate::clock::ManualClock::new());
        let c = VectorCache::new(clock.clone(), 2, ttl);
        c.insert("a".into(), Arc::new(vec![1.0]));
        clock.advance(ttl - Duration::from_secs(1));
        assert!(c.get("a").is_some());
        clock.advance(Duration::from_secs(1));
        assert!(c.get("a").is_none(), "expired at exactly the TTL");
        assert!(c.is_empty());
        c.insert("x".into(), Arc::new(vec![1.0]));
        c.insert("y".into(), Arc::new(vec![2.0]));
        let _ = c.get("x");
        c.insert("z".into(), Arc::new(vec![3.0]));
        assert!(c.get("y").is_none(), "least recently used is evicted");
        assert!(c.get("x").is_some() && c.get("z").is_some());
        assert_ne!(embedding_text_key("b", "m1", "t"), embedding_text_key("b", "m2", "t"));
        assert_eq!(embedding_text_key("b", "m", "t").len(), 64);
    }
}
