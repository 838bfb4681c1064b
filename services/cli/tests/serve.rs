//! `assay serve <stage>`: one service of the mesh on its own, as each Kubernetes Deployment runs
//! it (the binary on loopback, port 0): the scorer answers gRPC health SERVING under its own name
//! and drains and exits 0 on SIGTERM; an unknown stage fails with exit code 2, naming the valid
//! ones.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use assay_testkit::ChildOutput;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Every name `assay serve` takes, as the stage table spells them.
const STAGES: [&str; 7] = ["gateway", "generator", "refiners", "scorer", "arbiter", "delta-judge", "debate"];
const SCORER: &str = "assay.scorer.v1.ScorerService";

/// The health status `client` reports for `service`, once it is SERVING (or the last one after
/// 30 s).
async fn serving(client: &mut HealthClient<tonic::transport::Channel>, service: &str) -> ServingStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = client
            .check(HealthCheckRequest { service: service.into() })
            .await
            .map(|r| r.into_inner().status())
            .unwrap_or(ServingStatus::Unknown);
        if status == ServingStatus::Serving || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_scorer_answers_health_and_drains_on_sigterm() {
    // A model backend that loads at once (nothing is called): the scorer becomes SERVING.
    let mut out = ChildOutput::spawn(
        Command::new(env!("CARGO_BIN_EXE_assay"))
            .args(["serve", "scorer"])
            .env("ASSAY__BIND", "127.0.0.1")
            .env("ASSAY__PORTS__SCORER", "0")
            .env("ASSAY__DRAIN_SECONDS", "1")
            .env("ASSAY__MODELS__DEFAULT__BACKEND", "openai")
            .env("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
            .env("OPENAI_API_KEY", "test")
            .env_remove("ASSAY_CONFIG")
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
        "assay serve scorer",
    );
    // An info line: the stage's own telemetry (the CLI's would show warnings only).
    let addr = out.wait_for(Duration::from_secs(60), "the scorer's address", |line| {
        let rest = line.split("addr=Some(").nth(1).filter(|_| line.contains("listening"))?;
        rest.split(')').next().map(str::to_string)
    });
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");

    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    assert_eq!(serving(&mut health, SCORER).await, ServingStatus::Serving, "{SCORER}");
    assert_eq!(serving(&mut health, "").await, ServingStatus::Serving, "the server as a whole");

    // SIGTERM: drained, exit 0 (as a pod is stopped).
    let pid = out.child.id().to_string();
    let kill = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = out.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "still running 30 s after SIGTERM (drain_seconds 1)");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0), "exit after SIGTERM");
}

#[test]
fn serve_an_unknown_stage_fails_with_exit_code_2_naming_the_valid_ones() {
    let o = Command::new(env!("CARGO_BIN_EXE_assay")).args(["serve", "nonsense"]).output().expect("assay runs");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("nonsense"), "{err}");
    for stage in STAGES {
        assert!(err.contains(stage), "{stage} is not named:\n{err}");
    }

    // `--help` lists each with the gRPC service it serves.
    let o = Command::new(env!("CARGO_BIN_EXE_assay")).args(["serve", "--help"]).output().expect("assay runs");
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{help}");
    for stage in STAGES {
        assert!(help.contains(&format!("- {stage}:")), "{stage} is not listed:\n{help}");
    }
    assert!(help.contains(SCORER), "{help}");
}
