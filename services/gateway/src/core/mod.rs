//! Pipeline logic over stage traits (no transport types).

use std::sync::Arc;

use assay_domain::limits::MAX_RECORDS;
use assay_domain::{
    AggregateScores, Checklist, ModelRecord, ModelSpec, Score, ScoreRequest, ScoreTarget, Scorer, ScorerConfig,
    StageError, Usage, Violations,
};

/// One record of an evaluation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EvalRecord {
    pub id: String,
    pub input: String,
    pub target: String,
    pub reference: String,
    pub history: String,
    /// Contrastive candidates (rlcf_candidate, openrubrics_*: chosen first, rejected second).
    pub candidates: Vec<String>,
}

/// A checklist evaluation: an explicit checklist, or one generated per distinct input by a preset.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Evaluation {
    pub checklist: Checklist,
    pub preset: Option<assay_generator::Preset>,
    pub generator_model: ModelSpec,
    pub max_items: Option<u32>,
    pub records: Vec<EvalRecord>,
    pub scorer: ScorerConfig,
    /// The caller set scorer options (else the preset's defaults apply).
    pub scorer_set: bool,
    pub scorer_model: ModelSpec,
    /// Generate the checklist once from a corpus (wire form, forwarded to the generator).
    pub corpus: Option<assay_proto::generator::v1::GenerateCorpusRequest>,
    /// Refiner chain applied to every checklist before scoring (wire form, forwarded to the refiners).
    pub refiners: Vec<assay_proto::refiners::v1::RefinerStep>,
}

impl Evaluation {
    /// Whether the checklist needs stage calls (generation or refinement) before scoring.
    pub fn needs_checklist_stages(&self) -> bool {
        self.preset.is_some() || self.corpus.is_some() || !self.refiners.is_empty()
    }
}

/// Result of one record.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordOutcome {
    pub index: u32,
    pub record_id: String,
    pub checklist_id: String,
    pub score: Option<Score>,
    pub error: String,
}

/// Result of an evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct EvaluationOutcome {
    pub run_id: String,
    pub results: Vec<RecordOutcome>,
    pub aggregate: AggregateScores,
    pub checklists: Vec<Checklist>,
    pub usage: Usage,
    pub models: Vec<ModelRecord>,
}

/// The gateway's pipelines over stage clients.
#[derive(Clone)]
pub struct GatewayCore {
    scorer: Arc<dyn Scorer>,
}

impl GatewayCore {
    pub fn new(scorer: Arc<dyn Scorer>) -> Self {
        Self { scorer }
    }

    /// Score every record against the checklist in one scorer call (the scorer runs targets
    /// concurrently).
    pub async fn evaluate(&self, eval: Evaluation) -> Result<EvaluationOutcome, StageError> {
        let mut v = Violations::new();
        if eval.records.is_empty() {
            v.push("pipeline.records", "must not be empty");
        }
        if eval.records.len() > MAX_RECORDS {
            v.push("pipeline.records", format!("has {} records; the limit is {MAX_RECORDS}", eval.records.len()));
        }
        v.into_result()?;
        let mut checklist = eval.checklist;
        if checklist.id.is_empty() {
            checklist.id = format!("checklist-{}", uuid::Uuid::now_v7());
        }
        if checklist.source_method.is_empty() {
            checklist.source_method = "explicit".into();
        }
        let targets: Vec<ScoreTarget> = eval
            .records
            .iter()
            .enumerate()
            .map(|(i, r)| ScoreTarget {
                id: if r.id.is_empty() { i.to_string() } else { r.id.clone() },
                input: if r.input.is_empty() { checklist.input.clone() } else { r.input.clone() },
                target: r.target.clone(),
                reference: r.reference.clone(),
                history: r.history.clone(),
            })
            .collect();
        let request =
            ScoreRequest { checklist: checklist.clone(), targets, config: eval.scorer, model: eval.scorer_model };
        let out =
            self.scorer.score(request, &assay_domain::no_events).await.map_err(|e| rename_fields(e, "pipeline"))?;
        let results = out
            .scores
            .into_iter()
            .enumerate()
            .map(|(i, score)| RecordOutcome {
                index: i as u32,
                record_id: score.target_id.clone(),
                checklist_id: checklist.id.clone(),
                score: Some(score),
                error: String::new(),
            })
            .collect();
        Ok(EvaluationOutcome {
            run_id: uuid::Uuid::now_v7().to_string(),
            results,
            aggregate: out.aggregate,
            checklists: vec![checklist],
            usage: out.usage,
            models: vec![out.model],
        })
    }
}

/// Map a scorer's field names (`targets[i].target`, `checklist.items`) to the pipeline's
/// (`pipeline.records[i].target`, `pipeline.source.checklist.items`).
fn rename_fields(e: StageError, prefix: &str) -> StageError {
    e.map_fields(|field| {
        if let Some(rest) = field.strip_prefix("targets") {
            format!("{prefix}.records{rest}")
        } else if let Some(rest) = field.strip_prefix("checklist") {
            format!("{prefix}.source.checklist{rest}")
        } else if let Some(rest) = field.strip_prefix("config") {
            format!("{prefix}.scorer{rest}")
        } else if let Some(rest) = field.strip_prefix("model") {
            format!("{prefix}.scorer_model{rest}")
        } else {
            format!("{prefix}.{field}")
        }
    })
}
