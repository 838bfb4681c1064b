//! Backends that finish loading in the background: services serve (NOT_SERVING) at once, and calls
//! made before the load completes wait for it.

use std::sync::Arc;

use assay_llm::{ChatModel, ChatRequest, ChatResponse, EmbeddingModel, EmbeddingRequest, EmbeddingResponse, LlmError};
use tokio::sync::watch;

/// A backend's chat and embedding models (either may be absent).
pub type BackendPair = (Option<Arc<dyn ChatModel>>, Option<Arc<dyn EmbeddingModel>>);

type Loaded = Option<Result<BackendPair, BackendLoadError>>;

/// Why a backend could not be loaded (kept by every call waiting for it, hence cloned).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendLoadError {
    /// The configured model is not one the loader knows.
    #[error("unknown {kind} model {model:?} (known: {known})")]
    UnknownModel { kind: &'static str, model: String, known: &'static str },
    /// The model files could not be fetched.
    #[error("backend {backend}: fetching models: {source}")]
    Fetch { backend: String, source: Arc<dyn std::error::Error + Send + Sync> },
    /// The models could not be loaded.
    #[error("backend {backend}: {source}")]
    Load { backend: String, source: Arc<dyn std::error::Error + Send + Sync> },
}

/// A backend being loaded.
#[derive(Clone)]
pub struct LazyBackend {
    name: String,
    kind: String,
    default_model: String,
    rx: watch::Receiver<Loaded>,
}

/// Completes a [`LazyBackend`].
pub struct LazySetter(watch::Sender<Loaded>);

impl LazySetter {
    pub fn set(self, v: Result<BackendPair, BackendLoadError>) {
        let _ = self.0.send(Some(v));
    }
}

impl LazyBackend {
    pub fn new(name: &str, kind: &str, default_model: &str) -> (LazyBackend, LazySetter) {
        let (tx, rx) = watch::channel(None);
        (LazyBackend { name: name.into(), kind: kind.into(), default_model: default_model.into(), rx }, LazySetter(tx))
    }

    async fn loaded(&self) -> Result<BackendPair, LlmError> {
        let mut rx = self.rx.clone();
        let v = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| LlmError::Unavailable(format!("backend {} was dropped while loading", self.name)))?;
        match v.as_ref() {
            Some(Ok(pair)) => Ok(pair.clone()),
            Some(Err(e)) => Err(LlmError::Unavailable(format!("backend {} failed to load: {e}", self.name))),
            None => Err(LlmError::Unavailable(format!("backend {} is not loaded", self.name))),
        }
    }
}

#[async_trait::async_trait]
impl ChatModel for LazyBackend {
    fn backend(&self) -> &str {
        &self.kind
    }
    fn default_model(&self) -> &str {
        &self.default_model
    }
    fn supports_logprobs(&self) -> bool {
        true
    }
    async fn context_tokens(&self, model: &str) -> Option<u32> {
        match self.loaded().await {
            Ok((Some(chat), _)) => chat.context_tokens(model).await,
            Ok((None, _)) | Err(_) => None,
        }
    }
    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        match self.loaded().await?.0 {
            Some(m) => m.chat(request).await,
            None => Err(LlmError::Unsupported(format!("backend {} has no chat model", self.name))),
        }
    }
}

#[async_trait::async_trait]
impl EmbeddingModel for LazyBackend {
    fn backend(&self) -> &str {
        &self.kind
    }
    fn default_model(&self) -> &str {
        &self.default_model
    }
    async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError> {
        match self.loaded().await?.1 {
            Some(m) => m.embed(request).await,
            None => Err(LlmError::Unsupported(format!("backend {} has no embedding model", self.name))),
        }
    }
}

/// Loads an extra backend (e.g. the embedded local models) by name; set by binaries that link one.
#[async_trait::async_trait]
pub trait BackendLoader: Send + Sync {
    /// Backend kind this loader builds (e.g. `local`).
    fn kind(&self) -> &str;
    /// The model name responses report for `config` (before the load completes): its `model`, or
    /// the kind when blank.
    fn model_name(&self, config: &assay_config::BackendConfig) -> String {
        if config.model.is_empty() { self.kind().to_string() } else { config.model.clone() }
    }
    async fn load(&self, name: &str, config: &assay_config::BackendConfig) -> Result<BackendPair, BackendLoadError>;
}
