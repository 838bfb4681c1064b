//! `assay eval` (a preset generates the checklists) and `assay score` (a checklist from a file):
//! both stream a checklist_eval run through the gateway and write one JSON line per record.

use std::io::Write;
use std::path::{Path, PathBuf};

use assay_config::AssayConfig;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use serde_json::{Value, json};

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
    corpus: &super::generate::CorpusArgs,
    args: RunArgs,
) -> Result<Outcome, String> {
    let preset = super::preset(preset)?;
    let records = read_records(&args.data)?;
    let source = if super::generate::is_corpus(preset) {
        gw::checklist_source::Source::Corpus(super::generate::corpus_request(preset, corpus)?)
    } else {
        gw::checklist_source::Source::Preset(preset as i32)
    };
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(source) }),
        records,
        max_items,
        scorer,
        refiners: corpus.steps("")?,
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
    while let Some(msg) = events.message().await.map_err(|s| status_text(&s))? {
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
                | gw::run_event::Event::DebateStage(_),
            )
            | None => {}
        }
    }
    out.flush().map_err(|e| e.to_string())?;
    progress.finish();
    let completed = completed.ok_or_else(|| format!("run {run_id} ended without completing"))?;
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
        "cache_hits": u.cache_hits,
    });
    if args.json {
        println!("{summary}");
    } else {
        eprintln!(
            "run {run_id}: {total} records, {failed} failed; mean primary {:.3}, macro pass {:.3}, micro pass {:.3}; \
             {} calls, {} cache hits",
            a.mean_primary_score, a.macro_pass_rate, a.micro_pass_rate, u.calls, u.cache_hits
        );
    }
    Ok(if failed == 0 { Outcome::Complete } else { Outcome::Partial })
}

/// Records from JSON lines: `{"id","input","target","reference","history","candidates":[...]}`.
pub fn read_records(path: &Path) -> Result<Vec<gw::EvalRecord>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: Value =
            serde_json::from_str(line).map_err(|e| format!("{}:{}: not JSON: {e}", path.display(), n + 1))?;
        out.push(record_from_json(&v).map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?);
    }
    if out.is_empty() {
        return Err(format!("{}: no records", path.display()));
    }
    Ok(out)
}

/// One record from a JSON object.
pub fn record_from_json(v: &Value) -> Result<gw::EvalRecord, String> {
    if !v.is_object() {
        return Err("a record must be a JSON object".into());
    }
    let text = |k: &str| -> Result<String, String> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(format!("field {k:?} must be a string")),
        }
    };
    let candidates = match v.get("candidates") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, c)| match c {
                Value::String(t) => Ok(assay_proto::generator::v1::Candidate {
                    id: i.to_string(),
                    text: t.clone(),
                    model: String::new(),
                }),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => {
                    Err(format!("candidates[{i}] must be a string"))
                }
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("field \"candidates\" must be a list of strings".into()),
    };
    Ok(gw::EvalRecord {
        id: match v.get("id") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        },
        input: text("input")?,
        target: text("target")?,
        reference: text("reference")?,
        history: text("history")?,
        candidates,
    })
}

/// A checklist from a JSON file: a checklist object (`{"id", "items": [...]}`) or a bare list of
/// items; an item is a question string or `{"id", "question", "weight", "category"}`.
pub fn read_checklist(path: &Path) -> Result<common::Checklist, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    checklist_from_json(&v).map_err(|e| format!("{}: {e}", path.display()))
}

/// A checklist from JSON (see [`read_checklist`]).
pub fn checklist_from_json(v: &Value) -> Result<common::Checklist, String> {
    let (id, items, input) = match v {
        Value::Array(items) => (String::new(), items.as_slice(), String::new()),
        Value::Object(o) => (
            o.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
            o.get("items").and_then(Value::as_array).map(Vec::as_slice).ok_or("a checklist needs \"items\"")?,
            o.get("input").and_then(Value::as_str).unwrap_or_default().to_string(),
        ),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            return Err("a checklist is a JSON object or a list of items".into());
        }
    };
    let items = items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(q) => {
                Ok(common::ChecklistItem { id: format!("q{}", i + 1), question: q.clone(), ..Default::default() })
            }
            Value::Object(o) => Ok(common::ChecklistItem {
                id: o.get("id").and_then(Value::as_str).map_or_else(|| format!("q{}", i + 1), str::to_string),
                question: o
                    .get("question")
                    .and_then(Value::as_str)
                    .ok_or(format!("items[{i}] needs a \"question\""))?
                    .to_string(),
                weight: o.get("weight").and_then(Value::as_f64),
                category: o.get("category").and_then(Value::as_str).unwrap_or_default().to_string(),
                ..Default::default()
            }),
            Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) => {
                Err(format!("items[{i}] must be a question string or an object"))
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(common::Checklist { id, items, input, source_method: "explicit".into(), ..Default::default() })
}

/// A checklist as JSON (the shape [`checklist_from_json`] reads back).
pub fn checklist_json(c: &common::Checklist) -> Value {
    let items: Vec<Value> = c
        .items
        .iter()
        .map(|i| {
            let mut item = json!({"id": i.id, "question": i.question, "weight": i.weight.unwrap_or(100.0)});
            if !i.category.is_empty() {
                item["category"] = json!(i.category);
            }
            if !i.merged_from.is_empty() {
                item["merged_from"] = json!(i.merged_from);
            }
            if !i.source_indices.is_empty() {
                item["source_indices"] = json!(i.source_indices);
            }
            if !i.metadata.is_empty() {
                item["metadata"] = json!(i.metadata);
            }
            item
        })
        .collect();
    let level = common::GenerationLevel::try_from(c.generation_level)
        .map_or("unspecified", |l| l.as_str_name())
        .trim_start_matches("GENERATION_LEVEL_")
        .to_lowercase();
    json!({
        "id": c.id, "source_method": c.source_method, "generation_level": level, "input": c.input,
        "corpus_description": c.corpus_description, "items": items,
    })
}

/// One record's result as a JSON line.
pub fn record_json(r: &gw::RecordResult) -> Value {
    let answers: serde_json::Map<String, Value> = r
        .score
        .iter()
        .flat_map(|s| s.item_scores.iter())
        .map(|i| {
            let a = match common::Answer::try_from(i.answer) {
                Ok(common::Answer::Yes) => json!("yes"),
                Ok(common::Answer::No) => json!("no"),
                Ok(common::Answer::Unspecified) | Err(_) => Value::Null,
            };
            (i.item_id.clone(), a)
        })
        .collect();
    json!({
        "index": r.index,
        "id": r.record_id,
        "checklist_id": r.checklist_id,
        "error": if r.error.is_empty() { Value::Null } else { r.error.clone().into() },
        "pass_rate": r.score.as_ref().map(|s| s.pass_rate),
        "weighted_score": r.score.as_ref().map(|s| s.weighted_score),
        "normalized_score": r.score.as_ref().map(|s| s.normalized_score),
        "primary_score": r.score.as_ref().map(|s| s.primary_score),
        "unanswered": r.score.as_ref().map(|s| s.unanswered_count),
        "answers": answers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checklist_round_trips_through_json() {
        let v = json!({"id": "c1", "items": ["Is it short?", {"id": "x", "question": "Is it kind?", "weight": 40, "category": "tone"}]});
        let c = checklist_from_json(&v).unwrap();
        assert_eq!(c.items[0].id, "q1");
        assert_eq!(c.items[1].weight, Some(40.0));
        let back = checklist_from_json(&checklist_json(&c)).unwrap();
        // An unset weight is written as the default 100.
        assert_eq!(back.items[0].weight, Some(100.0));
        assert_eq!(back.items[1], c.items[1]);
        assert_eq!((back.items[0].id.as_str(), back.items[0].question.as_str()), ("q1", "Is it short?"));
        assert!(checklist_from_json(&json!({"items": [{"id": "a"}]})).unwrap_err().contains("items[0]"));
    }

    #[test]
    fn records_reject_wrong_types() {
        assert!(record_from_json(&json!({"target": 3})).unwrap_err().contains("target"));
        let r = record_from_json(&json!({"id": 7, "target": "t", "candidates": ["a", "b"]})).unwrap();
        assert_eq!(r.id, "7");
        assert_eq!(r.candidates.len(), 2);
    }
}
