//! `assay refine-text`: critique and revise one text through the gateway (`RunPipeline` with a
//! `self_refine` pipeline). Live progress goes to standard error, one line per pass; the final text
//! goes to standard output (only the text, so it can be piped), or with `--json` the whole result.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::self_refine::{DEFAULT_MAX_PASSES, DEFAULT_MIN_BYTES};
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines;
use assay_proto::refiners::v1 as rpb;
use serde_json::Value;

use super::common::{BackendArgs, BudgetArgs, load_config};
use super::error::{CliError, Ending, Outcome};
use super::follow::{RunFollower, Step, finished_as, is_final, run_and_follow};
use super::input::model_spec;
use super::render::json::run_output;
use super::render::junit::{self, RunReport};
use super::render::self_refine::{pass_line, summary_line};
use super::render::state_line;
use super::render::{plural, state_name, stop_reason_name};
use super::session::Session;

/// How convergence is decided when embeddings are unavailable.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Convergence {
    /// Never declare convergence without embeddings.
    Strict,
    /// Fall back to Jaccard and record the degradation.
    Permissive,
}

impl Convergence {
    fn proto(self) -> rpb::ConvergenceMode {
        match self {
            Convergence::Strict => rpb::ConvergenceMode::Strict,
            Convergence::Permissive => rpb::ConvergenceMode::Permissive,
        }
    }
}

/// Options of `assay refine-text`.
#[derive(clap::Args, Clone)]
pub struct RefineTextArgs {
    /// The draft to refine (UTF-8 text, at most 256 KiB); `-` reads standard input.
    #[arg(long)]
    pub input: PathBuf,
    /// What the text is meant to do (the task), given to the refiner with the draft.
    #[arg(long)]
    pub instruction: Option<String>,
    /// Critique/revise passes, 1 to 5 (default 1; more than 2 rarely pays).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
    pub max_passes: Option<u32>,
    /// Drafts shorter than this many bytes are returned unchanged with no model call (default 200;
    /// 0 refines every draft).
    #[arg(long)]
    pub min_bytes: Option<u32>,
    /// Convergence without embeddings: permissive falls back to Jaccard, strict never converges
    /// (default permissive).
    #[arg(long, value_enum)]
    pub mode: Option<Convergence>,
    /// Refiner model, MODEL, MODEL@BACKEND or @BACKEND (default: the self_refine phase).
    #[arg(long)]
    pub model: Option<String>,
    /// Embedding model of the convergence check and the regression guard, MODEL, MODEL@BACKEND or
    /// @BACKEND (default: the configured embedding backend).
    #[arg(long)]
    pub embedding_model: Option<String>,
    /// Gateway address (e.g. http://127.0.0.1:50051); absent = start the mesh in this process.
    #[arg(long)]
    pub gateway: Option<String>,
    /// The run's label (default "assay refine-text <input>").
    #[arg(long)]
    pub label: Option<String>,
    /// Print the whole result as JSON (final text, passes, stop reason, usage) instead of the text.
    #[arg(long)]
    pub json: bool,
    /// Also write the result as a JUnit XML report to FILE, for CI systems: one test case for the
    /// text, passed when the loop converged (or the draft was too short to refine), failed when it
    /// stopped otherwise (the last critique in the message), in error when the refiner failed.
    /// Written whole (a temporary file renamed over FILE); a run that fails leaves a report of one
    /// test case in error. The exit code is the same with or without it.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Model backend for every phase: `local` (embedded, offline) or `openai` (any
    /// OpenAI-compatible server from OPENAI_BASE_URL / OPENAI_API_KEY); the refiner model: --model.
    #[arg(long)]
    pub backend: Option<String>,
}

/// `assay refine-text` with the configuration at `config` (`--config`): 0 done, 1 the run failed
/// or was cancelled, 2 bad input.
pub async fn run(config: Option<&Path>, args: RefineTextArgs) -> Outcome {
    // --model is the refiner's (MODEL@BACKEND), not the backend's default model.
    let backend = BackendArgs { backend: args.backend.clone(), model: None };
    let label = if is_stdin(&args.input) { "stdin".to_string() } else { args.input.display().to_string() };
    let mut report = match &args.junit {
        Some(path) => Some(RunReport::create(path, "refine-text", label).map_err(CliError::Failed)?),
        None => None,
    };
    let outcome = async {
        let config = load_config(config, &backend)?;
        refine_text(&config, args, report.as_mut()).await.map(|()| Ending::Done)
    }
    .await;
    if let (Some(report), Err(e)) = (report, &outcome) {
        report.failed(e.message());
    }
    outcome
}

/// Whether `--input` names standard input.
fn is_stdin(input: &Path) -> bool {
    input.as_os_str() == "-"
}

/// The draft from `--input` (a file, or standard input for `-`); errors name the file.
pub fn read_draft(input: &Path) -> Result<String, String> {
    if is_stdin(input) {
        return draft_from(std::io::stdin().lock(), "standard input");
    }
    let file = std::fs::File::open(input).map_err(|e| format!("{}: {e}", input.display()))?;
    draft_from(file, &input.display().to_string())
}

/// A draft from a reader named `name` in errors: UTF-8, not blank, at most [`MAX_TEXT_BYTES`]. The
/// text is kept as it is (no trimming).
pub fn draft_from(reader: impl Read, name: &str) -> Result<String, String> {
    let mut bytes = Vec::new();
    reader.take(MAX_TEXT_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|e| format!("{name}: {e}"))?;
    if bytes.len() > MAX_TEXT_BYTES {
        return Err(format!(
            "{name}: more than {MAX_TEXT_BYTES} bytes; the limit of a draft is {MAX_TEXT_BYTES} bytes"
        ));
    }
    let text = String::from_utf8(bytes).map_err(|e| format!("{name}: not UTF-8 text ({e})"))?;
    if text.is_empty() {
        return Err(format!("{name}: empty; give the draft to refine"));
    }
    if text.trim().is_empty() {
        return Err(format!("{name}: only whitespace; give the draft to refine"));
    }
    Ok(text)
}

/// The request of a draft and the options.
pub fn build_request(draft: String, a: &RefineTextArgs) -> Result<rpb::SelfRefineRequest, String> {
    let instruction = a.instruction.clone().unwrap_or_default();
    if instruction.len() > MAX_TEXT_BYTES {
        return Err(format!("--instruction: {} bytes; the limit is {MAX_TEXT_BYTES} bytes", instruction.len()));
    }
    Ok(rpb::SelfRefineRequest {
        draft,
        instruction,
        max_passes: a.max_passes,
        min_bytes: a.min_bytes,
        convergence_mode: a.mode.map_or(rpb::ConvergenceMode::Unspecified, Convergence::proto) as i32,
        model: model_spec("--model", a.model.as_deref())?,
        embedding_model: model_spec("--embedding-model", a.embedding_model.as_deref())?,
        ..Default::default()
    })
}

/// `assay refine-text`: read the draft, start the run, follow it, print the result (and write
/// `report`, the `--junit` report).
pub async fn refine_text(
    config: &AssayConfig,
    args: RefineTextArgs,
    report: Option<&mut RunReport>,
) -> Result<(), CliError> {
    let draft = read_draft(&args.input).map_err(CliError::BadInput)?;
    let draft_bytes = draft.len();
    let request = build_request(draft, &args).map_err(CliError::BadInput)?;
    let label = args.label.clone().unwrap_or_else(|| {
        let input = if is_stdin(&args.input) { "stdin".to_string() } else { args.input.display().to_string() };
        format!("assay refine-text {input}")
    });
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::SelfRefine(gw::SelfRefinePipeline {
            request: Some(request),
        })),
        label,
        budget: args.budget.budget(),
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    let mut follower = Follower {
        gateway: args.gateway.clone().or_else(|| session.local_gateway()),
        draft_bytes,
        max_passes: args.max_passes.unwrap_or(DEFAULT_MAX_PASSES),
        run_id: String::new(),
    };
    let outcome = run_and_follow(&mut session.client, request, &mut follower).await;
    let printed = outcome.and_then(|(state, r)| {
        let summary = summary_line(&r, args.min_bytes.unwrap_or(DEFAULT_MIN_BYTES));
        eprintln!("{summary}");
        if let Some(report) = report {
            let properties = vec![
                ("run_id".to_string(), follower.run_id.clone()),
                ("state".to_string(), state_name(state)),
                ("input".to_string(), report.label.clone()),
                ("stop_reason".to_string(), stop_reason_name(r.stop_reason)),
                ("passes".to_string(), r.passes.len().to_string()),
                ("changed".to_string(), r.changed.to_string()),
            ];
            let case = junit::self_refine_case(&report.label, &r);
            report.finish(properties, summary, &[case]).map_err(CliError::Failed)?;
        }
        if args.json {
            let v = result_json(&follower.run_id, state, &r).map_err(CliError::Failed)?;
            outln!("{v}");
            Ok(())
        } else {
            write_text(&r.final_text)
        }
    });
    session.close().await?;
    printed
}

/// The final text on standard output, ending with a newline.
fn write_text(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    out.write_all(text.as_bytes())
        .and_then(|()| out.write_all(newline.as_bytes()))
        .and_then(|()| out.flush())
        .map_err(|e| CliError::Failed(format!("standard output: {e}")))
}

/// Follows one self-refine run ([`run_and_follow`]): prints its passes and returns the result.
struct Follower {
    /// The gateway's address: the one given, or the in-process mesh's.
    gateway: Option<String>,
    draft_bytes: usize,
    max_passes: u32,
    run_id: String,
}

/// The run's final state and its result.
type Finished = (i32, rpb::SelfRefineResponse);

impl RunFollower for Follower {
    type Ending = Finished;

    /// Print what the event says; done once the run completed.
    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Result<Finished, CliError>> {
        use gw::run_event::Event;
        if self.run_id.is_empty() {
            self.run_id = ev.run_id;
            let on = self.gateway.as_deref().map(|g| format!(" on {g}")).unwrap_or_default();
            eprintln!(
                "run {}{on}: self-refine of a {}-byte draft, at most {}",
                self.run_id,
                self.draft_bytes,
                plural(self.max_passes as usize, "pass")
            );
        }
        match ev.event {
            Some(Event::SelfRefinePass(p)) => eprintln!("{}", pass_line(&p)),
            Some(Event::StateChanged(s)) => eprintln!("{}", state_line(&s)),
            Some(Event::Completed(c)) => return Step::Done(self.completed(c.state, c.result)),
            // The kinds this verb leaves to `assay runs watch` (render::events words every kind).
            Some(_) | None => {}
        }
        Step::Continue
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Finished, CliError>> {
        is_final(run.state).then(|| self.completed(run.state, run.result))
    }
}

impl Follower {
    /// The run completed: its self-refine result, or why there is none.
    fn completed(&self, state: i32, result: Option<gw::RunResult>) -> Result<Finished, CliError> {
        finished_as::<pipelines::SelfRefine>(state, result, "self-refine result")
            .map(|r| (state, r))
            .map_err(|e| CliError::Failed(e.message(&self.run_id)))
    }
}

/// The result as `assay refine-text --json` prints it: the response in the proto3 JSON mapping
/// with the run's id and state.
pub fn result_json(run_id: &str, state: i32, r: &rpb::SelfRefineResponse) -> Result<Value, String> {
    run_output(run_id, state, r)
}

#[cfg(test)]
mod tests {
    use assay_proto::common::v1 as common;
    use clap::Parser;

    use super::*;

    #[test]
    fn a_draft_is_read_as_it_is() {
        let draft = "A draft.\n\nWith two paragraphs.\n";
        assert_eq!(draft_from(draft.as_bytes(), "draft.txt").unwrap(), draft);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("draft.txt");
        std::fs::write(&path, draft).unwrap();
        assert_eq!(read_draft(&path).unwrap(), draft);
    }

    #[test]
    fn bad_drafts_are_refused_naming_the_file() {
        assert_eq!(draft_from(&b""[..], "draft.txt").unwrap_err(), "draft.txt: empty; give the draft to refine");
        assert_eq!(
            draft_from(&b" \n\t\n"[..], "standard input").unwrap_err(),
            "standard input: only whitespace; give the draft to refine"
        );
        assert!(draft_from(&b"caf\xe9"[..], "draft.txt").unwrap_err().starts_with("draft.txt: not UTF-8 text"));
        let big = "x".repeat(MAX_TEXT_BYTES + 1);
        assert!(draft_from(big.as_bytes(), "big.txt").unwrap_err().starts_with("big.txt: more than 262144 bytes"));
        assert!(draft_from("x".repeat(MAX_TEXT_BYTES).as_bytes(), "ok.txt").is_ok());
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.txt");
        assert!(read_draft(&missing).unwrap_err().starts_with(&format!("{}: ", missing.display())));
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "").unwrap();
        assert_eq!(read_draft(&empty).unwrap_err(), format!("{}: empty; give the draft to refine", empty.display()));
        // A directory opens but does not read.
        assert!(read_draft(dir.path()).unwrap_err().starts_with(&dir.path().display().to_string()));
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RefineTextArgs,
    }

    fn args(extra: &[&str]) -> Result<RefineTextArgs, clap::Error> {
        Cli::try_parse_from([&["refine-text", "--input", "draft.txt"], extra].concat()).map(|c| c.args)
    }

    #[test]
    fn options_become_the_request() {
        let r = build_request("draft".into(), &args(&[]).unwrap()).unwrap();
        assert_eq!((r.max_passes, r.min_bytes, r.model, r.embedding_model), (None, None, None, None));
        assert_eq!(r.convergence_mode, rpb::ConvergenceMode::Unspecified as i32);
        let a = args(&[
            "--instruction",
            "Explain it to beginners",
            "--max-passes",
            "2",
            "--min-bytes",
            "0",
            "--mode",
            "strict",
            "--model",
            "big@openai",
            "--embedding-model",
            "@local",
        ])
        .unwrap();
        let r = build_request("draft".into(), &a).unwrap();
        assert_eq!((r.instruction.as_str(), r.max_passes, r.min_bytes), ("Explain it to beginners", Some(2), Some(0)));
        assert_eq!(r.convergence_mode, rpb::ConvergenceMode::Strict as i32);
        let m = r.model.unwrap();
        assert_eq!((m.model.as_str(), m.backend.as_str()), ("big", "openai"));
        let e = r.embedding_model.unwrap();
        assert_eq!((e.model.as_str(), e.backend.as_str()), ("", "local"));
        assert!(build_request("d".into(), &args(&["--model", "@"]).unwrap()).unwrap_err().contains("--model"));
        assert!(args(&["--max-passes", "6"]).is_err());
        assert!(args(&["--max-passes", "0"]).is_err());
        assert!(args(&["--mode", "lenient"]).is_err());
        assert!(Cli::try_parse_from(["refine-text"]).is_err());
    }

    #[test]
    fn the_json_is_the_response_in_the_proto_mapping() {
        let r = rpb::SelfRefineResponse {
            final_text: "Better text.".into(),
            passes: vec![rpb::SelfRefinePass { pass: 1, revised: "Better text.".into(), ..Default::default() }],
            converged: true,
            usage: Some(common::Usage { calls: 1, prompt_tokens: 300, completion_tokens: 120, ..Default::default() }),
            stop_reason: rpb::SelfRefineStopReason::Converged as i32,
            changed: true,
            degraded_from: "embedding".into(),
            ..Default::default()
        };
        let v = result_json("run-1", gw::RunState::Succeeded as i32, &r).unwrap();
        assert_eq!(v["finalText"], "Better text.");
        assert_eq!((v["runId"].as_str(), v["state"].as_str()), (Some("run-1"), Some("RUN_STATE_SUCCEEDED")));
        assert_eq!(v["stopReason"], "SELF_REFINE_STOP_REASON_CONVERGED");
        assert_eq!(v["passes"][0]["revised"], "Better text.");
        assert_eq!(v["usage"]["promptTokens"], "300");
        assert_eq!(v["degradedFrom"], "embedding");
    }
}
