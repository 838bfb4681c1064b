//! The checklist refiners over real gRPC on port 0, against the scripted OpenAI-compatible backend.
//! The UnitTester scores its rewrites through a scorer service (also on port 0, same backend).
#![allow(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::common::v1 as common;
use assay_proto::refiners::v1::refine_checklist_stream_response::Event;
use assay_proto::refiners::v1::refiner_step::Step;
use assay_proto::refiners::v1::refiners_service_client::RefinersServiceClient;
use assay_proto::refiners::v1::*;
use assay_refiners::ChecklistRefiners;
use assay_refiners::core::{BeamConfig, beam_search, cosine_matrix};
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer, hash_embedding};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

struct Harness {
    llm: ScriptedLlm,
    server: TestServer,
    /// The scorer the UnitTester calls.
    _scorer: TestServer,
}

impl Harness {
    async fn client(&self) -> RefinersServiceClient<Channel> {
        RefinersServiceClient::new(self.server.channel().await)
    }

    fn chats(&self) -> Vec<RecordedRequest> {
        self.llm.requests().into_iter().filter(RecordedRequest::is_chat).collect()
    }

    fn embeddings(&self) -> Vec<RecordedRequest> {
        self.llm.requests().into_iter().filter(RecordedRequest::is_embeddings).collect()
    }
}

async fn harness() -> Harness {
    let llm = ScriptedLlm::start().await;
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "refiner-1".into();
    cfg.base_backoff = Duration::from_millis(5);
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    // One scorer call per rewrite, each a single model call (as the unit tester expects).
    let scorer = TestServer::start(
        assay_scorer::routes(Arc::new(assay_scorer::ScorerCore::new(hub.clone(), 1))),
        &[assay_proto::service_names::SCORER],
    )
    .await;
    let remote_scorer = Arc::new(assay_rpc::remote::RemoteScorer::new(scorer.channel().await, None));
    let core = ChecklistRefiners::new(hub).with_concurrency(4).with_scorer(remote_scorer);
    let server =
        TestServer::start(assay_refiners::routes(Arc::new(core)), &[assay_proto::service_names::REFINERS]).await;
    Harness { llm, server, _scorer: scorer }
}

fn unit(deg: f64) -> Vec<f32> {
    let r = deg.to_radians();
    vec![r.cos() as f32, r.sin() as f32]
}

fn item(id: &str, question: &str, weight: f64) -> common::ChecklistItem {
    common::ChecklistItem { id: id.into(), question: question.into(), weight: Some(weight), ..Default::default() }
}

/// Which kind of prompt a chat request carries (by phrases of the refiners' and scorer's prompts).
fn prompt_kind(req: &RecordedRequest) -> (&'static str, String) {
    let p = req.last_user_message().unwrap_or_default();
    let kind = if p.contains("Replace them with one") {
        "merge"
    } else if p.contains("Judge the question below") {
        "tag"
    } else if p.contains("Response that passes:") {
        "rewrite"
    } else if p.contains("Response to evaluate:") {
        "score"
    } else {
        "other"
    };
    (kind, p)
}

/// The text after `marker` up to the end of its line.
fn line_after(prompt: &str, marker: &str) -> String {
    let start = prompt.find(marker).map(|i| i + marker.len()).unwrap_or(0);
    prompt[start..].lines().next().unwrap_or_default().trim().to_string()
}

/// Embeddings chosen per text (hash vectors for anything else); merges answer "MERGED: <first
/// listed question>"; every tag passes.
fn install_handler(llm: &ScriptedLlm, vectors: HashMap<String, Vec<f32>>) {
    llm.set_handler(move |req| {
        if req.is_embeddings() {
            return Reply::embeddings(
                req.embedding_inputs()
                    .iter()
                    .map(|t| vectors.get(t).cloned().unwrap_or_else(|| hash_embedding(t, 2)))
                    .collect(),
            );
        }
        let (kind, p) = prompt_kind(req);
        match kind {
            "merge" => {
                Reply::json(json!({"question": format!("MERGED: {}", line_after(&p, "Questions:\n- "))})).usage(50, 10)
            }
            "tag" => Reply::json(json!({"reasoning": "ok", "generally_applicable": true, "section_specific": true})),
            _ => Reply::status(400),
        }
    });
}

fn five_items() -> (Vec<common::ChecklistItem>, HashMap<String, Vec<f32>>) {
    let items = vec![
        item("q1", "Is the answer short?", 100.0),
        item("q2", "Does it cite sources?", 100.0),
        item("q3", "Is the answer brief?", 40.0),
        item("q4", "Is the reply concise?", 70.0),
        item("q5", "Is the tone polite?", 100.0),
    ];
    // q1~q3 (20deg, cos 0.94), q3~q4 (20deg), q1!~q4 (40deg, cos 0.77): one cluster by transitivity.
    let angles = [0.0, 120.0, 20.0, 40.0, -100.0];
    let vectors = items.iter().zip(angles).map(|(i, a)| (i.question.clone(), unit(a))).collect();
    (items, vectors)
}

fn kinds(actions: &[RefinerAction]) -> Vec<(String, ActionKind, String)> {
    actions
        .iter()
        .map(|a| (a.item_id.clone(), ActionKind::try_from(a.kind).unwrap(), a.result_item_id.clone()))
        .collect()
}

#[tokio::test]
async fn dedup_merges_transitive_clusters_with_mean_weight_and_sources() {
    let h = harness().await;
    let (mut items, vectors) = five_items();
    items[0].category = "style".into();
    items[0].source_indices = vec![4];
    items[2].source_indices = vec![1, 4];
    install_handler(&h.llm, vectors);
    let reply = h
        .client()
        .await
        .deduplicate(DeduplicateRequest { items, threshold: None, model: None, embedding_model: None })
        .await
        .unwrap()
        .into_inner();

    let ids: Vec<&str> = reply.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, vec!["q1-merged", "q2", "q5"], "merged item takes its first member's place");
    let m = &reply.items[0];
    assert_eq!(m.question, "MERGED: Is the answer short?");
    assert_eq!(m.weight, Some(70.0), "mean of 100, 40, 70");
    assert_eq!(m.merged_from, vec!["q1", "q3", "q4"]);
    assert_eq!(m.source_indices, vec![1, 4]);
    assert_eq!(m.category, "style");
    assert_eq!(
        m.metadata["original_questions"],
        r#"["Is the answer short?","Is the answer brief?","Is the reply concise?"]"#
    );
    assert_eq!(reply.clusters_merged, 1);
    assert_eq!(
        kinds(&reply.actions),
        vec![
            ("q1".into(), ActionKind::Merged, "q1-merged".into()),
            ("q2".into(), ActionKind::Kept, String::new()),
            ("q3".into(), ActionKind::Merged, "q1-merged".into()),
            ("q4".into(), ActionKind::Merged, "q1-merged".into()),
            ("q5".into(), ActionKind::Kept, String::new()),
        ]
    );
    let q4 = reply.actions.iter().find(|a| a.item_id == "q4").unwrap();
    assert!(q4.reason.contains("q1, q3, q4") && q4.reason.contains("0.940"), "{}", q4.reason);

    // One batched embedding call, one merge call listing the cluster's questions.
    let emb = h.embeddings();
    assert_eq!(emb.len(), 1);
    assert_eq!(emb[0].embedding_inputs().len(), 5);
    let chats = h.chats();
    assert_eq!(chats.len(), 1);
    let p = chats[0].last_user_message().unwrap();
    assert!(p.contains("- Is the answer brief?") && p.contains("- Is the reply concise?") && !p.contains("polite"));
    assert_eq!(chats[0].body["response_format"]["type"], "json_schema");
    let usage = reply.usage.unwrap();
    assert_eq!(usage.calls, 2);
    assert!(usage.prompt_tokens >= 50, "{usage:?}");

    // A higher threshold splits the cluster: nothing merged, no merge call.
    let (items, _) = five_items();
    let reply = h
        .client()
        .await
        .deduplicate(DeduplicateRequest { items, threshold: Some(0.99), model: None, embedding_model: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.items.len(), 5);
    assert_eq!(reply.clusters_merged, 0);
    assert_eq!(h.chats().len(), 1);
}

#[tokio::test]
async fn dedup_reports_an_unparseable_merge_and_keeps_the_cluster() {
    let h = harness().await;
    let (items, vectors) = five_items();
    h.llm.set_handler(move |req| {
        if req.is_embeddings() {
            Reply::embeddings(req.embedding_inputs().iter().map(|t| vectors[t].clone()).collect())
        } else {
            Reply::text("{\"question\": ")
        }
    });
    let reply =
        h.client().await.deduplicate(DeduplicateRequest { items, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(reply.items.len(), 5);
    assert_eq!(reply.clusters_merged, 0);
    let errors: Vec<&str> =
        reply.actions.iter().filter(|a| a.kind == ActionKind::Error as i32).map(|a| a.item_id.as_str()).collect();
    assert_eq!(errors, vec!["q1", "q3", "q4"]);
}

#[tokio::test]
async fn tagger_keeps_items_passing_both_and_reports_parse_failures() {
    let h = harness().await;
    h.llm.set_handler(|req| {
        let (_, p) = prompt_kind(req);
        let q = line_after(&p, "Question: ");
        match q.as_str() {
            "Is the tone polite?" => {
                Reply::json(json!({"reasoning": "universal", "generally_applicable": true, "section_specific": true}))
                    .usage(100, 20)
            }
            "Does the code compile?" => Reply::json(
                json!({"reasoning": "n/a without code", "generally_applicable": false, "section_specific": true}),
            ),
            "Is it short and well cited?" => {
                Reply::json(json!({"reasoning": "two checks", "generally_applicable": true, "section_specific": false}))
            }
            _ => Reply::text("I think this question is fine."),
        }
    });
    let items = vec![
        item("a", "Is the tone polite?", 100.0),
        item("b", "Does the code compile?", 100.0),
        item("c", "Is it short and well cited?", 100.0),
        item("d", "Is it good?", 100.0),
    ];
    let reply = h.client().await.tag(TagRequest { items, model: None, concurrency: 2 }).await.unwrap().into_inner();
    let ids: Vec<&str> = reply.items.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, vec!["a"]);
    assert_eq!(reply.items[0].metadata["tag_reasoning"], "universal");
    assert_eq!(reply.parse_failures, 1);
    let tags: Vec<(&str, bool, bool, bool)> = reply
        .tags
        .iter()
        .map(|t| (t.item_id.as_str(), t.generally_applicable, t.section_specific, !t.error.is_empty()))
        .collect();
    assert_eq!(
        tags,
        vec![("a", true, true, false), ("b", false, true, false), ("c", true, false, false), ("d", false, false, true)]
    );
    assert!(reply.tags[3].error.contains("could not be parsed"), "{}", reply.tags[3].error);
    assert_eq!(
        reply.actions.iter().map(|a| ActionKind::try_from(a.kind).unwrap()).collect::<Vec<_>>(),
        vec![ActionKind::Kept, ActionKind::Removed, ActionKind::Removed, ActionKind::Error]
    );
    assert!(reply.actions[1].reason.contains("not generally applicable"));
    let usage = reply.usage.unwrap();
    assert_eq!(usage.calls, 4);
    assert!(usage.prompt_tokens >= 100);
    assert_eq!(h.chats().len(), 4);
}

fn sample(id: &str, text: &str, answers: &[(&str, common::Answer)]) -> Sample {
    Sample {
        id: id.into(),
        text: text.into(),
        answers: answers.iter().map(|(k, a)| (k.to_string(), *a as i32)).collect(),
    }
}

/// Rewrites echo "REWRITTEN <sample text>"; the scorer answers YES (failure missed) for the
/// rewrites listed in `missed` as (question, sample text) and NO otherwise.
fn unit_test_handler(llm: &ScriptedLlm, missed: &'static [(&'static str, &'static str)]) {
    llm.set_handler(move |req| {
        let (kind, p) = prompt_kind(req);
        match kind {
            "rewrite" => {
                let text = line_after(&p, "Response that passes:\n");
                Reply::text(format!("REWRITTEN {text}")).usage(30, 10)
            }
            "score" => {
                let q = line_after(&p, "Question: ");
                let target = line_after(&p, "<response>\n");
                let caught = !missed.iter().any(|(mq, mt)| q == *mq && target == format!("REWRITTEN {mt}"));
                Reply::json(json!({"answer": if caught { "NO" } else { "YES" }})).usage(20, 2)
            }
            _ => Reply::status(400),
        }
    });
}

/// Samples given without answers are scored first, in one batch-mode scorer call per sample
/// against every item; then the test runs on the samples that passed.
#[tokio::test]
async fn unit_tester_scores_samples_given_without_answers() {
    let h = harness().await;
    h.llm.set_handler(|req| {
        let (kind, p) = prompt_kind(req);
        match kind {
            "rewrite" => Reply::text(format!("REWRITTEN {}", line_after(&p, "Response that passes:\n"))),
            // The batch scoring of a raw sample: "date" passes on "sample one" only, "short" on both.
            "score" if p.contains("Q1: ") => {
                let one = p.contains("sample one");
                Reply::json(json!({"answers": [
                    {"question_index": 1, "answer": if one { "YES" } else { "NO" }},
                    {"question_index": 2, "answer": "YES"}
                ]}))
            }
            // Every rewrite is caught.
            "score" => Reply::json(json!({"answer": "NO"})),
            _ => Reply::status(400),
        }
    });
    let raw = |id: &str, text: &str| Sample { id: id.into(), text: text.into(), answers: Default::default() };
    let reply = h
        .client()
        .await
        .unit_test(UnitTestRequest {
            items: vec![item("date", "Does it mention a date?", 100.0), item("short", "Is it short?", 100.0)],
            samples: vec![raw("s1", "sample one"), raw("s2", "sample two")],
            input: "Describe your weekend.".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let results: Vec<(&str, u32, u32, u32, bool)> = reply
        .results
        .iter()
        .map(|r| (r.item_id.as_str(), r.samples, r.correct_failures, r.unchecked, r.kept))
        .collect();
    assert_eq!(results, vec![("date", 1, 1, 0, true), ("short", 2, 2, 0, true)]);
    let chats = h.chats();
    let batch = chats.iter().filter(|r| prompt_kind(r).0 == "score" && prompt_kind(r).1.contains("Q1: ")).count();
    assert_eq!(batch, 2, "each raw sample scored once, in batch mode");
    assert_eq!(chats.iter().filter(|r| prompt_kind(r).0 == "rewrite").count(), 3);
}

#[tokio::test]
async fn unit_tester_rates_rewrites_and_applies_the_threshold() {
    use common::Answer::{No, Yes};
    let h = harness().await;
    unit_test_handler(
        &h.llm,
        &[
            ("Does it mention a date?", "sample four"),
            ("Is it under fifty words?", "sample two"),
            ("Is it under fifty words?", "sample three"),
        ],
    );
    let items = vec![
        item("date", "Does it mention a date?", 100.0),
        item("short", "Is it under fifty words?", 100.0),
        item("never", "Is it in French?", 100.0),
    ];
    let samples = vec![
        sample("s1", "sample one", &[("date", Yes), ("short", Yes), ("never", No)]),
        sample("s2", "sample two", &[("date", Yes), ("short", Yes), ("never", No)]),
        sample("s3", "sample three", &[("date", Yes), ("short", Yes)]),
        sample("s4", "sample four", &[("date", Yes), ("short", No)]),
        sample("s5", "sample five", &[("date", No)]),
    ];
    let reply = h
        .client()
        .await
        .unit_test(UnitTestRequest {
            items: items.clone(),
            samples: samples.clone(),
            input: "Describe your weekend.".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let results: Vec<(&str, u32, u32, bool)> =
        reply.results.iter().map(|r| (r.item_id.as_str(), r.samples, r.correct_failures, r.kept)).collect();
    // date: 3 of 4 caught = 0.75 >= 0.7; short: 1 of 3 < 0.7; never: no passing sample.
    assert_eq!(results, vec![("date", 4, 3, true), ("short", 3, 1, false), ("never", 0, 0, false)]);
    assert!((reply.results[0].rate - 0.75).abs() < 1e-12);
    assert_eq!(reply.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), vec!["date"]);
    assert_eq!(reply.items[0].metadata["enforceability_rate"], "0.75");
    assert!(reply.actions[2].reason.contains("untestable"), "{}", reply.actions[2].reason);
    assert_eq!(ActionKind::try_from(reply.actions[1].kind).unwrap(), ActionKind::Removed);

    // 7 rewrites + 7 scorer calls, all on the request's backend and model.
    let chats = h.chats();
    assert_eq!(chats.len(), 14);
    assert!(chats.iter().all(|r| r.model() == Some("refiner-1")));
    assert_eq!(chats.iter().filter(|r| prompt_kind(r).0 == "score").count(), 7);
    let rewrite = chats.iter().find(|r| prompt_kind(r).0 == "rewrite").unwrap().last_user_message().unwrap();
    assert!(rewrite.contains("Describe your weekend."));
    let usage = reply.usage.unwrap();
    assert_eq!(usage.calls, 14);
    assert_eq!(usage.prompt_tokens, 7 * 30 + 7 * 20);

    // A lower threshold keeps "short" too; max_samples 2 with a seed draws the same 2 every time.
    let run = |threshold: f64| {
        let (items, samples) = (items.clone(), samples.clone());
        let h = &h;
        async move {
            h.client()
                .await
                .unit_test(UnitTestRequest {
                    items,
                    samples,
                    threshold: Some(threshold),
                    max_samples: Some(2),
                    seed: Some(42),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let before = h.chats().len();
    let a = run(0.3).await;
    let drawn_a: Vec<String> = h.chats()[before..]
        .iter()
        .filter(|r| prompt_kind(r).0 == "rewrite")
        .map(|r| r.last_user_message().unwrap())
        .collect();
    let mid = h.chats().len();
    let b = run(0.3).await;
    let drawn_b: Vec<String> = h.chats()[mid..]
        .iter()
        .filter(|r| prompt_kind(r).0 == "rewrite")
        .map(|r| r.last_user_message().unwrap())
        .collect();
    assert_eq!(a.results.iter().map(|r| r.samples).collect::<Vec<_>>(), vec![2, 2, 0]);
    assert_eq!(a.results, b.results);
    let mut sa = drawn_a.clone();
    let mut sb = drawn_b.clone();
    sa.sort();
    sb.sort();
    assert_eq!(sa, sb, "the seeded draw is deterministic");
}

fn angles_request(angles: &[f64]) -> (Vec<common::ChecklistItem>, HashMap<String, Vec<f32>>) {
    let items: Vec<common::ChecklistItem> = angles
        .iter()
        .enumerate()
        .map(|(i, _)| item(&format!("i{i}"), &format!("Question number {i}?"), 100.0))
        .collect();
    let vectors = items.iter().zip(angles).map(|(it, a)| (it.question.clone(), unit(*a))).collect();
    (items, vectors)
}

#[tokio::test]
async fn selector_picks_diverse_and_covering_subsets() {
    let h = harness().await;
    // Three near-identical questions and one opposite.
    let (items, vectors) = angles_request(&[0.0, 1.0, 2.0, 180.0]);
    install_handler(&h.llm, vectors);
    let mut client = h.client().await;
    let select = |max: u32, alpha: Option<f64>, coverage: Vec<CoverageEntry>| SelectRequest {
        items: items.clone(),
        max_questions: Some(max),
        beam_width: None,
        length_penalty: None,
        alpha,
        coverage,
        embedding_model: None,
    };
    // Diversity only: the opposite pair {0, 180deg}, diversity 1 - cos(180) = 2.
    let r = client.select(select(2, None, vec![])).await.unwrap().into_inner();
    assert_eq!(r.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), vec!["i0", "i3"]);
    assert!((r.diversity - 2.0).abs() < 1e-6);
    assert!((r.score - (2.0 - 2.0 * 0.0005)).abs() < 1e-6);
    assert!(!r.passthrough);
    assert_eq!(
        r.actions.iter().map(|a| ActionKind::try_from(a.kind).unwrap()).collect::<Vec<_>>(),
        vec![ActionKind::Kept, ActionKind::Removed, ActionKind::Removed, ActionKind::Kept]
    );

    // Coverage: i1 covers o1 and o2, i2 covers o3. Strong coverage weight picks {i1, i2}, which
    // covers all three; at alpha 0.5 diversity wins back {i1 or i0, i3}.
    let coverage = vec![
        CoverageEntry { observation: "o1".into(), item_ids: vec!["i1".into()] },
        CoverageEntry { observation: "o2".into(), item_ids: vec!["i1".into()] },
        CoverageEntry { observation: "o3".into(), item_ids: vec!["i2".into()] },
    ];
    let r = client.select(select(2, Some(0.9), coverage.clone())).await.unwrap().into_inner();
    assert_eq!(r.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), vec!["i1", "i2"]);
    assert!((r.coverage - 1.0).abs() < 1e-12);
    let div = 1.0 - 1f64.to_radians().cos();
    assert!((r.diversity - div).abs() < 1e-6);
    assert!((r.score - (0.9 + 0.1 * div - 0.001)).abs() < 1e-6);
    let r = client.select(select(2, Some(0.5), coverage)).await.unwrap().into_inner();
    assert_eq!(r.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), vec!["i1", "i3"]);
    assert!((r.coverage - 2.0 / 3.0).abs() < 1e-12);

    // Small input: passthrough, unchanged, diversity still reported.
    let r = client.select(select(20, None, vec![])).await.unwrap().into_inner();
    assert!(r.passthrough);
    assert_eq!(r.items, items);
    let expected =
        1.0 - ([1.0f64, 2.0, 180.0, 1.0, 179.0, 178.0].iter().map(|d| d.to_radians().cos()).sum::<f64>() / 6.0);
    assert!((r.diversity - expected).abs() < 1e-6);
}

#[tokio::test]
async fn selector_is_deterministic_and_matches_the_library_on_many_candidates() {
    let h = harness().await;
    let n = 60;
    let items: Vec<common::ChecklistItem> =
        (0..n).map(|i| item(&format!("c{i}"), &format!("Candidate question {i}?"), 100.0)).collect();
    let vectors: HashMap<String, Vec<f32>> =
        items.iter().map(|it| (it.question.clone(), hash_embedding(&it.question, 8))).collect();
    let expected = {
        let v: Vec<Vec<f32>> = items.iter().map(|it| vectors[&it.question].clone()).collect();
        let cfg = BeamConfig { max_questions: 7, beam_width: 3, ..Default::default() };
        beam_search(&cosine_matrix(&v), None, &cfg)
    };
    install_handler(&h.llm, vectors);
    let req = SelectRequest { items, max_questions: Some(7), beam_width: Some(3), ..Default::default() };
    let a = h.client().await.select(req.clone()).await.unwrap().into_inner();
    let b = h.client().await.select(req).await.unwrap().into_inner();
    assert_eq!(a, b);
    let ids: Vec<String> = a.items.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids, expected.indices.iter().map(|i| format!("c{i}")).collect::<Vec<_>>());
    assert_eq!(ids.len(), 7);
    assert!((a.diversity - expected.diversity).abs() < 1e-9);
}

fn chain_steps() -> Vec<RefinerStep> {
    vec![
        RefinerStep { step: Some(Step::Deduplicate(DeduplicateRequest::default())) },
        RefinerStep { step: Some(Step::Tag(TagRequest::default())) },
        RefinerStep { step: Some(Step::Select(SelectRequest { max_questions: Some(2), ..Default::default() })) },
    ]
}

#[tokio::test]
async fn chain_streams_step_completed_events_in_order_then_the_result() {
    let h = harness().await;
    let (items, mut vectors) = five_items();
    // The merged question points the same way as the others of its cluster.
    vectors.insert("MERGED: Is the answer short?".into(), unit(10.0));
    install_handler(&h.llm, vectors);
    let mut stream = h
        .client()
        .await
        .refine_checklist_stream(RefineChecklistStreamRequest {
            request: Some(RefineChecklistRequest { items: items.clone(), steps: chain_steps() }),
        })
        .await
        .unwrap()
        .into_inner();
    let mut steps = Vec::new();
    let mut result = None;
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event.unwrap() {
            Event::StepCompleted(s) => {
                assert!(result.is_none(), "steps come before the result");
                steps.push((s.refiner, s.items_in, s.items_out, s.actions.len()));
            }
            Event::Result(r) => result = Some(r),
            Event::Progress(_) => {}
        }
    }
    assert_eq!(
        steps,
        vec![("deduplicator".to_string(), 5, 3, 5), ("tagger".to_string(), 3, 3, 3), ("selector".to_string(), 3, 2, 3),]
    );
    let result = result.expect("a final result");
    assert_eq!(result.items.len(), 2);
    assert_eq!(result.actions.len(), 11);
    assert_eq!(result.actions[0].refiner, "deduplicator");
    assert_eq!(result.actions[10].refiner, "selector");
    // 2 embedding calls (dedup, select) + 1 merge + 3 tags.
    assert_eq!(result.usage.unwrap().calls, 6);

    // The unary form gives the same items.
    let unary = h
        .client()
        .await
        .refine_checklist(RefineChecklistRequest { items, steps: chain_steps() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unary.items, result.items);
    assert_eq!(unary.actions, result.actions);
}

fn violations(status: &tonic::Status) -> Vec<String> {
    status
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field() {
    let h = harness().await;
    install_handler(&h.llm, HashMap::new());
    let mut c = h.client().await;
    let two = vec![item("a", "Is it short?", 100.0), item("b", "Is it polite?", 100.0)];
    let yes = |id: &str| sample("s1", "text", &[(id, common::Answer::Yes)]);

    let mut cases: Vec<(tonic::Status, &str)> = vec![
        (c.deduplicate(DeduplicateRequest::default()).await.unwrap_err(), "items"),
        (
            c.deduplicate(DeduplicateRequest { items: two.clone(), threshold: Some(0.0), ..Default::default() })
                .await
                .unwrap_err(),
            "threshold",
        ),
        (c.unit_test(UnitTestRequest { items: two.clone(), ..Default::default() }).await.unwrap_err(), "samples"),
        (
            c.unit_test(UnitTestRequest { items: two.clone(), samples: vec![yes("zzz")], ..Default::default() })
                .await
                .unwrap_err(),
            "samples",
        ),
        (
            c.unit_test(UnitTestRequest {
                items: two.clone(),
                samples: vec![sample("s1", "t", &[("a", common::Answer::Unspecified)])],
                ..Default::default()
            })
            .await
            .unwrap_err(),
            "samples[0].answers[\"a\"]",
        ),
        (
            c.select(SelectRequest { items: two.clone(), max_questions: Some(0), ..Default::default() })
                .await
                .unwrap_err(),
            "max_questions",
        ),
        (
            c.select(SelectRequest { items: two.clone(), beam_width: Some(0), ..Default::default() })
                .await
                .unwrap_err(),
            "beam_width",
        ),
        (
            c.select(SelectRequest { items: two.clone(), alpha: Some(1.5), ..Default::default() }).await.unwrap_err(),
            "alpha",
        ),
        (
            c.select(SelectRequest { items: two.clone(), length_penalty: Some(-0.1), ..Default::default() })
                .await
                .unwrap_err(),
            "length_penalty",
        ),
        (
            c.tag(TagRequest { items: vec![item("a", " ", 100.0)], ..Default::default() }).await.unwrap_err(),
            "items[0].question",
        ),
        (
            c.tag(TagRequest {
                items: (0..2001).map(|i| item(&format!("x{i}"), "q?", 100.0)).collect(),
                ..Default::default()
            })
            .await
            .unwrap_err(),
            "items",
        ),
        (
            c.tag(TagRequest {
                items: two.clone(),
                model: Some(common::ModelSpec { backend: "nope".into(), ..Default::default() }),
                ..Default::default()
            })
            .await
            .unwrap_err(),
            "model.backend",
        ),
        (
            c.refine_checklist(RefineChecklistRequest {
                items: two.clone(),
                steps: vec![RefinerStep {
                    step: Some(Step::Deduplicate(DeduplicateRequest { threshold: Some(1.5), ..Default::default() })),
                }],
            })
            .await
            .unwrap_err(),
            "steps[0].deduplicate.threshold",
        ),
        (
            c.refine_checklist(RefineChecklistRequest { items: two.clone(), steps: vec![RefinerStep { step: None }] })
                .await
                .unwrap_err(),
            "steps[0]",
        ),
        (
            c.refine_checklist(RefineChecklistRequest {
                items: two.clone(),
                steps: vec![RefinerStep {
                    step: Some(Step::UnitTest(UnitTestRequest { samples: vec![yes("zzz")], ..Default::default() })),
                }],
            })
            .await
            .unwrap_err(),
            "steps[0].unit_test.samples",
        ),
        (c.refine_checklist_stream(RefineChecklistStreamRequest { request: None }).await.unwrap_err(), "request"),
        (
            c.refine_checklist_stream(RefineChecklistStreamRequest {
                request: Some(RefineChecklistRequest {
                    items: two.clone(),
                    steps: vec![RefinerStep {
                        step: Some(Step::Select(SelectRequest { max_questions: Some(0), ..Default::default() })),
                    }],
                }),
            })
            .await
            .unwrap_err(),
            "request.steps[0].select.max_questions",
        ),
    ];
    for (status, field) in cases.drain(..) {
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        let fields = violations(&status);
        assert!(fields.iter().any(|f| f == field), "{field}: {fields:?}");
    }
    let too_many = c
        .tag(TagRequest {
            items: (0..2001).map(|i| item(&format!("x{i}"), "q?", 100.0)).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(too_many.message().contains("the limit is 2000"), "{}", too_many.message());
    let s = c.self_refine(SelfRefineRequest::default()).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert_eq!(violations(&s), vec!["draft".to_string()]);
    assert_eq!(h.llm.request_count(), 0, "bad input never reaches the backend");
}
