//! Money limits that hold when calls run at once, counted at the backend: a scripted
//! OpenAI-compatible server priced at $1,000 per million tokens reports each call's usage from
//! the size of what it was sent, and the test sums what it served. Spend is reserved before a
//! call is sent (its worst case), so the backend never serves more than the budget or the cap
//! plus the estimation error of the calls in flight, and every served call is in the run's usage.
//! The shapes are the ones a hostile probe found 17-62x over: checklist generation for every
//! input at once under a dollar budget, a debate under a token budget, and 20 runs at once on
//! one backend's daily cap (one gateway, and two gateways sharing PostgreSQL).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use assay_llm::pricing::Price;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient as Client;
use assay_testkit::{RecordedRequest, Reply, TempPostgres};
use assay_tests::{MeshSandbox, SandboxOptions, leaves_eval};
use serde_json::json;

/// USD per million tokens, input and output alike.
const PRICE: f64 = 1000.0;
/// Completion tokens every reply reports.
const COMPLETION: u64 = 40;

/// What the backend served: calls and tokens (every request it received: a provider bills a
/// reply whether or not its client is still waiting). With `slow`, one request in seven is
/// answered after [`SLOW`], past the attempt timeout the client has learnt.
#[derive(Default)]
struct Served {
    calls: AtomicU64,
    tokens: AtomicU64,
    slow: bool,
    /// Requests answered after [`SLOW`], and their tokens.
    slow_calls: AtomicU64,
    slow_tokens: AtomicU64,
}

/// How late a slow reply comes: past the attempt timeout of [`fast_timeouts`] (floor 150 ms,
/// 4x a 5 ms latency), well inside the ceiling.
const SLOW: Duration = Duration::from_millis(900);

/// Attempt timeouts learnt from a 5 ms backend: 150 ms at least.
fn fast_timeouts() -> assay_llm::AdaptiveTimeout {
    assay_llm::AdaptiveTimeout { floor: Duration::from_millis(150), ..assay_llm::AdaptiveTimeout::default() }
}

impl Served {
    fn usd(&self) -> f64 {
        self.tokens.load(Ordering::SeqCst) as f64 * PRICE / 1e6
    }
    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
    fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::SeqCst)
    }
}

/// `reply` with usage as a provider counts it (a token per four bytes of the request), counted.
fn served(served: &Served, r: &RecordedRequest, reply: Reply) -> Reply {
    let prompt = (r.raw_body.len() as u64 / 4).max(1);
    let n = served.calls.fetch_add(1, Ordering::SeqCst);
    served.tokens.fetch_add(prompt + COMPLETION, Ordering::SeqCst);
    // Never the first requests: the client learns the backend's pace from them.
    if served.slow && n >= 12 && n % 7 == 3 {
        served.slow_calls.fetch_add(1, Ordering::SeqCst);
        served.slow_tokens.fetch_add(prompt + COMPLETION, Ordering::SeqCst);
        return reply.usage(prompt, COMPLETION).delay(SLOW);
    }
    reply.usage(prompt, COMPLETION).delay(Duration::from_millis(5))
}

fn prices() -> BTreeMap<String, Price> {
    BTreeMap::from([("*".to_string(), Price { input: PRICE, output: PRICE, cached_input: None })])
}

/// Every stage the tests run, answered: tick generation, batch scoring, and the debate's stages.
fn answer(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    match r.schema_name() {
        "debate_solution" => Reply::json(json!({"approach": "direct", "reasoning_steps": ["add"],
            "final_answer": "4", "confidence": 0.7})),
        "debate_review" => Reply::json(json!({"strengths": ["clear"], "weaknesses": [], "errors": [],
            "suggested_changes": ["check"]})),
        "debate_refinement" => Reply::json(json!({"critiques_accepted": [], "critiques_rejected": [],
            "refinement_reasoning": "checked", "reasoning_steps": ["checked"], "final_answer": "4",
            "confidence": 0.8, "changed_from_original": false, "improvement_explanation": "none"})),
        "debate_judgment" => {
            Reply::text(json!({"reasoning": "solver_1", "winner": "solver_1", "confidence": 0.9}).to_string())
        }
        _ if prompt.contains("Q1:") => {
            let n = prompt.lines().filter(|l| l.starts_with('Q') && l.contains(':')).count().max(1);
            let answers: Vec<_> = (1..=n).map(|i| json!({"question_index": i, "answer": "YES"})).collect();
            Reply::json(json!({ "answers": answers }))
        }
        _ => Reply::json(json!({"items": [
            {"question": "Does it answer the question asked?"},
            {"question": "Is it under a hundred words?"},
            {"question": "Is every claim in it correct?"}
        ]})),
    }
}

/// A mesh at the default concurrency whose backend counts into `count`.
async fn start_counting(cap_usd: Option<f64>, store: Option<String>, count: &Arc<Served>) -> MeshSandbox {
    let sandbox = MeshSandbox::start_with(SandboxOptions {
        prices: Some(prices()),
        daily_spend_usd: cap_usd,
        concurrency: Some(256),
        store,
        adaptive_timeout: count.slow.then(fast_timeouts),
        ..SandboxOptions::default()
    })
    .await;
    let c = count.clone();
    sandbox.llm.set_handler(move |r| served(&c, r, answer(r)));
    sandbox
}

async fn start(cap_usd: Option<f64>, store: Option<String>) -> (MeshSandbox, Arc<Served>) {
    start_served(cap_usd, store, false).await
}

/// A mesh whose backend counts what it serves, answering one request in seven late (`slow`).
async fn start_served(cap_usd: Option<f64>, store: Option<String>, slow: bool) -> (MeshSandbox, Arc<Served>) {
    let count = Arc::new(Served { slow, ..Served::default() });
    (start_counting(cap_usd, store, &count).await, count)
}

/// Run `pipeline` to its end; the stored run.
async fn run(
    sandbox: &MeshSandbox,
    pipeline: gw::run_pipeline_request::Pipeline,
    budget: Option<gw::RunBudget>,
) -> gw::Run {
    let mut client = Client::new(sandbox.gateway().await);
    let request = gw::RunPipelineRequest { open: false, pipeline: Some(pipeline), label: "money".into(), budget };
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let mut run_id = String::new();
    while let Some(m) = stream.message().await.expect("event stream") {
        run_id.clone_from(&m.event.expect("an event").run_id);
    }
    client.get_run(gw::GetRunRequest { run_id }).await.expect("get run").into_inner().run.expect("run")
}

/// The run's cost (zero when it made no call; a priced backend leaves no call unpriced).
fn usd(run: &gw::Run) -> f64 {
    let usage = run.usage.clone().unwrap_or_default();
    assert_eq!(usage.unpriced_calls, 0, "{usage:?}");
    usage.cost_usd.unwrap_or(0.0)
}

fn tokens(run: &gw::Run) -> u64 {
    run.usage.as_ref().map(|u| u.prompt_tokens + u.completion_tokens).unwrap_or(0)
}

/// A tick evaluation of `n` records with distinct inputs: a checklist generated per record.
fn tick_eval(n: usize) -> gw::run_pipeline_request::Pipeline {
    let mut p = leaves_eval(n);
    p.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
    });
    for (i, r) in p.records.iter_mut().enumerate() {
        r.input = format!("Write a short note about topic number {i}, for a reader who knows nothing of it.");
    }
    gw::run_pipeline_request::Pipeline::ChecklistEval(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_for_every_input_at_once_holds_a_dollar_budget() {
    let (sandbox, count) = start(None, None).await;
    let budget = 5.0;
    let run = run(&sandbox, tick_eval(200), Some(gw::RunBudget { max_tokens: None, max_cost_usd: Some(budget) })).await;
    let served = count.usd();
    eprintln!(
        "tick eval, 200 inputs, --max-cost {budget}: backend served ${served:.4} in {} calls ({:.2}x); run usage ${:.4}",
        count.calls(),
        served / budget,
        usd(&run)
    );
    assert_eq!(run.state, gw::RunState::Partial as i32, "{}", run.budget_exhausted);
    assert!(run.budget_exhausted.starts_with("budget exhausted"), "{}", run.budget_exhausted);
    assert!(served <= budget * 1.25, "served ${served} on a ${budget} budget");
    assert!(served > budget / 4.0, "the budget was used: ${served}");
    assert!((usd(&run) - served).abs() < 1e-6, "every served call is in the run's usage: ${} vs ${served}", usd(&run));
    assert_eq!(tokens(&run), count.tokens());
    sandbox.shutdown().await.unwrap();
}

fn debate(problems: usize) -> gw::run_pipeline_request::Pipeline {
    gw::run_pipeline_request::Pipeline::Debate(gw::DebatePipeline {
        problems: (0..problems)
            .map(|i| gw::DebateProblem {
                id: format!("p{i}"),
                problem: format!("What is {i} + {i}? Show the steps."),
                reference: None,
            })
            .collect(),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debate_of_many_problems_holds_a_token_budget() {
    let (sandbox, count) = start(None, None).await;
    let max = 30_000;
    let run = run(&sandbox, debate(30), Some(gw::RunBudget { max_tokens: Some(max), max_cost_usd: None })).await;
    let served = count.tokens();
    eprintln!(
        "debate, 30 problems, --max-tokens {max}: backend served {served} tokens in {} calls ({:.2}x); run usage {} tokens",
        count.calls(),
        served as f64 / max as f64,
        tokens(&run)
    );
    assert!(served as f64 <= max as f64 * 1.5, "served {served} tokens on a {max} budget");
    assert_eq!(tokens(&run), served, "every served call is in the run's usage");
    let Some(gw::run_result::Result::Debate(d)) = run.result.as_ref().and_then(|r| r.result.as_ref()) else {
        panic!("a debate result: {run:?}")
    };
    assert_eq!(
        (d.tokens, u64::from(d.calls)),
        (served, count.calls()),
        "the summary's debate usage is what was served"
    );
    assert!(!run.budget_exhausted.is_empty(), "30 problems do not fit: the run says so");
    // Problems start only while the budget can finish them: some finish (before, the 30 ran at
    // once, shared the budget, and none finished).
    let finished = d.problems_total - d.problems_failed;
    eprintln!("{finished} of 30 problems finished");
    assert!(finished >= 2, "{finished} problems finished on a {max}-token budget");
    sandbox.shutdown().await.unwrap();
}

/// 20 runs at once on one capped backend: together they never pass the cap.
async fn twenty_runs_on_a_cap(gateways: &[&MeshSandbox], count: &Served, cap: f64) -> Vec<gw::Run> {
    let runs = (0..20).map(|i| {
        let sandbox = gateways[i % gateways.len()];
        async move { run(sandbox, tick_eval(20), None).await }
    });
    let runs = futures::future::join_all(runs).await;
    let served = count.usd();
    let charged: f64 = runs.iter().map(usd).sum();
    eprintln!(
        "20 concurrent runs on {} gateway(s), ${cap} daily cap: backend served ${served:.4} in {} calls ({:.2}x); runs charged ${charged:.4}",
        gateways.len(),
        count.calls(),
        served / cap
    );
    assert!(served <= cap * 1.25, "served ${served} on a ${cap} cap");
    assert!(served > cap / 4.0, "the cap was used: ${served}");
    assert!((charged - served).abs() < 1e-6, "every served call is in some run's usage: ${charged} vs ${served}");
    for r in &runs {
        assert!(
            r.state == gw::RunState::Succeeded as i32 || r.budget_exhausted.contains("daily spend cap"),
            "{:?}: {}",
            r.state,
            r.budget_exhausted
        );
    }
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_runs_hold_a_daily_cap() {
    let cap = 20.0;
    let (sandbox, count) = start(Some(cap), None).await;
    twenty_runs_on_a_cap(&[&sandbox], &count, cap).await;
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_runs_on_two_gateways_sharing_postgres_hold_a_daily_cap() {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).try_init();
    let Some(pg) = TempPostgres::start_or_skip("twenty_concurrent_runs_on_two_gateways") else { return };
    let url = pg.database("money_limits").expect("database");
    let cap = 20.0;
    let (a, count) = start(Some(cap), Some(url.clone())).await;
    let b = start_counting(Some(cap), Some(url), &count).await;
    twenty_runs_on_a_cap(&[&a, &b], &count, cap).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_backend_refuses_a_model_it_cannot_price() {
    let sandbox = MeshSandbox::start_with(SandboxOptions {
        prices: Some(BTreeMap::from([
            ("gpt-4o-mini".to_string(), Price { input: PRICE, output: PRICE, cached_input: None }),
            ("scripted-judge".to_string(), Price { input: PRICE, output: PRICE, cached_input: None }),
        ])),
        daily_spend_usd: Some(20.0),
        ..SandboxOptions::default()
    })
    .await;
    let count = Arc::new(Served::default());
    let c = count.clone();
    sandbox.llm.set_handler(move |r| served(&c, r, answer(r)));
    let mut p = leaves_eval(3);
    p.scorer_model = Some(assay_proto::common::v1::ModelSpec {
        backend: "openai".into(),
        model: "gpt-4o".into(),
        ..Default::default()
    });
    let run = run(&sandbox, gw::run_pipeline_request::Pipeline::ChecklistEval(p), None).await;
    assert_eq!(count.calls(), 0, "no call to a model without a price reaches a capped backend");
    assert!(run.budget_exhausted.contains("gpt-4o") || run.state != gw::RunState::Succeeded as i32, "{run:?}");
    sandbox.shutdown().await.unwrap();
}

/// Every request the backend served is in the run's usage: as a measured reply, as a duplicate
/// (at the usage of the reply used), or as an abandoned attempt at its reservation, which errs
/// high. `runs` together are all the backend served.
fn every_served_call_counted(runs: &[gw::Run], count: &Served, what: &str) {
    let usage: Vec<_> = runs.iter().map(|r| r.usage.clone().unwrap_or_default()).collect();
    let calls: u64 = usage.iter().map(|u| u64::from(u.calls)).sum();
    let abandoned: u64 = usage.iter().map(|u| u64::from(u.abandoned_calls)).sum();
    let hedged: u64 = usage.iter().map(|u| u64::from(u.hedged_calls)).sum();
    let tokens: u64 = usage.iter().map(|u| u.prompt_tokens + u.completion_tokens).sum();
    let abandoned_tokens: u64 = usage.iter().map(|u| u.abandoned_tokens).sum();
    eprintln!(
        "{what}: served {} calls ({} late), {} tokens; counted {calls} calls ({abandoned} abandoned, {hedged} hedged), \
         {tokens} tokens ({abandoned_tokens} reserved for abandoned attempts)",
        count.calls(),
        count.slow_calls.load(Ordering::SeqCst),
        count.tokens(),
    );
    assert!(count.slow_calls.load(Ordering::SeqCst) > 0, "{what}: some replies came late");
    assert!(abandoned > 0, "{what}: the late replies were given up on");
    // A duplicate dropped the instant the request it doubles answered may never have reached the
    // backend: counted all the same (never fewer than served), so the count may pass what was
    // served by those alone.
    assert!(
        calls >= count.calls() && calls - count.calls() <= hedged,
        "{what}: every request served is a call of some run ({calls} counted, {} served, {hedged} hedged)",
        count.calls()
    );
    assert!(tokens >= count.tokens(), "{what}: {tokens} tokens counted, {} served", count.tokens());
    assert!(
        hedged > 0 || tokens - abandoned_tokens <= count.tokens(),
        "{what}: measured {} tokens, more than the {} served",
        tokens - abandoned_tokens,
        count.tokens()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_given_up_on_are_counted_and_a_dollar_budget_still_holds() {
    let (sandbox, count) = start_served(None, None, true).await;
    let budget = 60.0;
    let run = run(&sandbox, tick_eval(200), Some(gw::RunBudget { max_tokens: None, max_cost_usd: Some(budget) })).await;
    let served = count.usd();
    eprintln!(
        "tick eval, 200 inputs, --max-cost {budget}, late replies: served ${served:.4} ({:.2}x)",
        served / budget
    );
    assert!(served <= budget * 1.1, "served ${served} on a ${budget} budget");
    assert!(usd(&run) <= budget * 1.0001, "the run counts ${} on a ${budget} budget", usd(&run));
    every_served_call_counted(std::slice::from_ref(&run), &count, "--max-cost");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_given_up_on_are_counted_and_a_debates_token_budget_still_holds() {
    let (sandbox, count) = start_served(None, None, true).await;
    let max = 100_000;
    let run = run(&sandbox, debate(30), Some(gw::RunBudget { max_tokens: Some(max), max_cost_usd: None })).await;
    let served = count.tokens();
    eprintln!("debate, --max-tokens {max}, late replies: served {served} ({:.2}x)", served as f64 / max as f64);
    assert!(served as f64 <= max as f64 * 1.1, "served {served} tokens on a {max} budget");
    every_served_call_counted(std::slice::from_ref(&run), &count, "--max-tokens");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_given_up_on_are_counted_and_twenty_runs_hold_a_daily_cap() {
    let cap = 100.0;
    let (sandbox, count) = start_served(Some(cap), None, true).await;
    let runs = futures::future::join_all((0..20).map(|_| run(&sandbox, tick_eval(20), None))).await;
    let served = count.usd();
    eprintln!("20 runs, ${cap} daily cap, late replies: served ${served:.4} ({:.2}x)", served / cap);
    assert!(served <= cap * 1.1, "served ${served} on a ${cap} cap");
    every_served_call_counted(&runs, &count, "daily cap");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedged_and_abandoned_requests_of_a_run_without_limits_are_in_its_usage() {
    let (sandbox, count) = start_served(None, None, true).await;
    let run = run(&sandbox, tick_eval(150), None).await;
    assert_eq!(run.state, gw::RunState::Succeeded as i32, "{run:?}");
    every_served_call_counted(std::slice::from_ref(&run), &count, "no limits");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_given_up_on_are_counted_and_two_responders_hold_a_token_budget() {
    let (sandbox, count) = start_served(None, None, true).await;
    let max = 40_000;
    let gw::run_pipeline_request::Pipeline::ChecklistEval(mut p) = tick_eval(30) else { unreachable!() };
    p.responders = ["model-a", "model-b"]
        .map(|m| gw::Responder {
            model: Some(assay_proto::common::v1::ModelSpec { model: m.into(), ..Default::default() }),
            template: "Please answer: {input}".into(),
            ..Default::default()
        })
        .to_vec();
    let budget = gw::RunBudget { max_tokens: Some(max), max_cost_usd: None };
    let run = run(&sandbox, gw::run_pipeline_request::Pipeline::ChecklistEval(p), Some(budget)).await;
    let served = count.tokens();
    eprintln!("two responders, --max-tokens {max}, late replies: served {served} ({:.2}x)", served as f64 / max as f64);
    assert!(served as f64 <= max as f64 * 1.1, "served {served} tokens on a {max} budget");
    every_served_call_counted(std::slice::from_ref(&run), &count, "responders --max-tokens");
    sandbox.shutdown().await.unwrap();
}

/// A run on a capped backend cancelled while its calls are out: the backend serves what was sent
/// (a provider bills a request whose client went away), so the calls cut off count at what they
/// held, in the run's usage and on the cap; before, their holds were given back and the served
/// replies were in no run's usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_with_calls_out_counts_them() {
    let count = Arc::new(Served::default());
    let sandbox = MeshSandbox::start_with(SandboxOptions {
        prices: Some(prices()),
        daily_spend_usd: Some(1000.0),
        concurrency: Some(16),
        ..SandboxOptions::default()
    })
    .await;
    let c = count.clone();
    sandbox.llm.set_handler(move |r| served(&c, r, answer(r)).delay(Duration::from_millis(600)));
    let mut client = Client::new(sandbox.gateway().await);
    let request =
        gw::RunPipelineRequest { open: false, pipeline: Some(tick_eval(60)), label: "cut".into(), budget: None };
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
    assert!(assay_testkit::eventually(Duration::from_secs(30), || count.calls() >= 8).await, "calls went out");
    client
        .control_run(gw::ControlRunRequest {
            run_id: run_id.clone(),
            action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
            actor: "tester".into(),
            reason: "enough".into(),
        })
        .await
        .unwrap();
    while stream.message().await.unwrap().is_some() {}
    let run = client.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.state, gw::RunState::Cancelled as i32);
    let served = count.usd();
    let usage = run.usage.clone().unwrap_or_default();
    eprintln!(
        "cancelled with calls out: served ${served:.4} in {} calls; the run counts ${:.4} ({} cut off, ${:.4})",
        count.calls(),
        usd(&run),
        usage.abandoned_calls,
        usage.abandoned_cost_usd
    );
    assert!(usage.abandoned_calls > 0, "calls were cut off: {usage:?}");
    assert!(usd(&run) >= served, "the run counts ${} of the ${served} served", usd(&run));
    sandbox.shutdown().await.unwrap();
}
