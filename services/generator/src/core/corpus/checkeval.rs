//! `checkeval` (deductive): questions from dimension definitions.
//!
//! Per dimension (dimensions concurrently, bounded), one call writes the questions for every
//! sub-dimension (none given: one `General` sub-dimension): 2 per sub-dimension in `seed` mode,
//! 5 in `elaboration`, 4 in `diversification`. `combined` writes seeds (2), then elaborates (5) and
//! diversifies (4) the seeds in two independent calls and merges the three pools by exact text,
//! seeds first. Category = dimension name. With `filter`, one call per question keeps those that
//! pass both alignment ("yes" means better) and dimension consistency; a judgement that cannot be
//! read keeps the question (as the original) and is counted. Deduplication (0.85) follows in the
//! built-in refinement, with `filter` only (the original ties redundancy removal to filtering).
//!
//! The task type and the dimensions are caller text, the current questions (augmentation) and the
//! question under review (filter) model text: each prompt quotes them between tags, fenced
//! ([`fence_untrusted`]), after the rule that they are material, not instructions.

use std::sync::atomic::{AtomicU32, Ordering};

use assay_domain::template::{fence_untrusted, render};
use assay_domain::{ChecklistItem, StageError, UnusableReply};
use futures::StreamExt;
use serde_json::{Value, json};

use super::reply::{find_list, same_name, str_field, text_of};
use super::run::{Generated, Run};
use crate::core::parse::MAX_QUESTION_CHARS;
use assay_domain::generator::corpus::{AugmentationMode, Dimension, stages};

pub const GENERATE_TEMPLATE: &str = include_str!("../../../prompts/corpus/checkeval_generate.txt");
pub const AUGMENT_TEMPLATE: &str = include_str!("../../../prompts/corpus/checkeval_augment.txt");
pub const FILTER_TEMPLATE: &str = include_str!("../../../prompts/corpus/checkeval_filter.txt");
/// Placeholders of the generation and augmentation templates.
pub const PLACEHOLDERS: &[&str] = &[
    "task_type",
    "dimension_name",
    "definition",
    "sub_dimensions",
    "questions_per_sub",
    "existing_questions",
    "augmentation_mode",
    "augmentation_instructions",
];
/// Placeholders of the filter template.
pub const FILTER_PLACEHOLDERS: &[&str] = &["dimension_name", "dimension_definition", "question"];
/// Task type shown when the request has no corpus description.
pub const DEFAULT_TASK_TYPE: &str = "general";
/// Sub-dimension used when a dimension has none.
pub const GENERAL: &str = "General";
/// Seed questions per sub-dimension.
pub const SEED_QUESTIONS: u32 = 2;
/// Elaboration questions per sub-dimension.
pub const ELABORATION_QUESTIONS: u32 = 5;
/// Diversification questions per sub-dimension.
pub const DIVERSIFICATION_QUESTIONS: u32 = 4;
/// Filter temperature.
pub const FILTER_TEMPERATURE: f64 = 0.0;
const TOKENS_PER_QUESTION: u32 = 80;

/// Metadata key of the augmentation a question came from.
pub const AUGMENTATION_SOURCE: &str = "augmentation_source";

const ELABORATION_INSTRUCTIONS: &str = "Elaboration: make the checks more detailed. Break broad criteria into \
specific points a reviewer can verify, and add checks for the usual ways responses fail on this dimension \
(for example transitions, consistency, structure).";
const DIVERSIFICATION_INSTRUCTIONS: &str = "Diversification: check the same criteria in other ways. Use different \
wording, look from another perspective (the reader's, the task's), or test the criterion through a different \
observable sign, while keeping \"yes\" as the better answer.";

/// Questions per sub-dimension one call of `mode` asks for (combined: the seeds).
pub fn questions_per_sub(mode: AugmentationMode) -> u32 {
    match mode {
        AugmentationMode::Seed | AugmentationMode::Combined => SEED_QUESTIONS,
        AugmentationMode::Elaboration => ELABORATION_QUESTIONS,
        AugmentationMode::Diversification => DIVERSIFICATION_QUESTIONS,
    }
}

/// One question of a dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct DimQuestion {
    pub question: String,
    pub sub_aspect: String,
    /// seed | elaboration | diversification.
    pub source: &'static str,
}

/// The sub-dimension names of `d` (`General` when it has none).
pub fn sub_names(d: &Dimension) -> Vec<String> {
    if d.sub_dimensions.is_empty() {
        vec![GENERAL.to_string()]
    } else {
        d.sub_dimensions.iter().map(|s| s.name.trim().to_string()).collect()
    }
}

fn sub_dimensions_text(d: &Dimension) -> String {
    if d.sub_dimensions.is_empty() {
        return format!("- {GENERAL}");
    }
    d.sub_dimensions
        .iter()
        .map(|s| match s.definition.trim() {
            "" => format!("- {}", s.name.trim()),
            def => format!("- {}: {def}", s.name.trim()),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Reply schema: at most `max` questions, each tagged with one of `subs`.
pub fn schema(subs: &[String], max: u32) -> Value {
    json!({
        "type": "object",
        "properties": {
            "questions": {
                "type": "array",
                "minItems": 1,
                "maxItems": max,
                "items": {
                    "type": "object",
                    "properties": {
                        "question": {"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS},
                        "sub_aspect": {"type": "string", "enum": subs}
                    },
                    "required": ["question", "sub_aspect"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["questions"],
        "additionalProperties": false
    })
}

/// Read a question reply: cleaned questions, at most `max`, each with its sub-dimension (matched
/// to the declared names ignoring case; missing: the only sub-dimension, else `General`).
/// Returns the questions and how many were beyond `max`.
pub fn parse_questions(
    value: &Value,
    subs: &[String],
    max: u32,
    source: &'static str,
) -> Result<(Vec<DimQuestion>, u32), UnusableReply> {
    let list = find_list(value, &["questions", "items"])
        .ok_or_else(|| UnusableReply::from("the reply's JSON has no list of questions"))?;
    let mut out = Vec::new();
    let mut dropped = 0;
    for entry in list {
        let Some(question) = text_of(entry) else { continue };
        if out.len() as u32 >= max {
            dropped += 1;
            continue;
        }
        let written = str_field(entry, &["sub_aspect", "sub_dimension", "aspect"]);
        let sub_aspect = match written {
            Some(w) => subs.iter().find(|s| same_name(s, &w)).cloned().unwrap_or(w),
            None if subs.len() == 1 => subs[0].clone(),
            None => GENERAL.to_string(),
        };
        out.push(DimQuestion { question, sub_aspect, source });
    }
    Ok((out, dropped))
}

/// Merge pools by exact (trimmed) question text; earlier pools win.
pub fn merge_by_text(pools: Vec<Vec<DimQuestion>>) -> Vec<DimQuestion> {
    let mut seen = std::collections::HashSet::new();
    pools.into_iter().flatten().filter(|q| seen.insert(q.question.trim().to_string())).collect()
}

/// A filter judgement: `(alignment_pass, dimension_consistent)`, or `None` when unreadable.
pub fn parse_judgement(value: &Value) -> Option<(bool, bool)> {
    let o = value.as_object()?;
    let flag = |keys: &[&str]| {
        keys.iter().find_map(|k| match o.get(*k)? {
            Value::Bool(b) => Some(*b),
            Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "pass" => Some(true),
                "false" | "no" | "fail" => Some(false),
                _ => None,
            },
            Value::Null | Value::Number(_) | Value::Array(_) | Value::Object(_) => None,
        })
    };
    Some((flag(&["alignment_pass", "alignment"])?, flag(&["dimension_consistent", "consistency"])?))
}

/// The prompt of one call for dimension `d` of a `task_type` task: generation when `existing` is
/// empty, else augmentation of the `existing` questions in `mode`; `per_sub` questions per
/// sub-dimension.
pub fn questions_prompt(
    task_type: &str,
    d: &Dimension,
    per_sub: u32,
    mode: AugmentationMode,
    existing: &[DimQuestion],
) -> String {
    let template = if existing.is_empty() { GENERATE_TEMPLATE } else { AUGMENT_TEMPLATE };
    let instructions = match mode {
        AugmentationMode::Elaboration => ELABORATION_INSTRUCTIONS,
        AugmentationMode::Diversification => DIVERSIFICATION_INSTRUCTIONS,
        AugmentationMode::Seed | AugmentationMode::Combined => "",
    };
    let existing: String =
        existing.iter().map(|q| format!("- [{}] {}", q.sub_aspect, q.question)).collect::<Vec<_>>().join("\n");
    render(
        template,
        &[
            ("task_type", &fence_untrusted(task_type.trim())),
            ("dimension_name", &fence_untrusted(d.name.trim())),
            ("definition", &fence_untrusted(d.definition.trim())),
            ("sub_dimensions", &fence_untrusted(&sub_dimensions_text(d))),
            ("questions_per_sub", &per_sub.to_string()),
            ("existing_questions", &fence_untrusted(&existing)),
            ("augmentation_mode", mode.name()),
            ("augmentation_instructions", instructions),
        ],
    )
}

/// The filter prompt for `question` of the dimension `name` defined as `definition`.
pub fn filter_prompt(name: &str, definition: &str, question: &str) -> String {
    render(
        FILTER_TEMPLATE,
        &[
            ("dimension_name", &fence_untrusted(name)),
            ("dimension_definition", &fence_untrusted(definition)),
            ("question", &fence_untrusted(question)),
        ],
    )
}

struct Call<'r> {
    run: &'r Run<'r>,
    dimension: &'r Dimension,
    subs: Vec<String>,
    task_type: &'r str,
}

impl Call<'_> {
    /// One generation (`existing` empty) or augmentation call of `mode`.
    async fn questions(
        &self,
        mode: AugmentationMode,
        existing: &[DimQuestion],
    ) -> Result<(Vec<DimQuestion>, u32), StageError> {
        let per_sub = match (mode, existing.is_empty()) {
            (AugmentationMode::Combined, _) | (_, true) => questions_per_sub(mode),
            (AugmentationMode::Elaboration, false) => ELABORATION_QUESTIONS,
            (AugmentationMode::Diversification, false) => DIVERSIFICATION_QUESTIONS,
            (AugmentationMode::Seed, false) => SEED_QUESTIONS,
        };
        let max = per_sub * self.subs.len() as u32;
        let (source, what) = if existing.is_empty() {
            (if mode == AugmentationMode::Combined { "seed" } else { mode.name() }, "checkeval questions")
        } else {
            (mode.name(), "checkeval augmentation")
        };
        let prompt = questions_prompt(self.task_type, self.dimension, per_sub, mode, existing);
        let max_tokens = budget(max);
        let value =
            self.run.call_json(what, prompt, schema(&self.subs, max), self.run.temperature(), max_tokens).await?;
        parse_questions(&value, &self.subs, max, source).map_err(|why| {
            StageError::Unavailable(format!(
                "the {what} reply for dimension {:?} could not be read: {why}",
                self.dimension.name.trim()
            ))
        })
    }
}

/// Questions of one dimension in `mode`, with the count dropped beyond the bounds.
async fn dimension_questions(
    run: &Run<'_>,
    dimension: &Dimension,
    task_type: &str,
) -> Result<(Vec<DimQuestion>, u32), StageError> {
    let call = Call { run, dimension, subs: sub_names(dimension), task_type };
    let mode = run.request.augmentation;
    match mode {
        AugmentationMode::Seed | AugmentationMode::Elaboration | AugmentationMode::Diversification => {
            call.questions(mode, &[]).await
        }
        AugmentationMode::Combined => {
            let (seeds, d0) = call.questions(AugmentationMode::Combined, &[]).await?;
            let (elaborated, diversified) = futures::future::join(
                call.questions(AugmentationMode::Elaboration, &seeds),
                call.questions(AugmentationMode::Diversification, &seeds),
            )
            .await;
            let ((elaborated, d1), (diversified, d2)) = (elaborated?, diversified?);
            Ok((merge_by_text(vec![seeds, elaborated, diversified]), d0 + d1 + d2))
        }
    }
}

pub(crate) async fn generate(run: &Run<'_>) -> Result<Generated, StageError> {
    let request = run.request;
    let task_type = match request.corpus_description.trim() {
        "" => DEFAULT_TASK_TYPE,
        t => t,
    };
    let total = request.dimensions.len() as u32;
    let done = AtomicU32::new(0);
    let per_dimension: Vec<Result<(Vec<DimQuestion>, u32), StageError>> =
        futures::stream::iter(0..request.dimensions.len())
            .map(|i| {
                let done = &done;
                let d = &request.dimensions[i];
                async move {
                    let out = dimension_questions(run, d, task_type).await?;
                    let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                    run.emit(
                        stages::DIMENSION,
                        n,
                        total,
                        format!("dimension {:?}: {} questions", d.name.trim(), out.0.len()),
                    );
                    Ok(out)
                }
            })
            .buffered(run.concurrency)
            .collect()
            .await;
    let mut items = Vec::new();
    let mut dropped = 0u32;
    for (d, result) in request.dimensions.iter().zip(per_dimension) {
        let (questions, over) = result?;
        dropped += over;
        let name = d.name.trim().to_string();
        for q in questions {
            let mut item = ChecklistItem::new(format!("ce-{}", items.len()), q.question);
            item.category = Some(name.clone());
            item.metadata.insert("dimension".into(), name.clone());
            item.metadata.insert("sub_aspect".into(), q.sub_aspect);
            item.metadata.insert(AUGMENTATION_SOURCE.into(), q.source.to_string());
            items.push(item);
        }
    }
    let raw_questions = items.len() as u32;
    let mut metadata = vec![
        ("dimension_count".to_string(), total.to_string()),
        ("augmentation_mode".to_string(), request.augmentation.name().to_string()),
        ("task_type".to_string(), task_type.to_string()),
    ];
    // As the original: max_questions keeps the first n generated questions (before filtering).
    if let Some(max) = request.refinement.max_questions
        && items.len() > max as usize
    {
        dropped += (items.len() - max as usize) as u32;
        items.truncate(max as usize);
    }
    if dropped > 0 {
        metadata.push(("dropped_questions".to_string(), dropped.to_string()));
    }
    if request.filter && !items.is_empty() {
        let (kept, stats) = filter(run, items).await?;
        items = kept;
        metadata.extend(stats);
    }
    // The model record reports the largest generation budget of the run.
    let per_sub = match request.augmentation {
        AugmentationMode::Combined => ELABORATION_QUESTIONS,
        m @ (AugmentationMode::Seed | AugmentationMode::Elaboration | AugmentationMode::Diversification) => {
            questions_per_sub(m)
        }
    };
    let subs = request.dimensions.iter().map(|d| sub_names(d).len() as u32).max().unwrap_or(1);
    Ok(Generated { items, raw_questions, metadata, max_tokens: budget(per_sub * subs) })
}

/// Reply budget for `max` questions.
fn budget(max: u32) -> u32 {
    (TOKENS_PER_QUESTION * max + 256).clamp(1024, 16_384)
}

fn filter_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "reasoning": {"type": "string", "maxLength": 400},
            "alignment_pass": {"type": "boolean"},
            "dimension_consistent": {"type": "boolean"}
        },
        "required": ["reasoning", "alignment_pass", "dimension_consistent"],
        "additionalProperties": false
    })
}

/// The alignment / dimension-consistency filter: one call per question (bounded), kept iff both
/// pass; unreadable judgements keep the question and are counted.
async fn filter(
    run: &Run<'_>,
    items: Vec<ChecklistItem>,
) -> Result<(Vec<ChecklistItem>, Vec<(String, String)>), StageError> {
    let dims = &run.request.dimensions;
    let items_ref = &items;
    let judged: Vec<Result<Option<(bool, bool)>, StageError>> = futures::stream::iter(0..items.len())
        .map(|i| async move {
            let item = &items_ref[i];
            let name = item.category.clone().unwrap_or_default();
            let definition = dims
                .iter()
                .find(|d| d.name.trim() == name)
                .map(|d| d.definition.trim().to_string())
                .unwrap_or_default();
            let definition = if definition.is_empty() { "(no definition given)".to_string() } else { definition };
            let prompt = filter_prompt(&name, &definition, &item.question);
            // A reply without JSON is an unreadable judgement; backend failures end the run.
            let (value, _) =
                run.call_value("checkeval filter", prompt, filter_schema(), FILTER_TEMPERATURE, 512).await?;
            Ok(value.as_ref().and_then(parse_judgement))
        })
        .buffered(run.concurrency)
        .collect()
        .await;
    let total = items.len() as u32;
    let (mut alignment, mut consistency, mut unreadable) = (0u32, 0u32, 0u32);
    let mut kept = Vec::new();
    for (item, j) in items.into_iter().zip(judged) {
        match j? {
            Some((true, true)) => kept.push(item),
            Some((a, c)) => {
                alignment += u32::from(!a);
                consistency += u32::from(!c);
            }
            None => {
                unreadable += 1;
                kept.push(item);
            }
        }
    }
    run.emit(
        stages::FILTER,
        total,
        total,
        format!(
            "kept {} of {total} questions ({alignment} failed alignment, {consistency} failed dimension consistency, \
             {unreadable} unreadable judgements kept)",
            kept.len()
        ),
    );
    let stats = vec![
        ("alignment_filtered".to_string(), alignment.to_string()),
        ("consistency_filtered".to_string(), consistency.to_string()),
        ("filter_unreadable".to_string(), unreadable.to_string()),
    ];
    Ok((kept, stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::corpus::SubDimension;

    fn q(text: &str, source: &'static str) -> DimQuestion {
        DimQuestion { question: text.into(), sub_aspect: GENERAL.into(), source }
    }

    #[test]
    fn counts_per_mode() {
        assert_eq!(questions_per_sub(AugmentationMode::Seed), 2);
        assert_eq!(questions_per_sub(AugmentationMode::Elaboration), 5);
        assert_eq!(questions_per_sub(AugmentationMode::Diversification), 4);
        assert_eq!(questions_per_sub(AugmentationMode::Combined), 2);
    }

    #[test]
    fn combined_merges_by_exact_text_earlier_pools_first() {
        let merged = merge_by_text(vec![
            vec![q("Is it clear?", "seed"), q("Is it short?", "seed")],
            vec![q("Is it clear? ", "elaboration"), q("Is it precise?", "elaboration")],
            vec![q("is it clear?", "diversification"), q("Is it short?", "diversification")],
        ]);
        let got: Vec<(&str, &str)> = merged.iter().map(|q| (q.question.as_str(), q.source)).collect();
        assert_eq!(
            got,
            vec![
                ("Is it clear?", "seed"),
                ("Is it short?", "seed"),
                ("Is it precise?", "elaboration"),
                ("is it clear?", "diversification")
            ]
        );
    }

    #[test]
    fn sub_aspects_are_matched_and_bounded() {
        let subs = vec!["Logical Flow".to_string(), "Consistency".to_string()];
        let v = json!({"questions": [
            {"question": "Does it flow?", "sub_aspect": "logical flow"},
            {"question": "Is it consistent?", "sub_aspect": "Tone"},
            {"question": "Is it tidy?"},
            {"question": "One too many?", "sub_aspect": "Consistency"}
        ]});
        let (got, dropped) = parse_questions(&v, &subs, 3, "seed").unwrap();
        let aspects: Vec<&str> = got.iter().map(|q| q.sub_aspect.as_str()).collect();
        assert_eq!(aspects, vec!["Logical Flow", "Tone", GENERAL]);
        assert_eq!(dropped, 1);
        let d = Dimension {
            name: "c".into(),
            definition: String::new(),
            sub_dimensions: vec![SubDimension { name: " Flow ".into(), definition: "reads on".into() }],
        };
        assert_eq!(sub_names(&d), vec!["Flow"]);
        assert_eq!(sub_dimensions_text(&d), "- Flow: reads on");
    }

    #[test]
    fn judgements_are_read() {
        assert_eq!(
            parse_judgement(&json!({"reasoning": "", "alignment_pass": true, "dimension_consistent": "no"})),
            Some((true, false))
        );
        assert_eq!(parse_judgement(&json!({"alignment_pass": true})), None);
    }

    /// Issue 44: the task type, every part of a dimension, the current questions and the question
    /// under review closing the old `>>>` fence or forging a tag stay inside their quotes.
    #[test]
    fn forged_fences_stay_quoted() {
        use crate::core::quoted::{FORGED, assert_injection_quoted, forged};
        // The caller's task type and dimension share one quote: one injection in all of them.
        let d = Dimension {
            name: "Coherence".into(),
            definition: "The summary is well structured.".into(),
            sub_dimensions: vec![
                SubDimension { name: "Logic".into(), definition: "ideas follow".into() },
                SubDimension { name: "Structure".into(), definition: String::new() },
            ],
        };
        let mut injected = d.clone();
        injected.sub_dimensions[0].definition = forged("ideas follow");
        let seeds = vec![q(&forged("Is it clear?"), "seed")];
        let prompts = [
            ("checkeval generate", questions_prompt(&forged("summarization"), &d, 2, AugmentationMode::Seed, &[]), 0),
            ("checkeval generate", questions_prompt("summarization", &injected, 2, AugmentationMode::Seed, &[]), 0),
            (
                "checkeval augment",
                questions_prompt("summarization", &injected, 5, AugmentationMode::Elaboration, &seeds),
                1,
            ),
        ];
        for (name, p, drafts) in prompts {
            assert_injection_quoted(name, &p, &[("brief", 1), ("draft", drafts)]);
            assert!(p.lines().any(|l| l == "DIMENSION: Coherence"), "{name}: {p}");
        }
        let mut named = d.clone();
        named.name = format!("Coherence{FORGED}");
        let p = questions_prompt("summarization", &named, 2, AugmentationMode::Seed, &[]);
        assert_injection_quoted("checkeval dimension name", &p, &[("brief", 1)]);
        let p = filter_prompt("Coherence", &forged("The summary is well structured."), &forged("Is it clear?"));
        assert_injection_quoted("checkeval filter", &p, &[("brief", 1), ("question", 1)]);
        assert!(p.contains("\nQUESTION: <question>Is it clear?\n>>>\n‹/instruction>"), "{p}");
        for t in [GENERATE_TEMPLATE, AUGMENT_TEMPLATE, FILTER_TEMPLATE] {
            assert!(!t.contains("<<<") && !t.contains(">>>"));
        }
    }

    #[test]
    fn templates_use_only_known_placeholders() {
        for t in [GENERATE_TEMPLATE, AUGMENT_TEMPLATE] {
            assert!(assay_domain::template::unknown_placeholders(t, PLACEHOLDERS).is_empty());
        }
        assert!(assay_domain::template::unknown_placeholders(FILTER_TEMPLATE, FILTER_PLACEHOLDERS).is_empty());
        assert!(AUGMENT_TEMPLATE.contains("{existing_questions}"));
    }
}
