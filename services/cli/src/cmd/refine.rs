//! `assay refine`: judge-targeted refinement of a sectioned document through the gateway
//! (`RunPipeline` with a `targeted_refinement` pipeline). Live progress goes to standard error, one
//! line per refinement event; the final document and how the run ended go to standard output as
//! JSON.

use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_domain::document::MAX_JUDGES;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines;
use assay_proto::scorer::v1 as scorer;
use serde_json::{Map, Value};

use super::common::{BackendArgs, BudgetArgs, load_config};
use super::error::{CliError, Outcome};
use super::follow::{NoResult, RunFollower, Step, finished_as, is_final, run_and_follow};
use super::input::{HookArgs, model_spec};
use super::render::json::{envelope, run_output, to_json};
use super::render::junit::{self, RunReport, Verdict};
use super::render::self_refine::self_refined_line;
use super::render::targeted_refinement::progress_line;
use super::render::{mode_name, outcome_name, quality_name, stage_progress_line, state_line, state_name};
use super::session::Session;

/// Refinement mode.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Accept automatically at the quality thresholds, else return the best iteration.
    FullAuto,
    /// Accept at higher thresholds, else wait for a human.
    SemiAuto,
}

impl Mode {
    fn proto(self) -> gw::RefinementMode {
        match self {
            Mode::FullAuto => gw::RefinementMode::FullAuto,
            Mode::SemiAuto => gw::RefinementMode::SemiAuto,
        }
    }
}

/// Options of `assay refine`.
#[derive(clap::Args, Clone)]
pub struct RefineArgs {
    /// The document (JSON): {"brief": {"objectives": [...], "audience", "language", "description"},
    /// "sections": [{"id", "title", "content"}, ...]}; the brief and titles are optional.
    #[arg(long)]
    pub doc: PathBuf,
    /// full-auto: accept at the quality thresholds, else return the best iteration; semi-auto:
    /// higher thresholds, else escalate to a human.
    #[arg(long, value_enum, default_value_t = Mode::FullAuto)]
    pub mode: Mode,
    /// Rounds of edits, 1 to 10 (default 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub max_iterations: Option<u32>,
    /// Tokens of the refinement after the first assessment, 1000 to 10000000 (default: the larger
    /// of 15000 and 5 per document token).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1_000..=10_000_000))]
    pub token_budget: Option<u64>,
    /// Seconds of work, pauses and waits for a human excluded, 1 to 86400 (default 300).
    #[arg(long, value_parser = clap::value_parser!(u32).range(10..=86_400))]
    pub time_budget_seconds: Option<u32>,
    /// Patchers at once within a batch, 1 to 3 (default 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3))]
    pub max_parallel_patchers: Option<u32>,
    /// A criterion a section scored at least this on is locked: no edit may lower it by more than
    /// 0.05 (default 0.85).
    #[arg(long)]
    pub lock_threshold: Option<f64>,
    /// Judges on the judge model at temperatures spread over 0.0 to 0.6, 1 to 9 (default: the
    /// gateway's panel, three judges at 0.0, 0.3 and 0.6).
    #[arg(long)]
    pub judges: Option<u32>,
    /// Judge model, MODEL or MODEL@BACKEND (default: the stage_6_judge phase).
    #[arg(long)]
    pub judge_model: Option<String>,
    /// Patcher model, MODEL or MODEL@BACKEND (default: the stage_6_patcher phase).
    #[arg(long)]
    pub patcher_model: Option<String>,
    /// Section regeneration model, MODEL or MODEL@BACKEND (default: stage_6_section_expander).
    #[arg(long)]
    pub expander_model: Option<String>,
    /// Verification model, MODEL or MODEL@BACKEND (default: stage_6_delta_judge).
    #[arg(long)]
    pub delta_judge_model: Option<String>,
    /// Planning model, MODEL or MODEL@BACKEND (default: stage_6_arbiter).
    #[arg(long)]
    pub arbiter_model: Option<String>,
    /// Gateway address (e.g. http://127.0.0.1:50051); absent = start the mesh in this process.
    #[arg(long)]
    pub gateway: Option<String>,
    /// The run's label (default "assay refine <doc>").
    #[arg(long)]
    pub label: Option<String>,
    /// On escalation keep following the run until a human edits and resumes, accepts or reviews it
    /// (default: exit with code 4 and leave the run waiting).
    #[arg(long)]
    pub wait: bool,
    /// Print the run id and leave the run going on the gateway (needs --gateway).
    #[arg(long, requires = "gateway", conflicts_with = "wait")]
    pub detach: bool,
    /// Also write the result as a JUnit XML report to FILE, for CI systems: a test case per issue
    /// the judges raised (class assay.refine.SECTION), failed when it is unresolved at the end,
    /// and one for the run, failed when it ended best effort (in error while it waits for a
    /// human). Written whole (a temporary file renamed over FILE); a run that fails leaves a
    /// report of one test case in error. The exit code is the same with or without it.
    #[arg(long, value_name = "FILE", conflicts_with = "detach")]
    pub junit: Option<PathBuf>,
    /// Self-refine the final document's sections.
    #[command(flatten)]
    pub hook: HookArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// How `assay refine` ended when it did not fail.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// Accepted (at a threshold, with a warning, by a human, or reviewed): exit 0.
    Accepted,
    /// The best iteration, below the thresholds: exit 3.
    BestEffort,
    /// Escalated; the run waits for a human on the gateway: exit 4.
    AwaitingHuman,
    /// `--detach`: the run goes on without us: exit 0.
    Detached,
}

impl From<Ending> for super::error::Ending {
    fn from(e: Ending) -> Self {
        match e {
            Ending::Accepted | Ending::Detached => Self::Done,
            Ending::BestEffort => Self::BestEffort,
            Ending::AwaitingHuman => Self::AwaitingHuman,
        }
    }
}

/// `assay refine` with the configuration at `config` (`--config`): 0 accepted or detached, 3 best
/// effort, 4 waiting for a human, 1 the run failed or was cancelled, 2 bad input.
pub async fn run(config: Option<&Path>, args: RefineArgs) -> Outcome {
    let mut report = match &args.junit {
        Some(path) => {
            Some(RunReport::create(path, "refine", args.doc.display().to_string()).map_err(CliError::Failed)?)
        }
        None => None,
    };
    let outcome = async {
        let config = load_config(config, &args.backend)?;
        refine(&config, args, &mut report).await.map(Into::into)
    }
    .await;
    if let (Some(report), Err(e)) = (report, &outcome) {
        report.failed(e.message());
    }
    outcome
}

/// A sectioned document read from a file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Doc {
    pub brief: Option<common::Brief>,
    pub sections: Vec<common::Section>,
}

/// Read a document file (see [`doc_from_json`]); errors name the file and the field.
pub fn read_doc(path: &Path) -> Result<Doc, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    doc_from_json(&v).map_err(|e| format!("{}: {e}", path.display()))
}

/// A document from JSON: `{"brief": {...}, "sections": [{"id", "title", "content"}, ...]}`. The
/// brief and the titles are optional; every section needs a non-empty id and content; a section's
/// index is its position. Duplicate ids and size limits are left to the gateway.
pub fn doc_from_json(v: &Value) -> Result<Doc, String> {
    let o = v.as_object().ok_or("the document must be a JSON object with \"sections\"")?;
    known_fields(o, "", &["brief", "sections"])?;
    let brief = match o.get("brief") {
        None | Some(Value::Null) => None,
        Some(b) => Some(brief_from_json(b)?),
    };
    let list = match o.get("sections") {
        None | Some(Value::Null) => return Err("sections is required".into()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err("sections must be a list of sections".into()),
    };
    if list.is_empty() {
        return Err("sections must not be empty".into());
    }
    let sections = list.iter().enumerate().map(|(i, s)| section_from_json(i, s)).collect::<Result<_, _>>()?;
    Ok(Doc { brief, sections })
}

fn known_fields(o: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), String> {
    match o.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => {
            let place = if at.is_empty() { String::new() } else { format!("{at}: ") };
            Err(format!("{place}unknown field {k:?} (known: {})", known.join(", ")))
        }
        None => Ok(()),
    }
}

/// An optional string field; `null` is absent.
fn text(o: &Map<String, Value>, field: &str, at: &str) -> Result<Option<String>, String> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{at}.{field} must be a string")),
    }
}

/// A required string field that must not be blank.
fn required_text(o: &Map<String, Value>, field: &str, at: &str) -> Result<String, String> {
    let s = text(o, field, at)?.ok_or_else(|| format!("{at}.{field} is required"))?;
    if s.trim().is_empty() {
        return Err(format!("{at}.{field} must not be empty"));
    }
    Ok(s)
}

fn section_from_json(i: usize, v: &Value) -> Result<common::Section, String> {
    let at = format!("sections[{i}]");
    let o = v.as_object().ok_or_else(|| format!("{at} must be an object with \"id\" and \"content\""))?;
    known_fields(o, &at, &["id", "title", "content"])?;
    Ok(common::Section {
        id: required_text(o, "id", &at)?,
        index: u32::try_from(i).map_err(|_| format!("{at}: too many sections"))?,
        title: text(o, "title", &at)?.unwrap_or_default(),
        content: required_text(o, "content", &at)?,
    })
}

fn brief_from_json(v: &Value) -> Result<common::Brief, String> {
    let o = v.as_object().ok_or("brief must be an object")?;
    known_fields(o, "brief", &["objectives", "audience", "language", "description"])?;
    let objectives = match o.get("objectives") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().map(str::to_string).ok_or_else(|| format!("brief.objectives[{i}] must be a string"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("brief.objectives must be a list of strings".into()),
    };
    Ok(common::Brief {
        objectives,
        audience: text(o, "audience", "brief")?.unwrap_or_default(),
        language: text(o, "language", "brief")?.unwrap_or_default(),
        description: text(o, "description", "brief")?.unwrap_or_default(),
    })
}

/// `count` judges (default 3 when only a model is given) at temperatures spread evenly over 0.0 to
/// 0.6; empty (the gateway's default panel) when neither is given. Ids are left to the gateway.
pub fn judge_panel(count: Option<u32>, model: Option<common::ModelSpec>) -> Result<Vec<scorer::PanelJudge>, String> {
    let n = match (count, &model) {
        (None, None) => return Ok(Vec::new()),
        (None, Some(_)) => 3,
        (Some(n), _) => n,
    };
    if n == 0 || n as usize > MAX_JUDGES {
        return Err(format!("--judges {n}: give 1 to {MAX_JUDGES} judges"));
    }
    let base = model.unwrap_or_default();
    Ok((0..n)
        .map(|i| {
            let t = if n == 1 { 0.0 } else { 0.6 * f64::from(i) / f64::from(n - 1) };
            let spec = common::ModelSpec { temperature: Some((t * 100.0).round() / 100.0), ..base.clone() };
            scorer::PanelJudge { id: String::new(), model: Some(spec) }
        })
        .collect())
}

/// The pipeline of a document and the options.
pub fn build_pipeline(doc: Doc, a: &RefineArgs) -> Result<gw::TargetedRefinementPipeline, String> {
    if let Some(t) = a.lock_threshold
        && !(0.0..=1.0).contains(&t)
    {
        return Err(format!("--lock-threshold {t}: must be in [0, 1]"));
    }
    Ok(gw::TargetedRefinementPipeline {
        sections: doc.sections,
        brief: doc.brief,
        judges: judge_panel(a.judges, model_spec("--judge-model", a.judge_model.as_deref())?)?,
        mode: a.mode.proto() as i32,
        max_iterations: a.max_iterations,
        token_budget: a.token_budget,
        time_budget_seconds: a.time_budget_seconds,
        patcher_model: model_spec("--patcher-model", a.patcher_model.as_deref())?,
        expander_model: model_spec("--expander-model", a.expander_model.as_deref())?,
        delta_judge_model: model_spec("--delta-judge-model", a.delta_judge_model.as_deref())?,
        arbiter_model: model_spec("--arbiter-model", a.arbiter_model.as_deref())?,
        max_parallel_patchers: a.max_parallel_patchers,
        lock_threshold: a.lock_threshold,
        self_refine: a.hook.hook(),
        ..Default::default()
    })
}

/// `assay refine`: read the document, start the run, follow it to its end (or to a human);
/// `report`, the `--junit` report, written when the run completes or waits for a human.
pub async fn refine(
    config: &AssayConfig,
    args: RefineArgs,
    report: &mut Option<RunReport>,
) -> Result<Ending, CliError> {
    let doc = read_doc(&args.doc).map_err(CliError::BadInput)?;
    let sections = doc.sections.len();
    let pipeline = build_pipeline(doc, &args).map_err(CliError::BadInput)?;
    let label = args.label.clone().unwrap_or_else(|| format!("assay refine {}", args.doc.display()));
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)),
        label,
        budget: args.budget.budget(),
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    let gateway = args.gateway.clone().or_else(|| session.local_gateway());
    let mut follower = Follower {
        wait: args.wait,
        detach: args.detach,
        gateway,
        remote: args.gateway.is_some(),
        sections,
        mode: args.mode,
        run_id: String::new(),
        escalation: None,
        events: Vec::new(),
        report: report.take(),
    };
    let outcome = run_and_follow(&mut session.client, request, &mut follower).await;
    *report = follower.report.take();
    if outcome == Ok(Ending::AwaitingHuman) && args.gateway.is_none() {
        eprintln!(
            "note: the mesh of this command stops now; the run stays in the gateway's store (unless it is \
             :memory:) and waits again under `assay up` with the same configuration (pass --gateway to use \
             a running mesh, or --wait)"
        );
    }
    session.close().await?;
    outcome
}

/// Follows one refinement run ([`run_and_follow`]): prints its progress and reports how the run
/// ended.
struct Follower {
    wait: bool,
    detach: bool,
    /// The gateway's address: the one given, or the in-process mesh's.
    gateway: Option<String>,
    /// The gateway was given (it outlives this command).
    remote: bool,
    sections: usize,
    mode: Mode,
    run_id: String,
    escalation: Option<gw::EscalationTriggered>,
    /// The refinement's events, with `--junit` (the issues raised and the edits tried).
    events: Vec<gw::RefinementEvent>,
    /// `--junit`.
    report: Option<RunReport>,
}

impl RunFollower for Follower {
    type Ending = Ending;

    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Result<Ending, CliError>> {
        use gw::run_event::Event;
        if self.run_id.is_empty() {
            self.run_id = ev.run_id;
            let mode = mode_name(self.mode.proto() as i32);
            let on = self.gateway.as_deref().map(|g| format!(" on {g}")).unwrap_or_default();
            eprintln!("run {}{on}: targeted refinement of {} sections, {mode}", self.run_id, self.sections);
        }
        match ev.event {
            Some(Event::Started(_)) if self.detach => {
                outln!("{}", envelope(&self.run_id, gw::RunState::Running as i32, []));
                let flag = self.gateway.as_deref().map(|g| format!(" --gateway {g}")).unwrap_or_default();
                eprintln!("detached: follow it with `assay runs watch {}{flag}`", self.run_id);
                Step::Done(Ok(Ending::Detached))
            }
            Some(Event::Refinement(r)) => {
                if let Some(gw::refinement_event::Event::EscalationTriggered(e)) = &r.event {
                    self.escalation = Some(e.clone());
                }
                if let Some(line) = progress_line(&self.run_id, &r) {
                    eprintln!("{line}");
                }
                if self.report.is_some() {
                    self.events.push(r);
                }
                Step::Continue
            }
            Some(Event::StateChanged(s)) => {
                eprintln!("{}", state_line(&s));
                if s.state == gw::RunState::AwaitingHuman as i32 && !self.wait {
                    Step::AwaitingHuman
                } else {
                    Step::Continue
                }
            }
            Some(Event::Progress(p)) => {
                if let Some(p) = p.progress.filter(|p| !p.message.is_empty() || p.total > 0) {
                    eprintln!("  {}", stage_progress_line(&p));
                }
                Step::Continue
            }
            Some(Event::SelfRefined(e)) => {
                eprintln!("{}", self_refined_line(&e));
                Step::Continue
            }
            Some(Event::Completed(c)) => Step::Done(self.completed(c.state, c.result)),
            // The kinds this verb leaves to `assay runs watch` (render::events words every kind).
            Some(_) | None => Step::Continue,
        }
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Ending, CliError>> {
        if is_final(run.state) {
            return Some(self.completed(run.state, run.result));
        }
        if run.state == gw::RunState::AwaitingHuman as i32 && !self.wait {
            return Some(self.awaiting_human(Some(&run)));
        }
        None
    }

    /// The run waits for a human: say how to act, print where it stands on standard output.
    fn awaiting_human(&mut self, run: Option<&gw::Run>) -> Result<Ending, CliError> {
        let id = &self.run_id;
        // The mesh of this command stops with it: the run waits again under `assay up`.
        let flag = if self.remote { self.gateway.as_deref().map(|g| format!(" --gateway {g}")) } else { None };
        let flag = flag.unwrap_or_default();
        eprintln!(
            "run {id} waits for a human: `assay runs edit {id} --section ID --file NEW.md{flag}` then \
             `assay runs resume {id}{flag}`, or `assay runs accept|review {id}{flag}`"
        );
        let v = awaiting_json(id, self.escalation.as_ref(), run).map_err(CliError::Failed)?;
        outln!("{v}");
        if let Some(report) = self.report.as_mut() {
            let case = junit::awaiting_human_case(&report.label, id, self.escalation.as_ref());
            let properties = vec![
                ("run_id".to_string(), id.clone()),
                ("state".to_string(), state_name(gw::RunState::AwaitingHuman as i32)),
                ("document".to_string(), report.label.clone()),
            ];
            report.finish(properties, String::new(), &[case]).map_err(CliError::Failed)?;
        }
        Ok(Ending::AwaitingHuman)
    }
}

impl Follower {
    /// The run completed: print the result, map the outcome.
    fn completed(&mut self, state: i32, result: Option<gw::RunResult>) -> Result<Ending, CliError> {
        let id = &self.run_id;
        let t = match finished_as::<pipelines::TargetedRefinement>(state, result, "refinement result") {
            Ok(t) => t,
            Err(e @ NoResult::Missing(_)) => return Err(CliError::Failed(e.message(id))),
            Err(e) => return Err(CliError::Failed(e.message(id))),
        };
        outln!("{}", result_json(id, state, &t).map_err(CliError::Failed)?);
        if !t.warning.is_empty() {
            eprintln!("warning: {}", t.warning);
        }
        if let Some(report) = self.report.as_mut() {
            write_junit(report, id, state, &t, &self.events).map_err(CliError::Failed)?;
        }
        ending_of(id, t.outcome)
    }
}

/// The `--junit` report of a finished refinement: a case per issue raised, then the run's.
fn write_junit(
    report: &mut RunReport,
    run_id: &str,
    state: i32,
    t: &gw::TargetedRefinementResult,
    events: &[gw::RefinementEvent],
) -> Result<(), String> {
    let cases = junit::refinement_cases(&report.label, t, events);
    let issues = cases.len().saturating_sub(1);
    let unresolved = cases.iter().filter(|c| matches!(c.verdict, Verdict::Failed { kind: "unresolved", .. })).count();
    let properties = vec![
        ("run_id".to_string(), run_id.to_string()),
        ("state".to_string(), state_name(state)),
        ("document".to_string(), report.label.clone()),
        ("outcome".to_string(), outcome_name(t.outcome)),
        ("quality".to_string(), quality_name(t.quality)),
        ("final_score".to_string(), format!("{:.4}", t.final_score)),
        ("iterations".to_string(), t.iterations.to_string()),
    ];
    let out = format!(
        "run {run_id}: {}, quality {}, final score {:.4} after {} iteration(s); {issues} issue(s) raised, {unresolved} unresolved",
        outcome_name(t.outcome),
        quality_name(t.quality),
        t.final_score,
        t.iterations
    );
    report.finish(properties, out, &cases).map(|_| ())
}

/// The exit of a refinement outcome.
fn ending_of(run_id: &str, outcome: i32) -> Result<Ending, CliError> {
    match gw::RefinementOutcome::try_from(outcome) {
        Ok(
            gw::RefinementOutcome::Accepted
            | gw::RefinementOutcome::AcceptedWithWarning
            | gw::RefinementOutcome::AcceptedManual
            | gw::RefinementOutcome::Reviewed,
        ) => Ok(Ending::Accepted),
        Ok(gw::RefinementOutcome::BestEffort) => Ok(Ending::BestEffort),
        Ok(gw::RefinementOutcome::Unspecified) | Err(_) => {
            Err(CliError::Failed(format!("run {run_id} ended without an outcome ({outcome})")))
        }
    }
}

/// The final result as `assay refine` prints it on standard output: the result (with the
/// document) in the proto3 JSON mapping, with the run's id and state.
pub fn result_json(run_id: &str, state: i32, t: &gw::TargetedRefinementResult) -> Result<Value, String> {
    run_output(run_id, state, t)
}

/// What `assay refine` prints on standard output when the run waits for a human: the escalation
/// and, when the gateway gave it, the progress with the document as it stands (`refinement`), in
/// the proto3 JSON mapping.
pub fn awaiting_json(
    run_id: &str,
    escalation: Option<&gw::EscalationTriggered>,
    run: Option<&gw::Run>,
) -> Result<Value, String> {
    let escalation = escalation.map(to_json).transpose()?.unwrap_or(Value::Null);
    let mut fields = vec![("escalation", escalation)];
    if let Some(gw::run::Progress::Refinement(p)) = run.and_then(|r| r.progress.as_ref()) {
        fields.push(("refinement", to_json(p)?));
    }
    Ok(envelope(run_id, gw::RunState::AwaitingHuman as i32, fields))
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use serde_json::json;

    use super::*;

    fn doc(v: Value) -> Result<Doc, String> {
        doc_from_json(&v)
    }

    #[test]
    fn a_good_document_keeps_its_order_brief_and_titles() {
        let d = doc(json!({
            "brief": {"objectives": ["Name the stages"], "audience": "beginners", "language": "en", "description": "A lesson"},
            "sections": [{"id": "intro", "title": "Intro", "content": "Funnels."}, {"id": "stages", "content": "Four stages."}]
        }))
        .unwrap();
        assert_eq!(d.sections.len(), 2);
        assert_eq!((d.sections[1].id.as_str(), d.sections[1].index, d.sections[1].title.as_str()), ("stages", 1, ""));
        let brief = d.brief.unwrap();
        assert_eq!(brief.objectives, ["Name the stages"]);
        assert_eq!((brief.audience.as_str(), brief.language.as_str()), ("beginners", "en"));
        // The brief is optional.
        assert_eq!(doc(json!({"sections": [{"id": "a", "content": "x"}]})).unwrap().brief, None);
    }

    #[test]
    fn document_errors_name_the_field() {
        let three = |last: Value| json!({"sections": [{"id": "a", "content": "x"}, {"id": "b", "content": "y"}, last]});
        assert_eq!(
            doc(three(json!({"id": "c", "content": " "}))).unwrap_err(),
            "sections[2].content must not be empty"
        );
        assert_eq!(doc(three(json!({"id": "c"}))).unwrap_err(), "sections[2].content is required");
        assert_eq!(doc(three(json!({"content": "z"}))).unwrap_err(), "sections[2].id is required");
        assert_eq!(doc(three(json!({"id": 3, "content": "z"}))).unwrap_err(), "sections[2].id must be a string");
        assert!(
            doc(three(json!({"id": "c", "contents": "z"})))
                .unwrap_err()
                .contains("sections[2]: unknown field \"contents\"")
        );
        assert!(doc(three(json!("text"))).unwrap_err().starts_with("sections[2] must be an object"));
        assert_eq!(doc(json!({"sections": []})).unwrap_err(), "sections must not be empty");
        assert_eq!(doc(json!({"brief": {}})).unwrap_err(), "sections is required");
        assert_eq!(
            doc(json!({"brief": {"objectives": [1]}, "sections": [{"id": "a", "content": "x"}]})).unwrap_err(),
            "brief.objectives[0] must be a string"
        );
        assert!(doc(json!([])).unwrap_err().contains("JSON object"));
        // Duplicate ids are the gateway's to refuse.
        assert_eq!(doc(three(json!({"id": "a", "content": "z"}))).unwrap().sections.len(), 3);
    }

    #[test]
    fn a_bad_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lesson.json");
        std::fs::write(&path, r#"{"sections": [{"id": "a", "content": ""}]}"#).unwrap();
        let e = read_doc(&path).unwrap_err();
        assert_eq!(e, format!("{}: sections[0].content must not be empty", path.display()));
        std::fs::write(&path, "{not json").unwrap();
        assert!(read_doc(&path).unwrap_err().contains("lesson.json: not JSON"));
        assert!(read_doc(&dir.path().join("missing.json")).unwrap_err().contains("missing.json"));
    }

    #[test]
    fn the_example_lesson_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lesson.json");
        if path.exists() {
            let d = read_doc(&path).unwrap();
            assert!(!d.sections.is_empty());
        }
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RefineArgs,
    }

    fn args(extra: &[&str]) -> RefineArgs {
        Cli::try_parse_from([&["refine", "--doc", "lesson.json"], extra].concat()).unwrap().args
    }

    #[test]
    fn options_become_the_pipeline() {
        let d = doc(json!({"sections": [{"id": "a", "content": "x"}]})).unwrap();
        let p = build_pipeline(d.clone(), &args(&[])).unwrap();
        assert_eq!(p.mode, gw::RefinementMode::FullAuto as i32);
        assert!(p.judges.is_empty());
        assert_eq!((p.max_iterations, p.patcher_model), (None, None));
        let a = args(&[
            "--mode",
            "semi-auto",
            "--judges",
            "4",
            "--judge-model",
            "big@openai",
            "--patcher-model",
            "small",
            "--max-iterations",
            "2",
        ]);
        let p = build_pipeline(d.clone(), &a).unwrap();
        assert_eq!(p.mode, gw::RefinementMode::SemiAuto as i32);
        assert_eq!(p.max_iterations, Some(2));
        let temps: Vec<Option<f64>> = p.judges.iter().map(|j| j.model.as_ref().and_then(|m| m.temperature)).collect();
        assert_eq!(temps, [Some(0.0), Some(0.2), Some(0.4), Some(0.6)]);
        let m = p.judges[0].model.clone().unwrap();
        assert_eq!((m.model.as_str(), m.backend.as_str()), ("big", "openai"));
        assert_eq!(p.patcher_model.unwrap().model, "small");
        assert_eq!(judge_panel(Some(1), None).unwrap()[0].model.as_ref().and_then(|m| m.temperature), Some(0.0));
        assert!(build_pipeline(d.clone(), &args(&["--judges", "10"])).unwrap_err().contains("1 to 9"));
        assert!(build_pipeline(d, &args(&["--patcher-model", "@"])).unwrap_err().contains("--patcher-model"));
        assert!(Cli::try_parse_from(["refine", "--doc", "x", "--max-iterations", "11"]).is_err());
        assert!(Cli::try_parse_from(["refine", "--doc", "x", "--mode", "manual"]).is_err());
        assert!(Cli::try_parse_from(["refine", "--doc", "x", "--detach"]).is_err());
    }

    #[test]
    fn self_refine_options_turn_the_hook_on() {
        let d = doc(json!({"sections": [{"id": "a", "content": "x"}]})).unwrap();
        assert_eq!(build_pipeline(d.clone(), &args(&[])).unwrap().self_refine, None);
        let on = build_pipeline(d.clone(), &args(&["--self-refine"])).unwrap().self_refine.unwrap();
        assert_eq!((on.max_passes, on.min_bytes, on.exclude.len()), (None, None, 0));
        // Each of the other options implies --self-refine.
        let h = build_pipeline(d.clone(), &args(&["--self-refine-min-bytes", "0"])).unwrap().self_refine.unwrap();
        assert_eq!(h.min_bytes, Some(0));
        let h = build_pipeline(d.clone(), &args(&["--self-refine-passes", "2"])).unwrap().self_refine.unwrap();
        assert_eq!(h.max_passes, Some(2));
        let a = args(&["--self-refine-exclude", "intro, human", "--self-refine-exclude", "summary"]);
        let h = build_pipeline(d, &a).unwrap().self_refine.unwrap();
        assert_eq!(h.exclude, ["intro", "human", "summary"]);
        assert!(Cli::try_parse_from(["refine", "--doc", "x", "--self-refine-passes", "6"]).is_err());
        assert!(Cli::try_parse_from(["refine", "--doc", "x", "--self-refine-passes", "0"]).is_err());
    }

    #[test]
    fn outcomes_map_to_exit_codes() {
        assert_eq!(ending_of("r", gw::RefinementOutcome::Reviewed as i32), Ok(Ending::Accepted));
        assert_eq!(ending_of("r", gw::RefinementOutcome::AcceptedManual as i32), Ok(Ending::Accepted));
        assert_eq!(ending_of("r", gw::RefinementOutcome::BestEffort as i32), Ok(Ending::BestEffort));
        assert!(ending_of("r", 0).is_err());
    }

    #[test]
    fn the_result_json_has_the_document_and_the_audit_log() {
        let t = gw::TargetedRefinementResult {
            sections: vec![common::Section { id: "a".into(), title: "A".into(), content: "text".into(), index: 0 }],
            outcome: gw::RefinementOutcome::AcceptedManual as i32,
            quality: gw::QualityStatus::Acceptable as i32,
            final_score: 0.8,
            score_history: vec![0.7, 0.8],
            audit_log: vec![gw::AuditEntry {
                actor: "alice".into(),
                action: "accept".into(),
                detail: "good enough".into(),
                time: None,
            }],
            ..Default::default()
        };
        let v = result_json("run-1", gw::RunState::Succeeded as i32, &t).unwrap();
        assert_eq!(v["outcome"], "REFINEMENT_OUTCOME_ACCEPTED_MANUAL");
        assert_eq!(v["quality"], "QUALITY_STATUS_ACCEPTABLE");
        assert_eq!(v["state"], "RUN_STATE_SUCCEEDED");
        assert_eq!(v["sections"][0], json!({"id": "a", "index": 0, "title": "A", "content": "text"}));
        assert_eq!(v["auditLog"][0]["actor"], "alice");
        assert_eq!(v["unresolvedIssues"], json!([]));
    }

    #[test]
    fn a_run_waiting_for_a_human_prints_the_escalation_and_the_document() {
        let escalation = gw::EscalationTriggered { reason: "below the thresholds".into(), ..Default::default() };
        let run = gw::Run {
            progress: Some(gw::run::Progress::Refinement(gw::RefinementProgress {
                sections: vec![common::Section { id: "a".into(), content: "text".into(), ..Default::default() }],
                ..Default::default()
            })),
            ..Default::default()
        };
        let v = awaiting_json("run-1", Some(&escalation), Some(&run)).unwrap();
        assert_eq!((v["runId"].as_str(), v["state"].as_str()), (Some("run-1"), Some("RUN_STATE_AWAITING_HUMAN")));
        assert_eq!(v["escalation"]["reason"], "below the thresholds");
        assert_eq!(v["refinement"]["sections"][0]["content"], "text");
        let v = awaiting_json("run-1", None, None).unwrap();
        assert!(v["escalation"].is_null() && v.get("refinement").is_none());
    }
}
