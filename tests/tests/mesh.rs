//! Whole-mesh tests: every service on its own loopback port, the gateway calling the scorer over

#![allow(clippy::wildcard_enum_match_arm)]
//! gRPC, the scorer calling the scripted OpenAI-compatible backend over HTTP.

use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::service_names;
use assay_testkit::{Reply, eventually};
use assay_tests::{MeshSandbox, SandboxOptions};
use serde_json::json;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

fn checklist() -> pb::Checklist {
    pb::Checklist {
        id: "haiku".into(),
        input: "Write a haiku about autumn.".into(),
        items: vec![
            pb::ChecklistItem {
                id: "lines".into(),
                question: "Is it three lines?".into(),
                weight: Some(60.0),
                ..Default::default()
            },
            pb::ChecklistItem {
                id: "topic".into(),
                question: "Is it about autumn?".into(),
                weight: Some(40.0),
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn evaluate_request(targets: &[&str]) -> gw::EvaluateRequest {
    gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist())) }),
            records: targets
                .iter()
                .enumerate()
                .map(|(i, t)| gw::EvalRecord { id: format!("r{i}"), target: (*t).into(), ..Default::default() })
                .collect(),
            scorer: Some(pb::ScorerConfig { primary_metric: pb::PrimaryMetric::Weighted as i32, ..Default::default() }),
            ..Default::default()
        }),
        budget: None,
    }
}

/// Answers YES to both questions for targets containing "leaves", else YES/NO.
fn judge(sandbox: &MeshSandbox) {
    sandbox.llm.set_handler(|req| {
        let prompt = req.last_user_message().unwrap_or_default();
        let second = if prompt.contains("leaves") { "YES" } else { "no" };
        Reply::json(json!({"answers": [
            {"question_index": 1, "answer": "YES"},
            {"question_index": 2, "answer": second}
        ]}))
        .usage(100, 20)
    });
}

#[tokio::test]
async fn evaluate_through_the_gateway_returns_answers_aggregates_and_usage() {
    let sandbox = MeshSandbox::start().await;
    judge(&sandbox);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let r = client
        .evaluate(evaluate_request(&["red leaves fall\nslowly\ndown", "a poem about spring"]))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.run_id.is_empty());
    assert_eq!(r.results.len(), 2);
    let s0 = r.results[0].score.clone().unwrap();
    let s1 = r.results[1].score.clone().unwrap();
    assert_eq!(r.results[0].record_id, "r0");
    assert_eq!((s0.pass_rate, s0.weighted_score), (1.0, 1.0));
    assert_eq!(s1.pass_rate, 0.5);
    assert!((s1.weighted_score - 0.6).abs() < 1e-9);
    assert_eq!(s1.primary_score, s1.weighted_score);
    assert_eq!(s1.item_scores[1].answer, pb::Answer::No as i32);
    let agg = r.aggregate.unwrap();
    assert_eq!(agg.targets, 2);
    assert!((agg.mean_primary_score - 0.8).abs() < 1e-9);
    assert!((agg.macro_pass_rate - 0.75).abs() < 1e-9);
    assert!((agg.micro_pass_rate - 0.75).abs() < 1e-9);
    let usage = r.usage.unwrap();
    assert_eq!((usage.calls, usage.prompt_tokens, usage.completion_tokens), (2, 200, 40));
    assert_eq!(r.models[0].model, "scripted-judge");
    assert_eq!(r.checklists[0].source_method, "explicit");
    assert_eq!(sandbox.llm.request_count(), 2);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn every_service_reports_health_and_reflection() {
    let sandbox = MeshSandbox::start().await;
    for (name, addr) in sandbox.mesh().addrs.all() {
        let ch = sandbox.channel(addr).await;
        let mut health = HealthClient::new(ch.clone());
        for service in [name, ""] {
            let s = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
            assert_eq!(s.status, ServingStatus::Serving as i32, "{name} / {service:?}");
        }
        // Reflection v1.
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        let mut refl = ServerReflectionClient::new(ch.clone());
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut stream = refl.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
        let resp = stream.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else { panic!("list services") };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
        assert!(names.iter().any(|n| n == "grpc.health.v1.Health"));
        // Reflection v1alpha (what grpcurl 1.8 speaks).
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest as AlphaReq;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient as AlphaClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest as AlphaRequest;
        let mut alpha = AlphaClient::new(ch);
        let req =
            AlphaReq { host: String::new(), message_request: Some(AlphaRequest::FileContainingSymbol(name.into())) };
        let mut stream = alpha.server_reflection_info(tokio_stream::iter(vec![req])).await.unwrap().into_inner();
        assert!(stream.message().await.unwrap().is_some());
    }
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn services_are_not_serving_until_ready() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { not_ready: true, ..Default::default() }).await;
    let mut health = HealthClient::new(sandbox.channel(sandbox.mesh().addrs.scorer).await);
    let s = health.check(HealthCheckRequest { service: service_names::SCORER.into() }).await.unwrap().into_inner();
    assert_eq!(s.status, ServingStatus::NotServing as i32);
    sandbox.mesh().set_serving().await;
    let s = health.check(HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    assert_eq!(s.status, ServingStatus::Serving as i32);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn bearer_auth_guards_everything_but_health() {
    let sandbox =
        MeshSandbox::start_with(SandboxOptions { auth_token: Some("s3cret".into()), ..Default::default() }).await;
    judge(&sandbox);
    let ch = sandbox.gateway().await;
    let mut anon = GatewayServiceClient::new(ch.clone());
    let err = anon.evaluate(evaluate_request(&["leaves"])).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let mut health = HealthClient::new(ch.clone());
    assert!(health.check(HealthCheckRequest { service: String::new() }).await.is_ok());
    let mut authed =
        GatewayServiceClient::with_interceptor(ch, assay_rpc::auth::BearerInterceptor::new(Some("s3cret")));
    let r = authed.evaluate(evaluate_request(&["leaves"])).await.expect("gateway forwards the token to the scorer");
    assert_eq!(r.into_inner().results[0].score.as_ref().unwrap().pass_rate, 1.0);
    // The scheme is case-insensitive (RFC 7235); the token is not.
    for (header, ok) in [("bearer s3cret", true), ("BEARER s3cret", true), ("Bearer S3CRET", false), ("s3cret", false)]
    {
        let mut request = tonic::Request::new(evaluate_request(&["leaves"]));
        request.metadata_mut().insert("authorization", header.parse().unwrap());
        let result = anon.evaluate(request).await;
        assert_eq!(result.is_ok(), ok, "{header}: {result:?}");
    }
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_names_the_field_and_limit() {
    let sandbox = MeshSandbox::start().await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut empty_checklist = evaluate_request(&["x"]);
    if let Some(gw::checklist_source::Source::Checklist(c)) =
        empty_checklist.pipeline.as_mut().unwrap().source.as_mut().unwrap().source.as_mut()
    {
        c.items.clear();
    }
    let mut unknown_mode = evaluate_request(&["x"]);
    unknown_mode.pipeline.as_mut().unwrap().scorer.as_mut().unwrap().mode = 42;
    let huge = "x".repeat(assay_domain::limits::MAX_TEXT_BYTES + 1);
    let cases = vec![
        (evaluate_request(&[]), "pipeline.records", "must not be empty"),
        (evaluate_request(&[""]), "pipeline.records[0].target", "must not be empty"),
        (empty_checklist, "pipeline.source.checklist.items", "must not be empty"),
        (unknown_mode, "pipeline.scorer.mode", "unknown enum value 42"),
        (evaluate_request(&[huge.as_str()]), "pipeline.records[0].target", "the limit is 262144 bytes"),
        (gw::EvaluateRequest { pipeline: None, budget: None }, "pipeline", "is required"),
    ];
    for (req, field, text) in cases {
        let st = client.evaluate(req).await.unwrap_err();
        assert_eq!(st.code(), Code::InvalidArgument, "{field}");
        let bad = st.get_details_bad_request().unwrap();
        let v = bad.field_violations.iter().find(|v| v.field == field).unwrap_or_else(|| panic!("{field}: {bad:?}"));
        assert!(v.description.contains(text), "{field}: {}", v.description);
    }
    assert_eq!(sandbox.llm.request_count(), 0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn rate_limit_is_retried_through_the_mesh() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.push(Reply::status(429).retry_after(1));
    sandbox.llm.push(Reply::json(
        json!({"answers": [{"question_index": 1, "answer": "YES"}, {"question_index": 2, "answer": "YES"}]}),
    ));
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let started = Instant::now();
    let r = client.evaluate(evaluate_request(&["leaves"])).await.unwrap().into_inner();
    assert!(started.elapsed() >= Duration::from_secs(1), "retry-after honoured");
    assert_eq!(r.results[0].score.as_ref().unwrap().pass_rate, 1.0);
    assert_eq!(r.usage.unwrap().retries, 1);
    assert_eq!(sandbox.llm.request_count(), 2);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_client_stops_the_backend_call() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.push(Reply::hang());
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let call = client.evaluate(evaluate_request(&["leaves"]));
    // The client gives up (drops the call) once the backend has the request.
    let llm = &sandbox.llm;
    let res = tokio::select! {
        r = call => Some(r),
        _ = async { while llm.request_count() == 0 { tokio::task::yield_now().await; tokio::time::sleep(Duration::from_millis(5)).await; } } => None,
    };
    assert!(res.is_none(), "the hanging backend cannot have answered");
    assert!(
        eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 1).await,
        "the backend saw the request cancelled"
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_callers_deadline_is_enforced_as_deadline_exceeded() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.push(Reply::hang());
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut req = tonic::Request::new(evaluate_request(&["leaves"]));
    req.set_timeout(Duration::from_millis(500));
    let st = client.evaluate(req).await.unwrap_err();
    assert_eq!(st.code(), Code::DeadlineExceeded, "{st:?}");
    assert!(eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 1).await);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_drains_in_flight_calls() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.push(
        Reply::json(
            json!({"answers": [{"question_index": 1, "answer": "YES"}, {"question_index": 2, "answer": "YES"}]}),
        )
        .delay(Duration::from_millis(700)),
    );
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let call = tokio::spawn(async move { client.evaluate(evaluate_request(&["leaves"])).await });
    assert!(eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 1).await);
    sandbox.shutdown().await.expect("clean shutdown");
    let r = call.await.unwrap().expect("the in-flight call completed during the drain");
    assert_eq!(r.into_inner().results[0].score.as_ref().unwrap().pass_rate, 1.0);
}

#[tokio::test]
async fn external_python_client_lists_checks_and_evaluates() {
    let sandbox = MeshSandbox::start().await;
    judge(&sandbox);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/external_client.py");
    let out = tokio::process::Command::new("python3")
        .arg(script)
        .arg(sandbox.mesh().addrs.gateway.to_string())
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python client failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("evaluate ok"), "{stdout}");
    sandbox.shutdown().await.unwrap();
}
