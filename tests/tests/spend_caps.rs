//! A backend's daily spend cap (`backends.<name>.daily_spend_usd`) through the whole mesh: the
//! gateway adds every priced stage call to the backend's spend of the day in the run store; a
//! running run stops as at the end of a budget once the cap is spent (PARTIAL, the scored records
//! kept, no model call started past it beyond those in flight), and new runs that use the backend
//! are refused with RESOURCE_EXHAUSTED naming the backend and the cap. On one PostgreSQL store the
//! cap holds across gateways: what one spent, the other refuses.

use std::collections::BTreeMap;
use std::time::Duration;

use assay_llm::pricing::Price;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient as Client;
use assay_testkit::{RecordedRequest, Reply, TempPostgres};
use assay_tests::{MeshSandbox, SandboxOptions, leaves_eval};

const PROMPT: u64 = 100;
const COMPLETION: u64 = 10;
/// USD per million tokens: input 2, output 8 -> $0.00028 a call.
const COST_PER_CALL: f64 = (PROMPT as f64 * 2.0 + COMPLETION as f64 * 8.0) / 1e6;
/// Records scored at once (the most calls in flight).
const IN_FLIGHT: u32 = 8;

fn prices() -> BTreeMap<String, Price> {
    BTreeMap::from([("scripted-judge".to_string(), Price { input: 2.0, output: 8.0, cached_input: None })])
}

/// YES to every item of a batch prompt, with known usage.
fn judge(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    let n = prompt.lines().filter(|l| l.starts_with('Q') && l.contains(':')).count().max(1);
    let answers: Vec<serde_json::Value> =
        (1..=n).map(|i| serde_json::json!({"question_index": i, "answer": "YES"})).collect();
    Reply::json(serde_json::json!({ "answers": answers })).usage(PROMPT, COMPLETION).delay(Duration::from_millis(2))
}

async fn start(cap_calls: f64, store: Option<String>) -> MeshSandbox {
    let sandbox = MeshSandbox::start_with(SandboxOptions {
        prices: Some(prices()),
        daily_spend_usd: Some(cap_calls * COST_PER_CALL),
        concurrency: Some(IN_FLIGHT),
        store,
        ..SandboxOptions::default()
    })
    .await;
    sandbox.llm.set_handler(judge);
    sandbox
}

fn request(records: usize) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(records))),
        label: "capped".into(),
        budget: None,
    }
}

/// Run to the end; the stored run and its evaluation.
async fn run(sandbox: &MeshSandbox, records: usize) -> (gw::Run, gw::EvaluateResponse) {
    let mut client = Client::new(sandbox.gateway().await);
    let mut stream = client.run_pipeline(request(records)).await.expect("run starts").into_inner();
    let (mut last, mut run_id) = (None, String::new());
    while let Some(m) = stream.message().await.expect("event stream") {
        let event = m.event.expect("an event");
        run_id.clone_from(&event.run_id);
        last = Some(event);
    }
    let done = assay_tests::evaluation(&last.expect("events")).expect("an evaluation");
    let run = client.get_run(gw::GetRunRequest { run_id }).await.expect("get run").into_inner().run.expect("run");
    (run, done)
}

fn spent(run: &gw::Run) -> f64 {
    run.usage.as_ref().and_then(|u| u.cost_usd).expect("priced")
}

/// A refused new run names the backend and the cap, and calls no model.
async fn assert_refused(sandbox: &MeshSandbox) {
    let calls = sandbox.llm.request_count();
    let mut client = Client::new(sandbox.gateway().await);
    let status = client.run_pipeline(request(3)).await.expect_err("a new run is refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let m = status.message();
    assert!(m.contains("backend openai") && m.contains("backends.openai.daily_spend_usd"), "{m}");
    let evaluate = gw::EvaluateRequest { pipeline: Some(leaves_eval(2)), budget: None };
    let status = client.evaluate(evaluate).await.expect_err("an evaluation is refused too");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(sandbox.llm.request_count(), calls, "a refused run calls no model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_daily_cap_stops_the_run_and_refuses_new_ones() {
    let sandbox = start(30.0, None).await;
    let cap = 30.0 * COST_PER_CALL;
    let (first, done) = run(&sandbox, 120).await;
    assert_eq!(first.state, gw::RunState::Partial as i32, "{}", first.budget_exhausted);
    assert!(
        first.budget_exhausted.contains("backend openai") && first.budget_exhausted.contains("daily spend cap"),
        "{}",
        first.budget_exhausted
    );
    let scored = done.results.iter().filter(|r| r.score.is_some()).count();
    assert_eq!(scored, sandbox.llm.request_count(), "every call made scored a record");
    let cost = spent(&first);
    // Every call held its worst case on the cap before it was sent: the cap is never passed.
    assert!(cost <= cap + 1e-12, "the cap was passed: ${cost} of ${cap}");
    assert!(cost >= cap / 3.0, "most of the cap was used: ${cost} of ${cap}");
    for r in done.results.iter().filter(|r| r.score.is_none()) {
        assert!(r.error.starts_with("not run: budget exhausted"), "{}", r.error);
    }
    eprintln!("cap ${cap:.6}: {scored} of 120 records scored, ${cost:.6} spent");
    assert_refused(&sandbox).await;
    sandbox.shutdown().await.unwrap();
}

/// A cap reached by one process refuses the next process's runs at admission (the least a
/// refused call needed is kept in the store): before, a new `assay score` on the same store
/// started, then failed every record with the cap message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_on_the_store_refuses_runs_the_cap_cannot_pay_for() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db").display().to_string();
    let sandbox = start(30.0, Some(store.clone())).await;
    let (first, _) = run(&sandbox, 120).await;
    assert_eq!(first.state, gw::RunState::Partial as i32, "{}", first.budget_exhausted);
    sandbox.shutdown().await.unwrap();
    let again = start(30.0, Some(store)).await;
    assert_refused(&again).await;
    again.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_cap_nothing_is_stopped() {
    let sandbox = start(1000.0, None).await;
    let (first, done) = run(&sandbox, 40).await;
    assert_eq!(first.state, gw::RunState::Succeeded as i32, "{}", first.budget_exhausted);
    assert!(first.budget_exhausted.is_empty());
    assert_eq!(done.results.iter().filter(|r| r.score.is_some()).count(), 40);
    let (second, _) = run(&sandbox, 10).await;
    assert_eq!(second.state, gw::RunState::Succeeded as i32, "the day's spend is 50 calls of a 1000-call cap");
    sandbox.shutdown().await.unwrap();
}

/// Two gateways (two meshes) on one PostgreSQL store: the first spends the cap, and both refuse
/// new runs at once (what a refused call needed is kept in the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_postgres_store_share_the_cap() {
    let Some(pg) = TempPostgres::start_or_skip("two_gateways_on_one_postgres_store_share_the_cap") else { return };
    let url = pg.database("spend_caps").expect("database");
    let a = start(30.0, Some(url.clone())).await;
    let b = start(30.0, Some(url)).await;
    // Gateway b spends a third of the cap first: a's run stops at the rest.
    let (early, _) = run(&b, 10).await;
    assert_eq!(early.state, gw::RunState::Succeeded as i32);
    let (first, done) = run(&a, 120).await;
    assert_eq!(first.state, gw::RunState::Partial as i32, "{}", first.budget_exhausted);
    let scored = done.results.iter().filter(|r| r.score.is_some()).count() as f64;
    assert!((1.0..=20.0).contains(&scored), "gateway a scores within what b left of the cap (20 calls): {scored}");
    eprintln!("two gateways, cap of 30 calls: b spent 10, then a scored {scored} of 120 before stopping");
    assert_refused(&a).await;
    // Gateway b has not had a call refused itself: it reads what a's refused call needed from
    // the store and refuses new runs at once too (before, its next run started, then stopped).
    assert_refused(&b).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
