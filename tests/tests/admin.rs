//! The admin page's HTTP face of the gateway (JSON + server-sent events) against the whole mesh:
//! the same contract as gRPC (proto3 JSON mapping), the same errors, the same auth; and
//! same-origin only: a token even with none configured (generated per start), JSON POSTs only,
//! foreign Origins and Hosts refused, `nosniff` answers, bounded error messages.

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_rpc::auth::BearerInterceptor;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, SandboxOptions};
use serde_json::{Value, json};

const TOKEN: &str = "admin-secret";

/// [`assay_tests::one_leaves_record`] with `n` records.
fn pipeline(n: usize) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        records: (0..n)
            .map(|i| gw::EvalRecord { id: format!("rec-{i}"), target: format!("leaves {i}"), ..Default::default() })
            .collect(),
        ..assay_tests::one_leaves_record()
    }
}

fn answer(_: &RecordedRequest) -> Reply {
    Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})).usage(10, 5)
}

async fn sandbox() -> MeshSandbox {
    let sandbox =
        MeshSandbox::start_with(SandboxOptions { admin: true, auth_token: Some(TOKEN.into()), ..Default::default() })
            .await;
    sandbox.llm.set_handler(answer);
    sandbox
}

/// Run a checklist evaluation over gRPC (with the token); its run id.
async fn evaluated(sandbox: &MeshSandbox, n: usize) -> String {
    let mut client =
        GatewayServiceClient::with_interceptor(sandbox.gateway().await, BearerInterceptor::new(Some(TOKEN)));
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(n))),
            label: "admin".into(),
            budget: None,
        })
        .await
        .expect("the run starts")
        .into_inner();
    let mut run_id = String::new();
    while let Some(m) = stream.message().await.expect("events") {
        if let Some(e) = m.event {
            run_id = e.run_id;
        }
    }
    run_id
}

async fn post(url: &str, method: &str, token: Option<&str>, body: &str) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{url}/api/{method}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("the admin page answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("a body");
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("JSON from {method}: {e}: {text}")))
}

#[tokio::test]
async fn unary_calls_speak_the_proto3_json_mapping_with_the_grpc_errors_and_auth() {
    let sandbox = sandbox().await;
    let url = sandbox.admin_url();
    let run_id = evaluated(&sandbox, 3).await;

    let config: Value = reqwest::get(format!("{url}/api/config")).await.unwrap().json().await.unwrap();
    assert_eq!(config, json!({"authRequired": true}));
    // The page itself is static and guarded by a strict content security policy.
    let page = reqwest::get(format!("{url}/")).await.unwrap();
    let csp = page.headers().get("content-security-policy").expect("a CSP").to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    assert!(page.text().await.unwrap().contains(r#"<script type="module" src="js/main.js">"#));

    for token in [None, Some("wrong")] {
        let (status, body) = post(&url, "ListRuns", token, "{}").await;
        assert_eq!((status, body["code"].as_str()), (401, Some("UNAUTHENTICATED")), "{token:?}: {body}");
    }
    let (status, list) = post(&url, "ListRuns", Some(TOKEN), r#"{"kind": "PIPELINE_KIND_CHECKLIST_EVAL"}"#).await;
    assert_eq!(status, 200, "{list}");
    let runs = list["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["runId"], run_id.as_str());
    assert_eq!(runs[0]["state"], "RUN_STATE_SUCCEEDED");

    let (status, got) = post(&url, "GetRun", Some(TOKEN), &json!({"run_id": run_id}).to_string()).await;
    assert_eq!(status, 200, "{got}");
    let run = &got["run"];
    assert_eq!(run["kind"], "PIPELINE_KIND_CHECKLIST_EVAL");
    assert_eq!(run["recordsDone"], 3);
    assert!(run["lastSequence"].is_string(), "64-bit integers are strings: {run}");
    assert_eq!(run["result"]["checklistEval"]["results"].as_array().map(Vec::len), Some(3), "{run}");
    assert_eq!(run["auditLog"], json!([]), "defaults are included");

    // Errors carry the gRPC code, its message and the field violations.
    let (status, err) = post(&url, "GetRun", Some(TOKEN), "{}").await;
    assert_eq!((status, err["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{err}");
    assert_eq!(err["fieldViolations"][0]["field"], "run_id");
    let (status, err) = post(&url, "GetRun", Some(TOKEN), r#"{"runId": "nope"}"#).await;
    assert_eq!((status, err["code"].as_str()), (404, Some("NOT_FOUND")), "{err}");
    let (status, err) =
        post(&url, "ControlRun", Some(TOKEN), &json!({"runId": run_id, "pause": {}, "reason": "late"}).to_string())
            .await;
    assert_eq!((status, err["code"].as_str()), (409, Some("FAILED_PRECONDITION")), "{err}");
    let (status, err) = post(&url, "GetRun", Some(TOKEN), r#"{"runId": 7"#).await;
    assert_eq!((status, err["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{err}");
    assert_eq!(err["fieldViolations"][0]["field"], "body");
    let (status, err) = post(&url, "RunPipeline", Some(TOKEN), "{}").await;
    assert_eq!((status, err["code"].as_str()), (404, Some("NOT_FOUND")), "{err}");
    sandbox.shutdown().await.unwrap();
}

/// `id:` / `event:` / `data:` blocks of a server-sent event stream.
fn sse_events(text: &str) -> Vec<(u64, String, Value)> {
    text.split("\n\n")
        .filter(|block| block.lines().any(|l| l.starts_with("data:")))
        .map(|block| {
            let field = |name: &str| {
                block.lines().filter_map(|l| l.strip_prefix(name)).map(str::trim).collect::<Vec<_>>().join("\n")
            };
            let data = field("data:");
            (
                field("id:").parse().unwrap_or(0),
                field("event:"),
                serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}")),
            )
        })
        .collect()
}

#[tokio::test]
async fn watch_run_relays_the_events_as_server_sent_events_from_a_sequence() {
    let sandbox = sandbox().await;
    let url = sandbox.admin_url();
    let run_id = evaluated(&sandbox, 4).await;
    let watch = format!("{url}/api/WatchRun?run_id={run_id}&after_sequence=2");
    let denied = reqwest::get(&watch).await.unwrap();
    assert_eq!(denied.status().as_u16(), 401);
    let resp = reqwest::Client::new().get(&watch).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    // The stream ends after the completion.
    let events = sse_events(&resp.text().await.unwrap());
    let ids: Vec<u64> = events.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, (3..3 + ids.len() as u64).collect::<Vec<_>>(), "gap-free from after_sequence + 1");
    assert!(events.iter().all(|(_, kind, e)| kind == "run" && e["runId"] == run_id.as_str()));
    assert_eq!(events.iter().filter(|(_, _, e)| e.get("recordScored").is_some()).count(), 4);
    let (_, _, last) = events.last().expect("events");
    assert_eq!(last["completed"]["state"], "RUN_STATE_SUCCEEDED", "{last}");
    let missing =
        reqwest::Client::new().get(format!("{url}/api/WatchRun?run_id=nope")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    sandbox.shutdown().await.unwrap();
}

/// In headless Chromium: the token prompt blocks everything until the right token; a checklist
/// evaluation's progress reaches 100% live, without a reload; a record id and a checklist question
/// carrying markup show as characters and never run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_asks_for_the_token_follows_an_evaluation_live_and_renders_markup_as_text() {
    let sandbox = sandbox().await;
    let gate = assay_testkit::Gate::new();
    let g = gate.clone();
    sandbox.llm.set_handler(move |r| answer(r).gated(&g));
    let hostile_id = r#"<img src=x onerror="window.__xss=1">"#;
    let hostile_question = "<script>window.__xss=2</script>Mentions leaves?";
    let mut p = pipeline(4);
    p.records[2].id = hostile_id.into();
    if let Some(gw::checklist_source::Source::Checklist(c)) = p.source.as_mut().and_then(|s| s.source.as_mut()) {
        c.items[0].question = hostile_question.into();
    }
    let mut client =
        GatewayServiceClient::with_interceptor(sandbox.gateway().await, BearerInterceptor::new(Some(TOKEN)));
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)),
            label: "evaluation in the browser".into(),
            budget: None,
        })
        .await
        .expect("the run starts")
        .into_inner();
    let run_id = stream.message().await.unwrap().and_then(|m| m.event).map(|e| e.run_id).expect("a first event");
    let follow = tokio::spawn(async move { while let Ok(Some(_)) = stream.message().await {} });
    let args = json!({
        "url": sandbox.admin_url(),
        "token": TOKEN,
        "run_id": run_id,
        "total": 4,
        "hostile": [hostile_id, hostile_question],
        "shots": format!("{}/admin-screenshots", env!("CARGO_TARGET_TMPDIR")),
    });
    // The backend answers once the page is following the run.
    assay_tests::admin_browser("checklist", &args, |line| {
        if line == "READY" {
            gate.open();
        }
    })
    .await;
    follow.await.unwrap();
    sandbox.shutdown().await.unwrap();
}

/// A scripted backend for a debate (every solver answers 42, reviews and refinements agree, the
/// judge picks solver_1) and for self-refine (one revision that appends a sentence).
fn debate_and_polish(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    if prompt.starts_with("TASK:") {
        return Reply::text(
            "<critique>\n- Say what the answer means.\n</critique>\n<revised>\nThe answer is 42, the product of 6 and 7.\n</revised>",
        );
    }
    let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str).unwrap_or("");
    let reply = match schema {
        "debate_solution" => json!({"approach": "direct", "reasoning_steps": ["6 * 7 = 42"], "final_answer": "42",
                                    "confidence": 0.9}),
        "debate_review" => json!({"strengths": ["clear"], "weaknesses": [], "errors": [], "suggested_changes": []}),
        "debate_refinement" => {
            json!({"critiques_accepted": [], "critiques_rejected": [], "refinement_reasoning": "kept",
                                      "reasoning_steps": ["6 * 7 = 42"], "final_answer": "42", "confidence": 0.9,
                                      "changed_from_original": false, "improvement_explanation": "none"})
        }
        "debate_judgment" => json!({"reasoning": "all agree", "winner": "solver_1", "confidence": 0.9}),
        other => panic!("unexpected call {other}: {prompt}"),
    };
    Reply::json(reply)
}

/// In headless Chromium: a debate shows each problem's answer and stage artifacts, a self-refine
/// run its passes and final text; the event log gives a spread run's `records_claimed` (which
/// needs PostgreSQL and two gateways; fed to the page's own module) a line of its own, not
/// "unknown event".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_debate_stage_by_stage_and_the_passes_of_a_self_refine() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { admin: true, ..Default::default() }).await;
    sandbox.llm.set_handler(debate_and_polish);
    let debate = gw::DebatePipeline {
        problems: vec![
            gw::DebateProblem { id: "p1".into(), problem: "What is 6 * 7?".into(), reference: Some("42".into()) },
            gw::DebateProblem { id: "p2".into(), problem: "What is 7 * 6?".into(), reference: Some("42".into()) },
        ],
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::Debate(debate)).await;
    let debate_id = events[0].run_id.clone();
    let polish = gw::SelfRefinePipeline {
        request: Some(assay_proto::refiners::v1::SelfRefineRequest {
            draft: "The answer is 42.".into(),
            instruction: "Answer: what is 6 * 7?".into(),
            min_bytes: Some(0),
            ..Default::default()
        }),
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::SelfRefine(polish)).await;
    let refine_id = events[0].run_id.clone();
    let args = json!({
        "url": sandbox.admin_url(),
        "token": sandbox.admin_token().expect("a token is generated when none is configured"),
        "debate": debate_id,
        "problems": ["p1", "p2"],
        "answer": "42",
        "self_refine": refine_id,
        "final_text": "The answer is 42, the product of 6 and 7.",
        "shots": format!("{}/admin-screenshots", env!("CARGO_TARGET_TMPDIR")),
    });
    assay_tests::admin_browser("views", &args, |_| {}).await;
    sandbox.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Same-origin only

/// A raw request to the admin page: (status, headers, body).
async fn raw(
    sandbox: &MeshSandbox,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", sandbox.admin_url()));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.body(body.to_string()).send().await.expect("the admin page answers");
    let (status, headers) = (resp.status().as_u16(), resp.headers().clone());
    (status, headers, resp.text().await.expect("a body"))
}

fn admin_port(sandbox: &MeshSandbox) -> u16 {
    sandbox.mesh().addrs.admin.expect("admin page").port()
}

/// With no token at all (`admin.no_auth`, as `assay up --no-admin-auth`), the page is open to
/// itself, but a cross-origin page still cannot drive it: a `text/plain` POST (a "simple" request
/// with no preflight) is refused, as is any foreign or `null` Origin and a preflight.
#[tokio::test]
async fn cross_origin_and_non_json_posts_are_refused_even_when_the_page_is_open() {
    let sandbox =
        MeshSandbox::start_with(SandboxOptions { admin: true, no_admin_auth: true, ..Default::default() }).await;
    sandbox.llm.set_handler(answer);
    assert_eq!(sandbox.admin_token(), None, "--no-admin-auth: no token");
    let run_id = evaluated(&sandbox, 1).await;
    let own = sandbox.admin_url();
    let cancel = json!({"runId": run_id, "cancel": {}, "reason": "from a web page"}).to_string();
    let post = reqwest::Method::POST;

    // What a hostile page can send without a preflight: text/plain (and forms), with its Origin.
    for (origin, content_type, expected) in [
        (Some("http://evil.example"), "text/plain", 403),
        (Some("null"), "text/plain;charset=UTF-8", 403),
        (None, "text/plain", 415),
        (None, "application/x-www-form-urlencoded", 415),
        (None, "multipart/form-data; boundary=x", 415),
        (Some("http://evil.example"), "application/json", 403),
        (Some("null"), "application/json", 403),
        (Some("https://evil.example"), "application/json", 403),
    ] {
        let mut headers = vec![("content-type", content_type)];
        headers.extend(origin.map(|o| ("origin", o)));
        for (method, body) in [("ControlRun", cancel.as_str()), ("ListRuns", "{}")] {
            let (status, _, text) = raw(&sandbox, post.clone(), &format!("/api/{method}"), &headers, body).await;
            assert_eq!(status, expected, "{method} {origin:?} {content_type}: {text}");
            let err: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(err["code"].is_string() && err["message"].is_string(), "{err}");
        }
    }
    // A foreign Origin is refused on every route, the event stream included.
    let watch = format!("/api/WatchRun?run_id={run_id}");
    for path in ["/", "/api/config", watch.as_str()] {
        let (status, _, text) =
            raw(&sandbox, reqwest::Method::GET, path, &[("origin", "http://evil.example")], "").await;
        assert_eq!(status, 403, "{path}: {text}");
    }
    // The CORS preflight a cross-origin JSON POST needs is never granted.
    let (status, headers, _) = raw(
        &sandbox,
        reqwest::Method::OPTIONS,
        "/api/ControlRun",
        &[
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "content-type"),
        ],
        "",
    )
    .await;
    assert!(!(200..300).contains(&status), "preflight answered {status}");
    assert!(headers.get("access-control-allow-origin").is_none(), "{headers:?}");

    // Nothing was cancelled; the page itself (its own Origin, JSON) is served with no token.
    let (status, got) = post_json(&sandbox, &json!({"runId": run_id}).to_string()).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["run"]["state"], "RUN_STATE_SUCCEEDED");
    assert!(got["run"]["auditLog"].as_array().is_some_and(Vec::is_empty), "{got}");
    let origin = own.clone();
    let (status, _, text) = raw(
        &sandbox,
        post.clone(),
        "/api/ListRuns",
        &[("content-type", "application/json; charset=utf-8"), ("origin", origin.as_str())],
        "{}",
    )
    .await;
    assert_eq!(status, 200, "the page's own origin, no token (--no-admin-auth): {text}");
    let config: Value = reqwest::get(format!("{own}/api/config")).await.unwrap().json().await.unwrap();
    assert_eq!(config, json!({"authRequired": false}));
    sandbox.shutdown().await.unwrap();
}

/// GetRun as the page sends it (JSON, no Origin, no token).
async fn post_json(sandbox: &MeshSandbox, body: &str) -> (u16, Value) {
    let (status, _, text) =
        raw(sandbox, reqwest::Method::POST, "/api/GetRun", &[("content-type", "application/json")], body).await;
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// DNS rebinding: a page at evil.example whose name now resolves to 127.0.0.1 reaches the admin
/// page with `Host: evil.example`, and is refused. The bound address, localhost (bound to
/// loopback) and `admin.allowed_hosts` names are answered.
#[tokio::test]
async fn only_the_bound_address_localhost_and_allowed_hosts_are_answered() {
    let sandbox = MeshSandbox::start_with(SandboxOptions {
        admin: true,
        no_admin_auth: true,
        admin_allowed_hosts: vec!["Admin.Example".into(), "pinned.example:8443".into()],
        ..Default::default()
    })
    .await;
    let port = admin_port(&sandbox);
    let json_ct = ("content-type", "application/json");
    let refused = [
        "evil.example".to_string(),
        format!("evil.example:{port}"),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        format!("localhost.evil.example:{port}"),
        "pinned.example:9000".into(),
        "pinned.example".into(),
    ];
    for host in &refused {
        for (method, path) in [
            (reqwest::Method::GET, "/"),
            (reqwest::Method::GET, "/api/config"),
            (reqwest::Method::POST, "/api/ListRuns"),
        ] {
            let (status, _, text) = raw(&sandbox, method, path, &[("host", host.as_str()), json_ct], "{}").await;
            assert_eq!(status, 403, "Host {host:?} {path}: {text}");
        }
    }
    let answered = [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        "admin.example".into(),
        "admin.example:443".into(),
        "pinned.example:8443".into(),
    ];
    for host in &answered {
        let (status, _, text) =
            raw(&sandbox, reqwest::Method::POST, "/api/ListRuns", &[("host", host.as_str()), json_ct], "{}").await;
        assert_eq!(status, 200, "Host {host:?}: {text}");
    }
    // Behind a proxy keeping the Host: the page's own origin is the allowed name.
    let (status, _, text) = raw(
        &sandbox,
        reqwest::Method::POST,
        "/api/ListRuns",
        &[("host", "admin.example"), ("origin", "https://admin.example"), json_ct],
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, _, text) = raw(
        &sandbox,
        reqwest::Method::POST,
        "/api/ListRuns",
        &[("host", "admin.example"), ("origin", &format!("http://127.0.0.1:{port}")), json_ct],
        "{}",
    )
    .await;
    assert_eq!(status, 403, "an Origin other than the Host: {text}");
    sandbox.shutdown().await.unwrap();
}

/// No token configured (the default): a token is generated per start, the page's URL carries it in
/// the fragment, and every API call without it is refused. gRPC stays as configured (no auth).
#[tokio::test]
async fn a_token_is_generated_when_none_is_configured_and_required() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { admin: true, ..Default::default() }).await;
    sandbox.llm.set_handler(answer);
    let token = sandbox.admin_token().expect("a generated token");
    assert!(token.len() >= 32 && token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    let page = sandbox.mesh().admin_url().expect("admin url");
    assert_eq!(page, format!("{}/#token={token}", sandbox.admin_url()));
    assert!(matches!(sandbox.mesh().admin_auth(), assay_gateway::admin::AdminAuth::Generated(_)));
    assert!(!format!("{:?}", sandbox.mesh().admin_auth()).contains(&token), "Debug never shows the token");

    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(1))).await;
    let run_id = events[0].run_id.clone();
    let url = sandbox.admin_url();
    let config: Value = reqwest::get(format!("{url}/api/config")).await.unwrap().json().await.unwrap();
    assert_eq!(config, json!({"authRequired": true}));
    let cancel = json!({"runId": run_id, "cancel": {}, "reason": "no token"}).to_string();
    for given in [None, Some("wrong")] {
        for (method, body) in [("ListRuns", "{}"), ("ControlRun", cancel.as_str())] {
            let (status, body) = post(&url, method, given, body).await;
            assert_eq!((status, body["code"].as_str()), (401, Some("UNAUTHENTICATED")), "{method} {given:?}: {body}");
        }
    }
    let watch = format!("{url}/api/WatchRun?run_id={run_id}");
    assert_eq!(reqwest::get(&watch).await.unwrap().status().as_u16(), 401);
    let (status, list) = post(&url, "ListRuns", Some(&token), "{}").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["runs"][0]["runId"], run_id.as_str());
    let resp = reqwest::Client::new().get(&watch).bearer_auth(&token).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    sandbox.shutdown().await.unwrap();
}

/// (method, path, headers, body) of one request.
type Case<'a> = (reqwest::Method, &'a str, Vec<(&'a str, &'a str)>, &'a str);

/// Every JSON answer (and the event stream, and refusals) says `X-Content-Type-Options: nosniff`;
/// an error quotes at most a bounded prefix of what the caller sent.
#[tokio::test]
async fn answers_say_nosniff_and_errors_quote_a_bounded_prefix_of_the_input() {
    let sandbox = sandbox().await;
    let run_id = evaluated(&sandbox, 1).await;
    let auth = format!("Bearer {TOKEN}");
    let json_ct = ("content-type", "application/json");
    let bearer = ("authorization", auth.as_str());
    let watch = format!("/api/WatchRun?run_id={run_id}");
    let (get, post_m) = (reqwest::Method::GET, reqwest::Method::POST);
    let cases: Vec<Case<'_>> = vec![
        (get.clone(), "/api/config", vec![], ""),
        (post_m.clone(), "/api/ListRuns", vec![json_ct, bearer], "{}"),
        (post_m.clone(), "/api/ListRuns", vec![json_ct], "{}"),
        (post_m.clone(), "/api/ListRuns", vec![], "{}"),
        (post_m.clone(), "/api/GetRun", vec![json_ct, bearer], "{}"),
        (post_m.clone(), "/api/ListRuns", vec![json_ct, ("origin", "http://evil.example")], "{}"),
        (get.clone(), watch.as_str(), vec![bearer], ""),
    ];
    for (method, path, headers, body) in cases {
        let (status, h, _) = raw(&sandbox, method, path, &headers, body).await;
        assert_eq!(h.get("x-content-type-options").map(|v| v.to_str().unwrap()), Some("nosniff"), "{path} ({status})");
    }

    let long = "x".repeat(20_000);
    let bodies = [
        format!("{{\"{long}\": 1}}"),
        json!({"runId": long}).to_string(),
        format!("{{\"runId\": \"{long}"),
        json!({"runId": run_id, "pause": {}, "reason": long}).to_string(),
    ];
    for (i, body) in bodies.iter().enumerate() {
        let method = if i == 3 { "ControlRun" } else { "GetRun" };
        let (status, err) = post(&sandbox.admin_url(), method, Some(TOKEN), body).await;
        assert!(status >= 400, "{method} #{i}: {status}");
        let text = err.to_string();
        assert!(text.len() < 2_000, "{method} #{i}: an error of {} bytes quotes the input", text.len());
    }
    let (status, err) = post(&sandbox.admin_url(), &"M".repeat(5_000), Some(TOKEN), "{}").await;
    assert_eq!(status, 404, "{err}");
    assert!(err.to_string().len() < 1_000, "{}", err.to_string().len());
    let (status, _, text) = raw(&sandbox, get.clone(), "/", &[("host", &format!("{long}.example"))], "").await;
    assert_eq!(status, 403);
    assert!(text.len() < 1_000, "{}", text.len());
    sandbox.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// The page's modules

/// `specifier` (`./x.js`, `../x.js`, `/js/x.js`) resolved against the path of the module (or
/// page) that names it.
fn resolve(base: &str, specifier: &str) -> String {
    let mut parts: Vec<&str> =
        if specifier.starts_with('/') { Vec::new() } else { base.split('/').filter(|p| !p.is_empty()).collect() };
    if !specifier.starts_with('/') {
        parts.pop(); // the naming file itself
    }
    for part in specifier.split('/').filter(|p| !p.is_empty()) {
        match part {
            "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The specifiers of a module's static imports and re-exports (`import ... from '...'`, also over
/// several lines, `import '...'`, `export ... from '...'`); a dynamic `import(` fails the test,
/// since nothing could follow it.
fn imports(path: &str, source: &str) -> Vec<String> {
    let quoted = |s: &str| {
        let s = s.trim_start();
        let quote = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
        s[1..].split(quote).next().map(str::to_string)
    };
    let mut found = Vec::new();
    for line in source.lines().map(str::trim) {
        assert!(!line.contains("import("), "{path}: a dynamic import cannot be checked: {line}");
        let statement = line.starts_with("import") || line.starts_with("export") || line.starts_with('}');
        if let Some((_, rest)) = line.split_once(" from ").filter(|_| statement) {
            found.extend(quoted(rest));
        } else if let Some(rest) = line.strip_prefix("import ") {
            found.extend(quoted(rest));
        }
    }
    found
}

/// The page's native ES modules: `index.html` loads `js/main.js` with `<script type="module">`;
/// it and every module reached through its imports is served (200) as JavaScript (a browser runs
/// a module of no JavaScript type under `nosniff`) with the page's CSP; and every file under
/// `admin/js/` is reached, so a module missing from the gateway's list fails here.
#[tokio::test]
async fn every_module_the_page_imports_is_served_as_javascript() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { admin: true, ..Default::default() }).await;
    let (status, headers, page) = raw(&sandbox, reqwest::Method::GET, "/", &[], "").await;
    assert_eq!(status, 200);
    let page_csp = headers.get("content-security-policy").expect("the page's CSP").clone();
    let mut queue: Vec<String> = page
        .split("<script")
        .skip(1)
        .map(|tag| tag.split('>').next().unwrap_or(""))
        .inspect(|tag| assert!(tag.contains(r#"type="module""#), "every script is a module: <script{tag}>"))
        .filter_map(|tag| tag.split(r#"src=""#).nth(1).and_then(|s| s.split('"').next()))
        .map(|src| resolve("/", src))
        .collect();
    assert_eq!(queue, ["/js/main.js"], "the page loads its entry module");
    let mut served = std::collections::BTreeSet::new();
    while let Some(path) = queue.pop() {
        if !served.insert(path.clone()) {
            continue;
        }
        let (status, headers, source) = raw(&sandbox, reqwest::Method::GET, &path, &[], "").await;
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert_eq!(status, 200, "{path} is imported but not served");
        assert!(header("content-type").starts_with("text/javascript"), "{path}: {}", header("content-type"));
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(headers.get("content-security-policy"), Some(&page_csp), "{path}");
        assert_eq!(header("cache-control"), "no-cache", "{path}");
        queue.extend(imports(&path, &source).iter().map(|s| resolve(&path, s)));
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../services/gateway/admin/js");
    let mut on_disk = std::collections::BTreeSet::new();
    let mut dirs = vec![std::path::PathBuf::from(dir)];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "js") {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().replace('\\', "/");
                on_disk.insert(format!("/js/{rel}"));
            }
        }
    }
    assert_eq!(served, on_disk, "the modules reached from the page are the files under admin/js");
    sandbox.shutdown().await.unwrap();
}

/// The members of a oneof of the contract, by their proto3 JSON names (what the page reads).
fn oneof_members(message: &str, oneof: &str) -> std::collections::BTreeSet<String> {
    let pool = assay_proto::descriptor_pool().expect("the contract's descriptors");
    let m = pool.get_message_by_name(message).unwrap_or_else(|| panic!("{message} in the contract"));
    let o = m.oneofs().find(|o| o.name() == oneof).unwrap_or_else(|| panic!("{message}.{oneof}"));
    o.fields().map(|f| f.json_name().to_string()).collect()
}

/// The quoted names of `export const <name> = [...]` in the page's `js/constants.js`.
fn page_list(name: &str) -> std::collections::BTreeSet<String> {
    let constants = include_str!("../../services/gateway/admin/js/constants.js");
    let list = constants
        .split(&format!("export const {name} = ["))
        .nth(1)
        .and_then(|rest| rest.split("];").next())
        .unwrap_or_else(|| panic!("{name} in constants.js"));
    list.split('\'').skip(1).step_by(2).map(str::to_string).collect()
}

/// The page knows every event of the contract: each member of `RunEvent.event` and
/// `RefinementEvent.event` is in its list (`EVENT_MEMBERS`, `REFINEMENT_MEMBERS`), so none is
/// logged as "unknown event" (`records_claimed` was, issue 58), and the lists name nothing else.
#[test]
fn the_page_knows_every_event_of_the_contract() {
    assert_eq!(page_list("EVENT_MEMBERS"), oneof_members("assay.gateway.v1.RunEvent", "event"));
    assert_eq!(page_list("REFINEMENT_MEMBERS"), oneof_members("assay.gateway.v1.RefinementEvent", "event"));
}

// ---------------------------------------------------------------------------------------------
// Compare view

/// A judge by scorer model: `good` answers YES to both items; `worse` answers NO to the second
/// item of every even record (the target says `item-<n>`).
fn compare_judge(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    let n: usize = prompt
        .split("item-")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a record number in {prompt}"));
    let second = if r.model() == Some("worse") && n.is_multiple_of(2) { "NO" } else { "YES" };
    Reply::json(json!({"answers": [
        {"question_index": 1, "answer": "YES"},
        {"question_index": 2, "answer": second},
    ]}))
}

fn compare_pipeline(judge: &str, hostile_id: &str, hostile_question: &str) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                id: "c".into(),
                items: vec![
                    pb::ChecklistItem { id: "a".into(), question: "Is it polite?".into(), ..Default::default() },
                    pb::ChecklistItem { id: "b".into(), question: hostile_question.into(), ..Default::default() },
                ],
                ..Default::default()
            })),
        }),
        records: (0..10)
            .map(|i| gw::EvalRecord {
                id: if i == 0 { hostile_id.to_string() } else { format!("rec-{i}") },
                target: format!("item-{i}"),
                ..Default::default()
            })
            .collect(),
        scorer_model: Some(pb::ModelSpec { model: judge.into(), ..Default::default() }),
        ..Default::default()
    }
}

/// The compare view's checks in headless Chromium, with the helpers of `admin_page.py`: pick two
/// runs in the list's compare form, see both means, the difference with its interval as a forest
/// plot (zero line, interval, point), method and p-value, the flipped item and the worst records,
/// untrusted text as characters; a run's detail shows the mean's interval when the aggregate has one.
const COMPARE_CHECKS: &str = r##"
import json, sys
sys.path.insert(0, sys.argv[1])
import admin_page as P
from selenium.webdriver.common.by import By

args = json.loads(sys.argv[2])
P.ARGS = args
d = P.browser()
try:
    P.login(d, args)
    P.wait(d, "the compare form", lambda d: P.shown(d, "#compare-form"))
    P.wait(d, "the runs in the form's choices",
           lambda d: len(d.find_elements(By.CSS_SELECTOR, "#eval-runs option")) >= 2)
    P.one(d, "#compare-baseline").send_keys(args["baseline"])
    P.one(d, "#compare-candidate").send_keys(args["candidate"])
    P.one(d, "#compare-submit").click()
    P.wait(d, "the comparison", lambda d: P.one(d, "#compare[data-method]"))
    want = args["expected"]
    fmt3 = lambda v: f"{v:.3f}"
    fmt4 = lambda v: f"{'+' if v >= 0 else ''}{v:.4f}"
    assert P.one(d, "#mean-baseline").text == fmt3(want["meanBaseline"]), P.one(d, "#mean-baseline").text
    assert P.one(d, "#mean-candidate").text == fmt3(want["meanCandidate"]), P.one(d, "#mean-candidate").text
    assert P.one(d, "#compare-diff").text == fmt4(want["diff"]), P.one(d, "#compare-diff").text
    assert P.one(d, "#compare-ci").text == f"[{fmt4(want['ciLow'])}, {fmt4(want['ciHigh'])}]", P.one(d, "#compare-ci").text
    assert P.one(d, "#compare-method").text == "paired_t", P.one(d, "#compare-method").text
    assert P.one(d, "#compare-p").text.strip(), "a p-value"
    assert "worse" in P.one(d, "#compare-verdict").text, P.one(d, "#compare-verdict").text
    # The forest plot: the interval lies left of the zero line and holds the point.
    num = lambda e, a: float(e.get_attribute(a))
    zero = P.one(d, "#forest line.zero")
    ci = P.one(d, "#forest line.interval.ci")
    point = P.one(d, "#forest g.ci circle.point")
    assert zero and ci and point, "zero line, interval and point"
    assert num(ci, "x1") < num(point, "cx") < num(ci, "x2") < num(zero, "x1"), "a regression: all below zero"
    assert P.one(d, "#forest line.interval.bootstrap"), "the bootstrap interval"
    # Flipped items and worst records; untrusted text as characters.
    flips = [r.text for r in d.find_elements(By.CSS_SELECTOR, "#flips tr.flip")]
    assert len(flips) == 1, flips
    worst = [r.get_attribute("data-record-id") for r in d.find_elements(By.CSS_SELECTOR, "#worst tr.worst")]
    assert sorted(worst) == sorted(want["worst"]), worst
    text = d.execute_script("return document.getElementById('compare').textContent;")
    for hostile in args["hostile"]:
        assert hostile in text, f"{hostile!r} is shown as text"
    assert d.execute_script("return window.__xss === undefined;"), "injected markup ran"
    assert not d.find_elements(By.CSS_SELECTOR, "#compare img[src='x'], #compare script"), "markup was parsed"
    P.shot(d, args, "compare")
    # An unknown run: the error, not a plot.
    d.get(f"{args['url']}/#/compare/no-such-run/{args['candidate']}")
    P.wait(d, "the error", lambda d: P.one(d, "#compare-error"))
    assert "NOT_FOUND" in P.one(d, "#compare-error").text, P.one(d, "#compare-error").text
    # The run's detail: the mean's interval when the aggregate has one.
    P.open_run(d, args, args["baseline"])
    P.wait(d, "the aggregates", lambda d: P.one(d, "#aggregates dd"))
    u = args.get("uncertainty")
    if u:
        P.wait(d, "the mean's interval", lambda d: P.one(d, "#mean-ci"))
        assert P.one(d, "#mean-ci").text == f"[{fmt3(u['ciLow'])}, {fmt3(u['ciHigh'])}]", P.one(d, "#mean-ci").text
    else:
        assert not P.one(d, "#mean-ci"), "no interval without one in the aggregate"
finally:
    d.quit()
print("OK", flush=True)
"##;

/// In headless Chromium: the compare view of a planted regression (see [`COMPARE_CHECKS`]); its
/// numbers are CompareRuns' answer through the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compare_view_plots_the_difference_and_lists_flips_and_worst_records() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { admin: true, ..Default::default() }).await;
    sandbox.llm.set_handler(compare_judge);
    let hostile_id = r#"<img src=x onerror="window.__xss=1">"#;
    let hostile_question = "<script>window.__xss=2</script>Is it short?";
    let mut ids = Vec::new();
    for judge in ["good", "worse"] {
        let p = compare_pipeline(judge, hostile_id, hostile_question);
        let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(p)).await;
        ids.push(events[0].run_id.clone());
    }
    let token = sandbox.admin_token().expect("a generated token");
    let body = json!({"baselineRunId": ids[0], "candidateRunId": ids[1]}).to_string();
    let (status, expected) = post(&sandbox.admin_url(), "CompareRuns", Some(&token), &body).await;
    assert_eq!(status, 200, "{expected}");
    assert_eq!(expected["method"], "COMPARE_METHOD_PAIRED_T");
    assert!((expected["diff"].as_f64().unwrap() + 0.25).abs() < 1e-12, "{expected}");
    let worst: Vec<Value> =
        expected["worstRegressions"].as_array().unwrap().iter().map(|w| w["recordId"].clone()).collect();
    assert_eq!(worst.len(), 5);
    let (_, run) = post(&sandbox.admin_url(), "GetRun", Some(&token), &json!({"runId": ids[0]}).to_string()).await;
    let uncertainty = run.pointer("/run/result/checklistEval/aggregate/uncertainty").cloned();
    let args = json!({
        "url": sandbox.admin_url(),
        "token": token,
        "baseline": ids[0],
        "candidate": ids[1],
        "expected": {
            "meanBaseline": expected["meanBaseline"], "meanCandidate": expected["meanCandidate"],
            "diff": expected["diff"], "ciLow": expected["ciLow"], "ciHigh": expected["ciHigh"], "worst": worst,
        },
        "uncertainty": uncertainty,
        "hostile": [hostile_id, hostile_question],
        "shots": format!("{}/admin-screenshots", env!("CARGO_TARGET_TMPDIR")),
    });
    page_checks(COMPARE_CHECKS, &args, "compare view").await;
    sandbox.shutdown().await.unwrap();
}

/// A two-responder evaluation's page in headless Chromium: the responders side by side (the
/// baseline marked), the forest plot of the second against the first (its interval left of zero:
/// a planted regression), the comparison's difference as the run holds it, and a responder column
/// in the records table.
const RESPONDER_CHECKS: &str = r##"
import json, sys
sys.path.insert(0, sys.argv[1])
import admin_page as P
from selenium.webdriver.common.by import By

args = json.loads(sys.argv[2])
P.ARGS = args
d = P.browser()
try:
    P.login(d, args)
    P.open_run(d, args, args["run_id"])
    P.wait(d, "the responders", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#responders tr.responder")) == 2)
    names = [r.get_attribute("data-responder") for r in d.find_elements(By.CSS_SELECTOR, "#responders tr.responder")]
    assert names == ["model-a", "model-b"], names
    assert "(baseline)" in P.one(d, '#responders tr.responder[data-responder="model-a"]').text
    diff = P.one(d, '#responders tr.comparison[data-candidate="model-b"] td.diff').text
    assert diff == f"{args['diff']:+.4f}", (diff, args["diff"])
    num = lambda e, a: float(e.get_attribute(a))
    zero = P.one(d, "#responder-forest line.zero")
    ci = P.one(d, '#responder-forest g[data-candidate="model-b"] line.interval')
    point = P.one(d, '#responder-forest g[data-candidate="model-b"] circle.point')
    assert num(ci, "x1") <= num(point, "cx") <= num(ci, "x2") < num(zero, "x1"), "model-b is worse: all below zero"
    P.wait(d, "the records with their responder", lambda d: d.find_elements(By.CSS_SELECTOR, "#records td.responder"))
    cells = {c.text for c in d.find_elements(By.CSS_SELECTOR, "#records td.responder")}
    assert cells == {"model-a", "model-b"}, cells
    P.shot(d, args, "responders")
finally:
    d.quit()
print("OK", flush=True)
"##;

/// Responders on the scripted backend: model-b says "weak" on every other input, and a weak answer
/// fails the first question.
fn responder_backend(r: &RecordedRequest) -> Reply {
    assay_tests::responders_backend(|model, n| model == "model-b" && n % 2 == 1)(r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responder_runs_page_shows_the_models_side_by_side_and_their_comparison() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { admin: true, ..Default::default() }).await;
    sandbox.llm.set_handler(responder_backend);
    let pipeline = responders_pipeline(12, None);
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)).await;
    let run_id = events[0].run_id.clone();
    let token = sandbox.admin_token().expect("a generated token");
    let (status, run) = post(&sandbox.admin_url(), "GetRun", Some(&token), &json!({"runId": run_id}).to_string()).await;
    assert_eq!(status, 200, "{run}");
    let diff =
        run.pointer("/run/result/checklistEval/comparisons/0/diff").and_then(Value::as_f64).expect("a comparison");
    assert!(diff < 0.0, "{diff}");
    let args = json!({
        "url": sandbox.admin_url(),
        "token": token,
        "run_id": run_id,
        "diff": diff,
        "shots": format!("{}/admin-screenshots", env!("CARGO_TARGET_TMPDIR")),
    });
    page_checks(RESPONDER_CHECKS, &args, "responder view").await;
    sandbox.shutdown().await.unwrap();
}

/// A run that stopped when decided, in headless Chromium: the sequence's intervals as they
/// narrowed (a row per update, the last the run's final one, decided "worse" and wholly below
/// zero) and what stopping saved.
const SEQUENTIAL_CHECKS: &str = r##"
import json, sys
sys.path.insert(0, sys.argv[1])
import admin_page as P
from selenium.webdriver.common.by import By

args = json.loads(sys.argv[2])
P.ARGS = args
d = P.browser()
try:
    P.login(d, args)
    P.open_run(d, args, args["run_id"])
    P.wait(d, "the sequence", lambda d: d.find_elements(By.CSS_SELECTOR, '#sequential-forest g[data-final="true"]'))
    num = lambda e, a: float(e.get_attribute(a))
    final = P.one(d, '#sequential-forest g[data-final="true"][data-candidate="model-b"]')
    assert final.get_attribute("data-decision") == "worse", final.get_attribute("data-decision")
    assert final.get_attribute("data-records") == str(args["records_used"]), final.get_attribute("data-records")
    zero = P.one(d, "#sequential-forest line.zero")
    ci = final.find_element(By.CSS_SELECTOR, "line.interval")
    assert num(ci, "x1") <= num(ci, "x2") < num(zero, "x1"), "model-b is worse: its final interval below zero"
    text = P.one(d, "#sequential").text
    assert "Stopped early\nyes" in text and f"Records not asked\n{args['not_asked']}" in text, text
    d.execute_script("arguments[0].scrollIntoView()", P.one(d, "#sequential-forest"))
    P.shot(d, args, "sequential")
finally:
    d.quit()
print("OK", flush=True)
"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_when_decided_shows_its_interval_narrowing() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { admin: true, ..Default::default() }).await;
    sandbox.llm.set_handler(responder_backend);
    let pipeline = responders_pipeline(200, Some(gw::StopWhenDecided { seed: Some(3), ..Default::default() }));
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)).await;
    let run_id = events[0].run_id.clone();
    let token = sandbox.admin_token().expect("a generated token");
    let (status, run) = post(&sandbox.admin_url(), "GetRun", Some(&token), &json!({"runId": run_id}).to_string()).await;
    assert_eq!(status, 200, "{run}");
    let q = run.pointer("/run/result/checklistEval/sequential").expect("the sequential result");
    assert_eq!(q["stoppedEarly"], json!(true), "{q}");
    let args = json!({
        "url": sandbox.admin_url(),
        "token": token,
        "run_id": run_id,
        "records_used": q["recordsUsed"],
        "not_asked": q["recordsNotAsked"].as_array().map_or(0, Vec::len),
        "shots": format!("{}/admin-screenshots", env!("CARGO_TARGET_TMPDIR")),
    });
    page_checks(SEQUENTIAL_CHECKS, &args, "sequential view").await;
    sandbox.shutdown().await.unwrap();
}

/// `records` records answered by model-a and model-b (the baseline first), tick checklists.
fn responders_pipeline(records: usize, stop: Option<gw::StopWhenDecided>) -> gw::ChecklistEvalPipeline {
    let responder = |model: &str| gw::Responder {
        model: Some(pb::ModelSpec { model: model.into(), ..Default::default() }),
        ..Default::default()
    };
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        records: (0..records)
            .map(|i| gw::EvalRecord {
                id: format!("q{i}"),
                input: format!("What about topic {i}?"),
                ..Default::default()
            })
            .collect(),
        responders: vec![responder("model-a"), responder("model-b")],
        stop_when_decided: stop,
        ..Default::default()
    }
}

/// Run a page's checks (a Python script driving headless Chromium through `admin_page`) with
/// `args`; they must end with "OK".
async fn page_checks(script: &str, args: &Value, what: &str) {
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python"))
        .arg(args.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .expect("python3 runs (scripts/setup-deps.sh installs selenium, chromium and chromium-driver)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().last() == Some("OK"),
        "{what} checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
