//! Layered configuration: compiled defaults -> optional file -> `ASSAY__SECTION__KEY` environment.
//! Tests build an [`AssayConfig`] directly (or with [`load_from`]) and never touch the environment.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

mod error;
pub use error::ConfigError;
pub mod backends;
pub mod models;

pub use backends::{BackendConfig, MAX_PRICE_PER_MTOK, MaxTokensField, Price, check_backends, check_prices};
pub use models::{ModelSettings, PhaseModels};

/// The compiled defaults.
pub const DEFAULT_TOML: &str = include_str!("../default.toml");

/// Configuration of the whole mesh; each service reads its part.
#[derive(Clone, Deserialize)]
pub struct AssayConfig {
    pub bind: String,
    pub auth_token: String,
    pub drain_seconds: u64,
    /// Seconds after which a server closes a client's connection gracefully (GOAWAY: calls in
    /// flight finish, new ones reconnect), so that load spreads over new pods behind one Service
    /// name; 0 = connections live on.
    #[serde(default)]
    pub max_connection_age_seconds: u64,
    pub ports: Ports,
    pub upstreams: Upstreams,
    pub gateway: GatewayConfig,
    pub scorer: ScorerSettings,
    pub backends: BTreeMap<String, BackendConfig>,
    pub cache: CacheConfig,
    pub models: PhaseModels,
    #[serde(default)]
    pub tls: TlsConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub convergence: ConvergenceConfig,
}

/// Self-refine's convergence cascade (`[convergence]`).
#[derive(Debug, Clone, Deserialize)]
pub struct ConvergenceConfig {
    /// Run the cascade's embedding step when a self-refine request does not say
    /// (`embedding_step`). Off by default: measured on the embedded backend, it costs an
    /// embedding call per undecided comparison and turns more right decisions wrong than it fixes
    /// (see `assay_domain::self_refine::DEFAULT_EMBEDDING_STEP`).
    #[serde(default = "embedding_step")]
    pub embedding_step: bool,
}

impl Default for ConvergenceConfig {
    fn default() -> Self {
        Self { embedding_step: embedding_step() }
    }
}

fn embedding_step() -> bool {
    assay_domain::self_refine::DEFAULT_EMBEDDING_STEP
}

impl std::fmt::Debug for AssayConfig {
    // By hand, so the bearer token never reaches a log line or an error; destructured so a new field
    // must be added here too.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let AssayConfig {
            bind,
            auth_token,
            drain_seconds,
            max_connection_age_seconds,
            ports,
            upstreams,
            gateway,
            scorer,
            backends,
            cache,
            models,
            tls,
            admin,
            convergence,
        } = self;
        f.debug_struct("AssayConfig")
            .field("bind", bind)
            .field("auth_token", &redacted(auth_token))
            .field("drain_seconds", drain_seconds)
            .field("max_connection_age_seconds", max_connection_age_seconds)
            .field("ports", ports)
            .field("upstreams", upstreams)
            .field("gateway", gateway)
            .field("scorer", scorer)
            .field("backends", backends)
            .field("cache", cache)
            .field("models", models)
            .field("tls", tls)
            .field("admin", admin)
            .field("convergence", convergence)
            .finish()
    }
}

/// How a secret shows in Debug output: whether it is set, never its value.
fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() { "" } else { "<redacted>" }
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

/// Who may use the gateway's admin page (served on `ports.admin`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AdminConfig {
    /// Names (besides the bound address, and `localhost` on loopback) the page answers to in the
    /// `Host` header: `name` (any port) or `name:port`; `*` turns the check off. Every other Host is
    /// refused, so a DNS-rebound name cannot reach the page.
    pub allowed_hosts: Vec<String>,
    /// UNSAFE: serve the page with no token when `auth_token` is empty (otherwise a fresh token is
    /// generated per start and printed once with the page's URL). Any local web page or process can
    /// then read and control every run. `assay up --no-admin-auth` sets it.
    pub no_auth: bool,
}

/// Where `assay up` serves the admin page when `ports.admin` is not set.
pub const DEFAULT_ADMIN_PORT: u16 = 50050;

impl Ports {
    /// Every port 0: each service binds any free port (the admin page stays off).
    pub fn ephemeral() -> Ports {
        Ports { gateway: 0, generator: 0, refiners: 0, scorer: 0, arbiter: 0, delta_judge: 0, debate: 0, admin: None }
    }
}

/// Upstream addresses of the stages as seen by the gateway. Each is one address, or replicas
/// balanced per call: several addresses (a TOML list, or separated by commas) or
/// `dns:///host:port` (a name resolved again every few seconds, such as a headless Service).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Upstreams {
    #[serde(deserialize_with = "addresses")]
    pub generator: String,
    #[serde(deserialize_with = "addresses")]
    pub refiners: String,
    #[serde(deserialize_with = "addresses")]
    pub scorer: String,
    #[serde(deserialize_with = "addresses")]
    pub arbiter: String,
    #[serde(deserialize_with = "addresses")]
    pub delta_judge: String,
    #[serde(deserialize_with = "addresses")]
    pub debate: String,
}

/// An upstream as a string: a list of addresses is joined with commas.
fn addresses<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => s,
        OneOrMany::Many(list) => list.join(","),
    })
}

/// Gateway settings.
#[derive(Debug, Clone, Deserialize)]
pub struct GatewayConfig {
    pub store: String,
    pub data_dir: String,
    pub concurrency: u32,
    /// Runs executing at once at most; beyond it RunPipeline and Evaluate answer
    /// RESOURCE_EXHAUSTED (0 = no limit).
    #[serde(default = "max_active_runs")]
    pub max_active_runs: u32,
    /// This gateway's name in a shared run store (the owner of the runs it executes). Empty: a
    /// new random name per process. Give each replica a stable one (its pod name) so a restarted
    /// process takes its own runs back at once instead of waiting for their leases to expire.
    #[serde(default)]
    pub instance_id: String,
    /// With a shared (PostgreSQL) run store: how long a gateway's claim on a run lasts without
    /// renewal. Renewed every third of it; another gateway takes over a run whose lease expired.
    #[serde(default = "lease_seconds")]
    pub lease_seconds: f64,
    /// Finished runs older than this many days are deleted (every hour, by one gateway of those
    /// sharing the store); 0 keeps every run. A fraction is honoured as it is (1.5 = 36 hours),
    /// never rounded.
    #[serde(default)]
    pub retention_days: f64,
}

/// The longest retention period `gateway.retention_days` takes (100 years; 0 = forever).
pub const MAX_RETENTION_DAYS: f64 = 36_500.0;

impl GatewayConfig {
    /// How long finished runs are kept, None = forever (`retention_days` 0), to the second.
    pub fn retention(&self) -> Option<std::time::Duration> {
        (self.retention_days > 0.0).then(|| std::time::Duration::from_secs_f64(self.retention_days * 86_400.0))
    }
}

fn max_active_runs() -> u32 {
    4096
}

fn lease_seconds() -> f64 {
    15.0
}

/// Scorer settings.
#[derive(Debug, Clone, Deserialize)]
pub struct ScorerSettings {
    pub concurrency: u32,
}

/// Response cache.
#[derive(Debug, Clone, Deserialize)]
pub struct CacheConfig {
    pub enabled: bool,
    pub capacity: u64,
    pub path: String,
}

/// TLS on every gRPC server and channel: paths of PEM files, every one empty = plaintext.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct TlsConfig {
    /// This service's certificate chain; with `key`, every server serves TLS only.
    pub cert: String,
    /// The private key of `cert`.
    pub key: String,
    /// CA certificates (PEM bundle): servers verify client certificates against them, channels
    /// trust the servers they sign (empty = the system's roots).
    pub ca: String,
    /// Certificate chain channels present to servers that ask for one (empty = `cert`).
    pub client_cert: String,
    /// The private key of `client_cert` (empty = `key`).
    pub client_key: String,
    /// Servers refuse clients without a certificate signed by `ca` (mutual TLS).
    pub require_client_cert: bool,
    /// Name checked in the servers' certificates (empty = the host of the address dialled).
    pub server_name: String,
}

/// A certificate chain and its private key, both PEM. Debug never shows the key.
#[derive(Clone)]
pub struct PemPair {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for PemPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PemPair").field("cert_bytes", &self.cert.len()).field("key", &"<redacted>").finish()
    }
}

/// The files of a [`TlsConfig`], read and checked: what servers and channels use.
#[derive(Clone, Default)]
pub struct TlsMaterial {
    /// What servers present; `None` = plaintext servers.
    pub server: Option<PemPair>,
    /// The CA bundle (PEM).
    pub ca: Option<Vec<u8>>,
    /// What channels present when a server asks (`client_cert`/`client_key`, else `cert`/`key`).
    pub client: Option<PemPair>,
    pub require_client_cert: bool,
    pub server_name: Option<String>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let TlsMaterial { server, ca, client, require_client_cert, server_name } = self;
        f.debug_struct("TlsMaterial")
            .field("server", server)
            .field("ca_bytes", &ca.as_ref().map(Vec::len))
            .field("client", client)
            .field("require_client_cert", require_client_cert)
            .field("server_name", server_name)
            .finish()
    }
}

impl TlsMaterial {
    /// Whether channels use TLS: whenever anything TLS is configured (an `http://` address is
    /// dialled as `https://`).
    pub fn channels_use_tls(&self) -> bool {
        self.server.is_some() || self.ca.is_some() || self.client.is_some()
    }
}

impl TlsConfig {
    /// Whether any TLS key is set.
    pub fn is_configured(&self) -> bool {
        let TlsConfig { cert, key, ca, client_cert, client_key, require_client_cert, server_name: _ } = self;
        *require_client_cert || [cert, key, ca, client_cert, client_key].iter().any(|p| !p.is_empty())
    }

    /// Read and check the files: pairs set together, files readable and holding PEM of the right
    /// kind, mutual TLS with its CA. Errors name the offending key.
    pub fn load(&self) -> Result<TlsMaterial, ConfigError> {
        let TlsConfig { cert, key, ca, client_cert, client_key, require_client_cert, server_name } = self;
        let server = pair(("tls.cert", cert), ("tls.key", key))?;
        let client = pair(("tls.client_cert", client_cert), ("tls.client_key", client_key))?;
        let ca = if ca.is_empty() { None } else { Some(read_pem("tls.ca", ca, Pem::Certificate)?) };
        if *require_client_cert {
            if server.is_none() {
                return Err(tls_error(
                    "tls.require_client_cert",
                    "needs tls.cert and tls.key (only a TLS server can ask for client certificates)",
                ));
            }
            if ca.is_none() {
                return Err(tls_error(
                    "tls.require_client_cert",
                    "needs tls.ca (the CA that signs client certificates)",
                ));
            }
        }
        Ok(TlsMaterial {
            client: client.or_else(|| server.clone()),
            server,
            ca,
            require_client_cert: *require_client_cert,
            server_name: Some(server_name.trim().to_string()).filter(|s| !s.is_empty()),
        })
    }
}

#[derive(Clone, Copy)]
enum Pem {
    Certificate,
    PrivateKey,
}

fn tls_error(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Key { key, message: message.into() }
}

fn pair(cert: (&'static str, &str), key: (&'static str, &str)) -> Result<Option<PemPair>, ConfigError> {
    match (cert.1.is_empty(), key.1.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Err(tls_error(cert.0, format!("is set but {} is not: set both or neither", key.0))),
        (true, false) => Err(tls_error(key.0, format!("is set but {} is not: set both or neither", cert.0))),
        (false, false) => Ok(Some(PemPair {
            cert: read_pem(cert.0, cert.1, Pem::Certificate)?,
            key: read_pem(key.0, key.1, Pem::PrivateKey)?,
        })),
    }
}

/// Read a PEM file and check it holds a block of the expected kind (the TLS library parses it).
fn read_pem(key: &'static str, path: &str, kind: Pem) -> Result<Vec<u8>, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| tls_error(key, format!("cannot read {path:?}: {e}")))?;
    let text = String::from_utf8_lossy(&bytes);
    let found = match kind {
        Pem::Certificate => text.contains("-----BEGIN CERTIFICATE-----"),
        Pem::PrivateKey => text.lines().any(|l| l.starts_with("-----BEGIN ") && l.ends_with("PRIVATE KEY-----")),
    };
    if !found {
        let what = match kind {
            Pem::Certificate => "PEM certificate",
            Pem::PrivateKey => "PEM private key",
        };
        return Err(tls_error(key, format!("{path:?} holds no {what}")));
    }
    Ok(bytes)
}

/// Defaults, then `file` (if any), then `ASSAY__*` environment variables.
pub fn load(file: Option<&Path>) -> Result<AssayConfig, ConfigError> {
    let mut b = config::Config::builder().add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml));
    if let Some(f) = file {
        b = b.add_source(config::File::from(f).required(true));
    }
    b = b.add_source(environment());
    checked(b.build()?.try_deserialize()?)
}

/// The `ASSAY__SECTION__KEY` layer (tests give it a map with `.source(...)` instead of the
/// process environment).
fn environment() -> config::Environment {
    config::Environment::with_prefix("ASSAY")
        .prefix_separator("__")
        .separator("__")
        .try_parsing(true)
        // ASSAY__ADMIN__ALLOWED_HOSTS=a.example,b.example
        .list_separator(",")
        .with_list_parse_key("admin.allowed_hosts")
}

/// Refuse a configuration whose TLS files are missing, unreadable or half set, whose backends
/// hold an unusable setting ([`check_backends`]: price tables, hedge factor, timeout multiplier),
/// or whose lease or connection age is out of range.
fn checked(config: AssayConfig) -> Result<AssayConfig, ConfigError> {
    config.tls.load()?;
    check_backends(&config.backends)?;
    let lease = config.gateway.lease_seconds;
    if !(1.0..=3600.0).contains(&lease) {
        return Err(ConfigError::Key {
            key: "gateway.lease_seconds",
            message: format!("is {lease}; it must be between 1 and 3600 seconds"),
        });
    }
    let days = config.gateway.retention_days;
    // At least a minute: a fraction so small it rounds to nothing would delete runs as they end.
    if !(days == 0.0 || (1.0 / 1440.0..=MAX_RETENTION_DAYS).contains(&days)) {
        return Err(ConfigError::Key {
            key: "gateway.retention_days",
            message: format!(
                "is {days}; it must be between 0.000695 (a minute) and {MAX_RETENTION_DAYS} days, a fraction \
                 taken as it is (1.5 = 36 hours), or 0 to keep every run"
            ),
        });
    }
    let age = config.max_connection_age_seconds;
    if age > 86_400 {
        return Err(ConfigError::Key {
            key: "max_connection_age_seconds",
            message: format!("is {age}; it must be at most 86400 seconds (0 = no limit)"),
        });
    }
    Ok(config)
}

/// Defaults overlaid with a TOML string (for tests; no environment).
pub fn load_from(toml: &str) -> Result<AssayConfig, ConfigError> {
    let c = config::Config::builder()
        .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
        .add_source(config::File::from_str(toml, config::FileFormat::Toml))
        .build()?;
    checked(c.try_deserialize()?)
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
    fn tls_is_off_by_default_and_half_settings_name_the_key() {
        assert!(!AssayConfig::defaults().tls.is_configured());
        let e = load_from("[tls]\ncert = \"/nonexistent/cert.pem\"\n").unwrap_err().to_string();
        assert_eq!(e, "configuration error: tls.cert: is set but tls.key is not: set both or neither");
        let e = load_from("[tls]\nclient_key = \"/k\"\n").unwrap_err().to_string();
        assert!(e.contains("tls.client_key: is set but tls.client_cert is not"), "{e}");
        let e = load_from("[tls]\nca = \"/nonexistent/ca.pem\"\n").unwrap_err().to_string();
        assert!(e.starts_with("configuration error: tls.ca: cannot read \"/nonexistent/ca.pem\""), "{e}");
        let e = load_from("[tls]\nrequire_client_cert = true\n").unwrap_err().to_string();
        assert!(e.contains("tls.require_client_cert: needs tls.cert and tls.key"), "{e}");
    }

    #[test]
    fn an_upstream_is_one_address_a_list_or_a_dns_name() {
        let c = load_from("[upstreams]\nscorer = [\"scorer-0:50054\", \"scorer-1:50054\"]\n").unwrap();
        assert_eq!(c.upstreams.scorer, "scorer-0:50054,scorer-1:50054");
        let c = load_from("[upstreams]\nscorer = \"dns:///scorer-headless:50054\"\n").unwrap();
        assert_eq!(c.upstreams.scorer, "dns:///scorer-headless:50054");
        assert_eq!(AssayConfig::defaults().upstreams.scorer, "");
    }

    #[test]
    fn lease_outside_its_range_names_the_key() {
        assert_eq!(AssayConfig::defaults().gateway.lease_seconds, 15.0);
        assert_eq!(AssayConfig::defaults().gateway.retention_days, 0.0, "runs are kept unless a retention is set");
        assert_eq!(AssayConfig::defaults().gateway.retention(), None);
        let e = load_from("[gateway]\nretention_days = 40000\n").unwrap_err().to_string();
        assert!(e.contains("gateway.retention_days") && e.contains("36500"), "{e}");
        assert_eq!(load_from("[gateway]\nretention_days = 30\n").unwrap().gateway.retention_days, 30.0);
        // A fraction is honoured, never rounded (1.4 was taken as 1, and 0.4 as 0 = forever).
        let g = load_from("[gateway]\nretention_days = 1.4\n").unwrap().gateway;
        assert_eq!(g.retention(), Some(std::time::Duration::from_secs(120_960)));
        let g = load_from("[gateway]\nretention_days = 0.4\n").unwrap().gateway;
        assert_eq!(g.retention(), Some(std::time::Duration::from_secs(34_560)));
        for bad in ["-1", "0.0001", "nan", "inf"] {
            let e = load_from(&format!("[gateway]\nretention_days = {bad}\n")).unwrap_err().to_string();
            assert!(e.contains("gateway.retention_days: is "), "{bad}: {e}");
        }
        let e = load_from("[gateway]\nlease_seconds = 0.5\n").unwrap_err().to_string();
        assert_eq!(e, "configuration error: gateway.lease_seconds: is 0.5; it must be between 1 and 3600 seconds");
        assert!(load_from("[gateway]\nlease_seconds = nan\n").is_err());
        assert_eq!(AssayConfig::defaults().max_connection_age_seconds, 0);
        assert_eq!(load_from("max_connection_age_seconds = 120\n").unwrap().max_connection_age_seconds, 120);
        let e = load_from("max_connection_age_seconds = 100000\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration error: max_connection_age_seconds: is 100000; it must be at most 86400 seconds (0 = no limit)"
        );
    }

    #[test]
    fn debug_never_shows_the_auth_token() {
        let mut c = AssayConfig::defaults();
        c.auth_token = "tok-3f9a-secret".into();
        let text = format!("{c:?}");
        assert!(!text.contains("tok-3f9a-secret") && text.contains("auth_token: \"<redacted>\""), "{text}");
    }

    #[test]
    fn the_embedding_step_is_off_by_default_and_configurable() {
        assert!(!AssayConfig::defaults().convergence.embedding_step);
        assert_eq!(
            AssayConfig::defaults().convergence.embedding_step,
            assay_domain::self_refine::DEFAULT_EMBEDDING_STEP
        );
        assert!(load_from("[convergence]\nembedding_step = true\n").unwrap().convergence.embedding_step);
    }

    /// Defaults, then `toml`, then `env` as the `ASSAY__*` environment (a map, not the process's).
    fn layered(toml: &str, env: &[(&str, &str)]) -> Result<AssayConfig, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let c = config::Config::builder()
            .add_source(config::File::from_str(DEFAULT_TOML, config::FileFormat::Toml))
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .add_source(environment().source(Some(env)))
            .build()?;
        checked(c.try_deserialize()?)
    }

    const GPT: &str = "[backends.openai.prices.\"gpt-4o\"]\n";

    #[test]
    fn prices_parse_through_every_layer() {
        let c = load_from(&format!("{GPT}input = 2.5\noutput = 10.0\ncached_input = 1.25\n")).unwrap();
        let p = c.backends["openai"].prices["gpt-4o"];
        assert_eq!(p, Price { input: 2.5, output: 10.0, cached_input: Some(1.25) });
        assert_eq!(c.backends["local"].prices["*"], Price { input: 0.0, output: 0.0, cached_input: None });
        // The environment overrides one rate of a table the file gave.
        let c = layered(
            "[backends.openai.prices.mini]\ninput = 0.15\noutput = 0.6\n",
            &[("ASSAY__BACKENDS__OPENAI__PRICES__MINI__OUTPUT", "0.5")],
        )
        .unwrap();
        assert_eq!(c.backends["openai"].prices["mini"], Price { input: 0.15, output: 0.5, cached_input: None });
        // The largest price allowed, and zero, are prices.
        assert!(load_from(&format!("{GPT}input = 10000\noutput = 0\n")).is_ok());
    }

    #[test]
    fn depends_on_no_runtime_crate() {
        // Configuration sits below everything it configures: the model clients, transport and
        // services depend on it, never the other way round.
        let manifest: toml::Table = toml::from_str(include_str!("../Cargo.toml")).unwrap();
        let deps = manifest["dependencies"].as_table().unwrap();
        let ours: Vec<&String> = deps.keys().filter(|k| k.starts_with("assay-")).collect();
        assert_eq!(ours, ["assay-domain"], "assay-config may depend on assay-domain only");
    }

    #[test]
    fn a_backend_setting_from_the_environment_is_checked_naming_its_key() {
        let c = layered("", &[("ASSAY__BACKENDS__OPENAI__HEDGE_FACTOR", "4")]).unwrap();
        assert_eq!(c.backends["openai"].hedge_factor, Some(4.0));
        let e = layered("", &[("ASSAY__BACKENDS__OPENAI__HEDGE_FACTOR", "0.5")]).unwrap_err().to_string();
        assert!(e.starts_with("configuration error: backends.openai.hedge_factor: is 0.5;"), "{e}");
    }

    #[test]
    fn an_unknown_price_key_is_refused_naming_backend_model_and_key() {
        // Was ignored: `inptu` left the model without an input rate it meant to set.
        let e = load_from(&format!("{GPT}inptu = 2.5\ninput = 2.5\noutput = 10.0\n")).unwrap_err().to_string();
        assert!(e.contains("unknown field `inptu`"), "{e}");
        assert!(e.contains("backends.openai.prices.gpt-4o"), "{e}");
        // From the environment layer too.
        let e = layered(
            "[backends.openai.prices.mini]\ninput = 0.15\noutput = 0.6\n",
            &[("ASSAY__BACKENDS__OPENAI__PRICES__MINI__CACHED", "0.1")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown field `cached`") && e.contains("backends.openai.prices.mini"), "{e}");
        // On the compiled defaults' own table.
        let e = load_from("[backends.local.prices.\"*\"]\nouptut = 1.0\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `ouptut`") && e.contains("backends.local.prices"), "{e}");
    }

    #[test]
    fn prices_out_of_bounds_are_refused_naming_backend_model_and_rate() {
        // Was accepted: 1e308 per million tokens made every cost `inf`.
        let e = load_from(&format!("{GPT}input = 1e308\noutput = 10.0\n")).unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration error: backends.openai.prices.\"gpt-4o\".input: is 1e308; a price must be at most 10000 USD \
             per million tokens"
        );
        let e = load_from(&format!("{GPT}input = 1.0\noutput = 10000.5\n")).unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration error: backends.openai.prices.\"gpt-4o\".output: is 10000.5; a price must be at most \
             10000 USD per million tokens"
        );
        let e = load_from(&format!("{GPT}input = 1.0\noutput = inf\n")).unwrap_err().to_string();
        assert!(e.contains("backends.openai.prices.\"gpt-4o\".output: is inf; a price must be a finite number"), "{e}");
        let e = load_from(&format!("{GPT}input = nan\noutput = 1.0\n")).unwrap_err().to_string();
        assert!(e.contains("backends.openai.prices.\"gpt-4o\".input: is NaN"), "{e}");
        let e = load_from(&format!("{GPT}input = 1.0\noutput = 1.0\ncached_input = -0.5\n")).unwrap_err().to_string();
        assert!(e.contains("\"gpt-4o\".cached_input: is -0.5; a price must not be negative"), "{e}");
        let e = layered(
            "[backends.openai.prices.mini]\ninput = 0.15\noutput = 0.6\n",
            &[("ASSAY__BACKENDS__OPENAI__PRICES__MINI__INPUT", "-1")],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("backends.openai.prices.\"mini\".input: is -1; a price must not be negative"), "{e}");
    }

    #[test]
    fn a_cached_input_price_above_the_input_price_is_refused() {
        // Was accepted: cached prompt tokens cost more than fresh ones.
        let e = load_from(&format!("{GPT}input = 2.5\noutput = 10.0\ncached_input = 5.0\n")).unwrap_err().to_string();
        assert_eq!(
            e,
            "configuration error: backends.openai.prices.\"gpt-4o\".cached_input: is 5, above input (2.5); prompt \
             tokens served from the provider's cache cost at most the input price"
        );
        assert!(load_from(&format!("{GPT}input = 2.5\noutput = 10.0\ncached_input = 2.5\n")).is_ok());
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
