//! Client commands: they talk to a gateway over gRPC, either one already running (`--gateway`) or a
//! mesh started in this process on ephemeral ports for the duration of the command.

pub mod agreement;
pub mod compare;
pub mod debate;
pub mod eval;
pub mod follow;
pub mod generate;
pub mod input;
pub mod power;
pub mod refine;
pub mod refine_text;
pub mod render;
pub mod runs;
pub mod source;

use std::sync::Arc;

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;
use assay_rpc::auth::BearerInterceptor;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

/// A gateway client that carries the configured bearer token.
pub type Client = gw::gateway_service_client::GatewayServiceClient<InterceptedService<Channel, BearerInterceptor>>;

// The exit codes of every verb, in one place (each verb's README section says which it uses).

/// Exit code of `--fail-on-regression` when a candidate is significantly worse.
pub const EXIT_REGRESSION: u8 = 1;
/// Exit code of unusable input: a file, a line, an option, a request the gateway rejected, an
/// unknown run id, an unreachable gateway; and of a regression gate whose statistics are not
/// numbers (no verdict).
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code when some records (or items, or problems) failed but the run produced results.
pub const EXIT_PARTIAL: u8 = 3;
/// Exit code of a best-effort refinement (full-auto below its thresholds).
pub const EXIT_BEST_EFFORT: u8 = 3;
/// Exit code of a refinement left waiting for a human (semi-auto escalation).
pub const EXIT_AWAITING_HUMAN: u8 = 4;
/// Exit code of `--fail-on-regression` when a responder could not be evaluated at all (every
/// response failed): no verdict, which is not a pass.
pub const EXIT_UNEVALUATED: u8 = 5;

/// Start the whole mesh in this process and wait until every service is SERVING.
pub async fn start(config: &AssayConfig) -> Result<assay_cli::Mesh, String> {
    let (hub, loading) =
        assay_runtime::build_hub(config, &assay_runtime::default_loaders()).map_err(|e| e.to_string())?;
    let mesh = assay_cli::start_mesh(config, Arc::new(hub), false).await.map_err(|e| e.to_string())?;
    eprintln!("services listening (NOT_SERVING until model backends are ready)");
    let started = std::time::Instant::now();
    loading.await.map_err(|e| e.to_string())?;
    mesh.set_serving().await;
    eprintln!("model backends ready in {:.1?}; every service SERVING", started.elapsed());
    for (name, addr) in mesh.addrs.all() {
        tracing::info!(service = name, %addr, "serving");
    }
    Ok(mesh)
}

/// A gateway client for `url` with the configured token (over TLS when `[tls]` is set).
pub fn client(config: &AssayConfig, url: &str) -> Result<Client, String> {
    let channel = assay_runtime::channel(config, url).map_err(|e| e.to_string())?;
    let token = assay_runtime::auth_token(config);
    Ok(gw::gateway_service_client::GatewayServiceClient::with_interceptor(
        channel,
        BearerInterceptor::new(token.as_deref()),
    )
    .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES))
}

/// Where a command's gateway is: the one given, or a mesh of our own (stopped by [`Session::close`]).
pub struct Session {
    pub client: Client,
    mesh: Option<assay_cli::Mesh>,
}

impl Session {
    /// Connect to `gateway`, or start an in-process mesh on ephemeral ports when it is absent.
    pub async fn open(config: &AssayConfig, gateway: Option<&str>) -> Result<Self, String> {
        match gateway {
            Some(url) => Ok(Self { client: client(config, url)?, mesh: None }),
            None => {
                let mut config = config.clone();
                config.ports = assay_config::Ports::ephemeral();
                let mesh = start(&config).await?;
                let url = format!("http://{}", mesh.addrs.gateway);
                Ok(Self { client: client(&config, &url)?, mesh: Some(mesh) })
            }
        }
    }

    /// The gateway address of the in-process mesh, if this session started one.
    pub fn local_gateway(&self) -> Option<String> {
        self.mesh.as_ref().map(|m| format!("http://{}", m.addrs.gateway))
    }

    /// Stop the in-process mesh, if any.
    pub async fn close(self) -> Result<(), String> {
        match self.mesh {
            Some(mesh) => mesh.shutdown().await.map_err(|e| e.to_string()),
            None => Ok(()),
        }
    }
}

/// The gateway address of a running mesh from the configuration (`http://127.0.0.1:<gateway port>`
/// when bound to all interfaces).
pub fn configured_gateway(config: &AssayConfig) -> String {
    let host = match config.bind.as_str() {
        "0.0.0.0" | "::" | "[::]" | "" => "127.0.0.1",
        other => other,
    };
    format!("http://{host}:{}", config.ports.gateway)
}

/// A gRPC status as a one-line message.
pub fn status_text(s: &tonic::Status) -> String {
    let mut text = format!("{}: {}", assay_rpc::status::code_name(s.code()), s.message());
    use tonic_types::StatusExt;
    if let Some(details) = s.get_error_details().bad_request() {
        for v in &details.field_violations {
            let line = format!("{}: {}", v.field, v.description);
            // The message often says the first violation already.
            if !s.message().contains(&line) {
                text.push_str(&format!("\n  {line}"));
            }
        }
    }
    text
}

/// A preset by its lower-case name (`tick`, `rlcf_direct`, `feedback`, ...).
pub fn preset(name: &str) -> Result<assay_proto::generator::v1::Preset, String> {
    assay_proto::generator::v1::Preset::from_str_name(&format!("PRESET_{}", name.to_ascii_uppercase()))
        .filter(|p| *p != assay_proto::generator::v1::Preset::Unspecified)
        .ok_or_else(|| {
            format!(
                "unknown preset {name:?} (tick, rocketeval, rlcf_direct, rlcf_candidate, rlcf_candidates_only, \
                 openrubrics_pairwise, openrubrics_listwise, feedback, checkeval, interacteval)"
            )
        })
}

/// A progress display on standard error: a bar on a terminal, else one line per tenth of the work.
pub struct Progress {
    bar: indicatif::ProgressBar,
    total: u64,
    done: u64,
    terminal: bool,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Self {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
                "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}}, eta {{eta}}) {{msg}}"
            )) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Self { bar, total, done: 0, terminal }
    }

    /// One more unit done; `failed` units are counted in the message.
    pub fn inc(&mut self, failed: u64) {
        self.done += 1;
        if self.terminal {
            self.bar.inc(1);
            if failed > 0 {
                self.bar.set_message(format!("{failed} failed"));
            }
        } else {
            let step = (self.total / 10).max(1);
            if self.done.is_multiple_of(step) || self.done == self.total {
                eprintln!("progress: {}/{} ({failed} failed)", self.done, self.total);
            }
        }
    }

    /// A status line above the bar.
    pub fn note(&self, line: &str) {
        if self.terminal { self.bar.println(line) } else { eprintln!("{line}") }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A run's spending limit, on every verb that runs a pipeline.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BudgetArgs {
    /// Stop starting model calls once the run used this many tokens (prompt + completion); the
    /// run then ends partial with what it has.
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Stop starting model calls once the run cost this many US dollars (from the backends'
    /// price tables; a model without a price stops such a run).
    #[arg(long)]
    pub max_cost: Option<f64>,
}

impl BudgetArgs {
    /// The request's budget; None when neither limit is given.
    pub fn budget(&self) -> Option<assay_proto::gateway::v1::RunBudget> {
        (self.max_tokens.is_some() || self.max_cost.is_some())
            .then_some(assay_proto::gateway::v1::RunBudget { max_tokens: self.max_tokens, max_cost_usd: self.max_cost })
    }
}
