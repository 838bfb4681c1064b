//! Layered configuration: compiled defaults -> optional file -> `ASSAY__SECTION__KEY` environment.
//! Tests build an [`AssayConfig`] directly (or with [`load_from`]) and never touch the environment.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

pub use assay_llm::phases::{ModelSettings, PhaseModels};

/// The compiled defaults.
pub const DEFAULT_TOML: &str = include_str!("../default.toml");

/// Configuration of the whole mesh; each service reads its part.
#[derive(Debug, Clone, Deserialize)]
pub struct AssayConfig {
    pub bind: String,
    pub auth_token: String,
    pub drain_seconds: u64,
    pub ports: Ports,
    pub upstreams: Upstreams,
    pub gateway: GatewayConfig,
    pub scorer: ScorerSettings,
    pub backends: BTreeMap<String, BackendConfig>,
    pub cache: CacheConfig,
    pub models: PhaseModels,
}

/// Listening ports.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Ports {
    pub gateway: u16,
    pub generator: u16,
    pub refiners: u16,
    pub scorer: u16,
    pub arbiter: u16,
    pub delta_judge: u16,
    pub debate: u16,
    /// The gateway's admin page (HTTP); off unless set (`assay up` serves it at
    /// [`DEFAULT_ADMIN_PORT`] when unset). 0 = any free port.
    #[serde(default)]
    pub admin: Option<u16>,
}

/// Where `assay up` serves the admin page when `ports.admin` is not set.
pub const DEFAULT_ADMIN_PORT: u16 = 50050;

impl Ports {
    /// Every port 0: each service binds any free port (the admin page stays off).
    pub fn ephemeral() -> Ports {
        Ports { gateway: 0, generator: 0, refiners: 0, scorer: 0, arbiter: 0, delta_judge: 0, debate: 0, admin: None }
    }
}

/// Upstream addresses of the stages as seen by the gateway.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Upstreams {
    pub generator: String,
    pub refiners: String,
    pub scorer: String,
    pub arbiter: String,
    pub delta_judge: String,
    pub debate: String,
}

/// Gateway settings.
#[derive(Debug, Clone, Deserialize)]
pub struct GatewayConfig {
    pub store: String,
    pub data_dir: String,
    pub concurrency: u32,
}

/// Scorer settings.
#[derive(Debug, Clone, Deserialize)]
pub struct ScorerSettings {
    pub concurrency: u32,
}

/// One model backend.
#[derive(Debug, Clone, Deserialize)]
pub struct BackendConfig {
    /// "openai" or "local".
    pub kind: String,
    #[serde(default)]
    pub base_url: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub embedding_model: String,
    #[serde(default)]
    pub max_tokens_field: String,
    /// Hard cap on requests in flight (openai backends; 0 = the client's 256).
    #[serde(default)]
    pub max_concurrency: u32,
    /// Requests in flight at the start; the limit then adapts to the backend (grows while latency
    /// stays flat, cut on 429 / 503 / timeouts / latency rises). 0 = fixed at `max_concurrency`.
    #[serde(default = "initial_concurrency")]
    pub initial_concurrency: u32,
    #[serde(default = "yes")]
    pub supports_json_schema: bool,
    #[serde(default = "yes")]
    pub supports_logprobs: bool,
    #[serde(default)]
    pub models_dir: String,
    /// Ceiling of one HTTP attempt's timeout, seconds (openai backends; 0 = the client's 120 s).
    #[serde(default)]
    pub request_timeout_secs: u64,
    /// Per-attempt timeouts from the backend's observed latency (openai backends).
    #[serde(default = "yes")]
    pub adaptive_timeout: bool,
    /// Least adaptive timeout, milliseconds (0 = the client's 1000 ms).
    #[serde(default)]
    pub timeout_floor_ms: u64,
    /// Adaptive timeout = this x the p95 of recent latencies (0 = the client's 4).
    #[serde(default)]
    pub timeout_multiplier: f64,
}

fn yes() -> bool {
    true
}

fn initial_concurrency() -> u32 {
    64
}

/// Response cache.
#[derive(Debug, Clone, Deserialize)]
pub struct CacheConfig {
    pub enabled: bool,
    pub capacity: u64,
    pub path: String,
}

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration error: {0}")]
    Invalid(#[from] config::ConfigError),
}

/// Defaults, then `file` (if any), then `ASSAY__*` environment variables.
pub fn load(file: Option<&Path>) -> Result<AssayConfig, ConfigError> {
    let mut b = config::Config::builder().add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
    if let Some(f) = file {
        b = b.add_source(config::File::from(f).required(true));
    }
    b = b
        .add_source(config::Environment::with_prefix("ASSAY").prefix_separator("__").separator("__").try_parsing(true));
    Ok(b.build()?.try_deserialize()?)
}

/// Defaults overlaid with a TOML string (for tests; no environment).
pub fn load_from(toml: &str) -> Result<AssayConfig, ConfigError> {
    let c = config::Config::builder()
        .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
        .add_source(config::File::from_str(toml, config::FileFormat::Toml))
        .build()?;
    Ok(c.try_deserialize()?)
}

impl AssayConfig {
    /// Defaults only.
    pub fn defaults() -> AssayConfig {
        load_from("").expect("compiled defaults parse")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse_with_documented_ports() {
        let c = AssayConfig::defaults();
        assert_eq!(c.ports.gateway, 50051);
        assert_eq!(c.ports.debate, 50057);
        assert_eq!(c.models.default.backend, "local");
        assert!(c.backends.contains_key("openai"));
    }

    #[test]
    fn file_layer_overrides_defaults() {
        let c = load_from("[ports]\nscorer = 6000\n[models.phases.scorer]\nbackend = \"openai\"\n").unwrap();
        assert_eq!(c.ports.scorer, 6000);
        assert_eq!(c.ports.gateway, 50051);
        assert_eq!(c.models.resolve("scorer").backend, "openai");
        assert_eq!(c.models.resolve("generator").backend, "local");
    }
}
