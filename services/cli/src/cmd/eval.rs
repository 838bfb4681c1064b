//! `assay eval` (a preset generates the checklists) and `assay score` (a checklist from a file):
//! both stream a checklist_eval run through the gateway and write one JSON line per record.

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use serde_json::json;

use super::input::{CorpusArgs, corpus_request, is_corpus, read_checklist, read_records};
use super::render::record_json;
use super::{Progress, Session, status_text};

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
    let request =
        gw::RunPipelineRequest { pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)), label };
    // Pipeline time: from the request to the run's last event (no process or mesh start).
    let started = std::time::Instant::now();
    let mut events = session.client.run_pipeline(request).await.map_err(|s| status_text(&s))?.into_inner();
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => {
            Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?))
        }
        None => Box::new(std::io::stdout()),
    };
    let mut progress = Progress::new(total as u64, "records");
    let mut failed = 0u64;
    let mut run_id = String::new();
    let mut completed = None;
    loop {
        let msg = match events.message().await {
            Ok(Some(msg)) => msg,
            Ok(None) => break,
            Err(s) => return Err(interrupted(&s, &run_id)),
        };
        let Some(ev) = msg.event else { continue };
        run_id.clone_from(&ev.run_id);
        match ev.event {
            Some(gw::run_event::Event::Started(_)) => progress.note(&format!("run {run_id} started")),
            Some(gw::run_event::Event::ChecklistReady(c)) => {
                let n = c.checklist.as_ref().map_or(0, |c| c.items.len());
                progress.note(&format!("checklist ready: {n} items for {} records", c.record_indices.len()));
            }
            Some(gw::run_event::Event::Progress(p)) => {
                if let Some(p) = p.progress {
                    progress.note(&format!("{}: {}/{} {}", p.stage, p.done, p.total, p.message));
                }
            }
            Some(gw::run_event::Event::RecordScored(r)) => {
                failed += u64::from(r.score.is_none());
                writeln!(out, "{}", record_json(&r)).map_err(|e| e.to_string())?;
                progress.inc(failed);
            }
            Some(gw::run_event::Event::Completed(c)) => completed = Some(c),
            Some(
                gw::run_event::Event::Aggregate(_)
                | gw::run_event::Event::StateChanged(_)
                | gw::run_event::Event::Refinement(_)
                | gw::run_event::Event::SelfRefinePass(_)
                | gw::run_event::Event::DebateStage(_)
                | gw::run_event::Event::DebateProblemDone(_)
                | gw::run_event::Event::SelfRefined(_),
            )
            | None => {}
        }
    }
    let pipeline_s = started.elapsed().as_secs_f64();
    out.flush().map_err(|e| e.to_string())?;
    progress.finish();
    let completed = completed.ok_or_else(|| format!("run {run_id} ended without completing"))?;
    if completed.state == gw::RunState::Cancelled as i32 {
        return Err(format!("run {run_id} was cancelled; the records scored before are written above"));
    }
    let result = completed.result.unwrap_or_default();
    if !result.error.is_empty() {
        return Err(format!("run {run_id} failed: {}", result.error));
    }
    let Some(gw::run_result::Result::ChecklistEval(e)) = result.result else {
        return Err(format!("run {run_id} returned no evaluation"));
    };
    let a = e.aggregate.unwrap_or_default();
    let u = e.usage.unwrap_or_default();
    let state = gw::RunState::try_from(completed.state).map_or("unknown", |s| s.as_str_name());
    let summary = json!({
        "run_id": run_id, "state": state.trim_start_matches("RUN_STATE_").to_lowercase(),
        "records": total, "failed": failed,
        "mean_primary_score": a.mean_primary_score, "macro_pass_rate": a.macro_pass_rate,
        "micro_pass_rate": a.micro_pass_rate,
        "category_pass_rates": a.category_pass_rates.iter().map(|c| json!({"category": c.category, "pass_rate": c.pass_rate, "items": c.items})).collect::<Vec<_>>(),
        "calls": u.calls, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "cache_hits": u.cache_hits, "pipeline_s": (pipeline_s * 1e3).round() / 1e3,
    });
    if args.json {
        println!("{summary}");
    } else {
        eprintln!(
            "run {run_id}: {total} records, {failed} failed; mean primary {:.3}, macro pass {:.3}, micro pass {:.3}; \
             {} calls, {} cache hits; {pipeline_s:.2} s",
            a.mean_primary_score, a.macro_pass_rate, a.micro_pass_rate, u.calls, u.cache_hits
        );
    }
    Ok(if failed == 0 { Outcome::Complete } else { Outcome::Partial })
}

/// A run's event stream that broke off: the status, and, once the run is known, that it goes on
/// in the gateway and how to follow it (the run belongs to the gateway, not to this stream).
fn interrupted(s: &tonic::Status, run_id: &str) -> String {
    let transport = std::error::Error::source(s).is_some();
    let text =
        if transport { format!("lost the connection to the gateway: {}", status_text(s)) } else { status_text(s) };
    if run_id.is_empty() {
        return text;
    }
    format!(
        "{text}\nrun {run_id} is stored in the gateway and goes on there (or resumes when the gateway restarts): \
         `assay runs watch {run_id}` follows it, `assay runs show {run_id}` shows it"
    )
}

#[cfg(test)]
mod interrupted_tests {
    use super::interrupted;

    #[test]
    fn a_broken_stream_says_how_to_follow_the_run() {
        let s = tonic::Status::unavailable("connection reset");
        assert_eq!(interrupted(&s, ""), "Unavailable: connection reset", "before the run is known: the status");
        let text = interrupted(&s, "01run");
        assert!(text.starts_with("Unavailable: connection reset\nrun 01run is stored in the gateway"), "{text}");
        assert!(text.contains("`assay runs watch 01run`"), "{text}");
    }
}
