//! Checklist evaluation through the gateway scores as each preset means it: partial scorer
//! settings keep the preset's defaults field by field, each preset has its own scoring prompt, the
//! judge never sees the reference unless a custom template asks for it, candidate models write the
//! candidates inside a pipeline, and the concurrency caps are honoured.

#![allow(clippy::wildcard_enum_match_arm)]

use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::generator::v1::Preset;
use assay_testkit::{RecordedRequest, Reply, schema_reply};
use assay_tests::{MeshSandbox, SandboxOptions};
use tonic::Code;

const TARGET: &str = "TARGET-TEXT the response under judgement";
const REFERENCE: &str = "GOLD-REFERENCE-TEXT";
const HISTORY: &str = "EARLIER-TURN of the conversation";

/// Schema-following replies; logprob calls answer YES with P(yes) = 0.9.
fn backend(r: &RecordedRequest) -> Reply {
    if r.body.get("logprobs") == Some(&serde_json::json!(true)) {
        return Reply::with_logprobs("YES", vec![("YES", 0.9f64.ln()), ("NO", 0.1f64.ln())]);
    }
    if let Some(model) = r.model().filter(|m| m.starts_with("cand-")) {
        return Reply::text(format!("CANDIDATE WRITTEN BY {model}"));
    }
    schema_reply(r)
}

fn prompt(r: &RecordedRequest) -> String {
    r.last_user_message().unwrap_or_default()
}

/// The scoring calls: the only prompts that show the response under judgement.
fn scoring_calls(sandbox: &MeshSandbox) -> Vec<RecordedRequest> {
    sandbox.llm.requests().into_iter().filter(|r| r.is_chat() && prompt(r).contains(TARGET)).collect()
}

fn record(preset: Preset) -> gw::EvalRecord {
    let candidates = match preset {
        Preset::RlcfCandidate
        | Preset::RlcfCandidatesOnly
        | Preset::OpenrubricsPairwise
        | Preset::OpenrubricsListwise => vec!["CAND-A a first answer", "CAND-B a second answer"],
        _ => vec![],
    };
    gw::EvalRecord {
        id: "r0".into(),
        input: "Write a short poem about autumn.".into(),
        target: TARGET.into(),
        reference: REFERENCE.into(),
        history: HISTORY.into(),
        candidates: candidates
            .into_iter()
            .enumerate()
            .map(|(i, t)| assay_proto::generator::v1::Candidate {
                id: i.to_string(),
                text: t.into(),
                model: String::new(),
            })
            .collect(),
    }
}

fn preset_pipeline(preset: Preset, scorer: Option<pb::ScorerConfig>) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(preset as i32)) }),
        records: vec![record(preset)],
        scorer,
        max_items: Some(3),
        ..Default::default()
    }
}

async fn evaluate(sandbox: &MeshSandbox, p: gw::ChecklistEvalPipeline) -> Result<gw::EvaluateResponse, tonic::Status> {
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    client.evaluate(gw::EvaluateRequest { pipeline: Some(p), budget: None }).await.map(tonic::Response::into_inner)
}

/// `rlcf_direct` and `rocketeval` with only `capture_reasoning` set are still scored in item mode
/// with their own metric, and rocketeval still asks for logprobs.
#[tokio::test]
async fn a_partial_scorer_setting_keeps_the_presets_other_defaults() {
    let cases = [
        (Preset::RlcfDirect, pb::PrimaryMetric::Weighted, false),
        (Preset::Rocketeval, pb::PrimaryMetric::Normalized, true),
    ];
    for (preset, metric, logprobs) in cases {
        let sandbox = MeshSandbox::start().await;
        sandbox.llm.set_handler(backend);
        let scorer = pb::ScorerConfig { capture_reasoning: Some(true), ..Default::default() };
        let out = evaluate(&sandbox, preset_pipeline(preset, Some(scorer))).await.unwrap();
        let score = out.results[0].score.clone().expect("scored");
        assert_eq!(score.primary_metric, metric as i32, "{preset:?}");
        let items = out.checklists[0].items.len();
        let calls = scoring_calls(&sandbox);
        assert_eq!(calls.len(), items, "{preset:?}: item mode, one call per question");
        for c in &calls {
            assert_eq!(c.body.get("logprobs").is_some(), logprobs, "{preset:?}: {}", c.body);
        }
        if logprobs {
            assert!((score.normalized_score - 0.9).abs() < 1e-6, "{score:?}");
            assert!(!score.logprobs_unavailable);
        }
        // A set field wins, false included: rocketeval without logprobs falls back to the parse.
        if preset == Preset::Rocketeval {
            let before = scoring_calls(&sandbox).len();
            let scorer = pb::ScorerConfig {
                use_logprobs: Some(false),
                primary_metric: pb::PrimaryMetric::Pass as i32,
                ..Default::default()
            };
            let out = evaluate(&sandbox, preset_pipeline(preset, Some(scorer))).await.unwrap();
            assert_eq!(out.results[0].score.as_ref().unwrap().primary_metric, pb::PrimaryMetric::Pass as i32);
            let later = &scoring_calls(&sandbox)[before..];
            assert!(!later.is_empty() && later.iter().all(|c| c.body.get("logprobs").is_none()));
        }
        sandbox.shutdown().await.unwrap();
    }
}

/// Every preset's scoring prompts leave the reference out; rocketeval's show the history; the
/// rlcf presets and rocketeval use their own prompts. A custom template that asks for
/// `{reference}` shows it, and `{checklist}` names the questions in a batch template.
#[tokio::test]
async fn scoring_prompts_show_the_reference_only_when_a_template_asks_for_it() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(backend);
    let presets = [
        Preset::Tick,
        Preset::Rocketeval,
        Preset::RlcfDirect,
        Preset::RlcfCandidate,
        Preset::RlcfCandidatesOnly,
        Preset::OpenrubricsPairwise,
        Preset::OpenrubricsListwise,
    ];
    let mut first_lines = std::collections::BTreeMap::new();
    for preset in presets {
        let before = scoring_calls(&sandbox).len();
        evaluate(&sandbox, preset_pipeline(preset, None)).await.unwrap_or_else(|e| panic!("{preset:?}: {e}"));
        let calls = scoring_calls(&sandbox)[before..].to_vec();
        assert!(!calls.is_empty(), "{preset:?}");
        for c in &calls {
            let p = prompt(c);
            assert!(!p.contains(REFERENCE), "{preset:?} shows the judge the reference:\n{p}");
            assert_eq!(p.contains(HISTORY), preset == Preset::Rocketeval, "{preset:?}:\n{p}");
        }
        first_lines.insert(format!("{preset:?}"), prompt(&calls[0]).lines().next().unwrap_or_default().to_string());
    }
    // Three prompts: the generic batch one, RLCF's and RocketEval's.
    assert_eq!(first_lines["RlcfDirect"], first_lines["RlcfCandidate"]);
    assert_eq!(first_lines["RlcfDirect"], first_lines["RlcfCandidatesOnly"]);
    assert_eq!(first_lines["Tick"], first_lines["OpenrubricsPairwise"]);
    assert_ne!(first_lines["Tick"], first_lines["RlcfDirect"]);
    assert_ne!(first_lines["Tick"], first_lines["Rocketeval"]);
    assert_ne!(first_lines["RlcfDirect"], first_lines["Rocketeval"]);

    // A custom template asking for the reference gets it; {checklist} is the questions.
    let before = scoring_calls(&sandbox).len();
    let scorer = pb::ScorerConfig {
        prompt_template: "Judge {target}\nReference: {reference}\nQuestions:\n{checklist}".into(),
        ..Default::default()
    };
    let out = evaluate(&sandbox, preset_pipeline(Preset::Tick, Some(scorer))).await.unwrap();
    let calls = scoring_calls(&sandbox)[before..].to_vec();
    assert_eq!(calls.len(), 1, "batch mode");
    let p = prompt(&calls[0]);
    assert!(p.contains(REFERENCE), "{p}");
    let question = &out.checklists[0].items[0].question;
    assert!(p.contains(&format!("Q1: {question}")), "{p}");
    sandbox.shutdown().await.unwrap();
}

/// Custom templates that never show the question, or the response, are refused naming the field;
/// so are batch mode with logprobs and caps beyond their limits.
#[tokio::test]
async fn scorer_settings_that_cannot_work_are_refused_before_anything_runs() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(backend);
    let item = |t: &str| pb::ScorerConfig {
        mode: pb::ScoringMode::Item as i32,
        prompt_template: t.into(),
        ..Default::default()
    };
    let cases: Vec<(gw::ChecklistEvalPipeline, &str, &str)> = vec![
        (
            preset_pipeline(Preset::Tick, Some(item("Is {target} good?"))),
            "pipeline.scorer.prompt_template",
            "{question}",
        ),
        (
            preset_pipeline(
                Preset::Tick,
                Some(pb::ScorerConfig { prompt_template: "Rate {target}".into(), ..Default::default() }),
            ),
            "pipeline.scorer.prompt_template",
            "numbered questions",
        ),
        (preset_pipeline(Preset::Tick, Some(item("{question}"))), "pipeline.scorer.prompt_template", "{target}"),
        (
            preset_pipeline(
                Preset::Rocketeval,
                Some(pb::ScorerConfig { mode: pb::ScoringMode::Batch as i32, ..Default::default() }),
            ),
            "pipeline.scorer.mode",
            "item mode",
        ),
        (
            preset_pipeline(Preset::Tick, Some(pb::ScorerConfig { concurrency: 300, ..Default::default() })),
            "pipeline.scorer.concurrency",
            "256",
        ),
        (
            gw::ChecklistEvalPipeline { concurrency: 300, ..preset_pipeline(Preset::Tick, None) },
            "pipeline.concurrency",
            "256",
        ),
    ];
    for (p, field, words) in cases {
        let err = evaluate(&sandbox, p).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(err.message().contains(field) && err.message().contains(words), "{field}: {}", err.message());
    }
    assert_eq!(sandbox.llm.request_count(), 0, "nothing was generated or scored");
    sandbox.shutdown().await.unwrap();
}

/// `rlcf_candidates_only` with candidate models and no candidates: each model writes one response
/// at 0.7, and the checklist is generated from them.
#[tokio::test]
async fn candidate_models_write_the_candidates_inside_a_pipeline() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(backend);
    let mut p = preset_pipeline(Preset::RlcfCandidatesOnly, None);
    p.records[0].candidates.clear();
    // Without candidates or candidate models the pipeline is refused up front.
    let err = evaluate(&sandbox, p.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("pipeline.records[0].candidates"), "{}", err.message());
    p.candidate_models = vec![
        pb::ModelSpec { model: "cand-1".into(), ..Default::default() },
        pb::ModelSpec { model: "cand-2".into(), ..Default::default() },
    ];
    let out = evaluate(&sandbox, p).await.unwrap();
    assert!(out.results[0].score.is_some());
    let requests = sandbox.llm.requests();
    for model in ["cand-1", "cand-2"] {
        let calls: Vec<&RecordedRequest> = requests.iter().filter(|r| r.model() == Some(model)).collect();
        assert_eq!(calls.len(), 1, "{model}");
        let t = calls[0].body["temperature"].as_f64().unwrap();
        assert!((t - 0.7).abs() < 1e-6, "{model}: {t}");
    }
    let generation = requests
        .iter()
        .find(|r| r.body.pointer("/response_format/json_schema/name").and_then(|n| n.as_str()) == Some("checklist"))
        .expect("a generation call");
    let g = prompt(generation);
    assert!(g.contains("CANDIDATE WRITTEN BY cand-1") && g.contains("CANDIDATE WRITTEN BY cand-2"), "{g}");
    sandbox.shutdown().await.unwrap();
}

fn explicit_pipeline(records: usize, items: usize) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: (0..items)
                    .map(|i| pb::ChecklistItem {
                        id: format!("q{i}"),
                        question: format!("Is point {i} covered?"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
        }),
        records: (0..records)
            .map(|i| gw::EvalRecord { id: format!("r{i}"), target: format!("{TARGET} {i}"), ..Default::default() })
            .collect(),
        ..Default::default()
    }
}

/// `scorer.concurrency` bounds one scoring request's calls over all its targets and items;
/// `pipeline.concurrency` bounds the records scored at once. Each call takes 150 ms, so a cap of
/// k over n calls cannot finish in less than ceil(n / k) x 150 ms.
#[tokio::test]
async fn concurrency_caps_are_honoured() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(16), ..Default::default() }).await;
    sandbox.llm.set_handler(|r| schema_reply(r).delay(Duration::from_millis(150)));
    // Evaluate with one checklist: one scoring request for 2 records x 3 items in item mode.
    let mut p = explicit_pipeline(2, 3);
    p.scorer = Some(pb::ScorerConfig { mode: pb::ScoringMode::Item as i32, concurrency: 2, ..Default::default() });
    let started = Instant::now();
    evaluate(&sandbox, p).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(450), "6 calls, 2 at a time: {:?}", started.elapsed());
    assert_eq!(sandbox.llm.request_count(), 6);

    // A stored run: 4 records in batch mode, one record at a time.
    let mut p = explicit_pipeline(4, 2);
    p.concurrency = 1;
    let started = Instant::now();
    let events =
        assay_tests::run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::ChecklistEval(p)).await;
    assert!(started.elapsed() >= Duration::from_millis(600), "4 records, 1 at a time: {:?}", started.elapsed());
    assert!(matches!(
        events.last().and_then(|e| e.event.as_ref()),
        Some(gw::run_event::Event::Completed(c)) if c.state == gw::RunState::Succeeded as i32
    ));
    sandbox.shutdown().await.unwrap();
}

/// tick with `max_items` 1 asks for exactly one question, never "between 2 and 1".
#[tokio::test]
async fn tick_with_one_item_asks_for_exactly_one() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(backend);
    let mut p = preset_pipeline(Preset::Tick, None);
    p.max_items = Some(1);
    evaluate(&sandbox, p).await.unwrap();
    let generation = sandbox
        .llm
        .requests()
        .into_iter()
        .find(|r| r.body.pointer("/response_format/json_schema/name").and_then(|n| n.as_str()) == Some("checklist"))
        .expect("a generation call");
    let g = prompt(&generation);
    assert!(g.contains("exactly one question") && !g.contains("between 2 and 1"), "{g}");
    sandbox.shutdown().await.unwrap();
}
