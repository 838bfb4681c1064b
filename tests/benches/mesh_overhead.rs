//! Mesh overhead: Evaluate through gateway -> scorer -> scripted backend (0 ms latency), versus the
//! same scoring call made directly to the scorer. Run: `cargo bench -p assay-tests --bench mesh_overhead`.
//! Prints p50/p99/mean latency per path; CALLS overrides the number of calls (default 2000).

use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::scorer::v1 as sc;
use assay_testkit::Reply;
use assay_tests::MeshSandbox;

fn checklist() -> pb::Checklist {
    pb::Checklist {
        id: "bench".into(),
        items: (1..=5)
            .map(|i| pb::ChecklistItem {
                id: format!("q{i}"),
                question: format!("Requirement {i} met?"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "{name:<28} calls {:>5}  p50 {:>8.3} ms  p99 {:>8.3} ms  mean {:>8.3} ms",
        samples.len(),
        percentile(&samples, 0.50).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3
    );
}

#[tokio::main]
async fn main() {
    let calls: usize = std::env::var("CALLS").ok().and_then(|c| c.parse().ok()).unwrap_or(2000);
    let sandbox = MeshSandbox::start().await;
    let reply = serde_json::json!({"answers": (1..=5).map(|i| serde_json::json!({"question_index": i, "answer": "YES"})).collect::<Vec<_>>()});
    sandbox.llm.set_handler(move |_| Reply::json(reply.clone()).usage(50, 10));

    let mut gateway = gw::gateway_service_client::GatewayServiceClient::new(sandbox.gateway().await);
    let eval = gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist())) }),
            records: vec![gw::EvalRecord { target: "a response".into(), ..Default::default() }],
            ..Default::default()
        }),
        budget: None,
    };
    let mut scorer =
        sc::scorer_service_client::ScorerServiceClient::new(sandbox.channel(sandbox.mesh().addrs.scorer).await);
    let score = sc::ScoreRequest {
        checklist: Some(checklist()),
        targets: vec![sc::ScoreTarget { target: "a response".into(), ..Default::default() }],
        ..Default::default()
    };
    // Warm up connections and allocators.
    for _ in 0..100 {
        gateway.evaluate(eval.clone()).await.expect("evaluate");
        scorer.score(score.clone()).await.expect("score");
    }
    let mut direct = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        scorer.score(score.clone()).await.expect("score");
        direct.push(t.elapsed());
    }
    let mut through = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        gateway.evaluate(eval.clone()).await.expect("evaluate");
        through.push(t.elapsed());
    }
    report("scorer direct", direct.clone());
    report("gateway -> scorer", through.clone());
    direct.sort();
    through.sort();
    println!(
        "gateway hop overhead at p50: {:.3} ms",
        (percentile(&through, 0.5).as_secs_f64() - percentile(&direct, 0.5).as_secs_f64()) * 1e3
    );
    sandbox.shutdown().await.expect("shutdown");
}
