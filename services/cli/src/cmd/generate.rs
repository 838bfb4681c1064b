//! `assay generate`: a checklist from a preset (one per record) or from a corpus, optionally refined,
//! through the gateway's generate_checklist pipeline. Writes one checklist JSON per line.

use std::io::Write;
use std::path::PathBuf;

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;

/// Re-exported here for `main.rs`, which names it `cmd::generate::CorpusArgs`.
pub use super::input::CorpusArgs;
use super::input::{corpus_request, is_corpus, read_checklist, read_records};
use super::render::checklist_json;
use super::{Progress, Session, status_text};

/// Everything `assay generate` takes.
pub struct GenerateArgs {
    pub preset: String,
    /// Instance level: one record from flags, or many from a file.
    pub record: gw::EvalRecord,
    /// Refine this checklist instead of generating one.
    pub checklist: Option<PathBuf>,
    pub data: Option<PathBuf>,
    pub corpus: CorpusArgs,
    pub max_items: Option<u32>,
    pub out: Option<PathBuf>,
    pub gateway: Option<String>,
}

/// Generate; Ok(false) when some generations failed.
pub async fn generate(config: &AssayConfig, args: GenerateArgs) -> Result<bool, String> {
    let preset = super::preset(&args.preset)?;
    let corpus = is_corpus(preset);
    let refiners = args.corpus.steps(&args.record.input)?;
    let pipelines: Vec<gw::GenerateChecklistPipeline> = if let Some(path) = &args.checklist {
        vec![gw::GenerateChecklistPipeline {
            source: Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Checklist(read_checklist(path)?)),
            }),
            refiners,
            ..Default::default()
        }]
    } else if corpus {
        vec![gw::GenerateChecklistPipeline {
            source: Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Corpus(corpus_request(preset, &args.corpus)?)),
            }),
            refiners,
            ..Default::default()
        }]
    } else {
        let records = match &args.data {
            Some(path) => read_records(path)?,
            None if args.record.input.trim().is_empty() => {
                return Err("give --input (or --data with records) for an instance-level preset".into());
            }
            None => vec![args.record.clone()],
        };
        let candidate_models = args.corpus.candidate_specs()?;
        records
            .into_iter()
            .map(|record| gw::GenerateChecklistPipeline {
                source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(preset as i32)) }),
                record: Some(record),
                max_items: args.max_items,
                refiners: refiners.clone(),
                candidate_models: candidate_models.clone(),
                ..Default::default()
            })
            .collect()
    };
    let mut session = Session::open(config, args.gateway.as_deref()).await?;
    let outcome = run_all(&mut session, pipelines, &args).await;
    session.close().await?;
    outcome
}

async fn run_all(
    session: &mut Session,
    pipelines: Vec<gw::GenerateChecklistPipeline>,
    args: &GenerateArgs,
) -> Result<bool, String> {
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => {
            Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?))
        }
        None => Box::new(std::io::stdout()),
    };
    let total = pipelines.len();
    let mut progress = Progress::new(total as u64, "checklists");
    let mut failed = 0u64;
    let mut last_error = String::new();
    // Each record is its own run; several run at once.
    let client = session.client.clone();
    let mut runs = futures::stream::iter(pipelines.into_iter().enumerate().map(|(i, p)| {
        let mut client = client.clone();
        async move {
            let request = gw::RunPipelineRequest {
                pipeline: Some(gw::run_pipeline_request::Pipeline::GenerateChecklist(p)),
                label: format!("assay generate #{i}"),
            };
            let mut events = client.run_pipeline(request).await.map_err(|s| status_text(&s))?.into_inner();
            let mut notes = Vec::new();
            let mut result = None;
            while let Some(m) = events.message().await.map_err(|s| status_text(&s))? {
                let Some(ev) = m.event else { continue };
                match ev.event {
                    Some(gw::run_event::Event::Progress(p)) => {
                        if let Some(p) = p.progress {
                            notes.push(format!("{}: {}/{} {}", p.stage, p.done, p.total, p.message));
                        }
                    }
                    Some(gw::run_event::Event::Completed(c)) => result = Some((ev.run_id, c)),
                    Some(_) | None => {}
                }
            }
            Ok::<_, String>((i, notes, result))
        }
    }))
    .buffered(4);
    use futures::StreamExt;
    while let Some(r) = runs.next().await {
        let (i, notes, result) = r?;
        for n in notes {
            progress.note(&n);
        }
        let (run_id, completed) = result.ok_or("a run ended without completing")?;
        let result = completed.result.unwrap_or_default();
        match result.result {
            Some(gw::run_result::Result::Checklist(c)) if result.error.is_empty() => {
                let mut v = checklist_json(&c);
                v["run_id"] = run_id.into();
                v["index"] = i.into();
                writeln!(out, "{v}").map_err(|e| e.to_string())?;
            }
            Some(_) | None => {
                failed += 1;
                last_error.clone_from(&result.error);
                let v = serde_json::json!({"run_id": run_id, "index": i, "error": result.error});
                writeln!(out, "{v}").map_err(|e| e.to_string())?;
            }
        }
        progress.inc(failed);
    }
    out.flush().map_err(|e| e.to_string())?;
    progress.finish();
    if total == 1 && failed == 1 {
        return Err(format!("generation failed: {last_error}"));
    }
    Ok(failed == 0)
}
