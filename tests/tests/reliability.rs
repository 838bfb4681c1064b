//! Reliability suites through the whole mesh on loopback: a 100-record evaluation under backend
//! faults equals a fault-free one; a cancelled caller stops its backend calls within 100 ms,
//! measured at the backend; many concurrent runs complete with a bounded latency spread, and a
//! full gateway sheds new runs with RESOURCE_EXHAUSTED instead of hanging.
//!
//! The load suite runs 200 concurrent streams; `ASSAY_HEAVY_TESTS=1` runs 1000.

#![allow(clippy::wildcard_enum_match_arm)]

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::generator::v1::Preset;
use assay_testkit::{Gate, RecordedRequest, Reply, eventually};
use assay_tests::MeshSandbox;
use serde_json::json;
use tonic::Code;

fn hash_of(parts: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

/// The records: distinct inputs (one tick checklist each), targets that differ in what they say.
fn records(n: usize) -> Vec<gw::EvalRecord> {
    (0..n)
        .map(|i| gw::EvalRecord {
            id: format!("r{i}"),
            input: format!("Explain topic {i} to a child."),
            target: format!("Topic {i} explained {}", if i % 3 == 0 { "briefly" } else { "with an example" }),
            ..Default::default()
        })
        .collect()
}

fn tick(n: usize) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(Preset::Tick as i32)) }),
        records: records(n),
        ..Default::default()
    }
}

/// A deterministic model: a checklist of three questions per input, and answers that depend on
/// the scoring prompt only (so any order of calls gives the same scores).
fn model(req: &RecordedRequest) -> Reply {
    let prompt = req.last_user_message().unwrap_or_default();
    if prompt.contains("Q1:") {
        let h = hash_of(&[&prompt]);
        let answers: Vec<_> = (0..3)
            .map(|q| json!({"question_index": q + 1, "answer": if (h >> q) & 1 == 1 { "YES" } else { "NO" }}))
            .collect();
        Reply::json(json!({ "answers": answers })).usage(20, 6)
    } else {
        let n = hash_of(&[&prompt]) % 50;
        Reply::json(json!({"items": [
            {"question": format!("Is it accurate about point {n}?")},
            {"question": "Is it suitable for a child?"},
            {"question": "Does it give an example?"}
        ]}))
        .usage(30, 12)
    }
}

#[derive(Default, Debug)]
struct Faults {
    /// Attempts seen per request body.
    attempts: HashMap<u64, u32>,
    rate_limited: usize,
    server_errors: usize,
    hangs: usize,
    answered: usize,
}

/// Per request body and attempt, one of: 429 (20%), 500 / 503 (10%), no answer (5%), the model's
/// answer; at most three faults in a row for one body, so every call succeeds within the client's
/// four retries.
fn faulty(faults: Arc<Mutex<Faults>>) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |req| {
        let key = hash_of(&[&req.raw_body]);
        let mut f = faults.lock().unwrap();
        let attempt = {
            let a = f.attempts.entry(key).or_default();
            *a += 1;
            *a - 1
        };
        let roll = hash_of(&[&req.raw_body, &attempt.to_string()]) % 100;
        if attempt < 3 {
            if roll < 20 {
                f.rate_limited += 1;
                return Reply::status(429);
            }
            if roll < 30 {
                f.server_errors += 1;
                return Reply::status(if roll.is_multiple_of(2) { 500 } else { 503 });
            }
            if roll < 35 {
                f.hangs += 1;
                return Reply::hang();
            }
        }
        f.answered += 1;
        model(req)
    }
}

fn result_of(events: &[gw::RunEvent]) -> gw::EvaluateResponse {
    match events.last().and_then(|e| e.event.clone()) {
        Some(Event::Completed(c)) => match c.result.and_then(|r| r.result) {
            Some(gw::run_result::Result::ChecklistEval(e)) => e,
            other => panic!("no evaluation: {other:?}"),
        },
        other => panic!("the run did not complete: {other:?}"),
    }
}

/// Per record: id, checklist questions, answers.
fn outcome(r: &gw::EvaluateResponse) -> Vec<(String, Vec<String>, Vec<i32>)> {
    r.results
        .iter()
        .map(|rec| {
            let checklist = r.checklists.iter().find(|c| c.id == rec.checklist_id).expect("the record's checklist");
            let answers =
                rec.score.as_ref().map(|s| s.item_scores.iter().map(|i| i.answer).collect()).unwrap_or_default();
            (rec.record_id.clone(), checklist.items.iter().map(|i| i.question.clone()).collect(), answers)
        })
        .collect()
}

#[tokio::test]
async fn a_100_record_evaluation_under_backend_faults_equals_a_fault_free_one() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(model);
    let clean = result_of(&sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(tick(100))).await);
    assert_eq!(clean.results.iter().filter(|r| r.score.is_some()).count(), 100);
    let clean_calls = sandbox.llm.request_count();

    let faults = Arc::new(Mutex::new(Faults::default()));
    sandbox.llm.set_handler(faulty(faults.clone()));
    let started = Instant::now();
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(tick(100))).await;
    let elapsed = started.elapsed();
    let faulted = result_of(&events);
    let f = std::mem::take(&mut *faults.lock().unwrap());
    let attempts = f.rate_limited + f.server_errors + f.hangs + f.answered;
    eprintln!(
        "faults: {attempts} attempts for {clean_calls} calls: {} x 429, {} x 5xx, {} without answer; {elapsed:?}",
        f.rate_limited, f.server_errors, f.hangs
    );
    assert!(f.rate_limited > 0 && f.server_errors > 0 && f.hangs > 0, "every kind of fault was injected: {f:?}");
    let rate = (attempts - f.answered) as f64 / attempts as f64;
    assert!((0.2..0.45).contains(&rate), "about a third of the attempts failed: {rate}");
    assert_eq!(f.answered, clean_calls, "every call answered once in the end (no cache)");
    assert_eq!(faulted.results.iter().filter(|r| r.score.is_some()).count(), 100, "100/100 records scored");
    assert_eq!(outcome(&faulted), outcome(&clean), "the same checklists and answers, record by record");
    assert_eq!(faulted.aggregate, clean.aggregate);
    let usage = faulted.usage.unwrap();
    // Every request the backend got and did not refuse is a call of the run: the answers used,
    // and the hung ones, given up on (counted at their reservation) or beaten by a duplicate.
    assert_eq!(usage.calls - usage.abandoned_calls - usage.hedged_calls, clean.usage.unwrap().calls);
    assert_eq!((usage.abandoned_calls + usage.hedged_calls) as usize, f.hangs, "every hung request counted: {usage:?}");
    assert!(usage.retries as usize >= attempts - f.answered, "every failed attempt retried: {usage:?}");
    sandbox.shutdown().await.unwrap();
}

fn explicit(n: usize) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: vec![pb::ChecklistItem {
                    id: "q1".into(),
                    question: "Is it correct?".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        }),
        records: (0..n)
            .map(|i| gw::EvalRecord { id: format!("r{i}"), target: format!("answer {i}"), ..Default::default() })
            .collect(),
        ..Default::default()
    }
}

fn yes(_: &RecordedRequest) -> Reply {
    Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]}))
}

/// Time from `t0` until the backend saw `n` requests cancelled.
async fn cancelled_within(sandbox: &MeshSandbox, n: usize, t0: Instant) -> Duration {
    assert!(
        eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() >= n).await,
        "the backend saw {} of {n} calls cancelled",
        sandbox.llm.cancelled_count()
    );
    sandbox.llm.cancelled_times().into_iter().map(|t| t.saturating_duration_since(t0)).max().unwrap_or_default()
}

#[tokio::test]
async fn a_cancelled_caller_stops_its_backend_calls_within_100_ms() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|_| Reply::hang());
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);

    // A unary Evaluate of 20 records whose caller goes away.
    let call = tokio::spawn({
        let mut client = client.clone();
        async move { client.evaluate(gw::EvaluateRequest { pipeline: Some(explicit(20)), budget: None }).await }
    });
    assert!(eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 20).await);
    let t0 = Instant::now();
    call.abort();
    let dropped = cancelled_within(&sandbox, 20, t0).await;

    // A stored run of 20 generations cancelled with ControlRun.
    let before = sandbox.llm.request_count();
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(tick(20))),
        label: String::new(),
        budget: None,
    };
    let mut stream = client.run_pipeline(request).await.unwrap().into_inner();
    let run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
    assert!(eventually(Duration::from_secs(10), || sandbox.llm.request_count() == before + 20).await);
    let t0 = Instant::now();
    let run = client
        .control_run(gw::ControlRunRequest {
            run_id,
            action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert_eq!(run.state, gw::RunState::Cancelled as i32);
    let controlled = cancelled_within(&sandbox, 40, t0).await;
    eprintln!("cancellation reached the backend in {dropped:?} (caller gone), {controlled:?} (ControlRun cancel)");
    assert!(dropped <= Duration::from_millis(100), "caller gone: {dropped:?}");
    assert!(controlled <= Duration::from_millis(100), "ControlRun cancel: {controlled:?}");
    assert_eq!(sandbox.llm.request_count(), before + 20, "nothing started after the cancel");
    sandbox.shutdown().await.unwrap();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn rss_mb() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread")]
async fn many_concurrent_runs_complete_with_a_bounded_latency_spread() {
    let streams: usize = if std::env::var("ASSAY_HEAVY_TESTS").is_ok_and(|v| v == "1") { 1000 } else { 200 };
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|req| yes(req).delay(Duration::from_millis(20)));
    let channel = sandbox.gateway().await;
    let (rss_before, _) = rss_mb();
    let started = Instant::now();
    let runs = (0..streams).map(|_| {
        let mut client = GatewayServiceClient::new(channel.clone());
        tokio::spawn(async move {
            let t = Instant::now();
            let request = gw::RunPipelineRequest {
                open: false,
                pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(explicit(1))),
                label: "load".into(),
                budget: None,
            };
            let mut stream = client.run_pipeline(request).await?.into_inner();
            let mut last = None;
            while let Some(m) = stream.message().await? {
                last = m.event;
            }
            Ok::<_, tonic::Status>((t.elapsed(), last))
        })
    });
    let outcomes = futures::future::join_all(runs).await;
    let wall = started.elapsed();
    let mut latencies = Vec::with_capacity(streams);
    for o in outcomes {
        let (latency, last) = o.expect("task").expect("no stream failed");
        let completed = match last.and_then(|e| e.event) {
            Some(Event::Completed(c)) => c,
            other => panic!("a stream ended without RunCompleted: {other:?}"),
        };
        assert_eq!(completed.state, gw::RunState::Succeeded as i32);
        latencies.push(latency);
    }
    latencies.sort();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    let (rss, peak) = rss_mb();
    eprintln!(
        "load: {streams} concurrent RunPipeline streams in {wall:?}: p50 {p50:?}, p99 {p99:?}, max {:?}; \
         whole mesh + client RSS {rss_before:.0} -> {rss:.0} MiB (peak {peak:.0} MiB)",
        latencies.last().unwrap()
    );
    assert_eq!(sandbox.llm.request_count(), streams, "one backend call per run");
    assert!(p99 <= p50 * 3, "p99 {p99:?} within 3x p50 {p50:?}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_full_gateway_sheds_new_runs_with_resource_exhausted() {
    let mut sandbox = MeshSandbox::start().await;
    sandbox.mesh.take().unwrap().shutdown().await.unwrap();
    sandbox.config.gateway.max_active_runs = 3;
    sandbox.restart(sandbox.hub()).await;
    let gate = Gate::new();
    sandbox.llm.set_handler({
        let gate = gate.clone();
        move |req| yes(req).gated(&gate)
    });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let start = |mut client: GatewayServiceClient<tonic::transport::Channel>| async move {
        let request = gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(explicit(1))),
            label: String::new(),
            budget: None,
        };
        client.run_pipeline(request).await.map(tonic::Response::into_inner)
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(start(client.clone()).await.expect("under the limit"));
    }
    assert!(eventually(Duration::from_secs(10), || gate.waiting() == 3).await);
    // Full: refused at once, both streaming and unary.
    let refused = tokio::time::timeout(Duration::from_secs(5), start(client.clone())).await.expect("no hang");
    let st = refused.expect_err("a fourth run is shed");
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert!(st.message().contains("max_active_runs = 3"), "{}", st.message());
    let st = tokio::time::timeout(
        Duration::from_secs(5),
        client.evaluate(gw::EvaluateRequest { pipeline: Some(explicit(1)), budget: None }),
    )
    .await
    .expect("no hang")
    .expect_err("an Evaluate is shed too");
    assert_eq!(st.code(), Code::ResourceExhausted, "{st:?}");
    assert_eq!(sandbox.llm.request_count(), 3, "nothing shed reached the backend");
    // Once the runs end, new ones are taken again.
    gate.open();
    for mut stream in held {
        while stream.message().await.unwrap().is_some() {}
    }
    let ok =
        client.evaluate(gw::EvaluateRequest { pipeline: Some(explicit(1)), budget: None }).await.expect("room again");
    assert_eq!(ok.into_inner().results.len(), 1);
    sandbox.shutdown().await.unwrap();
}
