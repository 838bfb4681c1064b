//! `assay debate`: a problem set (JSON lines `{"id", "problem", "reference"}`) debated through the
//! gateway (`RunPipeline` with a `debate` pipeline): three solvers solve, review each other, refine
//! and a judge picks the final answer. Progress goes to standard error, one line per problem; one
//! JSON line per problem (in input order) to `--out` or standard output; then a summary on standard
//! error (accuracy against the references, consensus and changed-answer rates, tokens; the
//! single-model and self-consistency baselines with `--baselines`). With `--self-refine`, every final
//! answer is then polished by the self-refine hook (one progress line each; the entry in the
//! problem's line).

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines;
use serde_json::{Map, Value};

use super::common::{BackendArgs, BudgetArgs, Progress, load_config};
use super::error::{CliError, Ending, Outcome};
use super::follow::{NoResult, RunFollower, Step, finished_as, follow_run, is_final, start_run};
use super::input::HookArgs;
use super::render::debate::{problem_json, problem_line, summary_text};
use super::render::junit::{self, RunReport};
use super::render::self_refine::self_refined_line;
use super::render::state_name;
use super::session::Session;

/// Options of `assay debate`.
#[derive(clap::Args, Clone)]
pub struct DebateArgs {
    /// Problems (JSON lines): {"id", "problem", "reference"}; id and reference are optional.
    #[arg(long)]
    pub data: PathBuf,
    /// Results (JSON lines, one per problem); standard output when absent.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Review/refine rounds, 1 to 5 (default 1).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
    pub rounds: Option<u32>,
    /// Also answer every problem with one model alone and by self-consistency (a majority vote
    /// over as many samples as the debate made calls).
    #[arg(long)]
    pub baselines: bool,
    /// Stop a debate as soon as the three solvers agree (no review when they agree at once).
    #[arg(long)]
    pub early_stop: bool,
    /// Problems debated at once, 1 to 64 (default: the gateway's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub concurrency: Option<u32>,
    /// Gateway address (e.g. http://127.0.0.1:50051); absent = start the mesh in this process.
    #[arg(long)]
    pub gateway: Option<String>,
    /// The run's label (default "assay debate <data>").
    #[arg(long)]
    pub label: Option<String>,
    /// Also write the results as a JUnit XML report to FILE, for CI systems: a test case per
    /// problem, failed when its (debated) answer is wrong against the reference, in error when the
    /// problem failed or has no reference. Written whole (a temporary file renamed over FILE); a
    /// run that fails leaves a report of one test case in error. The exit code is the same with or
    /// without it.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Self-refine every final answer (the problem as its instruction; grading keeps the debate's
    /// answer).
    #[command(flatten)]
    pub hook: HookArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// `assay debate` with the configuration at `config` (`--config`): 0 every problem debated, 3
/// some problems failed, 1 the run failed or was cancelled, 2 bad input.
pub async fn run(config: Option<&Path>, args: DebateArgs) -> Outcome {
    let mut report = match &args.junit {
        Some(path) => {
            Some(RunReport::create(path, "debate", args.data.display().to_string()).map_err(CliError::Failed)?)
        }
        None => None,
    };
    let outcome = async {
        let config = load_config(config, &args.backend)?;
        debate(&config, args, &mut report).await
    }
    .await;
    if let (Some(report), Err(e)) = (report, &outcome) {
        report.failed(e.message());
    }
    outcome
}

/// Problems from a JSON-lines file; an error names the file, the line and the field.
pub fn read_problems(path: &Path) -> Result<Vec<gw::DebateProblem>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), n + 1);
        let v: Value = serde_json::from_str(line).map_err(|e| format!("{at}: not JSON: {e}"))?;
        out.push(problem_from_json(&v).map_err(|e| format!("{at}: {e}"))?);
    }
    if out.is_empty() {
        return Err(format!("{}: no problems", path.display()));
    }
    Ok(out)
}

/// One problem from a JSON object: `{"id", "problem", "reference"}`; the id and the reference may
/// be strings or numbers; the problem is required and must not be blank.
pub fn problem_from_json(v: &Value) -> Result<gw::DebateProblem, String> {
    const KNOWN: [&str; 3] = ["id", "problem", "reference"];
    let o = v.as_object().ok_or("a problem must be a JSON object {\"id\", \"problem\", \"reference\"}")?;
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(format!("unknown field {k:?} (known: {})", KNOWN.join(", ")));
    }
    let scalar = |o: &Map<String, Value>, k: &str| -> Result<Option<String>, String> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(Value::Bool(_) | Value::Array(_) | Value::Object(_)) => {
                Err(format!("field {k:?} must be a string or a number"))
            }
        }
    };
    let problem = match o.get("problem") {
        None | Some(Value::Null) => return Err("field \"problem\" is required".into()),
        Some(Value::String(s)) if s.trim().is_empty() => return Err("field \"problem\" must not be empty".into()),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("field \"problem\" must be a string".into()),
    };
    let reference = scalar(o, "reference")?;
    if reference.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return Err("field \"reference\" must not be empty (leave it out for an ungraded problem)".into());
    }
    Ok(gw::DebateProblem { id: scalar(o, "id")?.unwrap_or_default(), problem, reference })
}

/// The pipeline of a problem set with the command's options.
pub fn build_pipeline(problems: Vec<gw::DebateProblem>, a: &DebateArgs) -> gw::DebatePipeline {
    gw::DebatePipeline {
        problems,
        rounds: a.rounds,
        early_stop_on_agreement: a.early_stop,
        baselines: a.baselines,
        concurrency: a.concurrency.unwrap_or(0),
        self_refine: a.hook.hook(),
        ..Default::default()
    }
}

/// `assay debate`; `report`, the `--junit` report, written when the run completes.
pub async fn debate(config: &AssayConfig, args: DebateArgs, report: &mut Option<RunReport>) -> Outcome {
    let problems = read_problems(&args.data).map_err(CliError::BadInput)?;
    let total = problems.len();
    let pipeline = build_pipeline(problems, &args);
    let label = args.label.clone().unwrap_or_else(|| format!("assay debate {}", args.data.display()));
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::Debate(pipeline)),
        label,
        budget: args.budget.budget(),
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    let outcome = follow(&mut session, request, total, &args, report).await;
    session.close().await?;
    outcome
}

async fn follow(
    session: &mut Session,
    request: gw::RunPipelineRequest,
    total: usize,
    args: &DebateArgs,
    report: &mut Option<RunReport>,
) -> Outcome {
    let events = start_run(&mut session.client, request).await?;
    let out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| CliError::Failed(format!("{}: {e}", p.display())))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let mut follower = Follower {
        total,
        baselines: args.baselines,
        out,
        progress: Progress::new(total as u64, "problems"),
        failed: 0,
        run_id: String::new(),
        report: report.take(),
    };
    let outcome = follow_run(&mut session.client, events, &mut follower).await;
    *report = follower.report.take();
    outcome
}

/// Follows one debate run ([`follow_run`]): a progress line per problem, then the problems' lines
/// and the summary.
struct Follower {
    total: usize,
    baselines: bool,
    /// Where the problems' lines go.
    out: Box<dyn Write>,
    progress: Progress,
    /// Problems failed so far.
    failed: u64,
    run_id: String,
    /// `--junit`.
    report: Option<RunReport>,
}

impl RunFollower for Follower {
    type Ending = Ending;

    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Outcome> {
        use gw::run_event::Event;
        self.run_id.clone_from(&ev.run_id);
        let run_id = &self.run_id;
        match ev.event {
            Some(Event::Started(_)) => self.progress.note(&format!("run {run_id} started: {} problems", self.total)),
            Some(Event::DebateProblemDone(p)) => {
                self.failed += u64::from(!p.error.is_empty());
                self.progress.note(&problem_line(&p));
                self.progress.inc(self.failed);
            }
            Some(Event::SelfRefined(e)) => self.progress.note(&self_refined_line(&e)),
            Some(Event::StateChanged(s)) => self.progress.note(&format!(
                "run {run_id}: {}{}",
                state_name(s.state),
                if s.reason.is_empty() { String::new() } else { format!(" ({})", s.reason) }
            )),
            Some(Event::Completed(c)) => return Step::Done(self.completed(c.state, c.result)),
            // The kinds this verb leaves to `assay runs watch` (render::events words every kind).
            Some(_) | None => {}
        }
        Step::Continue
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Outcome> {
        is_final(run.state).then(|| self.completed(run.state, run.result))
    }
}

impl Follower {
    /// The run completed: write the problems' lines (also of a run cancelled or failed part-way),
    /// print the summary, map the outcome.
    fn completed(&mut self, state: i32, result: Option<gw::RunResult>) -> Outcome {
        self.progress.finish();
        let run_id = &self.run_id;
        let failed_io = |e: std::io::Error| CliError::Failed(e.to_string());
        if let Some(gw::run_result::Result::Debate(d)) = result.as_ref().and_then(|r| r.result.as_ref()) {
            for p in &d.problems {
                let line = problem_json(p).map_err(CliError::Failed)?;
                writeln!(self.out, "{line}").map_err(failed_io)?;
            }
        }
        self.out.flush().map_err(failed_io)?;
        let cases: Vec<junit::Case> = match (&self.report, result.as_ref().and_then(|r| r.result.as_ref())) {
            (Some(report), Some(gw::run_result::Result::Debate(d))) => {
                d.problems.iter().map(|p| junit::debate_case(&report.label, p)).collect()
            }
            _ => Vec::new(),
        };
        let d = match finished_as::<pipelines::Debate>(state, result, "debate result") {
            Ok(d) => d,
            Err(e) => {
                let message = if matches!(e, NoResult::Cancelled) {
                    format!("{}; the problems debated are written", NoResult::Cancelled.message(run_id))
                } else {
                    e.message(run_id)
                };
                // The problems the run debated, and the run itself in error.
                if let Some(report) = self.report.as_mut().filter(|_| !cases.is_empty()) {
                    let mut cases = cases;
                    cases.push(report.run_error("run_failed", &message));
                    let properties = vec![("run_id".to_string(), run_id.clone()), ("state".into(), state_name(state))];
                    report.finish(properties, String::new(), &cases).map_err(CliError::Failed)?;
                }
                return Err(CliError::Failed(message));
            }
        };
        let summary = summary_text(run_id, &d, self.baselines);
        eprintln!("{summary}");
        if let Some(report) = self.report.as_mut() {
            let mut properties = vec![
                ("run_id".to_string(), run_id.clone()),
                ("state".to_string(), state_name(state)),
                ("data".to_string(), report.label.clone()),
                ("problems".to_string(), d.problems_total.to_string()),
                ("problems_failed".to_string(), d.problems_failed.to_string()),
                ("graded".to_string(), d.graded.to_string()),
                ("correct".to_string(), d.correct.to_string()),
            ];
            if let Some(a) = d.accuracy {
                properties.push(("accuracy".into(), format!("{a:.4}")));
            }
            report.finish(properties, summary, &cases).map_err(CliError::Failed)?;
        }
        Ok(if d.problems_failed == 0 { Ending::Done } else { Ending::Partial })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn problems_parse_with_numbers_and_name_bad_fields() {
        let p = problem_from_json(&json!({"id": 7, "problem": "What is 2+2?", "reference": 4})).unwrap();
        assert_eq!((p.id.as_str(), p.reference.as_deref()), ("7", Some("4")));
        let p = problem_from_json(&json!({"problem": "Who?"})).unwrap();
        assert_eq!((p.id.as_str(), p.reference), ("", None));
        for (v, text) in [
            (json!({"id": "a"}), "field \"problem\" is required"),
            (json!({"problem": "  "}), "field \"problem\" must not be empty"),
            (json!({"problem": 3}), "field \"problem\" must be a string"),
            (json!({"problem": "x", "answer": "1"}), "unknown field \"answer\""),
            (json!({"problem": "x", "reference": [1]}), "field \"reference\" must be a string or a number"),
            (json!(["x"]), "must be a JSON object"),
        ] {
            let e = problem_from_json(&v).unwrap_err();
            assert!(e.contains(text), "{v}: {e}");
        }
    }

    #[test]
    fn a_bad_line_is_named_with_its_file_and_line() {
        let dir = std::env::temp_dir().join(format!("assay-debate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.jsonl");
        std::fs::write(&path, "{\"problem\": \"1+1?\", \"reference\": \"2\"}\n\n{\"id\": \"b\"}\n").unwrap();
        let e = read_problems(&path).unwrap_err();
        assert!(e.ends_with("p.jsonl:3: field \"problem\" is required"), "{e}");
        std::fs::write(&path, "{\"problem\": \"1+1?\"\n").unwrap();
        assert!(read_problems(&path).unwrap_err().contains("p.jsonl:1: not JSON"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
