//! Wiring shared by every Assay binary: load configuration, build model backends from it, bind a
//! stage's port and serve it with the standard runtime until SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use assay_config::{AssayConfig, Ports};
use assay_llm::ModelHub;
use assay_llm::pricing::{PricedChat, PricedEmbed, Prices};
use assay_llm::{
    Backends, CacheConfig, CacheError, CachedChat, CachedEmbed, ChatModel, EmbeddingModel, LlmError, OpenAiClient,
    OpenAiConfig, ResponseCache,
};
use assay_rpc::{ClientTls, Readiness, ServeOptions, ServerTls};
use tokio::net::TcpListener;
use tonic::service::Routes;

pub use assay_config;

pub mod lazy;

pub use lazy::{BackendLoadError, BackendLoader};
#[cfg(feature = "embedded")]
pub mod local;

/// The process entry point of every Assay binary: process-wide settings that must precede any
/// thread (thread counts of the embedder, the open file limit), then `main` on a multi-threaded
/// Tokio runtime.
///
/// The embedded MiniLM embedder (candle) reads its thread counts from `RAYON_NUM_THREADS` and
/// `CANDLE_NUM_THREADS` only. Unless they are set, both become 1, and the embedder splits each
/// batch into one part per core embedded at once: on 2 cores that is 214 sentences/s at batch 32
/// against 157 with one batch spread over both cores (less synchronisation per operation). Set
/// them to another value to get candle's own threading back.
pub fn main<F: std::future::Future<Output = ExitCode>>(main: impl FnOnce() -> F) -> ExitCode {
    for var in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        if std::env::var_os(var).is_none() {
            // SAFETY: first thing the process does, before any other thread exists, so nothing
            // reads the environment concurrently.
            #[allow(unsafe_code)]
            unsafe {
                std::env::set_var(var, "1");
            }
        }
    }
    // One socket per request in flight to an HTTP/1.1 backend (up to `max_concurrency`, 1024 by
    // default) plus the mesh's own: the usual soft limit of 1024 open files is too few. Raised to
    // the hard limit, as Go's runtime does for every program.
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        eprintln!("cannot raise the open file limit: {e}");
    }
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt.block_on(main()),
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Loaders of every backend kind this binary links (the embedded one with feature `embedded`).
pub fn default_loaders() -> Vec<&'static dyn BackendLoader> {
    #[cfg(feature = "embedded")]
    {
        local::loaders()
    }
    #[cfg(not(feature = "embedded"))]
    {
        Vec::new()
    }
}

/// Configuration file from `--config <path>` or `ASSAY_CONFIG`.
pub fn config_path_from_args() -> Option<PathBuf> {
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("ASSAY_CONFIG").map(PathBuf::from)
}

/// Why a binary's wiring failed: the configuration, a backend, the response cache or a channel.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Config(#[from] assay_config::ConfigError),
    /// The OpenAI-compatible client could not be built.
    #[error("backend openai: {0}")]
    Client(#[source] LlmError),
    #[error("response cache: {0}")]
    Cache(#[from] CacheError),
    /// A phase uses a backend whose kind this binary has no loader for.
    #[error("backend {backend:?} of kind {kind:?} is not available in this binary")]
    KindUnavailable { backend: String, kind: String },
    /// A backend failed to load.
    #[error(transparent)]
    Load(#[from] BackendLoadError),
    #[error("backend loader panicked: {0}")]
    LoaderPanicked(#[source] tokio::task::JoinError),
    /// A channel to a stage could not be made (an invalid address).
    #[error(transparent)]
    Channel(#[from] assay_domain::StageError),
}

/// The OpenAI-compatible client for a backend entry (base URL and key from the entry or from
/// `OPENAI_BASE_URL` / `OPENAI_API_KEY`). Every setting the entry leaves unset keeps the client's
/// default; the values were checked when the configuration was loaded
/// ([`assay_config::check_backends`]).
pub fn openai_client(entry: &assay_config::BackendConfig) -> Result<OpenAiClient, RuntimeError> {
    let mut c = OpenAiConfig::from_env();
    if !entry.base_url.is_empty() {
        c.base_url = entry.base_url.clone();
    }
    if !entry.model.is_empty() {
        c.default_model = entry.model.clone();
    }
    if !entry.embedding_model.is_empty() {
        c.embedding_model = entry.embedding_model.clone();
    }
    if let Some(field) = entry.max_tokens_field {
        c.max_tokens_field = field;
    }
    if entry.max_concurrency > 0 {
        c.max_concurrency = entry.max_concurrency as usize;
    }
    if let Some(n) = entry.initial_concurrency {
        c.initial_concurrency = n as usize;
    }
    c.requests_per_minute = entry.requests_per_minute;
    c.tokens_per_minute = entry.tokens_per_minute;
    if entry.request_timeout_secs > 0 {
        c.request_timeout = std::time::Duration::from_secs(entry.request_timeout_secs);
    }
    if let Some(on) = entry.adaptive_timeout {
        c.adaptive_timeout.enabled = on;
    }
    if entry.timeout_floor_ms > 0 {
        c.adaptive_timeout.floor = std::time::Duration::from_millis(entry.timeout_floor_ms);
    }
    if entry.timeout_multiplier > 0.0 {
        c.adaptive_timeout.multiplier = entry.timeout_multiplier;
    }
    if let Some(h) = entry.hedge_factor {
        c.adaptive_timeout.hedge_factor = h;
    }
    if let Some(on) = entry.supports_json_schema {
        c.supports_json_schema = on;
    }
    if let Some(form) = entry.structured_output.as_deref().and_then(assay_llm::StructuredOutput::parse) {
        c.structured_output = form;
    }
    if let Some(on) = entry.supports_logprobs {
        c.supports_logprobs = on;
    }
    if let Some(api) = entry.api.as_deref().and_then(assay_llm::Api::parse) {
        c.api = Some(api);
    }
    OpenAiClient::new(c).map_err(RuntimeError::Client)
}

/// Backends still loading; resolves when every one is ready (or one failed).
pub type Loading = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), RuntimeError>> + Send>>;

/// Build every configured backend (wrapped in the response cache when enabled) and the phase map.
/// Backends with a loader (the embedded models) load in the background: the returned hub is usable
/// at once (calls wait for the load) and `Loading` resolves when they are ready. Backends of a kind
/// without a loader are skipped unless a phase uses them.
pub fn build_hub(
    config: &AssayConfig,
    loaders: &[&'static dyn BackendLoader],
) -> Result<(ModelHub, Loading), RuntimeError> {
    // Loaded configurations were checked; one built or changed in code is checked here.
    assay_config::check_backends(&config.backends)?;
    let cache = if config.cache.enabled {
        let c = CacheConfig {
            capacity: config.cache.capacity,
            sqlite_path: Some(PathBuf::from(&config.cache.path)).filter(|p| !p.as_os_str().is_empty()),
        };
        Some(ResponseCache::open(&c)?)
    } else {
        None
    };
    let mut used: Vec<String> = vec![config.models.default.backend.clone()];
    used.extend(config.models.phases.values().map(|s| s.backend.clone()));
    let mut backends = Backends::new();
    let mut pending = Vec::new();
    for (name, entry) in &config.backends {
        let (chat, embed): lazy::BackendPair = if entry.kind == "openai" {
            let client = Arc::new(openai_client(entry)?);
            (Some(client.clone()), Some(client))
        } else if let Some(loader) = loaders.iter().find(|l| l.kind() == entry.kind) {
            if !used.iter().any(|u| u == name) {
                continue;
            }
            let (lazy, setter) = lazy::LazyBackend::new(name, &entry.kind, &loader.model_name(entry));
            let (loader, name, entry) = (*loader, name.clone(), entry.clone());
            pending.push(tokio::spawn(async move {
                let r = loader.load(&name, &entry).await;
                let out = r.as_ref().map(|_| ()).map_err(|e| RuntimeError::Load(e.clone()));
                setter.set(r);
                out
            }));
            (Some(Arc::new(lazy.clone()) as Arc<dyn ChatModel>), Some(Arc::new(lazy) as Arc<dyn EmbeddingModel>))
        } else {
            if used.iter().any(|u| u == name) {
                return Err(RuntimeError::KindUnavailable { backend: name.clone(), kind: entry.kind.clone() });
            }
            continue;
        };
        let prices = Prices::new(entry.prices.clone());
        if let Some(chat) = chat {
            // Priced and held to the budget under the cache: a cache hit costs nothing.
            let chat: Arc<dyn ChatModel> = Arc::new(PricedChat::new(chat, name, prices.clone()));
            let chat: Arc<dyn ChatModel> = match &cache {
                Some(c) => Arc::new(CachedChat::new(chat, c.clone())),
                None => chat,
            };
            backends.insert_chat(name.clone(), chat);
        }
        if let Some(embed) = embed {
            let embed: Arc<dyn EmbeddingModel> = Arc::new(PricedEmbed::new(embed, name, prices));
            let embed: Arc<dyn EmbeddingModel> = match &cache {
                Some(c) => Arc::new(CachedEmbed::new(embed, c.clone())),
                None => embed,
            };
            backends.insert_embedding(name.clone(), embed);
        }
    }
    let loading: Loading = Box::pin(async move {
        for p in pending {
            p.await.map_err(RuntimeError::LoaderPanicked)??;
        }
        Ok(())
    });
    Ok((ModelHub::new(backends, config.models.clone()), loading))
}

/// Bind `bind:port` (port 0 = any free port).
pub async fn bind(config: &AssayConfig, port: u16) -> std::io::Result<TcpListener> {
    let addr: SocketAddr = format!("{}:{port}", config.bind)
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("bind address: {e}")))?;
    TcpListener::bind(addr).await
}

/// The bearer token every RPC but health needs: `ASSAY_AUTH_TOKEN`, else `auth_token`; `None`
/// when neither is set.
pub fn auth_token(config: &AssayConfig) -> Option<String> {
    std::env::var("ASSAY_AUTH_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
        .or_else(|| Some(config.auth_token.clone()).filter(|t| !t.is_empty()))
}

/// Serving options from configuration: token, drain period and the servers' TLS (`[tls]`, whose
/// files are read here: an error names the key).
pub fn serve_options(config: &AssayConfig) -> Result<ServeOptions, RuntimeError> {
    Ok(ServeOptions {
        auth_token: auth_token(config),
        drain: Duration::from_secs(config.drain_seconds),
        tls: server_tls(config)?,
        max_connection_age: Some(Duration::from_secs(config.max_connection_age_seconds)).filter(|age| !age.is_zero()),
    })
}

/// What servers present and whom they accept, from `[tls]`; `None` = plaintext.
pub fn server_tls(config: &AssayConfig) -> Result<Option<ServerTls>, RuntimeError> {
    let m = config.tls.load()?;
    Ok(m.server.map(|pair| {
        let tls = ServerTls::new(pair.cert, pair.key);
        match m.ca {
            Some(ca) => tls.client_ca(ca, m.require_client_cert),
            None => tls,
        }
    }))
}

/// What channels trust and present, from `[tls]`; `None` = plaintext channels.
pub fn client_tls(config: &AssayConfig) -> Result<Option<ClientTls>, RuntimeError> {
    let m = config.tls.load()?;
    if !m.channels_use_tls() {
        return Ok(None);
    }
    let mut tls = ClientTls::new();
    if let Some(ca) = m.ca {
        tls = tls.ca(ca);
    }
    if let Some(pair) = m.client {
        tls = tls.identity(pair.cert, pair.key);
    }
    if let Some(name) = m.server_name {
        tls = tls.domain(name);
    }
    Ok(Some(tls))
}

/// A lazily connected channel to `url` as configured: over TLS when `[tls]` is set (an `http://`
/// address is dialled as `https://`).
pub fn channel(config: &AssayConfig, url: &str) -> Result<tonic::transport::Channel, RuntimeError> {
    let tls = client_tls(config)?;
    let url = with_scheme(url, tls.is_some());
    Ok(assay_rpc::remote::channel_with(&url, tls.as_ref())?)
}

/// An address as people type it (`127.0.0.1:50051`, `gateway:50051`) as a URL: `http://`, or
/// `https://` when TLS is configured, in front of an address that names no scheme (without it the
/// connection failed with a bare "transport error").
fn with_scheme(url: &str, tls: bool) -> std::borrow::Cow<'_, str> {
    if url.contains("://") {
        std::borrow::Cow::Borrowed(url)
    } else {
        std::borrow::Cow::Owned(format!("{}://{url}", if tls { "https" } else { "http" }))
    }
}

/// What a stage binary serves.
pub struct StageSpec {
    pub binary: &'static str,
    pub service_name: &'static str,
    pub port: fn(&Ports) -> u16,
    /// Whether the stage calls model backends (the gateway and unbuilt stages do not).
    pub uses_models: bool,
}

/// Main of a stage binary: config, telemetry, backends, the service from `routes` (an error, such
/// as an invalid upstream address or a run store that cannot be opened, exits 1), serve until
/// SIGTERM/SIGINT; exit 0 after a clean drain.
pub async fn run_service<E: std::fmt::Display>(
    spec: StageSpec,
    loaders: &[&'static dyn BackendLoader],
    routes: impl FnOnce(Arc<ModelHub>, &AssayConfig) -> Result<Routes, E>,
) -> ExitCode {
    let _telemetry = assay_telemetry::init(spec.binary);
    let config = match assay_config::load(config_path_from_args().as_deref()) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot load configuration");
            return ExitCode::from(2);
        }
    };
    let port = (spec.port)(&config.ports);
    let listener = match bind(&config, port).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(port, error = %e, "cannot bind");
            return ExitCode::from(1);
        }
    };
    let options = match serve_options(&config) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up tls");
            return ExitCode::from(2);
        }
    };
    let readiness = Readiness::new(&[spec.service_name]).await;
    let (hub, loading) = if spec.uses_models {
        match build_hub(&config, loaders) {
            Ok((h, l)) => (Arc::new(h), l),
            Err(e) => {
                tracing::error!(error = %e, "cannot build model backends");
                return ExitCode::from(1);
            }
        }
    } else {
        (Arc::new(ModelHub::default()), Box::pin(async { Ok(()) }) as Loading)
    };
    let routes = match routes(hub, &config) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the service");
            return ExitCode::from(1);
        }
    };
    tracing::info!(service = spec.service_name, addr = ?listener.local_addr().ok(), "listening, not serving until ready");
    let ready = readiness.clone();
    tokio::spawn(async move {
        match loading.await {
            Ok(()) => ready.set_serving().await,
            Err(e) => tracing::error!(error = %e, "model backends failed to load; staying NOT_SERVING"),
        }
    });
    match assay_rpc::serve(listener, routes, readiness, options, assay_rpc::shutdown_signal()).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::from(1)
        }
    }
}

/// Address of an upstream stage: the configured one, else loopback at its port.
pub fn upstream_url(config: &AssayConfig, configured: &str, port: u16) -> String {
    if configured.is_empty() {
        let host = if config.bind == "0.0.0.0" { "127.0.0.1" } else { config.bind.as_str() };
        format!("http://{host}:{port}")
    } else if configured.contains("://") {
        configured.to_string()
    } else {
        format!("http://{configured}")
    }
}

#[cfg(test)]
mod scheme_tests {
    use super::with_scheme;

    #[test]
    fn an_address_without_a_scheme_gets_the_one_tls_implies() {
        assert_eq!(with_scheme("127.0.0.1:50051", false), "http://127.0.0.1:50051");
        assert_eq!(with_scheme("gateway:50051", true), "https://gateway:50051");
        assert_eq!(with_scheme("http://127.0.0.1:50051", true), "http://127.0.0.1:50051");
        assert_eq!(with_scheme("https://a:1", false), "https://a:1");
    }
}

#[cfg(test)]
mod backend_tests {
    use super::*;

    #[test]
    fn unset_settings_keep_the_clients_defaults_and_set_ones_reach_it() {
        let config = AssayConfig::defaults();
        let client = openai_client(&config.backends["openai"]).unwrap();
        let defaults = OpenAiConfig::default();
        let c = client.config();
        assert_eq!(c.adaptive_timeout, defaults.adaptive_timeout);
        assert_eq!(
            (c.max_concurrency, c.initial_concurrency),
            (defaults.max_concurrency, defaults.initial_concurrency)
        );
        assert_eq!(c.max_tokens_field, defaults.max_tokens_field);
        let config = assay_config::load_from(
            "[backends.openai]\nhedge_factor = 3\ninitial_concurrency = 0\nmax_tokens_field = \"max_completion_tokens\"\n",
        )
        .unwrap();
        let client = openai_client(&config.backends["openai"]).unwrap();
        let c = client.config();
        assert_eq!(c.adaptive_timeout.hedge_factor, 3.0);
        assert_eq!(c.initial_concurrency, 0);
        assert_eq!(c.max_tokens_field, assay_config::MaxTokensField::MaxCompletionTokens);
    }

    #[tokio::test]
    async fn a_configuration_changed_in_code_is_checked_when_backends_are_built() {
        let mut config = AssayConfig::defaults();
        config.backends.get_mut("openai").unwrap().hedge_factor = Some(0.5);
        let Err(e) = build_hub(&config, &[]) else { panic!("an unusable hedge factor is refused") };
        assert!(matches!(&e, RuntimeError::Config(assay_config::ConfigError::Backend { key: "hedge_factor", .. })));
        assert!(e.to_string().contains("backends.openai.hedge_factor: is 0.5;"), "{e}");
    }
}
