//! `assay refine-text`: critique and revise one text through the gateway (`RunPipeline` with a
//! `self_refine` pipeline). Live progress goes to standard error, one line per pass; the final text
//! goes to standard output (only the text, so it can be piped), or with `--json` the whole result.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use assay_config::AssayConfig;
use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::self_refine::{DEFAULT_MAX_PASSES, DEFAULT_MIN_BYTES};
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as rpb;
use serde_json::{Value, json};

use super::Session;
use super::refine::{RefineError, model_spec, state_line};
use super::runs::{RunFollower, Step, is_final, run_and_follow, state_name, stop_reason_name, usage_json};

/// Exit code of unusable input: the draft, an option, or a request the gateway rejected.
pub const EXIT_BAD_INPUT: u8 = 2;

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
}

/// The options of the self-refine hook on a pipeline's outputs (`assay refine`, `assay debate`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct HookArgs {
    /// Self-refine (critique and revise) every output once the pipeline is done; implied by the
    /// other --self-refine-* options.
    #[arg(long)]
    pub self_refine: bool,
    /// Critique/revise passes per output, 1 to 5 (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=5))]
    pub self_refine_passes: Option<u32>,
    /// Outputs shorter than this many bytes are kept as they are, no model call (default 200; 0
    /// refines every output).
    #[arg(long, value_name = "N")]
    pub self_refine_min_bytes: Option<u32>,
    /// An output to leave alone: a section or problem id, or a producer (original, human or model
    /// for sections no stage changed, a human edited or a model wrote; debate for every answer).
    /// Repeat it or separate ids with commas.
    #[arg(long, value_name = "ID", value_delimiter = ',')]
    pub self_refine_exclude: Vec<String>,
}

impl HookArgs {
    /// The hook, when any option turned it on.
    pub fn hook(&self) -> Option<rpb::SelfRefineHook> {
        let on = self.self_refine
            || self.self_refine_passes.is_some()
            || self.self_refine_min_bytes.is_some()
            || !self.self_refine_exclude.is_empty();
        let exclude =
            self.self_refine_exclude.iter().map(|e| e.trim()).filter(|e| !e.is_empty()).map(String::from).collect();
        on.then(|| rpb::SelfRefineHook {
            max_passes: self.self_refine_passes,
            min_bytes: self.self_refine_min_bytes,
            exclude,
            ..Default::default()
        })
    }
}

/// The process exit of `assay refine-text`, printing the error if any: 0 done, 1 the run failed, 2
/// bad input.
pub fn exit(outcome: Result<(), RefineError>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(RefineError::BadInput(e)) => {
            eprintln!("assay: {e}");
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Err(RefineError::Failed(e)) => {
            eprintln!("assay: {e}");
            ExitCode::FAILURE
        }
    }
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

/// `assay refine-text`: read the draft, start the run, follow it, print the result.
pub async fn refine_text(config: &AssayConfig, args: RefineTextArgs) -> Result<(), RefineError> {
    let draft = read_draft(&args.input).map_err(RefineError::BadInput)?;
    let draft_bytes = draft.len();
    let request = build_request(draft, &args).map_err(RefineError::BadInput)?;
    let label = args.label.clone().unwrap_or_else(|| {
        let input = if is_stdin(&args.input) { "stdin".to_string() } else { args.input.display().to_string() };
        format!("assay refine-text {input}")
    });
    let request = gw::RunPipelineRequest {
        pipeline: Some(gw::run_pipeline_request::Pipeline::SelfRefine(gw::SelfRefinePipeline {
            request: Some(request),
        })),
        label,
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await.map_err(RefineError::Failed)?;
    let mut follower = Follower {
        gateway: args.gateway.clone().or_else(|| session.local_gateway()),
        draft_bytes,
        max_passes: args.max_passes.unwrap_or(DEFAULT_MAX_PASSES),
        run_id: String::new(),
    };
    let outcome = run_and_follow(&mut session.client, request, &mut follower).await;
    let printed = outcome.and_then(|(state, r)| {
        eprintln!("{}", summary_line(&r, args.min_bytes.unwrap_or(DEFAULT_MIN_BYTES)));
        if args.json {
            println!("{}", result_json(&follower.run_id, state, &r));
            Ok(())
        } else {
            write_text(&r.final_text)
        }
    });
    session.close().await.map_err(RefineError::Failed)?;
    printed
}

/// The final text on standard output, ending with a newline.
fn write_text(text: &str) -> Result<(), RefineError> {
    let mut out = std::io::stdout().lock();
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    out.write_all(text.as_bytes())
        .and_then(|()| out.write_all(newline.as_bytes()))
        .and_then(|()| out.flush())
        .map_err(|e| RefineError::Failed(format!("standard output: {e}")))
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
    type Error = RefineError;

    /// Print what the event says; done once the run completed.
    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Result<Finished, RefineError>> {
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
            Some(
                Event::Started(_)
                | Event::Progress(_)
                | Event::ChecklistReady(_)
                | Event::RecordScored(_)
                | Event::Aggregate(_)
                | Event::Refinement(_)
                | Event::DebateStage(_)
                | Event::DebateProblemDone(_)
                | Event::SelfRefined(_),
            )
            | None => {}
        }
        Step::Continue
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Finished, RefineError>> {
        is_final(run.state).then(|| self.completed(run.state, run.result))
    }
}

impl Follower {
    /// The run completed: its self-refine result, or why there is none.
    fn completed(&self, state: i32, result: Option<gw::RunResult>) -> Result<Finished, RefineError> {
        let id = &self.run_id;
        let result = result.unwrap_or_default();
        match gw::RunState::try_from(state) {
            Ok(gw::RunState::Failed) => {
                let why = if result.error.is_empty() { "no reason given" } else { result.error.as_str() };
                Err(RefineError::Failed(format!("run {id} failed: {why}")))
            }
            Ok(gw::RunState::Cancelled) => Err(RefineError::Failed(format!("run {id} was cancelled"))),
            Ok(gw::RunState::Succeeded | gw::RunState::Partial) => match result.result {
                Some(gw::run_result::Result::SelfRefine(r)) => Ok((state, r)),
                Some(
                    gw::run_result::Result::ChecklistEval(_)
                    | gw::run_result::Result::Checklist(_)
                    | gw::run_result::Result::TargetedRefinement(_)
                    | gw::run_result::Result::Debate(_),
                )
                | None => Err(RefineError::Failed(format!("run {id} returned no self-refine result"))),
            },
            Ok(
                gw::RunState::Unspecified
                | gw::RunState::Pending
                | gw::RunState::Running
                | gw::RunState::Paused
                | gw::RunState::AwaitingHuman,
            )
            | Err(_) => Err(RefineError::Failed(format!("run {id} completed in state {}", state_name(state)))),
        }
    }
}

/// `1 pass`, `2 passes`.
fn plural(n: usize, one: &str) -> String {
    let many = if one.ends_with('s') || one.ends_with("ch") { "es" } else { "s" };
    if n == 1 { format!("{n} {one}") } else { format!("{n} {one}{many}") }
}

/// The critique of a pass in a few words.
fn critique_words(critique: &[String]) -> String {
    match critique {
        [] => "no critique".into(),
        [only] if only.trim().eq_ignore_ascii_case("no material issues") => "no material issues".into(),
        list => plural(list.len(), "critique point"),
    }
}

/// The figure the cascade decided by, with its name; None when no comparison was made.
fn decided_similarity(p: &rpb::SelfRefinePass) -> Option<String> {
    let value = match p.decided_by.as_str() {
        "" => return None,
        "jaccard" => p.jaccard,
        "embedding" => p.cosine,
        _ => Some(p.char_similarity),
    };
    Some(match value {
        Some(v) => format!("similarity {v:.2} ({})", p.decided_by),
        None => format!("decided by {}", p.decided_by),
    })
}

/// The progress line of one pass, as `assay refine-text` prints it on standard error.
pub fn pass_line(p: &rpb::SelfRefinePass) -> String {
    let mut parts = vec![critique_words(&p.critique)];
    if let Some(s) = decided_similarity(p) {
        parts.push(s);
    }
    if let Some(s) = p.similarity_to_original {
        let measure =
            if p.similarity_measure.is_empty() { String::new() } else { format!(" ({})", p.similarity_measure) };
        let mut guard = format!("{s:.2} to the original{measure}");
        if p.rolled_back
            && let Some(t) = p.rollback_threshold
        {
            guard.push_str(&format!(" < {t:.2}"));
        }
        parts.push(guard);
    }
    if !p.degraded_from.is_empty() {
        let why = if p.degraded_reason.is_empty() { String::new() } else { format!(": {}", p.degraded_reason) };
        parts.push(format!("degraded from {}{why}", p.degraded_from));
    }
    if p.revised_block_missing {
        parts.push("no <revised> block".into());
    }
    let verdict = if !p.error.is_empty() {
        format!("error: {}; kept the previous draft", p.error)
    } else if p.rolled_back {
        "rolled back; kept the previous draft".to_string()
    } else if p.converged {
        "converged".to_string()
    } else if p.diverged {
        "revised (diverged)".to_string()
    } else {
        "revised".to_string()
    };
    parts.push(verdict);
    format!("pass {}: {}", p.pass, parts.join("; "))
}

/// The progress line of one output through the self-refine hook, as `assay refine` and `assay
/// debate` print it on standard error.
pub fn self_refined_line(e: &gw::SelfRefined) -> String {
    let what = format!("self-refine {} ({})", e.target, e.producer);
    if !e.skipped.is_empty() {
        return format!("{what}: skipped: {}", e.skipped);
    }
    if !e.error.is_empty() {
        return format!("{what}: error: {}; kept the text", e.error);
    }
    let r = e.refine.clone().unwrap_or_default();
    if r.skipped_too_short {
        return format!("{what}: skipped: too_short");
    }
    format!(
        "{what}: {} after {}, text {}",
        stop_reason_name(r.stop_reason),
        plural(r.passes.len(), "pass"),
        if e.before == e.after { "unchanged" } else { "changed" }
    )
}

/// How the run ended, one line on standard error.
pub fn summary_line(r: &rpb::SelfRefineResponse, min_bytes: u32) -> String {
    if r.skipped_too_short {
        return format!(
            "done: the draft is shorter than {min_bytes} bytes (--min-bytes): returned unchanged, no model call"
        );
    }
    let u = r.usage.unwrap_or_default();
    let mut line = format!(
        "done: {} after {}, text {}, {} ({} tokens)",
        stop_reason_name(r.stop_reason),
        plural(r.passes.len(), "pass"),
        if r.changed { "changed" } else { "unchanged" },
        plural(u.calls as usize, "call"),
        u.prompt_tokens + u.completion_tokens
    );
    if !r.degraded_from.is_empty() {
        line.push_str(&format!("; decided without {} (degraded)", r.degraded_from));
    }
    line
}

/// One pass as JSON: the critique and every figure (the revision's size, not its text).
pub fn pass_json(p: &rpb::SelfRefinePass) -> Value {
    json!({
        "pass": p.pass, "critique": p.critique, "revised_bytes": p.revised.len(),
        "char_similarity": p.char_similarity, "jaccard": p.jaccard, "jaccard_confidence": p.jaccard_confidence,
        "cosine": p.cosine, "decided_by": p.decided_by, "converged": p.converged, "diverged": p.diverged,
        "rolled_back": p.rolled_back, "similarity_to_original": p.similarity_to_original,
        "similarity_measure": p.similarity_measure, "rollback_threshold": p.rollback_threshold,
        "degraded_from": p.degraded_from, "degraded_reason": p.degraded_reason,
        "similarity_degraded_reason": p.similarity_degraded_reason, "embedding_cached": p.embedding_cached,
        "revised_block_missing": p.revised_block_missing, "error": p.error, "usage": usage_json(p.usage.as_ref()),
    })
}

/// A self-refine result as JSON, without the final text (see [`result_json`]).
pub fn self_refine_result_json(r: &rpb::SelfRefineResponse) -> Value {
    let model = r
        .model
        .as_ref()
        .map(|m| json!({"phase": m.phase, "backend": m.backend, "model": m.model, "temperature": m.temperature}));
    json!({
        "stop_reason": stop_reason_name(r.stop_reason), "converged": r.converged, "rolled_back": r.rolled_back,
        "changed": r.changed, "skipped_too_short": r.skipped_too_short, "degraded_from": r.degraded_from,
        "passes": r.passes.iter().map(pass_json).collect::<Vec<_>>(), "usage": usage_json(r.usage.as_ref()),
        "model": model,
    })
}

/// The result as `assay refine-text --json` prints it.
pub fn result_json(run_id: &str, state: i32, r: &rpb::SelfRefineResponse) -> Value {
    let mut v = self_refine_result_json(r);
    v["run_id"] = json!(run_id);
    v["state"] = json!(state_name(state));
    v["final_text"] = json!(r.final_text);
    v
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
    fn pass_lines_speak_human() {
        let revised = rpb::SelfRefinePass {
            pass: 1,
            critique: vec!["Too vague".into(), "No example".into(), "Jargon".into()],
            revised: "New text".into(),
            char_similarity: 0.71,
            jaccard: Some(0.62),
            decided_by: "jaccard".into(),
            ..Default::default()
        };
        assert_eq!(pass_line(&revised), "pass 1: 3 critique points; similarity 0.62 (jaccard); revised");
        let converged = rpb::SelfRefinePass {
            pass: 2,
            critique: vec!["No material issues".into()],
            char_similarity: 0.994,
            decided_by: "char".into(),
            converged: true,
            similarity_to_original: Some(0.93),
            similarity_measure: "embedding".into(),
            rollback_threshold: Some(0.8),
            ..Default::default()
        };
        assert_eq!(
            pass_line(&converged),
            "pass 2: no material issues; similarity 0.99 (char); 0.93 to the original (embedding); converged"
        );
        let rolled = rpb::SelfRefinePass {
            pass: 2,
            critique: vec!["Rewrite all".into()],
            char_similarity: 0.2,
            decided_by: "char".into(),
            diverged: true,
            rolled_back: true,
            similarity_to_original: Some(0.41),
            similarity_measure: "jaccard".into(),
            rollback_threshold: Some(0.74),
            degraded_from: "embedding".into(),
            degraded_reason: "breaker open".into(),
            ..Default::default()
        };
        assert_eq!(
            pass_line(&rolled),
            "pass 2: 1 critique point; similarity 0.20 (char); 0.41 to the original (jaccard) < 0.74; degraded from \
             embedding: breaker open; rolled back; kept the previous draft"
        );
        let failed = rpb::SelfRefinePass {
            pass: 1,
            error: "reply cut at the token limit".into(),
            revised_block_missing: true,
            ..Default::default()
        };
        assert_eq!(
            pass_line(&failed),
            "pass 1: no critique; no <revised> block; error: reply cut at the token limit; kept the previous draft"
        );
        let diverged = rpb::SelfRefinePass {
            pass: 1,
            critique: vec!["a".into(), "b".into()],
            cosine: Some(0.5),
            decided_by: "embedding".into(),
            diverged: true,
            ..Default::default()
        };
        assert_eq!(pass_line(&diverged), "pass 1: 2 critique points; similarity 0.50 (embedding); revised (diverged)");
    }

    #[test]
    fn self_refined_lines_say_what_the_hook_did() {
        let entry = |skipped: &str, error: &str, refine: Option<rpb::SelfRefineResponse>| gw::SelfRefined {
            target: "stages".into(),
            producer: "model".into(),
            skipped: skipped.into(),
            before: "Old.".into(),
            after: if refine.is_some() { "New." } else { "Old." }.into(),
            refine,
            error: error.into(),
        };
        let refined = rpb::SelfRefineResponse {
            passes: vec![rpb::SelfRefinePass::default(), rpb::SelfRefinePass::default()],
            stop_reason: rpb::SelfRefineStopReason::Converged as i32,
            changed: true,
            ..Default::default()
        };
        assert_eq!(
            self_refined_line(&entry("", "", Some(refined))),
            "self-refine stages (model): converged after 2 passes, text changed"
        );
        assert_eq!(self_refined_line(&entry("excluded", "", None)), "self-refine stages (model): skipped: excluded");
        assert_eq!(
            self_refined_line(&entry("", "refiner unavailable", None)),
            "self-refine stages (model): error: refiner unavailable; kept the text"
        );
    }

    #[test]
    fn the_summary_and_the_json_tell_how_it_ended() {
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
        assert_eq!(
            summary_line(&r, 200),
            "done: converged after 1 pass, text changed, 1 call (420 tokens); decided without embedding (degraded)"
        );
        let skipped = rpb::SelfRefineResponse {
            skipped_too_short: true,
            stop_reason: rpb::SelfRefineStopReason::TooShort as i32,
            ..Default::default()
        };
        assert!(summary_line(&skipped, 200).contains("shorter than 200 bytes"));
        let v = result_json("run-1", gw::RunState::Succeeded as i32, &r);
        assert_eq!(v["final_text"], "Better text.");
        assert_eq!((v["run_id"].as_str(), v["state"].as_str()), (Some("run-1"), Some("succeeded")));
        assert_eq!(v["stop_reason"], "converged");
        assert_eq!(v["passes"][0]["revised_bytes"], 12);
        assert_eq!(v["usage"]["prompt_tokens"], 300);
        assert_eq!(v["degraded_from"], "embedding");
        assert!(self_refine_result_json(&r).get("final_text").is_none());
    }
}
