//! Repeated judging (`ScorerConfig.samples`): each sample is its own set of model calls with its own
//! seed (so the response cache keeps them apart, and an identical re-run costs nothing), items take
//! the majority over the samples that answered, an unparseable sample is an abstention, and one
//! sample is exactly the scoring without repeated judging. Against the scripted OpenAI-compatible
//! backend, the core in process and over real gRPC.

use std::sync::Arc;
use std::time::Duration;

use assay_domain::{
    Answer, Checklist, ChecklistItem, ItemStatus, ModelSpec, ScoreOutcome, ScoreRequest, ScoreTarget, Scorer,
    ScorerSettings, ScoringMode,
};
use assay_llm::{Backends, CachedChat, ModelHub, ModelSettings, OpenAiClient, OpenAiConfig, PhaseModels};
use assay_proto::common::v1 as pb;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use assay_scorer::ScorerCore;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer};
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;

fn config(llm: &ScriptedLlm) -> OpenAiConfig {
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "judge-1".into();
    cfg.max_retries = 0;
    cfg.base_backoff = Duration::from_millis(5);
    cfg
}

fn core(llm: &ScriptedLlm) -> ScorerCore {
    ScorerCore::new(Arc::new(ModelHub::single_openai(config(llm)).unwrap()), 8)
}

/// The core over the scripted backend behind an in-memory response cache.
fn cached_core(llm: &ScriptedLlm) -> ScorerCore {
    let client: Arc<OpenAiClient> = Arc::new(OpenAiClient::new(config(llm)).unwrap());
    let backends = Backends::new().with_chat("openai", Arc::new(CachedChat::in_memory(client)));
    let phases = PhaseModels { default: ModelSettings::backend("openai"), ..PhaseModels::default() };
    ScorerCore::new(Arc::new(ModelHub::new(backends, phases)), 8)
}

fn checklist(n: usize) -> Checklist {
    Checklist {
        id: "cl".into(),
        items: (1..=n)
            .map(|i| ChecklistItem::new(format!("i{i}"), format!("Does it satisfy requirement {i}?")))
            .collect(),
        ..Checklist::default()
    }
}

fn request(n: usize, mode: ScoringMode, samples: Option<u32>) -> ScoreRequest {
    ScoreRequest {
        checklist: checklist(n),
        targets: vec![ScoreTarget {
            id: "t1".into(),
            input: "Say hi.".into(),
            target: "Hello!".into(),
            ..Default::default()
        }],
        config: ScorerSettings { mode: Some(mode), samples, ..ScorerSettings::default() },
        model: ModelSpec::default(),
    }
}

/// The seed a request sent (`None`: no seed field).
fn seed(r: &RecordedRequest) -> Option<u64> {
    r.body.get("seed").and_then(Value::as_u64)
}

/// Which requirement an item prompt asks about.
fn requirement(r: &RecordedRequest) -> usize {
    let p = r.last_user_message().unwrap_or_default();
    (1..=9).find(|i| p.contains(&format!("requirement {i}?"))).expect("an item prompt")
}

async fn score(core: &ScorerCore, req: ScoreRequest) -> ScoreOutcome {
    core.score(req, &assay_domain::no_events).await.unwrap()
}

/// Item mode, three samples: three calls per item, seeds none / 1 / 2 (distinct cache entries);
/// per item the majority, the yes-share, the flaky flag and the abstentions; per target the mean
/// of the samples' aggregates, the per-sample scores and their spread; usage counts every call.
#[tokio::test]
async fn item_mode_samples_are_distinct_seeded_calls_combined_by_majority() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|r| {
        let answer = match (requirement(r), seed(r)) {
            // Requirement 1: YES, NO, YES -> YES, flaky, yes-share 2/3.
            (1, None | Some(2)) => "YES",
            (1, Some(_)) => "NO",
            // Requirement 2: unparseable, NO, NO -> NO with one abstention, not flaky.
            (2, None) => return Reply::text("I would rather not say.").usage(10, 2),
            (_, _) => "NO",
        };
        Reply::json(json!({"answer": answer})).usage(10, 2)
    });
    let out = score(&core(&llm), request(2, ScoringMode::Item, Some(3))).await;

    let reqs = llm.requests();
    assert_eq!(reqs.len(), 6, "three calls per item");
    for item in [1, 2] {
        let mut seeds: Vec<Option<u64>> = reqs.iter().filter(|r| requirement(r) == item).map(seed).collect();
        seeds.sort();
        assert_eq!(seeds, vec![None, Some(1), Some(2)], "requirement {item}");
    }
    let s = &out.scores[0];
    let (a, b) = (&s.item_scores[0], &s.item_scores[1]);
    assert_eq!((a.answer, a.status, a.flaky, a.abstentions), (Some(Answer::Yes), ItemStatus::Answered, true, 0));
    assert_eq!(a.yes_share, Some(2.0 / 3.0));
    assert_eq!(a.sample_answers, vec![Some(Answer::Yes), Some(Answer::No), Some(Answer::Yes)]);
    assert_eq!((b.answer, b.status, b.flaky, b.abstentions), (Some(Answer::No), ItemStatus::Answered, false, 1));
    assert_eq!(b.yes_share, Some(0.0));
    assert_eq!(b.sample_answers, vec![None, Some(Answer::No), Some(Answer::No)]);
    // Per-sample pass rates 1/1, 0/2, 1/2 (an abstention is neither a YES nor a NO within its own
    // sample: the first sample's rate is over its one answered item).
    assert_eq!(s.sample_primary_scores, vec![1.0, 0.0, 0.5]);
    assert!((s.primary_score - 0.5).abs() < 1e-12 && (s.pass_rate - 0.5).abs() < 1e-12);
    assert!((s.sample_spread.unwrap() - 0.5).abs() < 1e-12);
    assert_eq!((s.abstentions, s.answered_count, s.unanswered_count), (1, 2, 0));
    assert_eq!((out.usage.calls, out.usage.prompt_tokens), (6, 60), "every sample's calls are counted");
    // One target, three samples: three observations of one cluster (naive interval only).
    let u = out.aggregate.uncertainty.expect("three observations");
    assert_eq!((u.observations, u.clusters, u.se_clustered), (3, 0, None));
}

/// Batch mode: one call per sample; a reply that cannot be parsed makes every item of that sample
/// an abstention, never a NO: the other sample's YES stands unanimous.
#[tokio::test]
async fn an_unparseable_batch_sample_is_an_abstention_not_a_no() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|r| match seed(r) {
        None => Reply::json(
            json!({"answers": [{"question_index": 1, "answer": "YES"}, {"question_index": 2, "answer": "NO"}]}),
        ),
        Some(_) => Reply::text("I refuse to answer in JSON."),
    });
    let out = score(&core(&llm), request(2, ScoringMode::Batch, Some(2))).await;
    let seeds: Vec<Option<u64>> = llm.requests().iter().map(seed).collect();
    assert_eq!(seeds.len(), 2, "one batch call per sample");
    assert!(seeds.contains(&None) && seeds.contains(&Some(1)), "{seeds:?}");
    let s = &out.scores[0];
    let first = &s.item_scores[0];
    assert_eq!(
        (first.answer, first.flaky, first.abstentions, first.yes_share),
        (Some(Answer::Yes), false, 1, Some(1.0))
    );
    assert_eq!(first.sample_answers, vec![Some(Answer::Yes), None]);
    assert_eq!((s.item_scores[1].answer, s.item_scores[1].abstentions), (Some(Answer::No), 1));
    assert_eq!((s.abstentions, s.answered_count), (2, 2));
    // The unparseable sample scored nothing: it is no observation of 0 (issue 59, point 1; it was
    // [0.5, 0.0] and a primary score of 0.25).
    assert_eq!((s.sample_primary_scores.clone(), s.primary_score), (vec![0.5], 0.5));
}

/// Every sample's reply unusable: the item is not answered (the first sample's status) and counts
/// as unanswered, with every sample an abstention.
#[tokio::test]
async fn an_item_no_sample_answered_keeps_the_first_samples_status() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::text("unclear"));
    let out = score(&core(&llm), request(1, ScoringMode::Item, Some(2))).await;
    let item = &out.scores[0].item_scores[0];
    assert_eq!((item.answer, item.status, item.yes_share, item.abstentions), (None, ItemStatus::Unparseable, None, 2));
    assert_eq!(out.scores[0].unanswered_count, 1);
}

/// Behind a response cache the k samples stay k backend calls, and the identical re-run is served
/// from the cache: zero calls, k cache hits, the same score.
#[tokio::test]
async fn an_identical_rerun_with_a_response_cache_costs_no_calls() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|r| {
        let answer = if seed(r) == Some(2) { "NO" } else { "YES" };
        Reply::json(json!({"answers": [{"question_index": 1, "answer": answer}]}))
    });
    let core = cached_core(&llm);
    let first = score(&core, request(1, ScoringMode::Batch, Some(3))).await;
    assert_eq!(llm.request_count(), 3, "the cache does not collapse the samples");
    assert_eq!((first.usage.calls, first.usage.cache_hits), (3, 0));
    let again = score(&core, request(1, ScoringMode::Batch, Some(3))).await;
    assert_eq!(llm.request_count(), 3, "the re-run made no call");
    assert_eq!(again.usage.cache_hits, 3);
    assert_eq!(again.scores, first.scores);
    assert!(first.scores[0].item_scores[0].flaky);
}

/// One sample (unset or 1) is today's scoring: the same requests (no seed), no sample fields.
#[tokio::test]
async fn one_sample_sends_the_same_requests_as_before() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::json(json!({"answer": "YES"})));
    let core = core(&llm);
    let unset = score(&core, request(2, ScoringMode::Item, None)).await;
    let one = score(&core, request(2, ScoringMode::Item, Some(1))).await;
    let reqs = llm.requests();
    assert_eq!(reqs.len(), 4, "one call per item");
    assert!(reqs.iter().all(|r| r.body.get("seed").is_none()), "no seed is sent");
    let mut bodies: Vec<String> = reqs.iter().map(|r| r.body.to_string()).collect();
    bodies.sort();
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(bodies[2], bodies[3]);
    assert_eq!(unset.scores, one.scores);
    let s = &one.scores[0];
    assert!(s.sample_primary_scores.is_empty() && s.sample_spread.is_none() && s.abstentions == 0);
    assert!(s.item_scores.iter().all(|i| i.sample_answers.is_empty() && i.yes_share.is_none() && !i.flaky));
}

/// Judge models round-robin over the samples; seeds still distinct.
#[tokio::test]
async fn sample_models_are_used_round_robin() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})));
    let mut req = request(1, ScoringMode::Batch, Some(3));
    req.config.sample_models = vec!["judge-a".into(), "judge-b".into()];
    score(&core(&llm), req).await;
    let mut calls: Vec<(Option<u64>, String)> =
        llm.requests().iter().map(|r| (seed(r), r.model().unwrap_or_default().to_string())).collect();
    calls.sort();
    assert_eq!(
        calls,
        vec![(None, "judge-a".to_string()), (Some(1), "judge-b".to_string()), (Some(2), "judge-a".to_string())]
    );
}

/// With a seed in the model spec, sample i sends seed + i.
#[tokio::test]
async fn sample_seeds_count_up_from_the_specs_seed() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|_| Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})));
    let mut req = request(1, ScoringMode::Batch, Some(3));
    req.model.seed = Some(40);
    score(&core(&llm), req).await;
    let mut seeds: Vec<Option<u64>> = llm.requests().iter().map(seed).collect();
    seeds.sort();
    assert_eq!(seeds, vec![Some(40), Some(41), Some(42)]);
}

async fn grpc(llm: &ScriptedLlm) -> (TestServer, ScorerServiceClient<tonic::transport::Channel>) {
    let server =
        TestServer::start(assay_scorer::routes(Arc::new(core(llm))), &[assay_proto::service_names::SCORER]).await;
    let client = ScorerServiceClient::new(server.channel().await);
    (server, client)
}

fn wire_request(config: pb::ScorerConfig, targets: usize) -> assay_proto::scorer::v1::ScoreRequest {
    assay_proto::scorer::v1::ScoreRequest {
        checklist: Some(assay_proto::convert::checklist_to(&checklist(1))),
        targets: (0..targets)
            .map(|i| assay_proto::scorer::v1::ScoreTarget {
                id: format!("t{i}"),
                target: format!("response {i}"),
                ..Default::default()
            })
            .collect(),
        config: Some(config),
        model: None,
    }
}

/// Over gRPC: samples and judge models out of their limits are INVALID_ARGUMENT naming the field
/// and the limit, before any model call.
#[tokio::test]
async fn bad_sample_settings_are_invalid_argument_naming_the_field() {
    let llm = ScriptedLlm::start().await;
    let (_server, mut client) = grpc(&llm).await;
    let cases: Vec<(pb::ScorerConfig, &str, &str)> = vec![
        (pb::ScorerConfig { samples: Some(0), ..Default::default() }, "config.samples", "10"),
        (pb::ScorerConfig { samples: Some(11), ..Default::default() }, "config.samples", "10"),
        (
            pb::ScorerConfig { samples: Some(2), sample_models: vec!["a".into(), "  ".into()], ..Default::default() },
            "config.sample_models[1]",
            "blank",
        ),
        (
            pb::ScorerConfig { samples: Some(2), sample_models: vec!["m".into(); 11], ..Default::default() },
            "config.sample_models",
            "10",
        ),
    ];
    for (config, field, limit) in cases {
        let status = client.score(wire_request(config, 1)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        let bad = status.get_details_bad_request().expect("bad request details");
        let v = bad.field_violations.iter().find(|v| v.field == field);
        assert!(v.is_some_and(|v| v.description.contains(limit)), "{field}: {:?}", bad.field_violations);
    }
    assert_eq!(llm.request_count(), 0, "bad input never reaches the backend");
}

/// Over gRPC: the sample fields and the aggregate's uncertainty (clustered by target) reach the
/// wire.
#[tokio::test]
async fn samples_and_uncertainty_reach_the_wire() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|r| {
        let target0 = r.last_user_message().unwrap_or_default().contains("response 0");
        let answer = if target0 || seed(r).is_none() { "YES" } else { "NO" };
        Reply::json(json!({"answers": [{"question_index": 1, "answer": answer}]}))
    });
    let (_server, mut client) = grpc(&llm).await;
    let config = pb::ScorerConfig { samples: Some(2), ..Default::default() };
    let reply = client.score(wire_request(config, 3)).await.unwrap().into_inner();
    assert_eq!(llm.request_count(), 6);
    let s1 = &reply.scores[1];
    assert_eq!(s1.sample_primary_scores, vec![1.0, 0.0]);
    assert_eq!(s1.sample_spread, Some(std::f64::consts::FRAC_1_SQRT_2));
    let item = &s1.item_scores[0];
    assert_eq!(item.sample_answers, vec![pb::Answer::Yes as i32, pb::Answer::No as i32]);
    assert_eq!((item.answer, item.flaky, item.yes_share), (pb::Answer::No as i32, true, Some(0.5)));
    let u = reply.aggregate.unwrap().uncertainty.expect("six observations");
    let obs = [("t0", 1.0), ("t0", 1.0), ("t1", 1.0), ("t1", 0.0), ("t2", 1.0), ("t2", 0.0)];
    let want = assay_domain::stats::standard_error(&obs, 0.05).unwrap();
    assert_eq!((u.observations, u.clusters), (6, 3));
    assert_eq!(u.se_clustered, want.se_clustered);
    assert_eq!((u.se, u.ci_low, u.ci_high), (want.se(), want.ci().0, want.ci().1));
    assert_eq!((u.se_naive, u.ci_naive_low, u.alpha), (want.se_naive, want.ci_naive.0, 0.05));
}
