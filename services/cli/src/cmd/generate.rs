//! `assay generate`: a checklist from a preset (one per record) or from a corpus, optionally refined,
//! through the gateway's generate_checklist pipeline. Writes one checklist JSON per line.

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;
use assay_proto::generator::v1 as gen_pb;
use assay_proto::refiners::v1 as ref_pb;
use serde_json::Value;

use super::{Progress, Session, status_text};

/// Corpus inputs (feedback, checkeval, interacteval) and the refiner chain, shared by `generate`
/// and `eval`.
#[derive(clap::Args, Clone, Default)]
pub struct CorpusArgs {
    /// Corpus observations: one per line (.txt) or JSON strings / {"text"} objects (.jsonl).
    #[arg(long)]
    pub observations: Option<PathBuf>,
    /// What the corpus is about.
    #[arg(long, default_value = "")]
    pub description: String,
    /// checkeval dimensions: JSON list of {"name","definition","sub_dimensions":[{"name","definition"}]}.
    #[arg(long)]
    pub dimensions: Option<PathBuf>,
    /// checkeval augmentation: seed, elaboration, diversification, combined.
    #[arg(long)]
    pub augmentation: Option<String>,
    /// checkeval: filter questions for alignment and dimension consistency.
    #[arg(long)]
    pub filter: bool,
    /// feedback: observations per model call.
    #[arg(long)]
    pub batch_size: Option<u32>,
    /// Corpus presets: skip the built-in deduplicator.
    #[arg(long)]
    pub no_dedup: bool,
    /// Corpus presets: skip the built-in tagger.
    #[arg(long)]
    pub no_tagging: bool,
    /// Corpus presets: skip the built-in selector.
    #[arg(long)]
    pub no_selection: bool,
    /// Deduplicator cosine threshold (0, 1].
    #[arg(long)]
    pub dedup_threshold: Option<f64>,
    /// Selector: maximum questions kept (corpus presets and --refine selector).
    #[arg(long)]
    pub max_questions: Option<u32>,
    /// Refiners to run on the checklist, in order (comma separated): deduplicator, tagger,
    /// unit_tester (needs --samples), selector.
    #[arg(long, value_delimiter = ',')]
    pub refine: Vec<String>,
    /// unit_tester: scored sample responses, JSON lines {"id", "text", "answers": {"<item id>": "yes"|"no"}}.
    #[arg(long)]
    pub samples: Option<PathBuf>,
}

impl CorpusArgs {
    /// The refiner chain; `input` is the instruction the unit tester's samples answer.
    pub fn steps(&self, input: &str) -> Result<Vec<ref_pb::RefinerStep>, String> {
        let samples = match &self.samples {
            Some(path) => Some(read_samples(path)?),
            None => None,
        };
        self.refine
            .iter()
            .flat_map(|n| n.split(','))
            .filter(|n| !n.trim().is_empty())
            .map(|n| {
                let step = match n.trim() {
                    "deduplicator" | "dedup" => ref_pb::refiner_step::Step::Deduplicate(ref_pb::DeduplicateRequest {
                        threshold: self.dedup_threshold,
                        ..Default::default()
                    }),
                    "tagger" => ref_pb::refiner_step::Step::Tag(ref_pb::TagRequest::default()),
                    "unit_tester" => ref_pb::refiner_step::Step::UnitTest(ref_pb::UnitTestRequest {
                        samples: samples.clone().ok_or("--refine unit_tester needs --samples (scored responses)")?,
                        input: input.to_string(),
                        ..Default::default()
                    }),
                    "selector" => ref_pb::refiner_step::Step::Select(ref_pb::SelectRequest {
                        max_questions: self.max_questions,
                        ..Default::default()
                    }),
                    other => {
                        return Err(format!("unknown refiner {other:?} (deduplicator, tagger, unit_tester, selector)"));
                    }
                };
                Ok(ref_pb::RefinerStep { step: Some(step) })
            })
            .collect()
    }
}

/// Scored samples for the unit tester (JSON lines).
fn read_samples(path: &Path) -> Result<Vec<ref_pb::Sample>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            let at = |e: &str| format!("{}:{}: {e}", path.display(), n + 1);
            let v: Value = serde_json::from_str(l).map_err(|e| at(&format!("not JSON: {e}")))?;
            let text = v.get("text").and_then(Value::as_str).ok_or_else(|| at("needs a \"text\" string"))?;
            let answers = v
                .get("answers")
                .and_then(Value::as_object)
                .ok_or_else(|| at("needs \"answers\": {\"<item id>\": \"yes\" | \"no\"}"))?
                .iter()
                .map(|(id, a)| {
                    let answer = match a.as_str().map(str::to_ascii_lowercase).as_deref() {
                        Some("yes") => assay_proto::common::v1::Answer::Yes,
                        Some("no") => assay_proto::common::v1::Answer::No,
                        Some(_) | None => return Err(at(&format!("answers.{id} must be \"yes\" or \"no\""))),
                    };
                    Ok((id.clone(), answer as i32))
                })
                .collect::<Result<_, String>>()?;
            Ok(ref_pb::Sample {
                id: v.get("id").and_then(Value::as_str).map_or_else(|| n.to_string(), str::to_string),
                text: text.to_string(),
                answers,
            })
        })
        .collect()
}

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

fn read_observations(path: &Path) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let json_lines = path.extension().is_some_and(|e| e == "jsonl");
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            if !json_lines {
                return Ok(l.trim().to_string());
            }
            match serde_json::from_str::<Value>(l) {
                Ok(Value::String(s)) => Ok(s),
                Ok(Value::Object(o)) => o
                    .get("text")
                    .or_else(|| o.get("observation"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| format!("{}:{}: needs a \"text\" field", path.display(), n + 1)),
                Ok(_) | Err(_) => Err(format!("{}:{}: not a JSON string or object", path.display(), n + 1)),
            }
        })
        .collect()
}

fn read_dimensions(path: &Path) -> Result<Vec<gen_pb::Dimension>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    let list = v.as_array().ok_or_else(|| format!("{}: a list of dimensions", path.display()))?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    Ok(list
        .iter()
        .map(|d| gen_pb::Dimension {
            name: s(d, "name"),
            definition: s(d, "definition"),
            sub_dimensions: d
                .get("sub_dimensions")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .map(|x| gen_pb::SubDimension { name: s(x, "name"), definition: s(x, "definition") })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect())
}

pub fn corpus_request(preset: gen_pb::Preset, a: &CorpusArgs) -> Result<gen_pb::GenerateCorpusRequest, String> {
    let augmentation = match a.augmentation.as_deref() {
        None => gen_pb::AugmentationMode::Unspecified,
        Some(m) => gen_pb::AugmentationMode::from_str_name(&format!("AUGMENTATION_MODE_{}", m.to_ascii_uppercase()))
            .ok_or_else(|| format!("unknown augmentation {m:?} (seed, elaboration, diversification, combined)"))?,
    };
    Ok(gen_pb::GenerateCorpusRequest {
        preset: preset as i32,
        corpus_description: a.description.clone(),
        observations: a.observations.as_deref().map(read_observations).transpose()?.unwrap_or_default(),
        batch_size: a.batch_size,
        dimensions: a.dimensions.as_deref().map(read_dimensions).transpose()?.unwrap_or_default(),
        augmentation: augmentation as i32,
        filter: a.filter,
        refinement: Some(gen_pb::CorpusRefinement {
            skip_deduplication: a.no_dedup,
            skip_tagging: a.no_tagging,
            run_unit_tester: false,
            skip_selection: a.no_selection,
            dedup_threshold: a.dedup_threshold,
            max_questions: a.max_questions,
        }),
        ..Default::default()
    })
}

/// Whether a preset generates from a corpus.
pub fn is_corpus(preset: gen_pb::Preset) -> bool {
    matches!(preset, gen_pb::Preset::Feedback | gen_pb::Preset::Checkeval | gen_pb::Preset::Interacteval)
}

/// Generate; Ok(false) when some generations failed.
pub async fn generate(config: &AssayConfig, args: GenerateArgs) -> Result<bool, String> {
    let preset = super::preset(&args.preset)?;
    let corpus = is_corpus(preset);
    let refiners = args.corpus.steps(&args.record.input)?;
    let pipelines: Vec<gw::GenerateChecklistPipeline> = if let Some(path) = &args.checklist {
        vec![gw::GenerateChecklistPipeline {
            source: Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Checklist(super::eval::read_checklist(path)?)),
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
            Some(path) => super::eval::read_records(path)?,
            None if args.record.input.trim().is_empty() => {
                return Err("give --input (or --data with records) for an instance-level preset".into());
            }
            None => vec![args.record.clone()],
        };
        records
            .into_iter()
            .map(|record| gw::GenerateChecklistPipeline {
                source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(preset as i32)) }),
                record: Some(record),
                max_items: args.max_items,
                refiners: refiners.clone(),
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
                let mut v = super::eval::checklist_json(&c);
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
