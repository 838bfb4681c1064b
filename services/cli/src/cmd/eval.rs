//! `assay eval` (a preset generates the checklists) and `assay score` (a checklist from a file):
//! both stream a checklist_eval run through the gateway and write one JSON line per record.

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::pipelines;

use super::follow::{NoResult, RunFollower, Step, finished_as, follow_run, is_final, start_run};
use super::input::{CorpusArgs, corpus_request, is_corpus, read_checklist, read_records};
use super::render::checklist_eval::{checklist_ready_line, record_json, summary_json, summary_line};
use super::render::stage_progress_line;
use super::{Progress, Session};

/// What a finished evaluation command reports.
pub enum Outcome {
    /// Every record scored.
    Complete,
    /// Some records failed; the others were written.
    Partial,
}

/// Options shared by `eval` and `score`.
pub struct RunArgs {
    pub data: PathBuf,
    pub out: Option<PathBuf>,
    pub gateway: Option<String>,
    pub json: bool,
    pub budget: Option<gw::RunBudget>,
}

/// `assay eval`: generate with a preset, score every record.
pub async fn eval(
    config: &AssayConfig,
    preset: &str,
    max_items: Option<u32>,
    scorer: Option<common::ScorerConfig>,
    corpus: &CorpusArgs,
    args: RunArgs,
) -> Result<Outcome, String> {
    let preset = super::preset(preset)?;
    // `--samples N` / `--sample-model`: repeated judging, over the scoring options.
    let scorer = corpus.with_sampling(scorer)?;
    let records = read_records(&args.data)?;
    let source = if is_corpus(preset) {
        gw::checklist_source::Source::Corpus(corpus_request(preset, corpus)?)
    } else {
        gw::checklist_source::Source::Preset(preset as i32)
    };
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(source) }),
        records,
        max_items,
        scorer,
        refiners: corpus.steps("")?,
        candidate_models: corpus.candidate_specs()?,
        ..Default::default()
    };
    run(config, pipeline, format!("assay eval {}", args.data.display()), &args).await
}

/// `assay score`: score every record against one checklist.
pub async fn score(
    config: &AssayConfig,
    checklist: &Path,
    scorer: common::ScorerConfig,
    args: RunArgs,
) -> Result<Outcome, String> {
    let checklist = read_checklist(checklist)?;
    let records = read_records(&args.data)?;
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
        records,
        scorer: Some(scorer),
        ..Default::default()
    };
    run(config, pipeline, format!("assay score {}", args.data.display()), &args).await
}

async fn run(
    config: &AssayConfig,
    pipeline: gw::ChecklistEvalPipeline,
    label: String,
    args: &RunArgs,
) -> Result<Outcome, String> {
    let total = pipeline.records.len();
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    let outcome = stream(&mut session, pipeline, label, total, args).await;
    session.close().await?;
    outcome
}

async fn stream(
    session: &mut Session,
    pipeline: gw::ChecklistEvalPipeline,
    label: String,
    total: usize,
    args: &RunArgs,
) -> Result<Outcome, String> {
    let request = gw::RunPipelineRequest {
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
        label,
        budget: args.budget,
    };
    // Pipeline time: from the request to the run's last event (no process or mesh start).
    let started = std::time::Instant::now();
    let events = start_run(&mut session.client, request).await?;
    let out: Box<dyn Write> = match &args.out {
        Some(p) => {
            Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?))
        }
        None => Box::new(std::io::stdout()),
    };
    let mut follower = Follower {
        out,
        progress: Progress::new(total as u64, "records"),
        failed: 0,
        total,
        run_id: String::new(),
        started,
        json: args.json,
    };
    follow_run(&mut session.client, events, &mut follower).await
}

/// Follows one evaluation run ([`follow_run`]): a line per scored record, progress notes, then the
/// summary.
struct Follower {
    /// Where the records' lines go (`--out`, else standard output).
    out: Box<dyn Write>,
    progress: Progress,
    /// Records failed so far.
    failed: u64,
    total: usize,
    run_id: String,
    started: std::time::Instant,
    /// Print the summary as JSON on standard output.
    json: bool,
}

impl RunFollower for Follower {
    type Ending = Outcome;
    type Error = String;

    fn on_event(&mut self, ev: gw::RunEvent) -> Step<Result<Outcome, String>> {
        use gw::run_event::Event;
        self.run_id.clone_from(&ev.run_id);
        match ev.event {
            Some(Event::Started(_)) => self.progress.note(&format!("run {} started", self.run_id)),
            Some(Event::ChecklistReady(c)) => self.progress.note(&checklist_ready_line(&c)),
            Some(Event::Progress(p)) => {
                if let Some(p) = p.progress {
                    self.progress.note(&stage_progress_line(&p));
                }
            }
            Some(Event::RecordScored(r)) => {
                self.failed += u64::from(r.score.is_none());
                if let Err(e) = writeln!(self.out, "{}", record_json(&r)) {
                    return Step::Done(Err(e.to_string()));
                }
                self.progress.inc(self.failed);
            }
            Some(Event::Completed(c)) => return Step::Done(self.completed(c.state, c.result)),
            Some(
                Event::Aggregate(_)
                | Event::StateChanged(_)
                | Event::Refinement(_)
                | Event::SelfRefinePass(_)
                | Event::DebateStage(_)
                | Event::DebateProblemDone(_)
                | Event::SelfRefined(_),
            )
            | None => {}
        }
        Step::Continue
    }

    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Outcome, String>> {
        is_final(run.state).then(|| self.completed(run.state, run.result))
    }
}

impl Follower {
    /// The run completed: flush the lines, print the summary, map the outcome.
    fn completed(&mut self, state: i32, result: Option<gw::RunResult>) -> Result<Outcome, String> {
        let pipeline_s = self.started.elapsed().as_secs_f64();
        self.out.flush().map_err(|e| e.to_string())?;
        self.progress.finish();
        let run_id = &self.run_id;
        let e = match finished_as::<pipelines::ChecklistEval>(state, result, "evaluation") {
            Ok(e) => e,
            Err(e @ NoResult::Missing(_)) => return Err(e.message(run_id)),
            Err(NoResult::Cancelled) => {
                let cancelled = NoResult::Cancelled.message(run_id);
                return Err(format!("{cancelled}; the records scored before are written above"));
            }
            Err(e) => return Err(e.message(run_id)),
        };
        let failed = self.failed;
        if self.json {
            outln!("{}", summary_json(run_id, state, self.total, failed, &e, pipeline_s)?);
        } else {
            eprintln!("{}", summary_line(run_id, self.total, failed, &e, pipeline_s));
        }
        Ok(if failed == 0 { Outcome::Complete } else { Outcome::Partial })
    }
}
