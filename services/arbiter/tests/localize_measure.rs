//! Measurement, on the embedded default backend (local models, `assay models fetch`), of the two
//! ways to place an issue that names no section: the schema-constrained localization call and
//! the issue's embedding against the sections' passages. Ignored by default (it loads the local
//! models); run it with
//! `cargo test -p assay-arbiter --release --test localize_measure -- --ignored --nocapture`.

use std::sync::Arc;
use std::time::Instant;

use assay_arbiter::ArbiterCore;
use assay_arbiter::core::Locator;
use assay_domain::arbiter::ConsolidateRequest;
use assay_domain::document::{Brief, JudgeIssue, Section, Severity};
use serde_json::Value;

fn lesson(json: &str) -> (Brief, Vec<Section>) {
    let v: Value = serde_json::from_str(json).expect("the fixture is JSON");
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let b = &v["brief"];
    let brief = Brief {
        objectives: b["objectives"].as_array().map(|a| a.iter().map(text).collect()).unwrap_or_default(),
        audience: text(&b["audience"]),
        language: text(&b["language"]),
        description: text(&b["description"]),
    };
    let sections = v["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .enumerate()
        .map(|(i, s)| Section {
            id: text(&s["id"]),
            index: i as u32,
            title: text(&s["title"]),
            content: text(&s["content"]),
        })
        .collect();
    (brief, sections)
}

/// (description, fix instruction, criterion, the section(s) that should be named; empty: none).
type Case = (&'static str, &'static str, &'static str, &'static [&'static str]);

const COMPOUND: &[Case] = &[
    (
        "The compound interest rule of thumb says 'triple': the Rule of 72 estimates the time for money to double, not to triple.",
        "Replace 'triple' with 'double' in the explanation of the rule.",
        "factual_accuracy",
        &["rule72"],
    ),
    (
        "The monthly rate 0.048 / 12 = 0.004 is used in the worked example without saying where the growth factor 1.004 comes from.",
        "Add the step that divides the yearly rate by 12 before raising 1.004 to the power 216.",
        "clarity_readability",
        &["example"],
    ),
    (
        "The straight-line growth of simple interest is described but never contrasted with a year-by-year table of compound growth.",
        "Add a short table comparing simple and compound balances for the first five years.",
        "engagement_examples",
        &["simple"],
    ),
    (
        "Continuous compounding is mentioned as a ceiling without saying what it means for a saver.",
        "Explain continuous compounding in one plain sentence.",
        "completeness",
        &["frequency"],
    ),
    (
        "The warning that APR may be a nominal rate is given for loans without an example of how much higher the effective cost can be.",
        "Add a short example: a loan at 18 percent APR compounded monthly costs about 19.6 percent a year.",
        "completeness",
        &["apy"],
    ),
    (
        "The raised power notation (1 + r)^t is introduced with no reminder of what an exponent is, though the audience is not comfortable with algebra.",
        "Add a one-line reminder of what raising to a power means, with a small example.",
        "learning_objective_alignment",
        &["formula"],
    ),
    (
        "The answers to the practice problems are printed right after the questions, so learners see them before trying.",
        "Move the answers to the end, after a short summary.",
        "pedagogical_structure",
        &["practice"],
    ),
    (
        "The lesson never covers how cryptocurrency staking rewards are taxed in Brazil.",
        "Add a section on staking taxes.",
        "completeness",
        &[],
    ),
];

const INTERVIEWS: &[Case] = &[
    (
        "Five to eight interviews per group is stated as a rule with no hint of when to stop earlier.",
        "Say that interviews can stop once new ones add no new patterns.",
        "completeness",
        &["recruit"],
    ),
    (
        "Asking people whether they would like a new feature is discouraged, but no example of a good past-focused question is given.",
        "Give one example of an open question about the last time the problem happened.",
        "engagement_examples",
        &["open"],
    ),
    (
        "Sticky-note grouping is described without saying what to do with observations that fit no group.",
        "Add what to do with cards that fit no group.",
        "completeness",
        &["synthesis"],
    ),
    (
        "Confirmation bias is explained, but the advice to write down what would prove the idea wrong comes with no example.",
        "Add an example of a disproving statement written before the first interview.",
        "engagement_examples",
        &["bias"],
    ),
];

fn issue(n: usize, c: &Case) -> JudgeIssue {
    JudgeIssue {
        id: format!("doc-{n}"),
        criterion: c.2.into(),
        severity: Severity::Major,
        section_id: String::new(),
        description: c.0.into(),
        fix_instruction: c.1.into(),
        location: String::new(),
        raised_by: vec!["judge-1".into()],
        context_window: String::new(),
    }
}

#[derive(Default)]
struct Tally {
    cases: usize,
    exact: usize,
    hit: usize,
    wrong: usize,
    tokens: u64,
    ms: u128,
}

async fn measure(locators: &[(&str, Locator)]) {
    let config = assay_config::load_from("[gateway]\nstore = \":memory:\"\n").unwrap();
    assert_eq!(config.models.default.backend, "local");
    let (hub, loading) = assay_runtime::build_hub(&config, &assay_runtime::default_loaders()).unwrap();
    loading.await.expect("embedded models load (run `assay models fetch` first)");
    let core = ArbiterCore::new(Arc::new(hub));
    let lessons = [
        (include_str!("../../../tests/fixtures/lesson_compound_interest.json"), COMPOUND),
        (include_str!("../../../tests/fixtures/lesson12.json"), INTERVIEWS),
    ];
    for (name, locator) in locators {
        let mut t = Tally::default();
        for (json, cases) in &lessons {
            let (brief, sections) = lesson(json);
            let request = ConsolidateRequest { brief, sections, ..Default::default() };
            for (n, c) in cases.iter().enumerate() {
                let started = Instant::now();
                let got = core.locate(*locator, &request, &issue(n, c)).await.expect("locate");
                t.ms += started.elapsed().as_millis();
                t.cases += 1;
                t.tokens += got.usage.prompt_tokens + got.usage.completion_tokens;
                let want: Vec<String> = c.3.iter().map(|s| s.to_string()).collect();
                if got.section_ids == want {
                    t.exact += 1;
                }
                if want.is_empty() == got.section_ids.is_empty() && want.iter().all(|w| got.section_ids.contains(w)) {
                    t.hit += 1;
                }
                if got.section_ids.iter().any(|g| !want.contains(g)) {
                    t.wrong += 1;
                }
                let mut ranked: Vec<(f64, &str)> =
                    got.similarities.iter().zip(&request.sections).map(|(x, s)| (*x, s.id.as_str())).collect();
                ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
                ranked.truncate(3);
                eprintln!("{name:>15} | want {want:?} got {:?} {} top {ranked:.2?}", got.section_ids, got.reason);
            }
        }
        eprintln!(
            "{name:>15} | {} cases: exact {}, right section found {}, a wrong section named {}, {} tokens, {} ms",
            t.cases, t.exact, t.hit, t.wrong, t.tokens, t.ms
        );
    }
}

#[tokio::test]
#[ignore = "loads the embedded models: run with --ignored after `assay models fetch`"]
async fn localization_by_the_local_chat_model() {
    measure(&[("model", Locator::Model)]).await;
}

#[tokio::test]
#[ignore = "loads the embedded models: run with --ignored after `assay models fetch`"]
async fn localization_by_embedding() {
    measure(&[
        ("default", assay_arbiter::core::LOCATOR),
        ("emb 0.30/0.00", Locator::Embedding { threshold: 0.30, margin: 0.0 }),
        ("emb 0.40/0.02", Locator::Embedding { threshold: 0.40, margin: 0.02 }),
        ("emb 0.50/0.01", Locator::Embedding { threshold: 0.50, margin: 0.01 }),
    ])
    .await;
}
