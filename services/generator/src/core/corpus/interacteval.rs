//! `interacteval` (interactive): five LLM stages from think-aloud notes to a validated checklist.
//!
//! 1. extract components (at most 5) recurring in the notes;
//! 2. cluster the notes under the components;
//! 3. one key question per component;
//! 4. 2-3 sub-questions per key question;
//! 5. validation: the key and sub-questions are checked, merged and rewritten into a final list of
//!    10-15 questions (the upper bound is `refinement.max_questions` when set; the lower bound is
//!    never above the number of candidates).
//!
//! The evaluated dimension is the request's single dimension (name, definition as the rubric),
//! else `quality` with the corpus description as the rubric. Category = dimension name. Stages
//! 1-4 run at the generation temperature (0.7), validation at 0.5 unless the request sets one.
//!
//! The dimension, its rubric and the notes are caller text, the components and questions of
//! earlier stages model text: each prompt quotes them between tags, fenced ([`fence_untrusted`]),
//! after the rule that they are material, not instructions ([`Subject`]).

use assay_domain::template::{fence_untrusted, render};
use assay_domain::{ChecklistItem, StageError};
use serde_json::{Value, json};

use super::reply::{find_list, keyed_entries, same_name, strings, text_of};
use super::run::{Generated, Run};
use crate::core::parse::MAX_QUESTION_CHARS;
use assay_domain::generator::corpus::{CorpusRequest, stages};

pub const COMPONENTS_TEMPLATE: &str = include_str!("../../../prompts/corpus/interacteval_components.txt");
pub const CLUSTER_TEMPLATE: &str = include_str!("../../../prompts/corpus/interacteval_cluster.txt");
pub const KEY_QUESTIONS_TEMPLATE: &str = include_str!("../../../prompts/corpus/interacteval_key_questions.txt");
pub const SUB_QUESTIONS_TEMPLATE: &str = include_str!("../../../prompts/corpus/interacteval_sub_questions.txt");
pub const VALIDATE_TEMPLATE: &str = include_str!("../../../prompts/corpus/interacteval_validate.txt");
/// The five templates in stage order.
pub const TEMPLATES: [&str; 5] =
    [COMPONENTS_TEMPLATE, CLUSTER_TEMPLATE, KEY_QUESTIONS_TEMPLATE, SUB_QUESTIONS_TEMPLATE, VALIDATE_TEMPLATE];
/// Placeholders of the templates.
pub const PLACEHOLDERS: &[&str] = &[
    "dimension",
    "rubric",
    "attributes",
    "max_components",
    "components",
    "components_attributes",
    "key_questions",
    "all_questions",
    "min_questions",
    "max_questions",
];
/// Most components stage 1 keeps.
pub const MAX_COMPONENTS: u32 = 5;
/// Sub-questions per key question.
pub const MIN_SUB_QUESTIONS: u32 = 2;
pub const MAX_SUB_QUESTIONS: u32 = 3;
/// Bounds of the validated list.
pub const MIN_FINAL_QUESTIONS: u32 = 10;
pub use assay_domain::generator::corpus::MAX_FINAL_QUESTIONS;
/// Dimension evaluated when the request names none.
pub const DEFAULT_DIMENSION: &str = "quality";
/// Temperature of the validation stage unless the request sets one.
pub const VALIDATION_TEMPERATURE: f64 = 0.5;
const MAX_NAME_CHARS: u32 = 80;
const STAGES: u32 = 5;

/// A component with its notes, key question and sub-questions as the stages fill them in.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Component {
    pub name: String,
    pub notes: Vec<String>,
    pub key_question: Option<String>,
    pub sub_questions: Vec<String>,
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn question() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS})
}

/// Stage 1: the component names, deduplicated (ignoring case), at most [`MAX_COMPONENTS`].
pub fn parse_components(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in strings(v, &["components", "items"]).unwrap_or_default() {
        if out.len() as u32 == MAX_COMPONENTS {
            break;
        }
        if !out.iter().any(|c| same_name(c, &name)) {
            out.push(name);
        }
    }
    out
}

/// The declared component `name` refers to (ignoring case and spacing).
fn component_index(components: &[Component], name: &str) -> Option<usize> {
    components.iter().position(|c| same_name(&c.name, name))
}

/// The texts of a list, or of a single entry.
fn texts(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a.iter().filter_map(text_of).collect(),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Object(_) => {
            text_of(v).into_iter().collect()
        }
    }
}

/// Stage 2: notes per component. Unknown components are ignored.
pub fn apply_clusters(components: &mut [Component], v: &Value) {
    for (name, notes) in keyed_entries(v, &["clusters", "components"], &["component", "name"], &["attributes", "notes"])
    {
        if let Some(i) = component_index(components, &name) {
            let notes = texts(notes);
            components[i].notes.extend(notes);
        }
    }
}

/// Stage 3: the key question of each component (the first one wins).
pub fn apply_key_questions(components: &mut [Component], v: &Value) {
    for (name, q) in
        keyed_entries(v, &["key_questions", "questions"], &["component", "name"], &["question", "key_question"])
    {
        if let Some(i) = component_index(components, &name)
            && components[i].key_question.is_none()
        {
            components[i].key_question = text_of(q);
        }
    }
}

/// Stage 4: sub-questions per component, at most [`MAX_SUB_QUESTIONS`] each.
pub fn apply_sub_questions(components: &mut [Component], v: &Value) {
    for (name, qs) in
        keyed_entries(v, &["sub_questions", "questions"], &["component", "name"], &["questions", "sub_questions"])
    {
        if let Some(i) = component_index(components, &name) {
            let qs = texts(qs);
            let room = (MAX_SUB_QUESTIONS as usize).saturating_sub(components[i].sub_questions.len());
            components[i].sub_questions.extend(qs.into_iter().take(room));
        }
    }
}

/// The candidates for validation: per component its key question, then its sub-questions,
/// without exact repeats.
pub fn candidates(components: &[Component]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    components
        .iter()
        .flat_map(|c| c.key_question.iter().chain(c.sub_questions.iter()))
        .filter(|q| seen.insert(q.trim().to_string()))
        .cloned()
        .collect()
}

/// Bounds of the validated list for `n` candidates and an optional cap.
pub fn final_bounds(n: usize, cap: Option<u32>) -> (u32, u32) {
    let max = cap.unwrap_or(MAX_FINAL_QUESTIONS).max(1);
    let min = MIN_FINAL_QUESTIONS.min(max).min(n.max(1) as u32);
    (min, max)
}

fn bulleted(items: &[String]) -> String {
    items.iter().map(|i| format!("- {}", i.replace('\n', " "))).collect::<Vec<_>>().join("\n")
}

/// The evaluated dimension and its rubric, and the prompt of every stage about them.
#[derive(Debug, Clone, PartialEq)]
pub struct Subject {
    pub dimension: String,
    pub rubric: String,
}

impl Subject {
    /// The request's single dimension (name, definition as the rubric), else [`DEFAULT_DIMENSION`]
    /// with the corpus description as the rubric.
    pub fn of(request: &CorpusRequest) -> Self {
        let (dimension, rubric) = match request.dimensions.first() {
            Some(d) => (d.name.trim().to_string(), d.definition.trim().to_string()),
            None => (DEFAULT_DIMENSION.to_string(), String::new()),
        };
        let rubric = [rubric.as_str(), request.corpus_description.trim(), "(no definition given)"]
            .into_iter()
            .find(|r| !r.is_empty())
            .unwrap_or_default()
            .to_string();
        Self { dimension, rubric }
    }

    /// `template` with the dimension, the rubric and `values`, every one of them fenced.
    fn prompt(&self, template: &str, values: &[(&str, &str)]) -> String {
        let own = [("dimension", self.dimension.as_str()), ("rubric", self.rubric.as_str())];
        let fenced: Vec<(&str, String)> =
            own.iter().chain(values).map(|(k, v)| (*k, fence_untrusted(v).into_owned())).collect();
        let refs: Vec<(&str, &str)> = fenced.iter().map(|(k, v)| (*k, v.as_str())).collect();
        render(template, &refs)
    }

    /// Stage 1: the components recurring in `notes`.
    pub fn components_prompt(&self, notes: &[String]) -> String {
        self.prompt(
            COMPONENTS_TEMPLATE,
            &[("attributes", &bulleted(notes)), ("max_components", &MAX_COMPONENTS.to_string())],
        )
    }

    /// Stage 2: `notes` sorted under the components `names`.
    pub fn cluster_prompt(&self, names: &[String], notes: &[String]) -> String {
        self.prompt(CLUSTER_TEMPLATE, &[("components", &bulleted(names)), ("attributes", &bulleted(notes))])
    }

    /// Stage 3: one key question per component, from its notes.
    pub fn key_questions_prompt(&self, components: &[Component]) -> String {
        let components_attributes = components
            .iter()
            .map(|c| {
                let notes = if c.notes.is_empty() {
                    "  - (no notes)".to_string()
                } else {
                    c.notes.iter().map(|n| format!("  - {}", n.replace('\n', " "))).collect::<Vec<_>>().join("\n")
                };
                format!("{}:\n{notes}", c.name)
            })
            .collect::<Vec<_>>()
            .join("\n\n");
        self.prompt(KEY_QUESTIONS_TEMPLATE, &[("components_attributes", &components_attributes)])
    }

    /// Stage 4: sub-questions of every component's key question.
    pub fn sub_questions_prompt(&self, components: &[Component]) -> String {
        let key_questions = components
            .iter()
            .map(|c| format!("- {}: {}", c.name, c.key_question.clone().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n");
        self.prompt(SUB_QUESTIONS_TEMPLATE, &[("key_questions", &key_questions)])
    }

    /// Stage 5: the candidates `pool` validated into `min` to `max` questions.
    pub fn validate_prompt(&self, pool: &[String], min: u32, max: u32) -> String {
        self.prompt(
            VALIDATE_TEMPLATE,
            &[
                ("all_questions", &bulleted(pool)),
                ("min_questions", &min.to_string()),
                ("max_questions", &max.to_string()),
            ],
        )
    }
}

pub(crate) async fn generate(run: &Run<'_>) -> Result<Generated, StageError> {
    let request = run.request;
    let subject = Subject::of(request);
    let dimension = subject.dimension.clone();
    let notes: Vec<String> = request.observations.iter().map(|o| o.trim().to_string()).collect();
    let temperature = run.temperature();

    // 1. Components.
    let schema = object(
        json!({"components": {"type": "array", "minItems": 1, "maxItems": MAX_COMPONENTS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}}}),
        &["components"],
    );
    let p = subject.components_prompt(&notes);
    let v = run.call_json("interacteval components", p, schema, temperature, 1024).await?;
    let mut components: Vec<Component> =
        parse_components(&v).into_iter().map(|name| Component { name, ..Default::default() }).collect();
    if components.is_empty() {
        return Err(StageError::Unavailable(
            "the interacteval component extraction found no components in the notes".into(),
        ));
    }
    let names: Vec<String> = components.iter().map(|c| c.name.clone()).collect();
    run.emit(stages::EXTRACT_COMPONENTS, 1, STAGES, format!("{} components: {}", names.len(), names.join(", ")));

    // 2. Clusters.
    let schema = object(
        json!({"clusters": {"type": "array", "minItems": 1, "maxItems": names.len(), "items": object(
            json!({"component": {"type": "string", "enum": names},
                   "attributes": {"type": "array", "maxItems": notes.len(),
                                  "items": {"type": "string", "minLength": 1, "maxLength": 400}}}),
            &["component", "attributes"])}}),
        &["clusters"],
    );
    let p = subject.cluster_prompt(&names, &notes);
    let cluster_budget = (notes.len() as u32).saturating_mul(60).saturating_add(256).clamp(1024, 16_384);
    let v = run.call_json("interacteval clusters", p, schema, temperature, cluster_budget).await?;
    apply_clusters(&mut components, &v);
    let assigned: usize = components.iter().map(|c| c.notes.len()).sum();
    run.emit(stages::CLUSTER, 2, STAGES, format!("{assigned} of {} notes clustered", notes.len()));

    // 3. Key questions.
    let schema = object(
        json!({"key_questions": {"type": "array", "minItems": 1, "maxItems": names.len(), "items": object(
            json!({"component": {"type": "string", "enum": names}, "question": question()}),
            &["component", "question"])}}),
        &["key_questions"],
    );
    let p = subject.key_questions_prompt(&components);
    let v = run.call_json("interacteval key questions", p, schema, temperature, 1024).await?;
    apply_key_questions(&mut components, &v);
    components.retain(|c| c.key_question.is_some());
    if components.is_empty() {
        return Err(StageError::Unavailable("the interacteval key-question stage returned no questions".into()));
    }
    run.emit(stages::KEY_QUESTIONS, 3, STAGES, format!("{} key questions", components.len()));

    // 4. Sub-questions.
    let names: Vec<String> = components.iter().map(|c| c.name.clone()).collect();
    let schema = object(
        json!({"sub_questions": {"type": "array", "minItems": 1, "maxItems": names.len(), "items": object(
            json!({"component": {"type": "string", "enum": names},
                   "questions": {"type": "array", "minItems": MIN_SUB_QUESTIONS, "maxItems": MAX_SUB_QUESTIONS,
                                 "items": question()}}),
            &["component", "questions"])}}),
        &["sub_questions"],
    );
    let p = subject.sub_questions_prompt(&components);
    let v = run.call_json("interacteval sub questions", p, schema, temperature, 2048).await?;
    apply_sub_questions(&mut components, &v);
    let pool = candidates(&components);
    let subs: usize = components.iter().map(|c| c.sub_questions.len()).sum();
    run.emit(stages::SUB_QUESTIONS, 4, STAGES, format!("{subs} sub-questions, {} candidates", pool.len()));

    // 5. Validation.
    let (min, max) = final_bounds(pool.len(), request.refinement.max_questions);
    let schema = object(
        json!({"questions": {"type": "array", "minItems": min, "maxItems": max, "items": question()}}),
        &["questions"],
    );
    let p = subject.validate_prompt(&pool, min, max);
    let validation_temperature = request.model.temperature.unwrap_or(VALIDATION_TEMPERATURE);
    let max_tokens = (80 * max + 256).clamp(1024, 16_384);
    let v = run.call_json("interacteval validation", p, schema, validation_temperature, max_tokens).await?;
    let list = find_list(&v, &["questions", "items", "checklist"])
        .ok_or_else(|| StageError::Unavailable("the interacteval validation reply has no list of questions".into()))?;
    let mut seen = std::collections::HashSet::new();
    let validated: Vec<String> = list.iter().filter_map(text_of).filter(|q| seen.insert(q.clone())).collect();
    let returned = validated.len();
    let dropped = returned.saturating_sub(max as usize);
    let items: Vec<ChecklistItem> = validated
        .into_iter()
        .take(max as usize)
        .enumerate()
        .map(|(i, q)| {
            let mut item = ChecklistItem::new(format!("ie-{i}"), q);
            item.category = Some(dimension.clone());
            item.metadata.insert("dimension".into(), dimension.clone());
            item
        })
        .collect();
    if (items.len() as u32) < min {
        tracing::warn!(got = items.len(), min, "interacteval validation returned fewer questions than asked");
    }
    run.emit(stages::VALIDATE, 5, STAGES, format!("{} validated questions (asked for {min}-{max})", items.len()));

    let mut metadata = vec![
        ("dimension".to_string(), dimension.clone()),
        ("attribute_count".to_string(), notes.len().to_string()),
        ("components".to_string(), components.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join("; ")),
        ("validation_bounds".to_string(), format!("{min}-{max}")),
    ];
    if dropped > 0 {
        metadata.push(("dropped_questions".to_string(), dropped.to_string()));
    }
    if (items.len() as u32) < min {
        metadata.push(("validation_short".to_string(), format!("{} of at least {min}", items.len())));
    }
    Ok(Generated { raw_questions: pool.len() as u32, items, metadata, max_tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(names: &[&str]) -> Vec<Component> {
        names.iter().map(|n| Component { name: n.to_string(), ..Default::default() }).collect()
    }

    #[test]
    fn components_are_capped_and_deduplicated() {
        let v = json!({"components": ["Flow", "flow", "Tone", "Facts", "Style", "Length", "Format"]});
        assert_eq!(parse_components(&v), vec!["Flow", "Tone", "Facts", "Style", "Length"]);
        assert_eq!(parse_components(&json!(["A"])), vec!["A"]);
    }

    #[test]
    fn stages_fill_components_leniently() {
        let mut c = comps(&["Logical Flow", "Tone"]);
        apply_clusters(&mut c, &json!({"Logical flow": ["jumps around"], "Unknown": ["x"]}));
        assert_eq!(c[0].notes, vec!["jumps around"]);
        apply_key_questions(
            &mut c,
            &json!({"key_questions": [{"component": "tone", "question": "Is the tone friendly?"},
                {"component": "Logical Flow", "question": "Does it flow?"}]}),
        );
        assert_eq!(c[1].key_question.as_deref(), Some("Is the tone friendly?"));
        apply_sub_questions(
            &mut c,
            &json!({"sub_questions": [{"component": "Logical Flow", "questions": ["A?", "B?", "C?", "D?"]},
                {"component": "Tone", "questions": ["Does it flow?", "E?"]}]}),
        );
        assert_eq!(c[0].sub_questions, vec!["A?", "B?", "C?"]);
        assert_eq!(candidates(&c), vec!["Does it flow?", "A?", "B?", "C?", "Is the tone friendly?", "E?"]);
    }

    #[test]
    fn final_bounds_never_exceed_the_candidates_or_cap() {
        assert_eq!(final_bounds(20, None), (10, 15));
        assert_eq!(final_bounds(6, None), (6, 15));
        assert_eq!(final_bounds(20, Some(8)), (8, 8));
        assert_eq!(final_bounds(20, Some(30)), (10, 30));
    }

    /// Issue 44: the dimension, the rubric and the notes (caller text), and the components and
    /// questions of earlier stages (model text), closing the old `>>>` fence or forging a tag,
    /// stay inside their quotes in all five prompts.
    #[test]
    fn forged_fences_stay_quoted_in_every_stage() {
        use crate::core::quoted::{FORGED, assert_injection_quoted, forged};
        let subject = Subject { dimension: format!("Tone{FORGED}"), rubric: "How the text sounds.".into() };
        let plain = Subject { dimension: "Tone".into(), rubric: forged("How the text sounds.") };
        let notes = vec!["too casual".to_string(), forged("rude ending")];
        let names = vec!["Register".to_string(), forged("Politeness")];
        let components = vec![
            Component {
                name: "Register".into(),
                notes: vec![forged("too casual")],
                key_question: Some("Is the register right?".into()),
                sub_questions: vec![],
            },
            Component {
                name: "Politeness".into(),
                notes: vec![],
                key_question: Some(forged("Is it polite?")),
                sub_questions: vec![],
            },
        ];
        let pool = vec!["Is it polite?".to_string(), forged("Is it kind?")];
        let prompts = [
            ("components", subject.components_prompt(&notes), vec![("brief", 1), ("review", 1)]),
            ("components, rubric", plain.components_prompt(&notes), vec![("brief", 1), ("review", 1)]),
            ("cluster", subject.cluster_prompt(&names, &notes), vec![("brief", 1), ("draft", 1), ("review", 1)]),
            ("key questions", plain.key_questions_prompt(&components), vec![("brief", 1), ("review", 1)]),
            ("sub-questions", plain.sub_questions_prompt(&components), vec![("brief", 1), ("draft", 1)]),
            ("validate", subject.validate_prompt(&pool, 10, 15), vec![("brief", 1), ("draft", 1)]),
        ];
        for (name, p, expected) in prompts {
            assert_injection_quoted(name, &p, &expected);
        }
        for t in TEMPLATES {
            assert!(!t.contains("<<<") && !t.contains(">>>"));
        }
    }

    #[test]
    fn templates_use_only_known_placeholders() {
        for t in TEMPLATES {
            assert!(assay_domain::template::unknown_placeholders(t, PLACEHOLDERS).is_empty());
        }
    }
}
