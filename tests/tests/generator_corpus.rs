//! Corpus-level generation (feedback, checkeval, interacteval) over real gRPC on port 0, against
//! the scripted OpenAI-compatible backend with scripted (hash) embeddings. The built-in refiners
//! are the refiners service (port 0, same backend), reached over gRPC as in production.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use assay_domain::generator::{ChecklistGenerator, CorpusPreset, CorpusProgress, CorpusRequest};
use assay_generator::Generator;
use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::common::v1 as common;
use assay_proto::generator::v1 as pb;
use assay_proto::generator::v1::generate_corpus_stream_response::Event;
use assay_proto::generator::v1::generator_service_client::GeneratorServiceClient;
use assay_rpc::remote::{RemoteGenerator, RemoteRefiners};
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer, hash_embedding};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

const DIM: usize = 64;

struct Harness {
    llm: ScriptedLlm,
    server: TestServer,
    /// The refiners service the generator refines with.
    _refiners: TestServer,
    /// The scorer the refiners' UnitTester scores with.
    _scorer: TestServer,
}

impl Harness {
    async fn client(&self) -> GeneratorServiceClient<Channel> {
        GeneratorServiceClient::new(self.server.channel().await)
    }

    fn chat_requests(&self) -> Vec<RecordedRequest> {
        self.llm.requests().into_iter().filter(RecordedRequest::is_chat).collect()
    }

    /// Chat requests whose schema is `name`.
    fn calls(&self, name: &str) -> Vec<RecordedRequest> {
        self.chat_requests().into_iter().filter(|r| schema_name(r) == name).collect()
    }
}

async fn harness() -> Harness {
    let llm = ScriptedLlm::start().await;
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "gen-1".into();
    cfg.base_backoff = Duration::from_millis(5);
    cfg.max_retries = 1;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let scorer = TestServer::start(
        assay_scorer::routes(Arc::new(assay_scorer::ScorerCore::new(hub.clone(), 4))),
        &[assay_proto::service_names::SCORER],
    )
    .await;
    let remote_scorer = Arc::new(assay_rpc::remote::RemoteScorer::new(scorer.channel().await, None));
    let refiners = TestServer::start(
        assay_refiners::routes(Arc::new(
            assay_refiners::ChecklistRefiners::new(hub.clone()).with_scorer(remote_scorer),
        )),
        &[assay_proto::service_names::REFINERS],
    )
    .await;
    let remote_refiners = Arc::new(RemoteRefiners::new(refiners.channel().await, None));
    let server = TestServer::start(
        assay_generator::routes(Arc::new(Generator::new(hub).with_refiners(remote_refiners))),
        &[assay_proto::service_names::GENERATOR],
    )
    .await;
    Harness { llm, server, _refiners: refiners, _scorer: scorer }
}

fn schema_name(r: &RecordedRequest) -> String {
    r.body["response_format"]["json_schema"]["name"].as_str().unwrap_or_default().to_string()
}

fn schema(r: &RecordedRequest) -> &Value {
    &r.body["response_format"]["json_schema"]["schema"]
}

fn temperature(r: &RecordedRequest) -> f64 {
    r.body["temperature"].as_f64().unwrap_or_else(|| panic!("no temperature in {}", r.body))
}

fn prompt(r: &RecordedRequest) -> String {
    r.last_user_message().unwrap_or_default()
}

/// The `[n]` indices listed at the start of the prompt's lines.
fn listed_indices(prompt: &str) -> Vec<usize> {
    prompt.lines().filter_map(|l| l.strip_prefix('[')?.split_once(']')?.0.parse().ok()).collect()
}

/// A handler answering embeddings with hash vectors and chat calls with `chat`.
fn with_embeddings(
    chat: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r: &RecordedRequest| {
        if r.is_embeddings() {
            Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, DIM)).collect())
        } else {
            chat(r)
        }
    }
}

fn observations(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("observation {i}")).collect()
}

fn skip_all() -> pb::CorpusRefinement {
    pb::CorpusRefinement { skip_deduplication: true, skip_tagging: true, skip_selection: true, ..Default::default() }
}

fn feedback_request(obs: Vec<String>) -> pb::GenerateCorpusRequest {
    pb::GenerateCorpusRequest {
        preset: pb::Preset::Feedback as i32,
        corpus_description: "customer support replies".into(),
        observations: obs,
        ..Default::default()
    }
}

#[tokio::test]
async fn feedback_batches_show_global_indices_and_keep_valid_sources() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(|r| {
        let idx = listed_indices(&prompt(r));
        let (first, last) = (idx[0], *idx.last().unwrap());
        Reply::json(json!({"questions": [
            {"question": format!("Does it address comments {first} to {last}?"),
             "source_feedback_indices": [last, first, 9999, (first + 100) % 250]},
            {"question": format!("Is it specific about comment {first}?"), "source_feedback_indices": [format!("{}", first + 1), -3]}
        ]}))
        .usage(100, 20)
    }));
    let mut client = h.client().await;
    let mut req = feedback_request(observations(250));
    req.refinement = Some(skip_all());
    let reply = client.generate_corpus(req).await.unwrap().into_inner();

    // Three calls, each listing its batch with global indices and nothing else.
    let calls = h.calls("feedback_questions");
    assert_eq!(calls.len(), 3);
    let mut ranges: Vec<Vec<usize>> = calls.iter().map(|r| listed_indices(&prompt(r))).collect();
    ranges.sort();
    assert_eq!(ranges, vec![(0..100).collect::<Vec<_>>(), (100..200).collect(), (200..250).collect()]);
    for r in &calls {
        let p = prompt(r);
        let first = listed_indices(&p)[0];
        assert!(p.contains(&format!("[{first}] observation {first}\n")), "{p}");
        assert!(p.contains("customer support replies"));
        assert!((temperature(r) - 0.7).abs() < 1e-6);
        let items = &schema(r)["properties"]["questions"]["items"]["properties"]["source_feedback_indices"]["items"];
        assert_eq!(items["minimum"], first);
    }
    assert_eq!(h.llm.requests().iter().filter(|r| r.is_embeddings()).count(), 0, "no refiner ran");

    let cl = reply.checklist.unwrap();
    assert_eq!(cl.source_method, "feedback");
    assert_eq!(cl.generation_level, common::GenerationLevel::Corpus as i32);
    assert_eq!(cl.corpus_description, "customer support replies");
    assert_eq!(reply.raw_questions, 6);
    let got: Vec<(&str, Vec<u32>)> = cl.items.iter().map(|i| (i.id.as_str(), i.source_indices.clone())).collect();
    assert_eq!(
        got,
        vec![
            ("fb-0", vec![0, 99]),
            ("fb-1", vec![1]),
            ("fb-2", vec![100, 199]),
            ("fb-3", vec![101]),
            ("fb-4", vec![200, 249]),
            ("fb-5", vec![201]),
        ]
    );
    // Per batch: 9999, -3 and an index of another batch (batch 0 names 100, 1 names 200, 2 names 50).
    assert_eq!(cl.metadata["dropped_source_indices"], "9");
    assert_eq!(cl.metadata["observation_count"], "250");
    assert_eq!(cl.metadata["batches"], "3");
    let usage = reply.usage.unwrap();
    assert_eq!((usage.calls, usage.prompt_tokens, usage.completion_tokens), (3, 300, 60));
    let model = reply.model.unwrap();
    assert_eq!((model.phase.as_str(), model.model.as_str(), model.temperature), ("generator", "gen-1", Some(0.7)));
    assert_eq!(model.prompt_template_sha256.len(), 64);
}

#[tokio::test]
async fn batch_size_sets_the_number_of_calls() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(|r| {
        let first = listed_indices(&prompt(r))[0];
        Reply::json(json!({"questions": [{"question": format!("Q{first}?"), "source_feedback_indices": [first]}]}))
    }));
    let mut client = h.client().await;
    let mut req = feedback_request(observations(7));
    req.batch_size = Some(3);
    req.concurrency = 2;
    req.refinement = Some(skip_all());
    let reply = client.generate_corpus(req).await.unwrap().into_inner();
    assert_eq!(h.calls("feedback_questions").len(), 3);
    let qs: Vec<String> = reply.checklist.unwrap().items.into_iter().map(|i| i.question).collect();
    assert_eq!(qs, vec!["Q0?", "Q3?", "Q6?"], "pooled in batch order");
}

/// Two batches of three; "Is it concise?" comes from both (merged by the Deduplicator), "Is it
/// vague?" fails the Tagger.
fn refinement_handler(r: &RecordedRequest) -> Reply {
    let p = prompt(r);
    match schema_name(r).as_str() {
        "feedback_questions" => {
            if listed_indices(&p)[0] == 0 {
                Reply::json(json!({"questions": [
                    {"question": "Is it concise?", "source_feedback_indices": [0, 1]},
                    {"question": "Is it polite?", "source_feedback_indices": [2]}
                ]}))
            } else {
                Reply::json(json!({"questions": [
                    {"question": "Is it concise?", "source_feedback_indices": [3, 4]},
                    {"question": "Does it cite sources?", "source_feedback_indices": [5]},
                    {"question": "Is it vague?", "source_feedback_indices": []}
                ]}))
            }
        }
        "merged_question" => Reply::json(json!({"question": "Is the response concise?"})),
        "question_tags" => {
            let ok = !p.contains("vague");
            Reply::json(json!({"reasoning": "r", "generally_applicable": ok, "section_specific": true}))
        }
        other => Reply::status(500).body(format!("unexpected schema {other}")),
    }
}

/// feedback with `run_unit_tester`: the samples are scored against the questions, the passing ones
/// rewritten to fail, and only questions that catch the rewrites are kept.
#[tokio::test]
async fn feedback_runs_the_unit_tester_on_its_samples() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(|r| {
        let p = prompt(r);
        match schema_name(r).as_str() {
            "feedback_questions" => Reply::json(json!({"questions": [
                {"question": "Is it concise?", "source_feedback_indices": [0]},
                {"question": "Is it polite?", "source_feedback_indices": [1]}
            ]})),
            // Both samples pass both questions.
            "checklist_answers" => Reply::json(json!({"answers": [
                {"question_index": 1, "answer": "YES"}, {"question_index": 2, "answer": "YES"}
            ]})),
            // Rewrites: the conciseness question catches them, the politeness one never does.
            "checklist_answer" => {
                Reply::json(json!({"answer": if p.contains("Is it concise?") { "NO" } else { "YES" }}))
            }
            "" if p.contains("Response that passes:") => Reply::text("a long, rude rewrite"),
            other => Reply::status(500).body(format!("unexpected schema {other}")),
        }
    }));
    let mut req = feedback_request(observations(2));
    req.refinement = Some(pb::CorpusRefinement {
        skip_deduplication: true,
        skip_tagging: true,
        skip_selection: true,
        run_unit_tester: true,
        unit_test_samples: vec!["Thanks, done.".into(), "Fixed it for you.".into()],
        ..Default::default()
    });
    let reply = h.client().await.generate_corpus(req).await.unwrap().into_inner();
    let qs: Vec<String> = reply.checklist.unwrap().items.into_iter().map(|i| i.question).collect();
    assert_eq!(qs, vec!["Is it concise?"]);
    assert_eq!(h.calls("checklist_answers").len(), 2, "each sample scored once against the questions");
    assert_eq!(h.calls("checklist_answer").len(), 4, "2 questions x 2 passing samples, one rewrite each");

    // Samples without the flag, or the flag without samples, are refused naming the field.
    let mut client = h.client().await;
    for (refinement, field) in [
        (
            pb::CorpusRefinement { unit_test_samples: vec!["x".into()], ..Default::default() },
            "refinement.unit_test_samples",
        ),
        (pb::CorpusRefinement { run_unit_tester: true, ..Default::default() }, "refinement.run_unit_tester"),
    ] {
        let mut req = feedback_request(observations(2));
        req.refinement = Some(refinement);
        let err = client.generate_corpus(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains(field), "{}", err.message());
    }
}

#[tokio::test]
async fn feedback_refinement_streams_progress_and_selects_with_coverage_through_merges() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(refinement_handler));
    let mut client = h.client().await;
    let mut req = feedback_request(observations(6));
    req.batch_size = Some(3);
    req.model = Some(common::ModelSpec { model: "big-1".into(), ..Default::default() });
    req.refinement = Some(pb::CorpusRefinement { max_questions: Some(1), ..Default::default() });
    let mut stream = client
        .generate_corpus_stream(pb::GenerateCorpusStreamRequest { request: Some(req) })
        .await
        .unwrap()
        .into_inner();
    let mut progress = Vec::new();
    let mut result = None;
    while let Some(msg) = stream.message().await.unwrap() {
        match msg.event.unwrap() {
            Event::Progress(p) => {
                assert!(result.is_none(), "progress after the result");
                progress.push(p);
            }
            Event::Result(r) => result = Some(r),
        }
    }
    let got: Vec<(&str, u32, u32)> = progress.iter().map(|p| (p.stage.as_str(), p.done, p.total)).collect();
    assert_eq!(got, vec![("batch", 1, 2), ("batch", 2, 2), ("refine", 1, 3), ("refine", 2, 3), ("refine", 3, 3)]);
    let refine: Vec<&str> = progress[2..].iter().map(|p| p.message.as_str()).collect();
    assert_eq!(
        refine,
        vec!["deduplicator: 5 -> 4 questions", "tagger: 4 -> 3 questions", "selector: 3 -> 1 questions"]
    );

    let reply = result.expect("a result");
    assert_eq!(reply.raw_questions, 5);
    let cl = reply.checklist.unwrap();
    // The merged question covers observations 0, 1, 3, 4: coverage 4/6 beats 1/6.
    assert_eq!(cl.items.len(), 1);
    let item = &cl.items[0];
    assert_eq!((item.id.as_str(), item.question.as_str()), ("fb-0-merged", "Is the response concise?"));
    assert_eq!(item.merged_from, vec!["fb-0", "fb-2"]);
    assert_eq!(item.source_indices, vec![0, 1, 3, 4]);
    assert_eq!(cl.metadata["observation_coverage"], "0.6667");

    // The refiners used the generator's backend and model.
    let chats = h.chat_requests();
    assert_eq!(chats.len(), 2 + 1 + 4, "2 batches, 1 merge, 4 tags");
    assert!(chats.iter().all(|r| r.model() == Some("big-1")), "same model everywhere");
    assert!(h.llm.requests().iter().any(RecordedRequest::is_embeddings));
    assert!(reply.usage.unwrap().calls >= 7);
}

#[tokio::test]
async fn skip_flags_choose_the_refiners() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(refinement_handler));
    let mut client = h.client().await;

    // Dedup only: the duplicate is merged, nothing tagged, nothing selected.
    let mut req = feedback_request(observations(6));
    req.batch_size = Some(3);
    req.refinement = Some(pb::CorpusRefinement { skip_tagging: true, skip_selection: true, ..Default::default() });
    let reply = client.generate_corpus(req).await.unwrap().into_inner();
    let ids: Vec<String> = reply.checklist.unwrap().items.into_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec!["fb-0-merged", "fb-1", "fb-3", "fb-4"]);
    assert!(h.calls("question_tags").is_empty());
    assert_eq!(h.calls("merged_question").len(), 1);

    // Tagging only: no embeddings at all, the vague question is removed, the duplicate stays.
    let before = h.llm.request_count();
    let mut req = feedback_request(observations(6));
    req.batch_size = Some(3);
    req.refinement =
        Some(pb::CorpusRefinement { skip_deduplication: true, skip_selection: true, ..Default::default() });
    let reply = client.generate_corpus(req).await.unwrap().into_inner();
    let ids: Vec<String> = reply.checklist.unwrap().items.into_iter().map(|i| i.id).collect();
    assert_eq!(ids, vec!["fb-0", "fb-1", "fb-2", "fb-3"]);
    let later = &h.llm.requests()[before..];
    assert!(!later.iter().any(RecordedRequest::is_embeddings));
    assert_eq!(later.iter().filter(|r| schema_name(r) == "question_tags").count(), 5);

    // A dedup threshold above every similarity of distinct questions still merges identical ones.
    let mut req = feedback_request(observations(6));
    req.batch_size = Some(3);
    req.refinement = Some(pb::CorpusRefinement {
        skip_tagging: true,
        skip_selection: true,
        dedup_threshold: Some(0.999),
        ..Default::default()
    });
    let reply = client.generate_corpus(req).await.unwrap().into_inner();
    assert_eq!(reply.checklist.unwrap().items.len(), 4);
}

/// The `DIMENSION:` line of a checkeval prompt.
fn dimension_of(p: &str) -> String {
    p.lines().find_map(|l| l.strip_prefix("DIMENSION: ")).unwrap_or_default().to_string()
}

/// Checkeval backend: each call fills its schema exactly (maxItems questions spread over the
/// sub-dimension enum). Augmentation repeats one seed (and diversification one elaboration)
/// word for word, so combined mode has exact duplicates to merge.
fn checkeval_handler(r: &RecordedRequest) -> Reply {
    let p = prompt(r);
    let name = schema_name(r);
    if name == "checkeval_filter" {
        let q = p.lines().find_map(|l| l.strip_prefix("QUESTION: ")).unwrap_or_default().to_string();
        if q.contains("seed q1") {
            return Reply::json(json!({"reasoning": "", "alignment_pass": false, "dimension_consistent": true}));
        }
        if q.contains("Fluency") && q.contains("seed q0") {
            return Reply::json(json!({"reasoning": "", "alignment_pass": true, "dimension_consistent": false}));
        }
        if q.contains("Coherence Logic seed q0") {
            return Reply::text("I would rather not say.");
        }
        return Reply::json(json!({"reasoning": "", "alignment_pass": true, "dimension_consistent": true}));
    }
    let s = schema(r)["properties"]["questions"].clone();
    let max = s["maxItems"].as_u64().unwrap() as usize;
    let subs: Vec<String> = s["items"]["properties"]["sub_aspect"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let per_sub = max / subs.len();
    let dim = dimension_of(&p);
    let mode = p.lines().find_map(|l| l.strip_prefix("Strategy: ")).unwrap_or("seed").to_string();
    let mut qs = Vec::new();
    for sub in &subs {
        for k in 0..per_sub {
            let text = match (mode.as_str(), k) {
                ("elaboration" | "diversification", 0) => format!("Does {dim} {sub} seed q0 hold?"),
                ("diversification", 1) => format!("Does {dim} {sub} elaboration q1 hold?"),
                _ => format!("Does {dim} {sub} {mode} q{k} hold?"),
            };
            qs.push(json!({"question": text, "sub_aspect": sub}));
        }
    }
    Reply::json(json!({ "questions": qs }))
}

fn checkeval_request(mode: pb::AugmentationMode) -> pb::GenerateCorpusRequest {
    pb::GenerateCorpusRequest {
        preset: pb::Preset::Checkeval as i32,
        corpus_description: "summarization".into(),
        dimensions: vec![
            pb::Dimension {
                name: "Coherence".into(),
                definition: "The summary is well structured.".into(),
                sub_dimensions: vec![
                    pb::SubDimension { name: "Logic".into(), definition: "ideas follow".into() },
                    pb::SubDimension { name: "Structure".into(), definition: String::new() },
                ],
            },
            pb::Dimension { name: "Fluency".into(), definition: "Sentences read well.".into(), sub_dimensions: vec![] },
        ],
        augmentation: mode as i32,
        refinement: Some(pb::CorpusRefinement { skip_deduplication: true, ..Default::default() }),
        ..Default::default()
    }
}

#[tokio::test]
async fn checkeval_counts_per_augmentation_mode() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(checkeval_handler));
    let mut client = h.client().await;
    // (mode, questions per sub-dimension, calls per dimension, total questions): Coherence has 2
    // sub-dimensions, Fluency 1 (General).
    let cases = [
        (pb::AugmentationMode::Unspecified, 2, 1, 6),
        (pb::AugmentationMode::Seed, 2, 1, 6),
        (pb::AugmentationMode::Elaboration, 5, 1, 15),
        (pb::AugmentationMode::Diversification, 4, 1, 12),
    ];
    for (mode, per_sub, calls, total) in cases {
        let before = h.llm.request_count();
        let reply = client.generate_corpus(checkeval_request(mode)).await.unwrap().into_inner();
        let sent = &h.llm.requests()[before..];
        assert_eq!(sent.len(), 2 * calls, "{mode:?}");
        for r in sent {
            let p = prompt(r);
            assert!(p.contains(&format!("write exactly {per_sub} questions")), "{mode:?}: {p}");
            assert!(p.contains("summarization"));
        }
        assert_eq!(reply.raw_questions, total, "{mode:?}");
        let cl = reply.checklist.unwrap();
        assert_eq!(cl.items.len() as u32, total, "{mode:?}");
        assert_eq!(cl.source_method, "checkeval");
        let cats: Vec<(String, usize)> = cl.items.iter().fold(Vec::<(String, usize)>::new(), |mut acc, i| {
            let c = i.category.clone();
            match acc.last_mut() {
                Some((last, n)) if *last == c => *n += 1,
                _ => acc.push((c, 1)),
            }
            acc
        });
        assert_eq!(cats, vec![("Coherence".into(), per_sub * 2), ("Fluency".into(), per_sub)], "{mode:?}");
        assert_eq!(cl.items[0].metadata["sub_aspect"], "Logic");
        assert_eq!(cl.items.last().unwrap().metadata["sub_aspect"], "General");
    }
}

#[tokio::test]
async fn checkeval_combined_merges_the_three_pools_by_exact_text() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(checkeval_handler));
    let mut client = h.client().await;
    let reply = client.generate_corpus(checkeval_request(pb::AugmentationMode::Combined)).await.unwrap().into_inner();
    // Per dimension: seeds, then elaboration and diversification of the seeds.
    let sent = h.chat_requests();
    assert_eq!(sent.len(), 6);
    let augment: Vec<&RecordedRequest> = sent.iter().filter(|r| schema_name(r) == "checkeval_augmentation").collect();
    assert_eq!(augment.len(), 4);
    for r in &augment {
        let p = prompt(r);
        assert!(p.contains("seed q0 hold?") && p.contains("seed q1 hold?"), "seeds shown: {p}");
    }
    // Per sub-dimension: 2 seeds + 4 new of 5 elaborations + 2 new of 4 diversifications = 8.
    assert_eq!(reply.raw_questions, 24);
    let cl = reply.checklist.unwrap();
    let logic: Vec<(String, String)> = cl
        .items
        .iter()
        .filter(|i| i.metadata["sub_aspect"] == "Logic")
        .map(|i| (i.question.clone(), i.metadata["augmentation_source"].clone()))
        .collect();
    let want: Vec<(String, String)> = [
        ("Does Coherence Logic seed q0 hold?", "seed"),
        ("Does Coherence Logic seed q1 hold?", "seed"),
        ("Does Coherence Logic elaboration q1 hold?", "elaboration"),
        ("Does Coherence Logic elaboration q2 hold?", "elaboration"),
        ("Does Coherence Logic elaboration q3 hold?", "elaboration"),
        ("Does Coherence Logic elaboration q4 hold?", "elaboration"),
        ("Does Coherence Logic diversification q2 hold?", "diversification"),
        ("Does Coherence Logic diversification q3 hold?", "diversification"),
    ]
    .into_iter()
    .map(|(q, s)| (q.to_string(), s.to_string()))
    .collect();
    assert_eq!(logic, want);
    assert_eq!(cl.metadata["augmentation_mode"], "combined");
}

#[tokio::test]
async fn checkeval_filter_and_dedup() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(checkeval_handler));
    let mut client = h.client().await;

    // Filter off: no judgements.
    let reply = client.generate_corpus(checkeval_request(pb::AugmentationMode::Seed)).await.unwrap().into_inner();
    assert_eq!(reply.checklist.unwrap().items.len(), 6);
    assert!(h.calls("checkeval_filter").is_empty());

    // Filter on: one judgement per question at temperature 0. The three `seed q1` questions fail
    // alignment, Fluency's q0 fails consistency, an unreadable judgement keeps its question.
    let mut req = checkeval_request(pb::AugmentationMode::Seed);
    req.filter = true;
    let reply = client.generate_corpus(req).await.unwrap().into_inner();
    let judged = h.calls("checkeval_filter");
    assert_eq!(judged.len(), 6);
    assert!(judged.iter().all(|r| temperature(r) == 0.0));
    assert!(prompt(&judged[0]).contains("The summary is well structured."));
    assert_eq!(reply.raw_questions, 6);
    let cl = reply.checklist.unwrap();
    let qs: Vec<&str> = cl.items.iter().map(|i| i.question.as_str()).collect();
    assert_eq!(qs, vec!["Does Coherence Logic seed q0 hold?", "Does Coherence Structure seed q0 hold?"]);
    assert_eq!(cl.metadata["alignment_filtered"], "3");
    assert_eq!(cl.metadata["consistency_filtered"], "1");
    assert_eq!(cl.metadata["filter_unreadable"], "1");

    // Filter off, refinement at its defaults: the questions come back as generated (the original
    // ties redundancy removal to filtering): no embeddings, no refine stage.
    let mut req = checkeval_request(pb::AugmentationMode::Seed);
    req.refinement = None;
    let (stages, items) = corpus_stream(&mut client, req).await;
    assert_eq!(stages, vec!["dimension 1/2", "dimension 2/2"]);
    assert_eq!(items, 6);
    assert!(!h.llm.requests().iter().any(RecordedRequest::is_embeddings), "nothing deduplicated");

    // Filter on: deduplication follows; embeddings are computed, distinct questions stay.
    let mut req = checkeval_request(pb::AugmentationMode::Seed);
    req.refinement = None;
    req.filter = true;
    let (stages, items) = corpus_stream(&mut client, req).await;
    assert_eq!(stages.last().map(String::as_str), Some("refine 1/1"), "{stages:?}");
    assert_eq!(items, 2);
    assert!(h.llm.requests().iter().any(RecordedRequest::is_embeddings));
}

/// Progress stages and the number of items of a streamed corpus generation.
async fn corpus_stream(
    client: &mut GeneratorServiceClient<Channel>,
    req: pb::GenerateCorpusRequest,
) -> (Vec<String>, usize) {
    let mut stream = client
        .generate_corpus_stream(pb::GenerateCorpusStreamRequest { request: Some(req) })
        .await
        .unwrap()
        .into_inner();
    let mut stages = Vec::new();
    let mut items = 0;
    while let Some(msg) = stream.message().await.unwrap() {
        match msg.event.unwrap() {
            Event::Progress(p) => stages.push(format!("{} {}/{}", p.stage, p.done, p.total)),
            Event::Result(r) => items = r.checklist.unwrap().items.len(),
        }
    }
    (stages, items)
}

fn interacteval_handler(final_questions: usize) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r: &RecordedRequest| match schema_name(r).as_str() {
        "interacteval_components" => Reply::json(json!({"components": ["Flow", "Tone", "Facts"]})),
        "interacteval_clusters" => Reply::json(json!({"clusters": [
            {"component": "Flow", "attributes": ["jumps between topics"]},
            {"component": "Tone", "attributes": ["too casual", "rude ending"]},
            {"component": "Facts", "attributes": ["wrong date"]}
        ]})),
        "interacteval_key_questions" => Reply::json(json!({"key_questions": [
            {"component": "Flow", "question": "Does the text flow?"},
            {"component": "Tone", "question": "Is the tone appropriate?"},
            {"component": "Facts", "question": "Are the facts right?"}
        ]})),
        "interacteval_sub_questions" => Reply::json(json!({"sub_questions": [
            {"component": "Flow", "questions": ["F1?", "F2?", "F3?"]},
            {"component": "Tone", "questions": ["T1?", "T2?"]},
            {"component": "Facts", "questions": ["A1?", "A2?", "A3?"]}
        ]})),
        "interacteval_validation" => Reply::json(json!({
            "questions": (0..final_questions).map(|i| format!("Is final point {i} met?")).collect::<Vec<_>>()
        })),
        other => Reply::status(500).body(format!("unexpected schema {other}")),
    }
}

fn interacteval_request() -> pb::GenerateCorpusRequest {
    pb::GenerateCorpusRequest {
        preset: pb::Preset::Interacteval as i32,
        observations: vec![
            "jumps between topics".into(),
            "too casual".into(),
            "rude ending".into(),
            "wrong date".into(),
        ],
        dimensions: vec![pb::Dimension {
            name: "coherence".into(),
            definition: "How well the text hangs together.".into(),
            sub_dimensions: vec![],
        }],
        ..Default::default()
    }
}

#[tokio::test]
async fn interacteval_runs_five_stages_in_order() {
    let h = harness().await;
    h.llm.set_handler(interacteval_handler(12));
    let mut client = h.client().await;
    let mut stream = client
        .generate_corpus_stream(pb::GenerateCorpusStreamRequest { request: Some(interacteval_request()) })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    let mut result = None;
    while let Some(msg) = stream.message().await.unwrap() {
        match msg.event.unwrap() {
            Event::Progress(p) => events.push((p.stage, p.done, p.total)),
            Event::Result(r) => result = Some(r),
        }
    }
    let stages: Vec<(&str, u32)> = events.iter().map(|(s, d, _)| (s.as_str(), *d)).collect();
    assert_eq!(
        stages,
        vec![("extract_components", 1), ("cluster", 2), ("key_questions", 3), ("sub_questions", 4), ("validate", 5)]
    );
    assert!(events.iter().all(|e| e.2 == 5));

    let sent = h.chat_requests();
    let order: Vec<String> = sent.iter().map(schema_name).collect();
    assert_eq!(
        order,
        vec![
            "interacteval_components",
            "interacteval_clusters",
            "interacteval_key_questions",
            "interacteval_sub_questions",
            "interacteval_validation"
        ]
    );
    assert_eq!(schema(&sent[0])["properties"]["components"]["maxItems"], 5);
    assert!(prompt(&sent[0]).contains("- rude ending"));
    assert!(prompt(&sent[2]).contains("Tone:\n  - too casual\n  - rude ending"), "{}", prompt(&sent[2]));
    assert!(prompt(&sent[3]).contains("- Tone: Is the tone appropriate?"));
    let validation = &sent[4];
    let p = prompt(validation);
    for q in ["Does the text flow?", "F3?", "T2?", "A1?"] {
        assert!(p.contains(&format!("- {q}")), "{q} is a candidate: {p}");
    }
    assert!(p.contains("between 10 and 15"));
    let s = &schema(validation)["properties"]["questions"];
    assert_eq!((s["minItems"].as_u64(), s["maxItems"].as_u64()), (Some(10), Some(15)));
    assert!((temperature(validation) - 0.5).abs() < 1e-6);
    assert!(sent[..4].iter().all(|r| (temperature(r) - 0.7).abs() < 1e-6));

    let reply = result.unwrap();
    assert_eq!(reply.raw_questions, 11, "3 key + 8 sub-questions");
    let cl = reply.checklist.unwrap();
    assert_eq!(cl.source_method, "interacteval");
    assert_eq!(cl.items.len(), 12);
    assert!(cl.items.iter().all(|i| i.category == "coherence"));
    assert_eq!(cl.metadata["components"], "Flow; Tone; Facts");
    assert_eq!(reply.usage.unwrap().calls, 5);
}

#[tokio::test]
async fn interacteval_keeps_at_most_fifteen() {
    let h = harness().await;
    h.llm.set_handler(interacteval_handler(20));
    let mut client = h.client().await;
    let reply = client.generate_corpus(interacteval_request()).await.unwrap().into_inner();
    let cl = reply.checklist.unwrap();
    assert_eq!(cl.items.len(), 15);
    assert_eq!(cl.metadata["dropped_questions"], "5");

    // max_questions lowers the bound (and the minimum with it).
    let mut req = interacteval_request();
    req.refinement = Some(pb::CorpusRefinement { max_questions: Some(8), ..Default::default() });
    let reply = client.generate_corpus(req).await.unwrap().into_inner();
    assert_eq!(reply.checklist.unwrap().items.len(), 8);
    let v = h.calls("interacteval_validation");
    let s = &schema(v.last().unwrap())["properties"]["questions"];
    assert_eq!((s["minItems"].as_u64(), s["maxItems"].as_u64()), (Some(8), Some(8)));
}

fn assert_invalid(st: &tonic::Status, field: &str, text: &str) {
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    let bad = st.get_details_bad_request().expect("bad request details");
    let v = bad
        .field_violations
        .iter()
        .find(|v| v.field == field)
        .unwrap_or_else(|| panic!("no violation for {field}: {bad:?}"));
    assert!(v.description.contains(text), "{field}: {}", v.description);
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field() {
    let h = harness().await;
    let mut client = h.client().await;
    let fb = || feedback_request(observations(3));
    let refinement = |r: pb::CorpusRefinement| Some(r);
    let cases: Vec<(pb::GenerateCorpusRequest, &str, &str)> = vec![
        (feedback_request(vec![]), "observations", "required by preset feedback"),
        (
            pb::GenerateCorpusRequest { preset: pb::Preset::Interacteval as i32, ..Default::default() },
            "observations",
            "required by preset interacteval",
        ),
        (
            pb::GenerateCorpusRequest { preset: pb::Preset::Checkeval as i32, ..Default::default() },
            "dimensions",
            "required by preset checkeval",
        ),
        (pb::GenerateCorpusRequest { batch_size: Some(0), ..fb() }, "batch_size", "between 1 and 500"),
        (pb::GenerateCorpusRequest { batch_size: Some(501), ..fb() }, "batch_size", "between 1 and 500"),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { dedup_threshold: Some(0.0), ..Default::default() }),
                ..fb()
            },
            "refinement.dedup_threshold",
            "(0, 1]",
        ),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { dedup_threshold: Some(1.2), ..Default::default() }),
                ..fb()
            },
            "refinement.dedup_threshold",
            "(0, 1]",
        ),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { max_questions: Some(0), ..Default::default() }),
                ..fb()
            },
            "refinement.max_questions",
            "between 1 and",
        ),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { run_unit_tester: true, ..Default::default() }),
                ..fb()
            },
            "refinement.run_unit_tester",
            "UnitTest",
        ),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { beam_width: Some(0), ..Default::default() }),
                ..fb()
            },
            "refinement.beam_width",
            "between 1 and",
        ),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { length_penalty: Some(-1.0), ..Default::default() }),
                ..fb()
            },
            "refinement.length_penalty",
            ">= 0",
        ),
        (
            pb::GenerateCorpusRequest {
                refinement: refinement(pb::CorpusRefinement { alpha: Some(1.5), ..Default::default() }),
                ..fb()
            },
            "refinement.alpha",
            "[0, 1]",
        ),
        (pb::GenerateCorpusRequest { preset: pb::Preset::Tick as i32, ..fb() }, "preset", "use Generate"),
        (pb::GenerateCorpusRequest { preset: 0, ..fb() }, "preset", "is required"),
        (
            pb::GenerateCorpusRequest {
                preset: pb::Preset::Checkeval as i32,
                dimensions: vec![pb::Dimension { name: " ".into(), ..Default::default() }],
                ..Default::default()
            },
            "dimensions[0].name",
            "is required",
        ),
        (feedback_request(observations(10_001)), "observations", "the limit is 10000"),
        (pb::GenerateCorpusRequest { augmentation: 9, ..fb() }, "augmentation", "unknown enum value 9"),
        (
            pb::GenerateCorpusRequest {
                model: Some(common::ModelSpec { backend: "nope".into(), ..Default::default() }),
                ..fb()
            },
            "model.backend",
            "nope",
        ),
    ];
    for (req, field, text) in cases {
        let st = client.generate_corpus(req.clone()).await.unwrap_err();
        assert_invalid(&st, field, text);
        // The stream fails the call itself, with the field under `request` (a backend name is
        // resolved once the stream runs: see the next test).
        if field != "model.backend" {
            let st = client
                .generate_corpus_stream(pb::GenerateCorpusStreamRequest { request: Some(req) })
                .await
                .map(|_| ())
                .unwrap_err();
            assert_invalid(&st, &format!("request.{field}"), text);
        }
    }
    let st =
        client.generate_corpus_stream(pb::GenerateCorpusStreamRequest { request: None }).await.map(|_| ()).unwrap_err();
    assert_invalid(&st, "request", "is required");
    assert_eq!(h.llm.request_count(), 0, "no backend call for bad input");
}

#[tokio::test]
async fn a_bad_backend_in_the_stream_is_an_error_event_with_the_field() {
    let h = harness().await;
    let mut client = h.client().await;
    let mut req = feedback_request(observations(3));
    req.embedding_model = Some(common::ModelSpec { backend: "nope".into(), ..Default::default() });
    let mut stream = client
        .generate_corpus_stream(pb::GenerateCorpusStreamRequest { request: Some(req) })
        .await
        .unwrap()
        .into_inner();
    let st = stream.message().await.unwrap_err();
    assert_invalid(&st, "request.embedding_model.backend", "nope");
    assert_eq!(h.llm.request_count(), 0);
}

#[tokio::test]
async fn unreadable_or_empty_model_replies_are_unavailable() {
    let h = harness().await;
    let mut client = h.client().await;
    h.llm.set_handler(|_| Reply::text("I cannot help with that."));
    let mut req = feedback_request(observations(3));
    req.refinement = Some(skip_all());
    let st = client.generate_corpus(req.clone()).await.unwrap_err();
    assert_eq!(st.code(), Code::Unavailable, "{st:?}");
    assert!(st.message().contains("no JSON"), "{}", st.message());

    h.llm.set_handler(|_| Reply::json(json!({"questions": []})));
    let st = client.generate_corpus(req).await.unwrap_err();
    assert_eq!(st.code(), Code::Unavailable, "{st:?}");
    assert!(st.message().contains("no questions"), "{}", st.message());
}

#[tokio::test]
async fn remote_generator_relays_progress_and_errors() {
    let h = harness().await;
    h.llm.set_handler(with_embeddings(refinement_handler));
    let remote = RemoteGenerator::new(h.server.channel().await, None);
    let mut req = CorpusRequest::new(CorpusPreset::Feedback);
    req.observations = observations(6);
    req.batch_size = Some(3);
    req.refinement.max_questions = Some(1);
    let seen: Mutex<Vec<CorpusProgress>> = Mutex::new(Vec::new());
    let sink = |e: CorpusProgress| seen.lock().unwrap().push(e);
    let out = remote.generate_corpus(req.clone(), &sink).await.unwrap();
    assert_eq!(out.checklist.items.len(), 1);
    assert_eq!(out.checklist.items[0].id, "fb-0-merged");
    assert_eq!(out.raw_questions, 5);
    assert_eq!(out.checklist.generation_level, assay_domain::GenerationLevel::Corpus);
    let stages: Vec<String> = seen.lock().unwrap().iter().map(|e| e.stage.clone()).collect();
    assert_eq!(stages, vec!["batch", "batch", "refine", "refine", "refine"]);

    // Field violations come back with the domain request's field names.
    req.batch_size = Some(0);
    let e = remote.generate_corpus(req, &assay_domain::no_events).await.unwrap_err();
    let assay_domain::StageError::InvalidArgument(v) = e else { panic!("not invalid argument: {e}") };
    assert_eq!(v[0].field, "batch_size");

    // The in-process core gives the same result for the same script.
    let presets = remote.list_presets().await.unwrap();
    assert_eq!(presets, assay_domain::generator::preset_table());
}
