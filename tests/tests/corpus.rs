//! Corpus-level generation and the refiner chain through the whole mesh: the gateway calls the
//! generator's corpus stream (with its built-in refiners) and the refiners service, relays their
//! progress as run events, and scores records against the refined checklist.

#![allow(clippy::wildcard_enum_match_arm)]

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::generator::v1 as gen_pb;
use assay_proto::refiners::v1 as ref_pb;
use assay_tests::MeshSandbox;
use tonic::Code;

fn observations(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("Reviewer note {i}: the answer skipped the units in step {i}.")).collect()
}

fn feedback(batch_size: u32) -> gen_pb::GenerateCorpusRequest {
    gen_pb::GenerateCorpusRequest {
        preset: gen_pb::Preset::Feedback as i32,
        corpus_description: "grading notes on physics homework".into(),
        observations: observations(10),
        batch_size: Some(batch_size),
        ..Default::default()
    }
}

fn progress_from<'a>(events: &'a [gw::RunEvent], service: &str) -> Vec<&'a pb::Progress> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::Progress(p)) if p.service == service => p.progress.as_ref(),
            _ => None,
        })
        .collect()
}

/// The checklist a succeeded generate-only run returned.
fn result_checklist(c: gw::RunCompleted) -> pb::Checklist {
    assert_eq!(c.state, gw::RunState::Succeeded as i32, "{c:?}");
    match c.result.unwrap().result.unwrap() {
        gw::run_result::Result::Checklist(c) => c,
        other => panic!("{other:?}"),
    }
}

fn completed(events: &[gw::RunEvent]) -> gw::RunCompleted {
    match &events.last().unwrap().event {
        Some(Event::Completed(c)) => c.clone(),
        other => panic!("last event is not completed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_corpus_then_selector_through_the_gateway_scores_every_record() {
    let sandbox = MeshSandbox::start().await;
    // Every chat call gets an instance of its JSON schema; embeddings are hash vectors (equal texts,
    // equal vectors). Both feedback batches propose the same questions, so the built-in
    // deduplicator has real clusters to merge.
    sandbox.llm.set_handler(assay_testkit::schema_reply);
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Corpus(feedback(5))) }),
        records: (0..3)
            .map(|i| gw::EvalRecord { id: format!("r{i}"), target: format!("answer {i}"), ..Default::default() })
            .collect(),
        refiners: vec![ref_pb::RefinerStep {
            step: Some(ref_pb::refiner_step::Step::Select(ref_pb::SelectRequest {
                max_questions: Some(3),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free sequences");
    let c = completed(&events);
    assert_eq!(c.state, gw::RunState::Succeeded as i32, "{c:?}");

    // Generator progress (two batches of 5, then its refiners) and the gateway's refiner chain.
    assert!(progress_from(&events, "generator").len() >= 2, "{events:?}");
    let refiners = progress_from(&events, "refiners");
    assert!(refiners.iter().any(|p| p.stage == "selector"), "{refiners:?}");

    let ready: Vec<&gw::ChecklistReady> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::ChecklistReady(r)) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(ready.len(), 1, "one corpus checklist for every record");
    let checklist = ready[0].checklist.as_ref().unwrap();
    assert_eq!(ready[0].record_indices, vec![0, 1, 2]);
    assert_eq!(checklist.source_method, "feedback");
    assert_eq!(checklist.generation_level, pb::GenerationLevel::Corpus as i32);
    assert_eq!(checklist.items.len(), 3, "the selector keeps max_questions");
    assert!(checklist.items.iter().all(|i| !i.source_indices.is_empty() && i.source_indices.iter().all(|s| *s < 10)));
    // The two batches proposed the same questions: they were merged.
    assert!(checklist.items.iter().any(|i| i.id.ends_with("-merged") && i.merged_from.len() >= 2), "{checklist:?}");

    let result = match c.result.unwrap().result.unwrap() {
        gw::run_result::Result::ChecklistEval(e) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(result.results.len(), 3);
    assert!(result.results.iter().all(|r| r.score.as_ref().is_some_and(|s| s.item_scores.len() == 3)));
    let usage = result.usage.unwrap();
    assert!(usage.calls >= 2 + 3, "two generation batches and three scorings at least: {usage:?}");
    let requests = sandbox.llm.requests();
    assert!(requests.iter().any(|r| r.is_embeddings()), "dedup and selector embed the questions");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_only_pipeline_returns_the_refined_checklist() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(assay_testkit::schema_reply);
    let pipeline = gw::GenerateChecklistPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(gen_pb::Preset::Tick as i32)),
        }),
        record: Some(gw::EvalRecord { input: "Write a limerick about tea.".into(), ..Default::default() }),
        refiners: vec![ref_pb::RefinerStep {
            step: Some(ref_pb::refiner_step::Step::Tag(ref_pb::TagRequest::default())),
        }],
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::GenerateChecklist(pipeline)).await;
    let checklist = result_checklist(completed(&events));
    assert_eq!(checklist.source_method, "tick");
    assert_eq!(checklist.input, "Write a limerick about tea.");
    // The schema-following backend marks every item applicable and specific: the tagger keeps all 6.
    assert_eq!(checklist.items.len(), 6);
    assert_eq!(checklist.metadata.get("refiners").map(String::as_str), Some("tagger"));
    assert!(progress_from(&events, "refiners").iter().any(|p| p.stage == "tagger"));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_corpus_and_refiner_input_is_rejected_before_any_model_call() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(assay_testkit::schema_reply);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut empty = feedback(5);
    empty.observations.clear();
    let bad = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Corpus(empty)) }),
        records: vec![gw::EvalRecord { target: "t".into(), ..Default::default() }],
        refiners: vec![
            ref_pb::RefinerStep { step: None },
            ref_pb::RefinerStep {
                step: Some(ref_pb::refiner_step::Step::Deduplicate(ref_pb::DeduplicateRequest {
                    threshold: Some(1.5),
                    ..Default::default()
                })),
            },
            ref_pb::RefinerStep {
                step: Some(ref_pb::refiner_step::Step::Select(ref_pb::SelectRequest {
                    max_questions: Some(0),
                    ..Default::default()
                })),
            },
        ],
        ..Default::default()
    };
    let err = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(bad)),
            label: String::new(),
            budget: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let fields: Vec<String> = tonic_types::StatusExt::get_error_details(&err)
        .bad_request()
        .unwrap()
        .field_violations
        .iter()
        .map(|v| v.field.clone())
        .collect();
    assert!(fields.contains(&"pipeline.source.corpus.observations".to_string()), "{fields:?}");
    assert!(fields.contains(&"pipeline.refiners[0]".to_string()), "{fields:?}");
    assert!(fields.contains(&"pipeline.refiners[1].deduplicate.threshold".to_string()), "{fields:?}");
    assert!(fields.contains(&"pipeline.refiners[2].select.max_questions".to_string()), "{fields:?}");
    assert_eq!(sandbox.llm.request_count(), 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_tester_in_the_gateway_chain_keeps_only_enforceable_items() {
    let sandbox = MeshSandbox::start().await;
    // Rewrites of samples for "Is it kind?" really break it (the judge then says NO); rewrites for
    // "Is it short?" do not (the judge still says YES).
    sandbox.llm.set_handler(|req: &assay_testkit::RecordedRequest| {
        let has_schema = req.body.pointer("/response_format/json_schema/schema").is_some();
        let prompt = req.last_user_message().unwrap_or_default();
        if !has_schema {
            return assay_testkit::Reply::text(if prompt.contains("Is it kind?") {
                "BROKEN: you are a fool."
            } else {
                "A perfectly fine, short and kind reply."
            });
        }
        let answer = if req.raw_body.contains("BROKEN") { "NO" } else { "YES" };
        assay_testkit::Reply::json(serde_json::json!({"answer": answer}))
    });
    let sample = |id: &str, text: &str| ref_pb::Sample {
        id: id.into(),
        text: text.into(),
        answers: [("kind".to_string(), pb::Answer::Yes as i32), ("short".to_string(), pb::Answer::Yes as i32)]
            .into_iter()
            .collect(),
    };
    let checklist = pb::Checklist {
        id: "given".into(),
        items: vec![
            pb::ChecklistItem { id: "kind".into(), question: "Is it kind?".into(), ..Default::default() },
            pb::ChecklistItem { id: "short".into(), question: "Is it short?".into(), ..Default::default() },
        ],
        ..Default::default()
    };
    let pipeline = gw::GenerateChecklistPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
        refiners: vec![ref_pb::RefinerStep {
            step: Some(ref_pb::refiner_step::Step::UnitTest(ref_pb::UnitTestRequest {
                samples: vec![sample("s1", "Thanks so much, happy to help!"), sample("s2", "Glad it worked.")],
                input: "Reply to a thank-you note.".into(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::GenerateChecklist(pipeline)).await;
    let checklist = result_checklist(completed(&events));
    assert_eq!(checklist.items.iter().map(|i| i.id.as_str()).collect::<Vec<_>>(), ["kind"]);
    let step = progress_from(&events, "refiners");
    assert!(step.iter().any(|p| p.stage == "unit_tester" && p.total == 2 && p.done == 1), "{step:?}");
    // Two rewrites and two verdicts per item.
    let chat = sandbox.llm.requests().iter().filter(|r| r.is_chat()).count();
    assert_eq!(chat, 8);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_chain_that_removes_every_item_fails_the_run_and_says_why() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|req: &assay_testkit::RecordedRequest| {
        if req.raw_body.contains("generally_applicable") {
            assay_testkit::Reply::json(serde_json::json!({
                "reasoning": "too vague", "generally_applicable": false, "section_specific": false
            }))
        } else {
            assay_testkit::schema_reply(req)
        }
    });
    let pipeline = gw::GenerateChecklistPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(gen_pb::Preset::Tick as i32)),
        }),
        record: Some(gw::EvalRecord { input: "Write a limerick about tea.".into(), ..Default::default() }),
        refiners: vec![ref_pb::RefinerStep {
            step: Some(ref_pb::refiner_step::Step::Tag(ref_pb::TagRequest::default())),
        }],
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::GenerateChecklist(pipeline)).await;
    let c = completed(&events);
    assert_eq!(c.state, gw::RunState::Failed as i32);
    let error = c.result.unwrap().error;
    assert!(error.contains("removed every one of the 6 items") && error.contains("tagger"), "{error}");
    sandbox.shutdown().await.unwrap();
}
