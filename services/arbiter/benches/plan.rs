//! Plan for a 40-section document with 3 judges, through the arbiter's gRPC service on loopback,
//! against the scripted OpenAI-compatible backend answering every call after 50 ms. Prints the
//! model calls (embeddings + synthesis) and the wall time (median of 5 runs), next to the
//! sequential lower bound (calls x 50 ms) to show the synthesis calls run concurrently.
//! `cargo bench -p assay-arbiter --bench plan`

use std::sync::Arc;
use std::time::{Duration, Instant};

use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::arbiter::v1::PlanRequest;
use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::common::v1 as pb;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer, hash_embedding};

const LATENCY: Duration = Duration::from_millis(50);
const SECTIONS: usize = 40;
const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

fn handler(r: &RecordedRequest) -> Reply {
    let reply = if r.is_embeddings() {
        Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(&t[..t.len().min(12)], 64)).collect())
    } else {
        Reply::json(serde_json::json!({ "instruction": "Tighten the wording and add one worked example." }))
    };
    reply.delay(LATENCY)
}

/// Three judges: each flags a third of the sections (overlapping), with near-equal scores.
fn request() -> PlanRequest {
    let sections: Vec<pb::Section> = (0..SECTIONS)
        .map(|i| pb::Section {
            id: format!("s{i}"),
            index: i as u32,
            title: format!("Part {i}"),
            content: "A paragraph of lesson text with a claim, an example and a transition. ".repeat(12),
        })
        .collect();
    let verdicts = (0..3)
        .map(|j| pb::JudgeVerdict {
            judge_id: format!("judge-{j}"),
            criterion_scores: CRITERIA
                .iter()
                .enumerate()
                .map(|(c, name)| (name.to_string(), 0.9 - 0.05 * c as f64 + 0.01 * j as f64))
                .collect(),
            issues: (0..SECTIONS)
                .filter(|i| (i + j) % 3 != 0)
                .map(|i| pb::JudgeIssue {
                    criterion: CRITERIA[3 + (i % 3)].into(),
                    severity: if i % 7 == 0 { pb::Severity::Major } else { pb::Severity::Minor } as i32,
                    section_id: format!("s{i}"),
                    description: format!("Section {i}: wording too dense"),
                    fix_instruction: format!("Split the long sentences of section {i}."),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    PlanRequest { verdicts, sections, ..Default::default() }
}

#[tokio::main]
async fn main() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(handler);
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "bench".into();
    cfg.max_concurrency = 64;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_arbiter::routes(Arc::new(assay_arbiter::ArbiterCore::new(hub))),
        &[assay_proto::service_names::ARBITER],
    )
    .await;
    let mut client = ArbiterServiceClient::new(server.channel().await);
    let mut times = Vec::new();
    let mut calls = 0;
    let mut tasks = 0;
    let mut batches = 0;
    let mut tokens = 0;
    for _ in 0..5 {
        let before = llm.request_count();
        let mut req = request();
        // No response cache between runs: every run makes its calls.
        req.model = Some(pb::ModelSpec { no_cache: true, ..Default::default() });
        req.embedding_model = Some(pb::ModelSpec { no_cache: true, ..Default::default() });
        let t = Instant::now();
        let plan = client.plan(req).await.expect("plan").into_inner();
        times.push(t.elapsed());
        calls = llm.request_count() - before;
        let routing = plan.routing.unwrap();
        tasks = routing.tasks.len();
        batches = plan.batches.len();
        tokens = plan.estimated_tokens;
    }
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "plan: {SECTIONS} sections, 3 judges, {tasks} tasks in {batches} batches, {tokens} estimated tokens; \
         {calls} model calls at {} ms each; wall {:.0} ms (median of 5; sequential would be {} ms)",
        LATENCY.as_millis(),
        median.as_secs_f64() * 1e3,
        calls as u128 * LATENCY.as_millis()
    );
}
