//! Cost and budgets through the whole mesh: a price table turns every call's tokens into dollars
//! summed into the run; a run's budget travels with each stage call, so no model call starts once
//! it is spent, and a checklist evaluation ends PARTIAL with the records scored so far.

use std::collections::BTreeMap;
use std::time::Duration;

use assay_llm::pricing::Price;
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient as Client;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, SandboxOptions, leaves_eval};

/// Tokens the scripted judge reports per call: 100 prompt, 10 completion.
const PROMPT: u64 = 100;
const COMPLETION: u64 = 10;
const PER_CALL: u64 = PROMPT + COMPLETION;

/// USD per million tokens: input 2, output 8 -> (100 x 2 + 10 x 8) / 1e6 = $0.00028 per call.
fn prices() -> BTreeMap<String, Price> {
    BTreeMap::from([("scripted-judge".to_string(), Price { input: 2.0, output: 8.0, cached_input: None })])
}
const COST_PER_CALL: f64 = (PROMPT as f64 * 2.0 + COMPLETION as f64 * 8.0) / 1e6;

/// YES to every `Q<n>:` line of a batch prompt, with known usage, after `delay`.
fn judge(delay: Duration) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r| {
        let prompt = r.last_user_message().unwrap_or_default();
        let n = prompt.lines().filter(|l| l.starts_with('Q') && l.contains(':')).count().max(1);
        let answers: Vec<serde_json::Value> =
            (1..=n).map(|i| serde_json::json!({"question_index": i, "answer": "YES"})).collect();
        Reply::json(serde_json::json!({ "answers": answers })).usage(PROMPT, COMPLETION).delay(delay)
    }
}

async fn start(concurrency: u32) -> MeshSandbox {
    let sandbox = MeshSandbox::start_with(SandboxOptions {
        prices: Some(prices()),
        concurrency: Some(concurrency),
        ..SandboxOptions::default()
    })
    .await;
    sandbox.llm.set_handler(judge(Duration::from_millis(2)));
    sandbox
}

async fn run(sandbox: &MeshSandbox, records: usize, budget: Option<gw::RunBudget>) -> (gw::Run, gw::EvaluateResponse) {
    let mut client = Client::new(sandbox.gateway().await);
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(records))),
        label: "budget".into(),
        budget,
    };
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let mut last = None;
    let mut run_id = String::new();
    while let Some(m) = stream.message().await.expect("event stream") {
        let event = m.event.expect("an event");
        run_id = event.run_id.clone();
        last = Some(event);
    }
    let done = assay_tests::evaluation(&last.expect("events")).expect("the run completes with an evaluation");
    let run = client.get_run(gw::GetRunRequest { run_id }).await.expect("get run").into_inner().run.expect("run");
    (run, done)
}

fn cost(u: &Option<pb::Usage>) -> Option<f64> {
    u.as_ref().and_then(|u| u.cost_usd)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_is_summed_from_the_price_table_into_the_run() {
    let sandbox = start(16).await;
    let (run, done) = run(&sandbox, 40, None).await;
    assert_eq!(run.state, gw::RunState::Succeeded as i32);
    let calls = sandbox.llm.request_count() as f64;
    assert_eq!(calls, 40.0, "one batch call per record");
    let usage = run.usage.as_ref().expect("usage");
    assert_eq!(usage.prompt_tokens + usage.completion_tokens, 40 * PER_CALL);
    let want = calls * COST_PER_CALL;
    assert!((cost(&run.usage).expect("priced") - want).abs() < 1e-12, "{:?} vs {want}", run.usage);
    assert_eq!(cost(&done.usage), cost(&run.usage), "the result's usage is the run's");
    assert_eq!(usage.unpriced_calls, 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_price_costs_unknown_never_zero() {
    let sandbox = MeshSandbox::start_with(SandboxOptions::default()).await;
    sandbox.llm.set_handler(judge(Duration::ZERO));
    let (run, _) = run(&sandbox, 5, None).await;
    let usage = run.usage.expect("usage");
    assert_eq!((usage.cost_usd, usage.unpriced_calls), (None, 5), "{usage:?}");
    sandbox.shutdown().await.unwrap();
}

/// 500 records, 64 scored at once, a token budget of a tenth of the whole run: the run ends
/// PARTIAL; every record scored is kept; no model call starts once the gateway knows the budget
/// is spent beyond those already in flight; every other record says why it was not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenth_of_the_tokens_ends_partial_keeping_what_was_scored() {
    const RECORDS: usize = 500;
    const IN_FLIGHT: u64 = 64;
    let sandbox = start(IN_FLIGHT as u32).await;
    let max = RECORDS as u64 * PER_CALL / 10;
    let (run, done) = run(&sandbox, RECORDS, Some(gw::RunBudget { max_tokens: Some(max), max_cost_usd: None })).await;
    assert_eq!(run.state, gw::RunState::Partial as i32, "{:?}", run.budget_exhausted);
    assert!(run.budget_exhausted.starts_with("budget exhausted"), "{}", run.budget_exhausted);
    assert_eq!(done.budget_exhausted, run.budget_exhausted, "the evaluation says why it stopped, as the run does");
    let scored = done.results.iter().filter(|r| r.score.is_some()).count() as u64;
    let calls = sandbox.llm.request_count() as u64;
    assert_eq!(calls, scored, "every call made scored a record; none was started for nothing");
    let used = run.usage.as_ref().map(|u| u.prompt_tokens + u.completion_tokens).unwrap();
    assert_eq!(used, calls * PER_CALL, "every call made is charged");
    // Every call reserved its worst case before it was sent: the budget is never passed, and
    // it ends once what is left cannot pay for one more call's worst case.
    assert!(used <= max, "the budget was passed: {used} of {max}");
    assert!(used >= max / 2, "most of the budget was used: {used} of {max}");
    eprintln!(
        "budget {max} tokens: {scored} of {RECORDS} records scored, {used} tokens used ({IN_FLIGHT} in flight at most)"
    );
    for r in done.results.iter().filter(|r| r.score.is_none()) {
        assert!(r.error.starts_with("not run: budget exhausted"), "{}", r.error);
    }
    assert_eq!(done.results.len(), RECORDS, "every record is accounted for");
    sandbox.shutdown().await.unwrap();
}

/// A dollar budget: the same, priced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_budget_stops_the_run_at_its_dollars() {
    let sandbox = start(8).await;
    let max = 30.0 * COST_PER_CALL;
    let (run, done) = run(&sandbox, 120, Some(gw::RunBudget { max_tokens: None, max_cost_usd: Some(max) })).await;
    assert_eq!(run.state, gw::RunState::Partial as i32);
    let spent = cost(&run.usage).expect("priced");
    assert!(spent <= max + 1e-12 && spent >= max / 3.0, "{spent} of {max}");
    let scored = done.results.iter().filter(|r| r.score.is_some()).count();
    assert_eq!(scored, sandbox.llm.request_count());
    sandbox.shutdown().await.unwrap();
}

/// The budget travels with the stage call: in item mode a record makes one call per item, and
/// the scorer stops starting them once the remaining budget it was sent is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_starts_no_call_past_the_budget_it_was_sent() {
    let sandbox = start(1).await;
    let items: Vec<pb::ChecklistItem> = (1..=10)
        .map(|i| pb::ChecklistItem { id: format!("q{i}"), question: format!("Question {i}?"), ..Default::default() })
        .collect();
    let mut pipeline = leaves_eval(1);
    pipeline.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Checklist(pb::Checklist { items, ..Default::default() })),
    });
    pipeline.scorer =
        Some(pb::ScorerConfig { mode: pb::ScoringMode::Item as i32, concurrency: 1, ..Default::default() });
    let mut client = Client::new(sandbox.gateway().await);
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
        label: "stage budget".into(),
        budget: Some(gw::RunBudget { max_tokens: Some(3 * PER_CALL), max_cost_usd: None }),
    };
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let mut last = None;
    while let Some(m) = stream.message().await.expect("events") {
        last = m.event;
    }
    let last = last.unwrap();
    let done = assay_tests::evaluation(&last).expect("completes");
    let calls = sandbox.llm.request_count() as u64;
    assert!((1..10).contains(&calls), "the calls that fit the budget ran, the rest never started: {calls}");
    assert!(done.results[0].error.starts_with("not run: budget exhausted"), "{}", done.results[0].error);
    // The stage call failed, yet its calls were paid for: the run is charged them (the failed
    // call's status carries its usage) and the cost counts.
    let run = client.get_run(gw::GetRunRequest { run_id: last.run_id }).await.unwrap().into_inner().run.unwrap();
    let usage = run.usage.expect("usage");
    assert_eq!(
        (u64::from(usage.calls), usage.prompt_tokens + usage.completion_tokens),
        (calls, calls * PER_CALL),
        "{usage:?}"
    );
    assert!(usage.prompt_tokens + usage.completion_tokens <= 3 * PER_CALL, "{usage:?}");
    assert!((usage.cost_usd.expect("priced") - calls as f64 * COST_PER_CALL).abs() < 1e-12, "{usage:?}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_zero_or_a_negative_cost_is_refused_naming_the_field() {
    let sandbox = start(4).await;
    let mut client = Client::new(sandbox.gateway().await);
    for (budget, field) in [
        (gw::RunBudget { max_tokens: Some(0), max_cost_usd: None }, "budget.max_tokens"),
        (gw::RunBudget { max_tokens: None, max_cost_usd: Some(-1.0) }, "budget.max_cost_usd"),
        (gw::RunBudget { max_tokens: None, max_cost_usd: Some(f64::NAN) }, "budget.max_cost_usd"),
    ] {
        let request = gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(2))),
            label: String::new(),
            budget: Some(budget),
        };
        let status = client.run_pipeline(request).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    assert_eq!(sandbox.llm.request_count(), 0);
    sandbox.shutdown().await.unwrap();
}

/// A budget that pays for every record stopped nothing: every record is scored and the run does
/// not say it stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_that_pays_for_every_record_stops_nothing() {
    let sandbox = start(8).await;
    let (run, done) = run(&sandbox, 4, Some(gw::RunBudget { max_tokens: Some(100_000), max_cost_usd: None })).await;
    assert_eq!(run.state, gw::RunState::Succeeded as i32);
    assert!(done.results.iter().all(|r| r.score.is_some()));
    assert_eq!((run.budget_exhausted.as_str(), done.budget_exhausted.as_str()), ("", ""));
    sandbox.shutdown().await.unwrap();
}
