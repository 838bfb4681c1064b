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

use clap::{Parser, Subcommand};

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

#[derive(Subcommand)]
enum Command {
    /// Run the whole mesh (seven services and the admin page) until Ctrl-C.
    ///
    /// Every service on its own port, in this process, until SIGTERM/SIGINT.
    Up(cmd::up::UpArgs),
    /// Run one service of the mesh on its own, as one Kubernetes Deployment runs it.
    ///
    /// STAGE serves on its configured port (`ports.<stage>` at `bind`) and reaches the stages it
    /// calls at `upstreams.*`; health says NOT_SERVING until it is ready (models loaded, the
    /// gateway's run store open). SIGTERM/SIGINT: NOT_SERVING, drain for up to `drain_seconds`,
    /// exit 0. Logs info lines (`RUST_LOG` decides; -v does not apply), under the service name
    /// `assay-<stage>`. Exit codes: 0 stopped after a drain, 1 it could not start or serve, 2 bad
    /// configuration or an unknown stage.
    Serve(cmd::serve::ServeArgs),
    /// Start the mesh, evaluate two example records, print the result, stop.
    ///
    /// A checklist evaluation run through the gateway, as `assay eval` runs one.
    Demo(cmd::demo::DemoArgs),
    /// Evaluate records: generate a checklist per input and score each record against it.
    ///
    /// Records are JSON lines ({"id","input","target","reference","history","candidates"}) or a
    /// CSV file with those columns. The preset generates one checklist per distinct input, then
    /// every record is scored against its input's checklist. Writes one JSON line per record. Exit
    /// codes: 0 all scored, 3 some records failed, 1 the run failed or its input was refused, 2 a
    /// malformed option.
    Eval(Box<cmd::eval::EvalArgs>),
    /// Score records against one given checklist.
    ///
    /// Records are JSON lines; the checklist a JSON file: {"id","items":[...]} or a list of
    /// questions. Same output and exit codes as `eval`.
    Score(cmd::eval::ScoreArgs),
    /// Generate checklists (or refine a given one) without scoring.
    ///
    /// Instance presets from --input (or one per record of --data), corpus presets
    /// (feedback, checkeval, interacteval) from --observations / --dimensions; or refine a given
    /// checklist (--checklist with --refine). One checklist JSON per line.
    Generate(cmd::generate::GenerateArgs),
    /// Improve a sectioned document where a panel of judges finds issues.
    ///
    /// The document is JSON: {"brief", "sections": [{"id", "title", "content"}]}. The loop: judge, plan, patch or regenerate sections, verify, re-judge, until a
    /// threshold, convergence or a limit. Progress on stderr; the result as JSON on stdout. Exit codes:
    /// 0 accepted (also with a warning, by a human, or reviewed), 3 best effort, 4 waiting for a human
    /// (semi-auto escalation; see `assay runs edit|resume|accept|review`), 1 the run failed or was
    /// cancelled, 2 bad input.
    Refine(cmd::refine::RefineArgs),
    /// Critique and revise one text (self-refine).
    ///
    /// Up to --max-passes critique/revise passes, stopped
    /// when a revision converges, rolled back when it drifts from the original. One progress line
    /// per pass on stderr; the final text on stdout (the whole result as JSON with --json). Exit
    /// codes: 0 done, 1 the run failed or was cancelled, 2 bad input.
    RefineText(cmd::refine_text::RefineTextArgs),
    /// Debate problems with three solvers and a judge; grade the answers.
    ///
    /// Problems are JSON lines {"id","problem","reference"}: three solvers solve, review
    /// each other, refine, and a judge picks the final answer; answers are graded against the
    /// references after normalisation. One JSON line per problem; progress and a summary (accuracy,
    /// consensus and changed-answer rates, tokens; baselines with --baselines) on stderr. Exit codes:
    /// 0 every problem debated, 3 some problems failed, 1 the run failed or was cancelled, 2 bad input.
    Debate(cmd::debate::DebateArgs),
    /// Compare two evaluations record by record: difference, interval, p, regression gate.
    ///
    /// Each side is a run id in the gateway's store or a JSON-lines file of `assay eval --out`;
    /// records pair by id: candidate minus baseline with its interval and p
    /// (evalconfidence's methods), a paired bootstrap interval, the items that flipped and the worst
    /// regressions. Exit codes: 0 done, 1 a significant regression under --fail-on-regression, 2 bad
    /// input.
    Compare(cmd::compare::CompareArgs),
    /// Plan a comparison: records needed for a difference, or the difference a size detects.
    ///
    /// From a pilot (run ids or `assay eval --out` files): the records needed to detect a
    /// difference of --mde, or the smallest difference --n records detect (both: the power
    /// achieved), as evalconfidence's `power` computes it. One file plans an unpaired comparison from
    /// its per-record variance, --candidate a paired one from the per-record differences. Exit codes:
    /// 0 done, 2 bad input.
    Power(cmd::power::PowerArgs),
    /// Check a judge against human labels: kappa, alpha, a corrected mean.
    ///
    /// The evaluation is a run id or an `assay eval --out` file; the labels JSON lines
    /// {"id","score"} and/or {"id","items":{item:"yes"|"no"}}): accuracy, Cohen's kappa,
    /// Krippendorff's alpha, the confusion table, and the prediction-powered mean (the judge's mean
    /// corrected by the labels) beside the judge-only and gold-only means. Exit codes: 0 done, 2 bad
    /// input.
    Agreement(cmd::agreement::AgreementArgs),
    /// List, inspect, follow and control runs on a running gateway.
    Runs(cmd::runs::RunsArgs),
    /// Write a finished run as one file to share: a self-contained HTML page or Markdown.
    ///
    /// Read through the gateway (--gateway): what ran (pipeline, models, settings, cost), the
    /// aggregates with their intervals, responders and their comparisons as a forest plot, the
    /// records with their answers (paged inside the page); a refinement's sections before and
    /// after with the issues fixed; a debate's answers, reviews and verdicts. The HTML loads
    /// nothing from the network. Exit codes: 0 written, 1 it could not be written, 2 an unknown or
    /// unfinished run, an unreachable gateway or a bad option.
    Report(cmd::report::ReportArgs),
    /// Manage the embedded models.
    Models(cmd::models::ModelsArgs),
}

/// Many small allocations on many threads (requests, JSON, events): mimalloc spends less time in
/// allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    cmd::timings::mark("main");
    // The contracts' descriptors (what --json and the events' wording read) decoded beside the
    // verb's own start, not when its first result is printed.
    std::thread::spawn(cmd::render::json::warm);
    assay_runtime::main(run)
}

async fn run() -> ExitCode {
    cmd::timings::mark("runtime");
    let cli = Cli::parse();
    let level = match (cli.verbose, &cli.command) {
        (0, Command::Up(_)) | (1, _) => "info",
        (0, _) => "warn",
        _ => "debug",
    };
    // `serve` is a stage's own process: its telemetry and exit codes are the stage's
    // (`assay_mesh::standalone`).
    let serve = matches!(cli.command, Command::Serve(_));
    let _telemetry = (!serve).then(|| assay_telemetry::init_at("assay", level));
    let config = cli.config.as_deref();
    // The verbs that read results name themselves in their error line.
    let (who, outcome) = match cli.command {
        Command::Serve(args) => return cmd::serve::run(args).await,
        Command::Up(args) => ("assay", cmd::up::run(config, args).await),
        Command::Demo(args) => ("assay", cmd::demo::run(config, args).await),
        Command::Models(args) => ("assay", cmd::models::run(args).await),
        Command::Eval(args) => ("assay", cmd::eval::run(config, *args).await),
        Command::Score(args) => ("assay", cmd::eval::run_score(config, args).await),
        Command::Generate(args) => ("assay", cmd::generate::run(config, args).await),
        Command::Refine(args) => ("assay", cmd::refine::run(config, args).await),
        Command::RefineText(args) => ("assay", cmd::refine_text::run(config, args).await),
        Command::Debate(args) => ("assay", cmd::debate::run(config, args).await),
        Command::Runs(args) => ("assay", cmd::runs::run(config, args).await),
        Command::Report(args) => ("assay report", cmd::report::run(config, args).await),
        Command::Compare(args) => ("assay compare", cmd::compare::run(config, args).await),
        Command::Power(args) => ("assay power", cmd::power::run(args)),
        Command::Agreement(args) => ("assay agreement", cmd::agreement::run(args)),
    };
    let code = cmd::error::finish(who, outcome);
    cmd::timings::write();
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The demo's suggestions are commands this binary accepts as written.
    #[test]
    fn the_demo_suggests_commands_that_parse() {
        for (args, _) in cmd::demo::DEMO_NEXT {
            let argv = std::iter::once("assay").chain(args.split_whitespace());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("assay {args}: {e}");
            }
        }
        let openai = ["assay", "demo", "--backend", "openai", "--model", "MODEL"];
        assert!(Cli::try_parse_from(openai).is_ok());
    }
}
