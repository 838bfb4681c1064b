//! The debate pipeline on the 50-problem set (`examples/problems.jsonl`) through the whole mesh,
//! against the scripted backend answering every call after 50 ms. Run:
//! `cargo bench -p assay-tests --bench debate` (or `--profile dev`: the time is the backend's).
//!
//! The scripted solvers answer the reference, except the third solver on every third problem, which
//! is wrong at first and corrects itself after the reviews; the judge picks solver_1.
//!
//! Prints one table: wall time and model calls per problem for problems debated one at a time and
//! several at once (with and without baselines), against the sequential count: every call one
//! after the other, 13 calls per problem for one round (3 solutions, 6 reviews, 3 refinements,
//! 1 judgment) at 50 ms.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use assay_proto::gateway::v1 as gw;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, run_to_end};
use serde_json::{Value, json};

const LATENCY: Duration = Duration::from_millis(50);
/// Calls of one debate round, one after the other.
const SEQUENTIAL_CALLS: u32 = 13;

fn problems() -> Vec<gw::DebateProblem> {
    include_str!("../../examples/problems.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("problem line parses");
            gw::DebateProblem {
                id: v["id"].as_str().unwrap_or_default().into(),
                problem: v["problem"].as_str().unwrap_or_default().into(),
                reference: v["reference"].as_str().map(String::from),
            }
        })
        .collect()
}

fn stage(r: &RecordedRequest) -> String {
    r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str).unwrap_or("?").to_string()
}

fn prompt(r: &RecordedRequest) -> String {
    r.messages().into_iter().find(|(role, _)| role == "user").map(|(_, c)| c).unwrap_or_default()
}

/// The scripted backend: (reference, wrong-at-first) by problem text.
fn handler(set: &[gw::DebateProblem]) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    let answers: Arc<HashMap<String, (String, bool)>> = Arc::new(
        set.iter()
            .enumerate()
            .map(|(i, p)| (p.problem.clone(), (p.reference.clone().unwrap_or_default(), i % 3 == 0)))
            .collect(),
    );
    move |r| {
        let p = prompt(r);
        let (reference, tricky) =
            answers.iter().find(|(q, _)| p.contains(q.as_str())).map(|(_, a)| a.clone()).unwrap_or_default();
        let third = p.starts_with("You are solver_3,");
        let reply = match stage(r).as_str() {
            "debate_solution" => {
                let answer = if third && tricky { format!("not {reference}") } else { reference };
                json!({"approach": "direct", "reasoning_steps": ["work it out"], "final_answer": answer,
                       "confidence": 0.7})
            }
            "debate_review" => {
                json!({"strengths": ["clear"], "weaknesses": [], "errors": [], "suggested_changes": ["check"]})
            }
            "debate_refinement" => json!({"critiques_accepted": ["check"], "critiques_rejected": [],
                   "refinement_reasoning": "checked", "reasoning_steps": ["checked"], "final_answer": reference,
                   "confidence": 0.8, "changed_from_original": third && tricky, "improvement_explanation": "checked"}),
            _ => json!({"reasoning": "solver_1 is right", "winner": "solver_1", "confidence": 0.9}),
        };
        Reply::json(reply).usage(50, 10).delay(LATENCY)
    }
}

struct Row {
    name: &'static str,
    at_once: u32,
    wall: Duration,
    problems: usize,
    debate_calls: u32,
    baseline_calls: u32,
    accuracy: f64,
}

async fn run(sandbox: &MeshSandbox, name: &'static str, at_once: u32, baselines: bool) -> Row {
    let set = problems();
    let n = set.len();
    sandbox.llm.set_handler(handler(&set));
    let pipeline = gw::DebatePipeline { problems: set, baselines, concurrency: at_once, ..Default::default() };
    let started = Instant::now();
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::Debate(pipeline)).await;
    let wall = started.elapsed();
    let Some(gw::run_event::Event::Completed(done)) = events.last().and_then(|e| e.event.clone()) else {
        panic!("the run completes")
    };
    let Some(gw::run_result::Result::Debate(d)) = done.result.and_then(|r| r.result) else { panic!("a debate result") };
    assert_eq!(d.problems_failed, 0, "every problem debated");
    Row {
        name,
        at_once,
        wall,
        problems: n,
        debate_calls: d.calls,
        baseline_calls: d.baseline_usage.map_or(0, |u| u.calls),
        accuracy: d.accuracy.unwrap_or_default(),
    }
}

#[tokio::main]
async fn main() {
    let sandbox = MeshSandbox::start().await;
    let mut rows = Vec::new();
    for (name, at_once, baselines) in
        [("debate", 1, false), ("debate", 8, false), ("debate", 50, false), ("debate + baselines", 50, true)]
    {
        rows.push(run(&sandbox, name, at_once, baselines).await);
    }
    let n = rows[0].problems;
    let sequential = LATENCY * SEQUENTIAL_CALLS * n as u32;
    println!(
        "debate pipeline, {n} problems, scripted backend at {} ms a call; sequential: {SEQUENTIAL_CALLS} calls a \
         problem one after the other = {:.1} s",
        LATENCY.as_millis(),
        sequential.as_secs_f64()
    );
    println!(
        "{:<20} {:>8} {:>8} {:>12} {:>14} {:>10} {:>9}",
        "run", "at once", "wall s", "calls/prob", "baseline/prob", "vs seq", "accuracy"
    );
    for r in &rows {
        println!(
            "{:<20} {:>8} {:>8.2} {:>12.1} {:>14.1} {:>9.1}x {:>8.0}%",
            r.name,
            r.at_once,
            r.wall.as_secs_f64(),
            f64::from(r.debate_calls) / r.problems as f64,
            f64::from(r.baseline_calls) / r.problems as f64,
            sequential.as_secs_f64() / r.wall.as_secs_f64(),
            r.accuracy * 100.0
        );
    }
    sandbox.shutdown().await.expect("mesh stops");
}
