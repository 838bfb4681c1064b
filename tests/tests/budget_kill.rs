//! A budget holds across a SIGKILL of the whole mesh with calls in flight: before each stage call
//! is sent, what the run's calls hold of its budget is stored with the run; the next process
//! counts what was held at the kill as spent (a provider may have served every call in flight),
//! so the backend never serves more than the budget, however the run was interrupted.
//!
//! A CLI verb following such a run reattaches once the gateway is back, and ends with its result.
//!
//! Needs the `assay` binary of this workspace (built by any workspace test run).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{Reply, ScriptedLlm};
use assay_tests::{leaves_eval, watch_all};
use tokio::process::Child;
use tonic::transport::Channel;

const RECORDS: usize = 300;
const BUDGET: u64 = 20_000;

/// `assay up` on the scripted backend and the store at `store`: the child and its gateway address.
async fn up(store: &Path, backend: &str) -> (Child, String) {
    assay_tests::assay_up(store, backend, &[("ASSAY__GATEWAY__CONCURRENCY", "64")]).await
}

async fn client(url: &str) -> GatewayServiceClient<Channel> {
    GatewayServiceClient::new(Channel::from_shared(url.to_string()).unwrap().connect().await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_holds_across_a_sigkill_with_calls_in_flight() {
    let llm = ScriptedLlm::start().await;
    // Usage as a provider counts it (a token per four bytes sent), summed as the calls arrive: a
    // call in flight at the kill is served all the same.
    let served = Arc::new(AtomicU64::new(0));
    let count = served.clone();
    llm.set_handler(move |r| {
        let prompt = (r.raw_body.len() as u64 / 4).max(1);
        count.fetch_add(prompt + 10, Ordering::SeqCst);
        let first = if r.last_user_message().unwrap_or_default().contains("leaves") { "YES" } else { "NO" };
        Reply::json(serde_json::json!({"answers": [
            {"question_index": 1, "answer": first},
            {"question_index": 2, "answer": "YES"},
        ]}))
        .usage(prompt, 10)
        .delay(Duration::from_millis(150))
    });
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let (mut child, url) = up(&store, &llm.base_url()).await;
    let mut gateway = client(&url).await;
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(RECORDS))),
        label: "budget-kill".into(),
        budget: Some(gw::RunBudget { max_tokens: Some(BUDGET), max_cost_usd: None }),
    };
    let mut stream = gateway.run_pipeline(request).await.unwrap().into_inner();
    let mut run_id = String::new();
    let mut scored = 0;
    while scored < 3 {
        let ev = stream.message().await.unwrap().expect("the run goes on").event.unwrap();
        run_id.clone_from(&ev.run_id);
        scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
    }
    let in_flight = llm.request_count() - scored;
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    drop(stream);
    let at_kill = served.load(Ordering::SeqCst);

    let (next, url) = up(&store, &llm.base_url()).await;
    child = next;
    let mut gateway = client(&url).await;
    watch_all(&mut gateway, &run_id).await;
    let run = gateway.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
    let total = served.load(Ordering::SeqCst);
    let charged = run.usage.as_ref().map(|u| u.prompt_tokens + u.completion_tokens).unwrap_or(0);
    eprintln!(
        "budget {BUDGET} tokens, SIGKILL with {in_flight} calls in flight ({at_kill} tokens served by then): \
         {total} tokens served in all ({:.2}x), {charged} in the run's usage; {}",
        total as f64 / BUDGET as f64,
        run.budget_exhausted
    );
    assert!(in_flight > 0, "calls were in flight at the kill");
    assert!(total <= BUDGET, "the backend served {total} tokens on a {BUDGET}-token budget");
    assert_eq!(run.state, gw::RunState::Partial as i32, "{}", run.budget_exhausted);
    assert!(run.budget_exhausted.starts_with("budget exhausted"), "{}", run.budget_exhausted);
    child.start_kill().ok();
}

/// A free loopback port (bound, then released for the mesh to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `assay score --gateway` follows its run across a SIGKILL of the mesh and its restart on the
/// same address: it reattaches from the last event it saw and ends with the run's result.
#[tokio::test(flavor = "multi_thread")]
async fn a_cli_verb_reattaches_after_the_gateway_is_killed_and_restarted() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(assay_tests::leaves_judge(Duration::from_millis(100)));
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let port = free_port().to_string();
    let env = [("ASSAY__GATEWAY__CONCURRENCY", "4"), ("ASSAY__PORTS__GATEWAY", port.as_str())];
    let (mut mesh, url) = assay_tests::assay_up(&store, &llm.base_url(), &env).await;
    let data = dir.path().join("records.jsonl");
    let lines: Vec<String> = (0..40)
        .map(|i| serde_json::json!({"id": format!("r{i}"), "target": format!("leaves {i}")}).to_string())
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    let checklist = dir.path().join("checklist.json");
    std::fs::write(&checklist, r#"["Mentions leaves?", "Is it short?"]"#).unwrap();
    let out = dir.path().join("out.jsonl");
    let score = tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"))
        .args(["score", "--checklist"])
        .arg(&checklist)
        .arg("--data")
        .arg(&data)
        .args(["--gateway", &url, "--out"])
        .arg(&out)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("assay score starts");
    // Some records scored, the rest in flight: kill the mesh.
    while llm.request_count() < 8 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    mesh.start_kill().expect("SIGKILL");
    mesh.wait().await.expect("reaped");
    let (restarted, again) = assay_tests::assay_up(&store, &llm.base_url(), &env).await;
    mesh = restarted;
    assert_eq!(again, url, "the gateway is back on its address");
    let finished = tokio::time::timeout(Duration::from_secs(120), score.wait_with_output()).await.expect("score ends");
    let output = finished.expect("score output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("reattaching"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 40, "every record's line is written");
    mesh.start_kill().ok();
}
