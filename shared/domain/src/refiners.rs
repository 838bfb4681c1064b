//! Checklist refiners: the steps (Deduplicator, Tagger, UnitTester,
//! Selector) with their options, what they report, the validation of a chain, and the
//! [`ChecklistRefiner`] stage trait. No transport types.

use std::collections::{BTreeMap, HashSet};

use crate::Usage;
use crate::limits::{MAX_QUESTION_BYTES, MAX_RECORDS, MAX_TEXT_BYTES};

use crate::checklist::ChecklistItem;
use crate::error::{StageError, Violations};
use crate::model::ModelSpec;
use crate::score::Answer;
use crate::stage::EventSink;

/// Refiner names as they appear in actions and step reports.
pub mod names {
    pub const DEDUPLICATOR: &str = "deduplicator";
    pub const TAGGER: &str = "tagger";
    pub const UNIT_TESTER: &str = "unit_tester";
    pub const SELECTOR: &str = "selector";
}

/// Most items one refiner request (or chain) may carry. Higher than a generated checklist's limit:
/// corpus-level generators produce many candidate questions for the refiners to whittle down.
pub const MAX_ITEMS: usize = 2_000;
/// Most samples one unit-test request may carry.
pub const MAX_SAMPLES: usize = 1_000;
/// Most coverage entries (observations) one select request may carry.
pub const MAX_COVERAGE_ENTRIES: usize = MAX_RECORDS;
/// Largest beam width accepted by the selector.
pub const MAX_BEAM_WIDTH: u32 = 64;
/// Most steps in one chain.
pub const MAX_STEPS: usize = 16;
/// Largest concurrency a request may ask for.
pub const MAX_CONCURRENCY: usize = 64;
/// Default bound on concurrent model calls per request.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// Deduplicator default cosine threshold.
pub const DEFAULT_DEDUP_THRESHOLD: f64 = 0.85;
/// UnitTester default enforceability threshold.
pub const DEFAULT_ENFORCEABILITY_THRESHOLD: f64 = 0.7;
/// UnitTester default number of passing samples tested per item.
pub const DEFAULT_MAX_SAMPLES: u32 = 10;
/// UnitTester default sampling seed (the original seeds its sampler with 0).
pub const DEFAULT_SEED: u64 = 0;
/// Selector defaults.
pub const DEFAULT_MAX_QUESTIONS: u32 = 20;
pub const DEFAULT_BEAM_WIDTH: u32 = 5;
pub const DEFAULT_LENGTH_PENALTY: f64 = 0.0005;
pub const DEFAULT_ALPHA: f64 = 0.5;

/// Deduplicator options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DedupOptions {
    /// Cosine similarity at or above which two questions are linked (default 0.85, range (0, 1]).
    pub threshold: Option<f64>,
    /// Model merging each cluster.
    pub model: ModelSpec,
    /// Model embedding the questions.
    pub embedding_model: ModelSpec,
}

/// Tagger options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TagOptions {
    pub model: ModelSpec,
    /// Concurrent tagging calls; 0 = the service default.
    pub concurrency: usize,
}

/// A sample response with the answers it got from a prior scoring run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sample {
    pub id: String,
    pub text: String,
    /// Item id -> answer.
    pub answers: BTreeMap<String, Answer>,
}

/// UnitTester options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnitTestOptions {
    pub samples: Vec<Sample>,
    /// Instruction the samples answer.
    pub input: String,
    /// Minimum enforceability rate to keep an item (default 0.7, range (0, 1]).
    pub threshold: Option<f64>,
    /// Passing samples tested per item (default 10).
    pub max_samples: Option<u32>,
    /// Seed of the sample draw (default [`DEFAULT_SEED`]).
    pub seed: Option<u64>,
    /// Model rewriting samples and scoring the rewrites.
    pub model: ModelSpec,
    /// Concurrent model calls; 0 = the service default.
    pub concurrency: usize,
}

/// Observation -> ids of the items that cover it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CoverageEntry {
    pub observation: String,
    pub item_ids: Vec<String>,
}

/// Selector options.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SelectOptions {
    /// Default 20; at least 1.
    pub max_questions: Option<u32>,
    /// Default 5; at least 1.
    pub beam_width: Option<u32>,
    /// Penalty per selected item, lambda (default 0.0005, at least 0).
    pub length_penalty: Option<f64>,
    /// Weight of coverage against diversity (default 0.5, range [0, 1]); used with `coverage`.
    pub alpha: Option<f64>,
    pub coverage: Vec<CoverageEntry>,
    pub embedding_model: ModelSpec,
}

/// One refiner of a chain with its options.
#[derive(Debug, Clone, PartialEq)]
pub enum RefinerStep {
    Deduplicate(DedupOptions),
    Tag(TagOptions),
    UnitTest(UnitTestOptions),
    Select(SelectOptions),
}

impl RefinerStep {
    /// The refiner's name (as in actions).
    pub fn refiner(&self) -> &'static str {
        match self {
            RefinerStep::Deduplicate(_) => names::DEDUPLICATOR,
            RefinerStep::Tag(_) => names::TAGGER,
            RefinerStep::UnitTest(_) => names::UNIT_TESTER,
            RefinerStep::Select(_) => names::SELECTOR,
        }
    }

    /// The field name of this step in a chain request (`deduplicate`, `tag`, `unit_test`, `select`).
    pub fn field(&self) -> &'static str {
        match self {
            RefinerStep::Deduplicate(_) => "deduplicate",
            RefinerStep::Tag(_) => "tag",
            RefinerStep::UnitTest(_) => "unit_test",
            RefinerStep::Select(_) => "select",
        }
    }
}

/// What a refiner did to one item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    Kept,
    Removed,
    Merged,
    /// The item could not be judged (reply unparseable, or the call failed after its retries).
    /// Tagger: the item is not kept. Deduplicator: the cluster's members are kept unmerged.
    Error,
}

/// One refiner decision on one item.
#[derive(Debug, Clone, PartialEq)]
pub struct RefinerAction {
    pub refiner: String,
    pub item_id: String,
    pub kind: ActionKind,
    pub reason: String,
    /// For merges: the resulting item id; empty otherwise.
    pub result_item_id: String,
}

impl RefinerAction {
    pub fn new(refiner: &str, item_id: &str, kind: ActionKind, reason: impl Into<String>) -> Self {
        Self {
            refiner: refiner.to_string(),
            item_id: item_id.to_string(),
            kind,
            reason: reason.into(),
            result_item_id: String::new(),
        }
    }
}

/// The Tagger's judgment of one item.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ItemTag {
    pub item_id: String,
    pub generally_applicable: bool,
    pub section_specific: bool,
    pub reasoning: String,
    /// Set when the reply could not be parsed or the call failed; the item is not kept.
    pub error: Option<String>,
}

/// The UnitTester's result for one item.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ItemEnforceability {
    pub item_id: String,
    /// Passing samples tested (after the draw down to `max_samples`).
    pub samples: u32,
    /// Rewrites the scorer answered NO (the criterion caught the failure).
    pub correct_failures: u32,
    /// Rewrites that could not be checked: empty rewrite, or the scorer gave no usable answer.
    /// They count as not caught.
    pub unchecked: u32,
    /// correct_failures / samples (0 when no sample passed the item).
    pub rate: f64,
    pub kept: bool,
}

/// What one refiner produced. The fields after `usage` are filled by the refiner they name and
/// left at their defaults by the others.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepOutcome {
    pub items: Vec<ChecklistItem>,
    /// One action per input item.
    pub actions: Vec<RefinerAction>,
    pub usage: Usage,
    /// Deduplicator: clusters of two or more items merged into one.
    pub clusters_merged: u32,
    /// Tagger: one tag per input item, in input order.
    pub tags: Vec<ItemTag>,
    /// Tagger: replies that could not be parsed or calls that failed. Deduplicator: merge replies
    /// that could not be parsed (the cluster is then kept unmerged).
    pub parse_failures: u32,
    /// UnitTester: one result per input item, in input order.
    pub enforceability: Vec<ItemEnforceability>,
    /// Selector: diversity of the selected set (1 - mean pairwise cosine; 1 for <= 1 item).
    pub diversity: f64,
    /// Selector: covered observations / all observations (0 without coverage entries).
    pub coverage: f64,
    /// Selector: objective of the selected set.
    pub score: f64,
    /// Selector: the input had at most max_questions items and was returned unchanged.
    pub passthrough: bool,
}

/// Report of one finished chain step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StepReport {
    pub refiner: String,
    pub items_in: u32,
    pub items_out: u32,
    pub actions: Vec<RefinerAction>,
    pub usage: Usage,
}

/// What a chain produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChainOutcome {
    pub items: Vec<ChecklistItem>,
    /// Every step's actions, in step order.
    pub actions: Vec<RefinerAction>,
    pub steps: Vec<StepReport>,
    pub usage: Usage,
}

/// Rules on the items every refiner takes: non-empty, within [`MAX_ITEMS`], unique non-empty ids,
/// non-empty questions within the size limit.
pub fn validate_items(items: &[ChecklistItem], field: &str, v: &mut Violations) {
    if items.is_empty() {
        v.push(field, "must not be empty");
    }
    if items.len() > MAX_ITEMS {
        v.push(field, format!("has {} items; the limit is {MAX_ITEMS}", items.len()));
        return;
    }
    let mut seen = HashSet::new();
    for (i, it) in items.iter().enumerate() {
        if it.id.is_empty() {
            v.push(format!("{field}[{i}].id"), "must not be empty");
        } else if !seen.insert(it.id.as_str()) {
            v.push(format!("{field}[{i}].id"), format!("duplicate id {:?}", it.id));
        }
        if it.question.trim().is_empty() {
            v.push(format!("{field}[{i}].question"), "must not be empty");
        }
        if it.question.len() > MAX_QUESTION_BYTES {
            v.push(
                format!("{field}[{i}].question"),
                format!("is {} bytes; the limit is {MAX_QUESTION_BYTES} bytes", it.question.len()),
            );
        }
        if !(0.0..=100.0).contains(&it.weight) {
            v.push(format!("{field}[{i}].weight"), "must be between 0 and 100");
        }
    }
}

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

fn unit_interval(value: Option<f64>, field: String, v: &mut Violations) {
    if let Some(t) = value
        && !(t > 0.0 && t <= 1.0)
    {
        v.push(field, format!("must be in (0, 1] (got {t})"));
    }
}

fn concurrency_limit(c: usize, field: String, v: &mut Violations) {
    if c > MAX_CONCURRENCY {
        v.push(field, format!("is {c}; the limit is {MAX_CONCURRENCY}"));
    }
}

pub fn validate_dedup(o: &DedupOptions, prefix: &str, v: &mut Violations) {
    unit_interval(o.threshold, join(prefix, "threshold"), v);
}

pub fn validate_tag(o: &TagOptions, prefix: &str, v: &mut Violations) {
    concurrency_limit(o.concurrency, join(prefix, "concurrency"), v);
}

pub fn validate_unit_test(o: &UnitTestOptions, prefix: &str, v: &mut Violations) {
    let samples = join(prefix, "samples");
    if o.samples.is_empty() {
        v.push(
            &samples,
            "must not be empty: the unit tester rewrites samples that passed an item (pass samples with their answers, or without to have them scored first)",
        );
    }
    if o.samples.len() > MAX_SAMPLES {
        v.push(&samples, format!("has {} samples; the limit is {MAX_SAMPLES}", o.samples.len()));
    } else {
        let mut seen = HashSet::new();
        for (i, s) in o.samples.iter().enumerate() {
            if s.id.is_empty() {
                v.push(format!("{samples}[{i}].id"), "must not be empty");
            } else if !seen.insert(s.id.as_str()) {
                v.push(format!("{samples}[{i}].id"), format!("duplicate id {:?}", s.id));
            }
            if s.text.trim().is_empty() {
                v.push(format!("{samples}[{i}].text"), "must not be empty");
            }
            if s.text.len() > MAX_TEXT_BYTES {
                v.push(
                    format!("{samples}[{i}].text"),
                    format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", s.text.len()),
                );
            }
        }
    }
    if o.input.len() > MAX_TEXT_BYTES {
        v.push(join(prefix, "input"), format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", o.input.len()));
    }
    unit_interval(o.threshold, join(prefix, "threshold"), v);
    if o.max_samples == Some(0) {
        v.push(join(prefix, "max_samples"), "must be at least 1 when set");
    }
    concurrency_limit(o.concurrency, join(prefix, "concurrency"), v);
}

pub fn validate_select(o: &SelectOptions, prefix: &str, v: &mut Violations) {
    if let Some(m) = o.max_questions
        && (m < 1 || m as usize > MAX_ITEMS)
    {
        v.push(join(prefix, "max_questions"), format!("must be between 1 and {MAX_ITEMS} (got {m})"));
    }
    if let Some(b) = o.beam_width
        && !(1..=MAX_BEAM_WIDTH).contains(&b)
    {
        v.push(join(prefix, "beam_width"), format!("must be between 1 and {MAX_BEAM_WIDTH} (got {b})"));
    }
    if let Some(l) = o.length_penalty
        && !(l.is_finite() && l >= 0.0)
    {
        v.push(join(prefix, "length_penalty"), format!("must be a finite number >= 0 (got {l})"));
    }
    if let Some(a) = o.alpha
        && !(0.0..=1.0).contains(&a)
    {
        v.push(join(prefix, "alpha"), format!("must be in [0, 1] (got {a})"));
    }
    let coverage = join(prefix, "coverage");
    if o.coverage.len() > MAX_COVERAGE_ENTRIES {
        v.push(&coverage, format!("has {} entries; the limit is {MAX_COVERAGE_ENTRIES}", o.coverage.len()));
    } else {
        for (i, c) in o.coverage.iter().enumerate() {
            if c.observation.len() > MAX_TEXT_BYTES {
                v.push(
                    format!("{coverage}[{i}].observation"),
                    format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", c.observation.len()),
                );
            }
            if c.item_ids.len() > MAX_ITEMS {
                v.push(
                    format!("{coverage}[{i}].item_ids"),
                    format!("has {} ids; the limit is {MAX_ITEMS}", c.item_ids.len()),
                );
            }
        }
    }
}

fn validate_steps_into(steps: &[RefinerStep], v: &mut Violations) {
    if steps.is_empty() {
        v.push("steps", "must not be empty");
    }
    if steps.len() > MAX_STEPS {
        v.push("steps", format!("has {} steps; the limit is {MAX_STEPS}", steps.len()));
    }
    for (i, step) in steps.iter().enumerate() {
        let prefix = format!("steps[{i}].{}", step.field());
        match step {
            RefinerStep::Deduplicate(o) => validate_dedup(o, &prefix, v),
            RefinerStep::Tag(o) => validate_tag(o, &prefix, v),
            RefinerStep::UnitTest(o) => validate_unit_test(o, &prefix, v),
            RefinerStep::Select(o) => validate_select(o, &prefix, v),
        }
    }
}

/// Every rule on a chain's steps, with field paths `steps[i].<refiner>.<field>`; bad input ->
/// INVALID_ARGUMENT naming the field.
pub fn validate_steps(steps: &[RefinerStep]) -> Result<(), StageError> {
    let mut v = Violations::new();
    validate_steps_into(steps, &mut v);
    v.into_result()
}

/// Rules on a chain's items and steps together.
pub fn validate_chain(items: &[ChecklistItem], steps: &[RefinerStep]) -> Result<(), StageError> {
    let mut v = Violations::new();
    validate_items(items, "items", &mut v);
    validate_steps_into(steps, &mut v);
    v.into_result()
}

/// The checklist refiners stage: an ordered chain of steps, each fed the previous step's items.
#[async_trait::async_trait]
pub trait ChecklistRefiner: Send + Sync {
    /// Run `steps` in order on `items`, reporting each finished step to `events`. Field paths of
    /// errors are the chain's (`items[i].question`, `steps[i].deduplicate.threshold`).
    async fn refine(
        &self,
        items: Vec<ChecklistItem>,
        steps: Vec<RefinerStep>,
        events: EventSink<'_, StepReport>,
    ) -> Result<ChainOutcome, StageError>;
}
