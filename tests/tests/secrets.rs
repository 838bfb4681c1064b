//! Secrets never logged: the whole mesh (with mutual TLS) runs with a backend API key and a bearer
//! token set to distinctive strings while every log record at trace level, of every crate (through
//! `log` too), is captured; successful and failing calls (no token, a wrong token, backend 401 and
//! 500, bad input, the admin page) must never show the key, the token or the TLS private key in a
//! log line, in a gRPC status (message, details, metadata) or a response sent to the client, nor
//! in the configuration's Debug output.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::scorer::v1 as sc;
use assay_rpc::auth::BearerInterceptor;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, SandboxOptions};
use serde_json::json;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[path = "support/pki.rs"]
mod pki;

const API_KEY: &str = "sk-assay-Zq7XkR2mN9vLwP4tY8sBcD1eF6gH3jK5";
const TOKEN: &str = "assay-bearer-Vw3Nq8Lm2Xc6Rt9Yp4Hs7Jd1Kf5Gb0Za";
const WRONG_TOKEN: &str = "not-the-token";

/// Every formatted log record of this process, at trace level.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_span_events(tracing_subscriber::fmt::format::FmtSpan::FULL)
            .with_writer(move || assay_tests::LogCapture(sink.clone()))
            .finish();
        // Also installs the `log` bridge, so crates logging through `log` (reqwest, rustls) are caught.
        tracing_subscriber::util::SubscriberInitExt::try_init(subscriber).expect("the only subscriber");
        buffer
    })
}

/// Every secret of the run, by name.
struct Secrets(Vec<(&'static str, String)>);

impl Secrets {
    fn assert_absent(&self, what: &str, text: &str) {
        for (name, secret) in &self.0 {
            assert!(!text.contains(secret.as_str()), "the {name} appears in {what}:\n{text}");
        }
    }
}

/// What the client saw of a failed call: code, message, details and metadata.
fn status_text(s: &tonic::Status) -> String {
    format!(
        "{:?} {} {} {:?}",
        s.code(),
        s.message(),
        String::from_utf8_lossy(s.details()),
        s.metadata().clone().into_headers()
    )
}

fn request(targets: &[&str]) -> gw::EvaluateRequest {
    let checklist = pb::Checklist {
        id: "c".into(),
        input: "Write a haiku about autumn.".into(),
        items: vec![pb::ChecklistItem {
            id: "topic".into(),
            question: "Is it about autumn?".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
            records: targets
                .iter()
                .enumerate()
                .map(|(i, t)| gw::EvalRecord { id: format!("r{i}"), target: (*t).into(), ..Default::default() })
                .collect(),
            ..Default::default()
        }),
        budget: None,
    }
}

/// The backend checks the key, answers YES, and fails on demand: a 401 whose body names the key the
/// way OpenAI does (masked), or a 500.
fn backend(req: &RecordedRequest) -> Reply {
    let authorization = req.header("authorization").unwrap_or_default().to_string();
    if authorization != format!("Bearer {API_KEY}") {
        return Reply::status(401).body(json!({"error": {"message": "missing api key"}}).to_string());
    }
    let prompt = req.last_user_message().unwrap_or_default();
    if prompt.contains("backend-401") {
        let masked = format!("{}****{}", &API_KEY[..5], &API_KEY[API_KEY.len() - 4..]);
        return Reply::status(401).body(
            json!({"error": {"message": format!("Incorrect API key provided: {masked}."), "type": "invalid_request_error"}})
                .to_string(),
        );
    }
    if prompt.contains("backend-500") {
        return Reply::status(500).body(json!({"error": {"message": "the server had an error"}}).to_string());
    }
    Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})).usage(10, 2)
}

fn client(
    ch: Channel,
    token: Option<&str>,
) -> GatewayServiceClient<tonic::codegen::InterceptedService<Channel, BearerInterceptor>> {
    GatewayServiceClient::with_interceptor(ch, BearerInterceptor::new(token))
}

#[tokio::test]
async fn secrets_never_reach_logs_errors_or_debug_output() {
    let logs = logs();
    let dir = tempfile::tempdir().unwrap();
    let ca = pki::Ca::new("assay test ca");
    let server = ca.leaf("assay-mesh");
    let tls = pki::mesh_tls(dir.path(), &ca, &server, None, true);
    // The private key's base64 lines, each a secret too.
    let key_lines: Vec<String> =
        server.key.lines().filter(|l| !l.starts_with("-----") && l.len() > 16).map(str::to_string).collect();
    let mut secrets = vec![("api key", API_KEY.to_string()), ("bearer token", TOKEN.to_string())];
    secrets.extend(key_lines.iter().map(|l| ("tls private key", l.clone())));
    let secrets = Secrets(secrets);

    let sandbox = MeshSandbox::start_with(SandboxOptions {
        auth_token: Some(TOKEN.into()),
        api_key: Some(API_KEY.into()),
        tls: Some(tls),
        admin: true,
        ..Default::default()
    })
    .await;
    sandbox.llm.set_handler(backend);
    let mut seen = Vec::new();

    // A successful evaluation.
    let ok = client(sandbox.gateway().await, Some(TOKEN)).evaluate(request(&["red leaves fall"])).await;
    let ok = ok.expect("evaluation with the token").into_inner();
    assert!(ok.results[0].error.is_empty(), "{:?}", ok.results[0]);
    seen.push(format!("{ok:?}"));
    let sent = sandbox.llm.requests();
    assert!(
        sent.iter().any(|r| r.header("authorization") == Some(&format!("Bearer {API_KEY}"))),
        "the key reached the backend"
    );

    // No token, a wrong token: refused, on the gateway and on a stage.
    for token in [None, Some(WRONG_TOKEN)] {
        let e = client(sandbox.gateway().await, token).evaluate(request(&["x"])).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        seen.push(status_text(&e));
        let mut scorer = assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient::with_interceptor(
            sandbox.channel(sandbox.mesh().addrs.scorer).await,
            BearerInterceptor::new(token),
        );
        let e = scorer.score(sc::ScoreRequest::default()).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        seen.push(status_text(&e));
    }
    // Health needs no token.
    let h = HealthClient::new(sandbox.gateway().await).check(HealthCheckRequest { service: String::new() }).await;
    seen.push(format!("{:?}", h.expect("health without a token").into_inner()));

    // The backend refuses the key (401, never retried) or fails (500, retried then given up).
    for target in ["backend-401 please", "backend-500 please"] {
        let r = client(sandbox.gateway().await, Some(TOKEN)).evaluate(request(&[target])).await;
        match r {
            Ok(reply) => {
                let reply = reply.into_inner();
                assert!(!reply.results[0].error.is_empty(), "{target}: the record failed: {reply:?}");
                seen.push(format!("{reply:?}"));
            }
            Err(e) => seen.push(status_text(&e)),
        }
    }
    // Bad input: no records, an item without a question.
    let mut bad = request(&[]);
    seen.push(status_text(
        &client(sandbox.gateway().await, Some(TOKEN)).evaluate(bad.clone()).await.expect_err("no records"),
    ));
    bad = request(&["a"]);
    if let Some(gw::checklist_source::Source::Checklist(c)) =
        bad.pipeline.as_mut().and_then(|p| p.source.as_mut()).and_then(|s| s.source.as_mut())
    {
        c.items[0].question.clear();
    }
    let e = client(sandbox.gateway().await, Some(TOKEN)).evaluate(bad).await.expect_err("an empty question");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    seen.push(status_text(&e));

    // A streamed run whose backend fails: every event the client gets.
    let mut stream = client(sandbox.gateway().await, Some(TOKEN))
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(
                request(&["backend-401 again", "fine"]).pipeline.unwrap(),
            )),
            label: "secrets".into(),
            budget: None,
        })
        .await
        .expect("the run starts")
        .into_inner();
    while let Some(m) = stream.message().await.transpose() {
        match m {
            Ok(m) => seen.push(format!("{m:?}")),
            Err(e) => {
                seen.push(status_text(&e));
                break;
            }
        }
    }

    // The admin page: its config, a refused call and an answered one.
    let http = reqwest::Client::new();
    let admin = sandbox.admin_url();
    seen.push(http.get(format!("{admin}/api/config")).send().await.unwrap().text().await.unwrap());
    for (token, status) in [(WRONG_TOKEN, 401), (TOKEN, 200)] {
        let r = http
            .post(format!("{admin}/api/ListRuns"))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status);
        seen.push(format!("{} {:?} {}", r.status(), r.headers().clone(), r.text().await.unwrap()));
    }

    // Debug output of everything that holds a secret.
    seen.push(format!("{:?}", sandbox.config));
    seen.push(format!("{:?}", assay_runtime::serve_options(&sandbox.config).expect("options")));
    seen.push(format!("{:?}", assay_runtime::client_tls(&sandbox.config).expect("client tls")));
    seen.push(format!("{:?}", sandbox.config.tls.load().expect("tls material")));
    let mut openai = assay_llm::OpenAiConfig::new(sandbox.llm.base_url());
    openai.api_key = Some(API_KEY.into());
    seen.push(format!("{openai:?}"));

    sandbox.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The failing paths ran: the backend's 401 and 500 reached the client as errors.
    assert!(seen.iter().any(|t| t.contains("http 401")), "a backend 401 reached the client");
    assert!(seen.iter().any(|t| t.contains("http 500")), "a backend 500 reached the client");
    for (i, text) in seen.iter().enumerate() {
        secrets.assert_absent(&format!("what the client saw (#{i})"), text);
    }
    let captured = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    // The capture saw the run at trace level (spans, the transport's own records, the backend calls).
    assert!(captured.contains("GatewayService/Evaluate"), "rpc spans captured");
    assert!(captured.contains("TRACE"), "trace records captured");
    assert!(captured.lines().count() > 100, "{} log lines", captured.lines().count());
    for line in captured.lines() {
        secrets.assert_absent("a log line", line);
    }
    eprintln!("checked {} log lines and {} client-visible texts", captured.lines().count(), seen.len());
}
