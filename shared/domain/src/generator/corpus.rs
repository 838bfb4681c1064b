//! Corpus-level generation requests: one checklist for a
//! whole corpus instead of one instruction. Presets feedback (inductive), checkeval (deductive) and
//! interacteval (interactive), their defaults, the request and its validation.

use crate::Usage;
use crate::limits::{MAX_CHECKLIST_ITEMS, MAX_TEXT_BYTES};

use crate::checklist::Checklist;
use crate::error::{StageError, Violations};
use crate::model::{ModelRecord, ModelSpec};
use crate::score::{PrimaryMetric, ScorerConfig, ScoringMode};

/// Upper bound of interacteval's validated list unless the request sets `refinement.max_questions`.
pub const MAX_FINAL_QUESTIONS: u32 = 15;
/// Most observations one request may carry.
pub const MAX_OBSERVATIONS: usize = 10_000;
/// Longest observation (bytes).
pub const MAX_OBSERVATION_BYTES: usize = 16 * 1024;
/// Most bytes of all observations together.
pub const MAX_CORPUS_BYTES: usize = 8 * 1024 * 1024;
/// Observations per feedback call unless the request sets `batch_size`.
pub const DEFAULT_BATCH_SIZE: u32 = 100;
/// Largest `batch_size`.
pub const MAX_BATCH_SIZE: u32 = 500;
/// Most dimensions (checkeval).
pub const MAX_DIMENSIONS: usize = 50;
/// Most sub-dimensions per dimension.
pub const MAX_SUB_DIMENSIONS: usize = 20;
/// Longest dimension or sub-dimension name (bytes).
pub const MAX_NAME_BYTES: usize = 200;
/// Longest dimension or sub-dimension definition (bytes).
pub const MAX_DEFINITION_BYTES: usize = 16 * 1024;
/// Largest `concurrency`.
pub const MAX_CONCURRENCY: u32 = 64;
/// Deduplicator similarity threshold unless the request sets one.
pub const DEFAULT_DEDUP_THRESHOLD: f64 = 0.85;
/// Selector budget (feedback) unless the request sets `max_questions`.
pub const DEFAULT_MAX_QUESTIONS: u32 = 20;

/// Request fields corpus presets require or check (as named in errors).
pub mod fields {
    pub const PRESET: &str = "preset";
    pub const OBSERVATIONS: &str = "observations";
    pub const DIMENSIONS: &str = "dimensions";
    pub const BATCH_SIZE: &str = "batch_size";
    pub const CONCURRENCY: &str = "concurrency";
    pub const CORPUS_DESCRIPTION: &str = "corpus_description";
    pub const DEDUP_THRESHOLD: &str = "refinement.dedup_threshold";
    pub const MAX_QUESTIONS: &str = "refinement.max_questions";
    pub const RUN_UNIT_TESTER: &str = "refinement.run_unit_tester";
}

/// Progress stage names (the `stage` of [`CorpusProgress`]).
pub mod stages {
    /// One feedback batch answered.
    pub const BATCH: &str = "batch";
    /// One checkeval dimension generated.
    pub const DIMENSION: &str = "dimension";
    /// Checkeval alignment / consistency filter done.
    pub const FILTER: &str = "filter";
    /// One built-in refiner step done (the message names the refiner).
    pub const REFINE: &str = "refine";
    /// Interacteval stages, in order.
    pub const EXTRACT_COMPONENTS: &str = "extract_components";
    pub const CLUSTER: &str = "cluster";
    pub const KEY_QUESTIONS: &str = "key_questions";
    pub const SUB_QUESTIONS: &str = "sub_questions";
    pub const VALIDATE: &str = "validate";
}

/// A corpus-level preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CorpusPreset {
    /// Inductive: questions from feedback comments, then Deduplicator -> Tagger -> Selector.
    Feedback,
    /// Deductive: questions from dimension definitions.
    CheckEval,
    /// Interactive: five stages from think-aloud notes.
    InteractEval,
}

impl CorpusPreset {
    pub const ALL: [CorpusPreset; 3] = [CorpusPreset::Feedback, CorpusPreset::CheckEval, CorpusPreset::InteractEval];

    /// The preset's name (also the checklist's `source_method`).
    pub fn name(self) -> &'static str {
        match self {
            CorpusPreset::Feedback => "feedback",
            CorpusPreset::CheckEval => "checkeval",
            CorpusPreset::InteractEval => "interacteval",
        }
    }

    /// The preset with this name (case-insensitive), if any.
    pub fn from_name(name: &str) -> Option<CorpusPreset> {
        let name = name.trim();
        CorpusPreset::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// Request fields the preset requires.
    pub fn required_fields(self) -> Vec<&'static str> {
        match self {
            CorpusPreset::Feedback | CorpusPreset::InteractEval => vec![fields::OBSERVATIONS],
            CorpusPreset::CheckEval => vec![fields::DIMENSIONS],
        }
    }

    /// Questions kept at most unless the request sets `refinement.max_questions`: the Selector's
    /// budget (feedback), the validation stage's upper bound (interacteval); checkeval keeps every
    /// question (0 = no limit).
    pub fn default_max_items(self) -> u32 {
        match self {
            CorpusPreset::Feedback => DEFAULT_MAX_QUESTIONS,
            CorpusPreset::CheckEval => 0,
            CorpusPreset::InteractEval => MAX_FINAL_QUESTIONS,
        }
    }

    /// Temperature of the generation calls unless the request's model spec sets one.
    pub fn default_temperature(self) -> f64 {
        match self {
            CorpusPreset::Feedback | CorpusPreset::CheckEval | CorpusPreset::InteractEval => 0.7,
        }
    }

    /// Scorer configuration checklists of this preset are meant for: batch, pass rate.
    pub fn default_scorer(self) -> ScorerConfig {
        match self {
            CorpusPreset::Feedback | CorpusPreset::CheckEval | CorpusPreset::InteractEval => ScorerConfig {
                mode: ScoringMode::Batch,
                primary_metric: PrimaryMetric::Pass,
                ..ScorerConfig::default()
            },
        }
    }
}

impl std::fmt::Display for CorpusPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How checkeval augments its questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AugmentationMode {
    /// 2 questions per sub-dimension (the default, as in the original).
    #[default]
    Seed,
    /// 5 detailed questions per sub-dimension.
    Elaboration,
    /// 4 alternative framings per sub-dimension.
    Diversification,
    /// Seeds, then elaboration and diversification of the seeds, merged by exact text.
    Combined,
}

impl AugmentationMode {
    pub fn name(self) -> &'static str {
        match self {
            AugmentationMode::Seed => "seed",
            AugmentationMode::Elaboration => "elaboration",
            AugmentationMode::Diversification => "diversification",
            AugmentationMode::Combined => "combined",
        }
    }
}

/// A sub-dimension of a checkeval dimension.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubDimension {
    pub name: String,
    pub definition: String,
}

/// An evaluation dimension (checkeval; interacteval takes at most one: its name and definition).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dimension {
    pub name: String,
    pub definition: String,
    pub sub_dimensions: Vec<SubDimension>,
}

/// Which built-in refiners run (feedback: all four steps; checkeval: deduplication only;
/// interacteval: none, its validation stage is the refinement).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CorpusRefinement {
    pub skip_deduplication: bool,
    pub skip_tagging: bool,
    /// UnitTester, off by default; feedback runs it after the Tagger with `unit_test_samples`.
    pub run_unit_tester: bool,
    pub skip_selection: bool,
    /// Deduplicator threshold, in (0, 1] (default 0.85).
    pub dedup_threshold: Option<f64>,
    /// feedback: the Selector's budget (default 20); checkeval: keep the first n generated
    /// questions (as the original); interacteval: upper bound of the validated list (default 15).
    pub max_questions: Option<u32>,
    /// feedback: the Selector's beam width (default 5).
    pub beam_width: Option<u32>,
    /// feedback: the Selector's penalty per selected question (default 0.0005).
    pub length_penalty: Option<f64>,
    /// feedback: the Selector's weight of coverage against diversity (default 0.5).
    pub alpha: Option<f64>,
    /// feedback: sample responses for the UnitTester, scored against the questions first.
    pub unit_test_samples: Vec<String>,
}

/// Most UnitTester samples a corpus request may carry (each is scored against every question).
pub const MAX_UNIT_TEST_SAMPLES: usize = 20;

/// Corpus-level generation with a preset.
#[derive(Debug, Clone, PartialEq)]
pub struct CorpusRequest {
    pub preset: CorpusPreset,
    /// What the corpus is about (feedback: the domain; checkeval: the task type; interacteval: the
    /// rubric when no dimension is given).
    pub corpus_description: String,
    /// feedback: feedback comments; interacteval: think-aloud notes.
    pub observations: Vec<String>,
    /// feedback: observations per call (default 100).
    pub batch_size: Option<u32>,
    /// checkeval: the dimensions; interacteval: at most one, naming the evaluated dimension.
    pub dimensions: Vec<Dimension>,
    pub augmentation: AugmentationMode,
    /// checkeval: run the alignment / dimension-consistency filter.
    pub filter: bool,
    pub refinement: CorpusRefinement,
    pub model: ModelSpec,
    pub embedding_model: ModelSpec,
    /// Concurrent model calls (None: the service default).
    pub concurrency: Option<u32>,
}

impl CorpusRequest {
    /// A request for `preset`, everything else unset.
    pub fn new(preset: CorpusPreset) -> Self {
        Self {
            preset,
            corpus_description: String::new(),
            observations: Vec::new(),
            batch_size: None,
            dimensions: Vec::new(),
            augmentation: AugmentationMode::default(),
            filter: false,
            refinement: CorpusRefinement::default(),
            model: ModelSpec::default(),
            embedding_model: ModelSpec::default(),
            concurrency: None,
        }
    }

    /// Generation temperature: the request's model spec, else the preset's.
    pub fn effective_temperature(&self) -> f64 {
        self.model.temperature.unwrap_or_else(|| self.preset.default_temperature())
    }

    /// Observations per feedback call.
    pub fn effective_batch_size(&self) -> u32 {
        self.batch_size.unwrap_or(DEFAULT_BATCH_SIZE)
    }

    /// Every domain-level rule of the request ([`validate`]).
    pub fn validate(&self) -> Result<(), StageError> {
        validate(self)
    }
}

/// A corpus-level checklist with what it took.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CorpusOutcome {
    pub checklist: Checklist,
    /// Questions before refinement (after merging by exact text for checkeval combined).
    pub raw_questions: u32,
    /// Summed over every model call, the built-in refiners included.
    pub usage: Usage,
    /// The generation calls (phase `generator`).
    pub model: ModelRecord,
}

/// One progress event of a corpus generation: per batch, per dimension, per stage, per refiner.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CorpusProgress {
    /// One of [`stages`].
    pub stage: String,
    pub message: String,
    pub done: u32,
    pub total: u32,
}

impl CorpusProgress {
    pub fn new(stage: &str, done: u32, total: u32, message: impl Into<String>) -> Self {
        Self { stage: stage.to_string(), message: message.into(), done, total }
    }
}

fn text_limit(text: &str, field: &str, max: usize, v: &mut Violations) {
    if text.len() > max {
        v.push(field, format!("is {} bytes; the limit is {max} bytes", text.len()));
    }
}

/// A named, defined entry (dimension or sub-dimension) at `field`: name required and unique (case
/// and surrounding spaces ignored) among `seen`, both texts within their limits.
fn check_named(
    name: &str,
    definition: &str,
    field: &str,
    what: &str,
    seen: &mut std::collections::HashSet<String>,
    v: &mut Violations,
) {
    if name.trim().is_empty() {
        v.push(format!("{field}.name"), "is required");
    } else if !seen.insert(name.trim().to_lowercase()) {
        v.push(format!("{field}.name"), format!("duplicate {what} {:?}", name.trim()));
    }
    text_limit(name, &format!("{field}.name"), MAX_NAME_BYTES, v);
    text_limit(definition, &format!("{field}.definition"), MAX_DEFINITION_BYTES, v);
}

/// Every domain-level rule of a corpus request: the preset's required fields, counts, limits and
/// ranges. Pure: callers (the gRPC adapter, the gateway) may run it before any work starts.
pub fn validate(request: &CorpusRequest) -> Result<(), StageError> {
    let mut v = Violations::new();
    let preset = request.preset;
    let uses_observations = matches!(preset, CorpusPreset::Feedback | CorpusPreset::InteractEval);
    if uses_observations {
        if request.observations.is_empty() {
            v.push(fields::OBSERVATIONS, format!("is required by preset {preset}: pass at least one observation"));
        }
    } else if !request.observations.is_empty() {
        v.push(fields::OBSERVATIONS, format!("is not used by preset {preset} (it takes dimensions)"));
    }
    if request.observations.len() > MAX_OBSERVATIONS {
        v.push(
            fields::OBSERVATIONS,
            format!("has {} observations; the limit is {MAX_OBSERVATIONS}", request.observations.len()),
        );
    } else {
        let mut total = 0usize;
        for (i, o) in request.observations.iter().enumerate() {
            if o.trim().is_empty() {
                v.push(format!("observations[{i}]"), "must not be empty");
            }
            text_limit(o, &format!("observations[{i}]"), MAX_OBSERVATION_BYTES, &mut v);
            total += o.len();
        }
        if total > MAX_CORPUS_BYTES {
            v.push(fields::OBSERVATIONS, format!("hold {total} bytes together; the limit is {MAX_CORPUS_BYTES} bytes"));
        }
    }
    match preset {
        CorpusPreset::CheckEval => {
            if request.dimensions.is_empty() {
                v.push(fields::DIMENSIONS, format!("is required by preset {preset}: pass at least one dimension"));
            }
        }
        CorpusPreset::InteractEval => {
            if request.dimensions.len() > 1 {
                v.push(
                    fields::DIMENSIONS,
                    format!(
                        "preset {preset} evaluates one dimension; got {} (run one request per dimension)",
                        request.dimensions.len()
                    ),
                );
            }
        }
        CorpusPreset::Feedback => {
            if !request.dimensions.is_empty() {
                v.push(fields::DIMENSIONS, format!("is not used by preset {preset} (it takes observations)"));
            }
        }
    }
    if request.dimensions.len() > MAX_DIMENSIONS {
        v.push(
            fields::DIMENSIONS,
            format!("has {} dimensions; the limit is {MAX_DIMENSIONS}", request.dimensions.len()),
        );
    }
    let mut names = std::collections::HashSet::new();
    for (i, d) in request.dimensions.iter().enumerate() {
        let f = format!("dimensions[{i}]");
        check_named(&d.name, &d.definition, &f, "dimension", &mut names, &mut v);
        if d.sub_dimensions.len() > MAX_SUB_DIMENSIONS {
            v.push(
                format!("{f}.sub_dimensions"),
                format!("has {} sub-dimensions; the limit is {MAX_SUB_DIMENSIONS}", d.sub_dimensions.len()),
            );
        }
        let mut subs = std::collections::HashSet::new();
        for (j, s) in d.sub_dimensions.iter().enumerate() {
            let g = format!("{f}.sub_dimensions[{j}]");
            check_named(&s.name, &s.definition, &g, "sub-dimension", &mut subs, &mut v);
        }
    }
    if let Some(b) = request.batch_size
        && (b == 0 || b > MAX_BATCH_SIZE)
    {
        v.push(fields::BATCH_SIZE, format!("must be between 1 and {MAX_BATCH_SIZE} when set (got {b})"));
    }
    if let Some(c) = request.concurrency
        && (c == 0 || c > MAX_CONCURRENCY)
    {
        v.push(fields::CONCURRENCY, format!("must be between 1 and {MAX_CONCURRENCY} when set (got {c})"));
    }
    let r = &request.refinement;
    if let Some(t) = r.dedup_threshold
        && (t.is_nan() || t <= 0.0 || t > 1.0)
    {
        v.push(fields::DEDUP_THRESHOLD, format!("must be in (0, 1] (got {t})"));
    }
    if let Some(m) = r.max_questions
        && (m < 1 || m as usize > MAX_CHECKLIST_ITEMS)
    {
        v.push(fields::MAX_QUESTIONS, format!("must be between 1 and {MAX_CHECKLIST_ITEMS} when set (got {m})"));
    }
    // The Selector's own rules, under this request's field names.
    let select = crate::refiners::SelectOptions {
        beam_width: r.beam_width,
        length_penalty: r.length_penalty,
        alpha: r.alpha,
        ..Default::default()
    };
    crate::refiners::validate_select(&select, "refinement", &mut v);
    if r.run_unit_tester && request.preset != CorpusPreset::Feedback {
        v.push(
            fields::RUN_UNIT_TESTER,
            format!("the UnitTester is part of the feedback preset's refinement, not of {}", request.preset),
        );
    } else if r.run_unit_tester && r.unit_test_samples.is_empty() {
        v.push(
            fields::RUN_UNIT_TESTER,
            "needs refinement.unit_test_samples: sample responses the UnitTester scores, rewrites and re-scores",
        );
    } else if !r.run_unit_tester && !r.unit_test_samples.is_empty() {
        v.push(
            "refinement.unit_test_samples",
            "are given but refinement.run_unit_tester is false: set it to run the UnitTester",
        );
    }
    if r.unit_test_samples.len() > MAX_UNIT_TEST_SAMPLES {
        v.push(
            "refinement.unit_test_samples",
            format!("has {} samples; the limit is {MAX_UNIT_TEST_SAMPLES}", r.unit_test_samples.len()),
        );
    }
    for (i, t) in r.unit_test_samples.iter().enumerate() {
        if t.trim().is_empty() {
            v.push(format!("refinement.unit_test_samples[{i}]"), "must not be empty");
        }
        text_limit(t, &format!("refinement.unit_test_samples[{i}]"), MAX_TEXT_BYTES, &mut v);
    }
    text_limit(&request.corpus_description, fields::CORPUS_DESCRIPTION, MAX_TEXT_BYTES, &mut v);
    v.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(e: StageError) -> Vec<String> {
        let StageError::InvalidArgument(v) = e else { panic!("not invalid argument: {e}") };
        v.into_iter().map(|f| f.field).collect()
    }

    fn feedback(n: usize) -> CorpusRequest {
        let mut r = CorpusRequest::new(CorpusPreset::Feedback);
        r.observations = (0..n).map(|i| format!("comment {i}")).collect();
        r
    }

    #[test]
    fn names_round_trip() {
        for p in CorpusPreset::ALL {
            assert_eq!(CorpusPreset::from_name(p.name()), Some(p));
        }
        assert_eq!(CorpusPreset::from_name("tick"), None);
    }

    #[test]
    fn empty_corpus_names_the_field_of_the_preset() {
        let r = CorpusRequest::new(CorpusPreset::Feedback);
        assert_eq!(fields_of(validate(&r).unwrap_err()), vec!["observations"]);
        let r = CorpusRequest::new(CorpusPreset::InteractEval);
        assert_eq!(fields_of(validate(&r).unwrap_err()), vec!["observations"]);
        let r = CorpusRequest::new(CorpusPreset::CheckEval);
        assert_eq!(fields_of(validate(&r).unwrap_err()), vec!["dimensions"]);
        validate(&feedback(3)).unwrap();
    }

    #[test]
    fn ranges_and_limits_are_checked() {
        let mut r = feedback(2);
        r.batch_size = Some(0);
        r.refinement.dedup_threshold = Some(0.0);
        r.refinement.max_questions = Some(0);
        r.concurrency = Some(0);
        assert_eq!(
            fields_of(validate(&r).unwrap_err()),
            vec!["batch_size", "concurrency", "refinement.dedup_threshold", "refinement.max_questions"]
        );
        r = feedback(2);
        r.batch_size = Some(MAX_BATCH_SIZE + 1);
        r.refinement.dedup_threshold = Some(1.5);
        assert_eq!(fields_of(validate(&r).unwrap_err()), vec!["batch_size", "refinement.dedup_threshold"]);
        r.batch_size = Some(MAX_BATCH_SIZE);
        r.refinement.dedup_threshold = Some(1.0);
        validate(&r).unwrap();

        let r = feedback(MAX_OBSERVATIONS + 1);
        let StageError::InvalidArgument(v) = validate(&r).unwrap_err() else { panic!() };
        assert_eq!(v[0].field, "observations");
        assert!(v[0].description.contains("the limit is 10000"), "{}", v[0].description);

        let mut r = feedback(3);
        r.observations[1] = "  ".into();
        r.refinement.run_unit_tester = true;
        assert_eq!(fields_of(validate(&r).unwrap_err()), vec!["observations[1]", "refinement.run_unit_tester"]);
    }

    #[test]
    fn dimensions_are_checked() {
        let mut r = CorpusRequest::new(CorpusPreset::CheckEval);
        r.dimensions = vec![
            Dimension { name: "coherence".into(), ..Default::default() },
            Dimension { name: " ".into(), ..Default::default() },
            Dimension { name: "Coherence".into(), sub_dimensions: vec![SubDimension::default()], ..Default::default() },
        ];
        assert_eq!(
            fields_of(validate(&r).unwrap_err()),
            vec!["dimensions[1].name", "dimensions[2].name", "dimensions[2].sub_dimensions[0].name"]
        );
        let mut r = feedback(1);
        r.preset = CorpusPreset::InteractEval;
        r.dimensions = vec![Dimension { name: "a".into(), ..Default::default() }; 2];
        assert!(fields_of(validate(&r).unwrap_err()).contains(&"dimensions".to_string()));
    }
}
