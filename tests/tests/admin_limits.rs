//! The admin page's HTTP server under a hostile local client, over raw TCP on loopback: requests
//! whose headers never finish are closed after the header-read timeout (they were held open for
//! as long as the client liked); two Host or two Origin headers and absolute-form targets
//! (`GET http://other.example/`) are refused with 400 (the checks read the first Host, the router
//! the path, whoever reads the rest); and live event streams are capped (503 beyond the cap, a
//! slot freed when a client leaves or its run ends).

use std::time::{Duration, Instant};

use assay_gateway::admin::{HEADER_READ_TIMEOUT, MAX_LIVE_CLIENTS};
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_rpc::auth::BearerInterceptor;
use assay_testkit::{Gate, RecordedRequest, Reply};
use assay_tests::{MeshSandbox, SandboxOptions};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "admin-limits-secret";

async fn sandbox() -> MeshSandbox {
    MeshSandbox::start_with(SandboxOptions { admin: true, auth_token: Some(TOKEN.into()), ..Default::default() }).await
}

fn port(sandbox: &MeshSandbox) -> u16 {
    sandbox.mesh().addrs.admin.expect("admin page").port()
}

async fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).await.expect("the admin page accepts")
}

/// Read until the end of the response head: (status, head, the body bytes read with it).
async fn read_head(stream: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut chunk))
            .await
            .expect("an answer within 20 s")
            .expect("read");
        assert!(n > 0, "the connection closed before a response head: {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("a status: {head}"));
    (status, head, buf[end..].to_vec())
}

/// Send `request` as it is on a fresh connection and read the whole answer (the request says
/// `Connection: close`): (status, JSON body).
async fn exchange(port: u16, request: &str) -> (u16, Value) {
    let mut stream = connect(port).await;
    stream.write_all(request.as_bytes()).await.expect("write");
    let (status, head, mut body) = read_head(&mut stream).await;
    tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut body))
        .await
        .expect("the body within 20 s")
        .expect("read");
    let text = String::from_utf8_lossy(&body);
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("JSON ({e}): {head}{text}")))
}

/// Whether the server closes `stream` (EOF or reset, after whatever it answers) within `limit`.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut sink = [0u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Whether the response streaming on `stream` ends (its last chunk, or the connection closed)
/// within `limit`.
async fn ended_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut seen = Vec::new();
    let mut chunk = [0u8; 4096];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&chunk[..n]),
            }
            if seen.ends_with(b"\r\n0\r\n\r\n") {
                return;
            }
        }
    })
    .await
    .is_ok()
}

/// Half-sent requests (slowloris): headers that never end, a request line alone, nothing at all.
/// Each connection is closed once the header-read timeout has passed, never before; a whole
/// request on another connection meanwhile is answered at once.
#[tokio::test]
async fn requests_whose_headers_never_end_are_closed_after_the_header_read_timeout() {
    let sandbox = sandbox().await;
    let port = port(&sandbox);
    let host = format!("Host: 127.0.0.1:{port}\r\n");
    let partial = [
        format!("GET /api/config HTTP/1.1\r\n{host}"),
        format!("POST /api/ListRuns HTTP/1.1\r\n{host}Content-Type: application/json\r\nX-Slow: a"),
        "GET / HTTP/1.1\r\n".to_string(),
        "GE".to_string(),
        String::new(),
    ];
    let start = Instant::now();
    let mut held = Vec::new();
    for _ in 0..10 {
        for p in &partial {
            let mut stream = connect(port).await;
            stream.write_all(p.as_bytes()).await.expect("write");
            held.push((p.clone(), stream));
        }
    }
    // The page still answers whole requests.
    let (status, body) = exchange(port, &format!("GET /api/config HTTP/1.1\r\n{host}Connection: close\r\n\r\n")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"authRequired": true}));
    let limit = HEADER_READ_TIMEOUT + Duration::from_secs(8);
    let closed = futures::future::join_all(held.iter_mut().map(|(p, stream)| async move {
        let closed = closed_within(stream, limit.saturating_sub(start.elapsed())).await;
        (p.clone(), closed, start.elapsed())
    }))
    .await;
    for (partial, closed, at) in closed {
        assert!(closed, "a connection that sent {partial:?} is still open after {at:?}");
        assert!(at >= HEADER_READ_TIMEOUT - Duration::from_millis(500), "{partial:?} closed early, after {at:?}");
    }
    sandbox.shutdown().await.unwrap();
}

/// One Host and at most one Origin; a path as the target. The first Host or Origin of two is the
/// page's own, so that the checks, reading the first, passed them.
#[tokio::test]
async fn two_hosts_two_origins_and_absolute_form_targets_are_refused() {
    let sandbox = sandbox().await;
    let port = port(&sandbox);
    let own = format!("127.0.0.1:{port}");
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let list = |target: &str, headers: &str| {
        format!(
            "POST {target} HTTP/1.1\r\n{headers}{auth}Content-Type: application/json\r\nContent-Length: 2\r\n\
             Connection: close\r\n\r\n{{}}"
        )
    };
    // The same request, well formed, is answered.
    let (status, body) =
        exchange(port, &list("/api/ListRuns", &format!("Host: {own}\r\nOrigin: http://{own}\r\n"))).await;
    assert_eq!(status, 200, "{body}");

    let cases = [
        ("two Host", list("/api/ListRuns", &format!("Host: {own}\r\nHost: evil.example\r\n")), "2 host headers"),
        ("two Host, the same", list("/api/ListRuns", &format!("Host: {own}\r\nHost: {own}\r\n")), "2 host headers"),
        (
            "two Origin",
            list("/api/ListRuns", &format!("Host: {own}\r\nOrigin: http://{own}\r\nOrigin: http://evil.example\r\n")),
            "2 origin headers",
        ),
        (
            "absolute form, a foreign authority",
            list("http://evil.example/api/ListRuns", &format!("Host: {own}\r\n")),
            "the request target must be a path",
        ),
        (
            "absolute form, the page's own authority",
            list(&format!("http://{own}/api/ListRuns"), &format!("Host: {own}\r\n")),
            "the request target must be a path",
        ),
    ];
    for (what, request, says) in &cases {
        let (status, body) = exchange(port, request).await;
        assert_eq!(status, 400, "{what}: {body}");
        assert_eq!(body["code"], "INVALID_ARGUMENT", "{what}: {body}");
        let message = body["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{what}: {message}");
    }
    // GETs too (the page, its config, the event stream).
    for target in ["/", "/api/config", "/api/WatchRun?run_id=x"] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: {own}\r\nHost: {own}\r\n{auth}Connection: close\r\n\r\n");
        let (status, body) = exchange(port, &request).await;
        assert_eq!(status, 400, "{target}: {body}");
        let request = format!("GET http://{own}{target} HTTP/1.1\r\nHost: {own}\r\n{auth}Connection: close\r\n\r\n");
        let (status, body) = exchange(port, &request).await;
        assert_eq!(status, 400, "absolute {target}: {body}");
    }
    sandbox.shutdown().await.unwrap();
}

fn answer(_: &RecordedRequest) -> Reply {
    Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})).usage(10, 5)
}

/// A checklist evaluation of one record whose model call is held at `gate`: its run id.
async fn held_run(sandbox: &MeshSandbox, gate: &Gate) -> String {
    let g = gate.clone();
    sandbox.llm.set_handler(move |r| answer(r).gated(&g));
    let mut client =
        GatewayServiceClient::with_interceptor(sandbox.gateway().await, BearerInterceptor::new(Some(TOKEN)));
    let pipeline = assay_tests::one_leaves_record();
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
        label: "held".into(),
        budget: None,
    };
    let mut stream = client.run_pipeline(request).await.expect("the run starts").into_inner();
    let run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
    let deadline = Instant::now() + Duration::from_secs(20);
    while gate.waiting() == 0 {
        assert!(Instant::now() < deadline, "the model call reaches the gate");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run_id
}

/// Open an event stream of `run_id` on a fresh connection: (status, the connection, the head).
async fn watch(port: u16, run_id: &str) -> (u16, TcpStream, String, Vec<u8>) {
    let mut stream = connect(port).await;
    let request = format!(
        "GET /api/WatchRun?run_id={run_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let (status, head, body) = read_head(&mut stream).await;
    (status, stream, head, body)
}

/// At most MAX_LIVE_CLIENTS event streams at once: the next is refused (503, saying why); one
/// leaving frees its slot, and so does the run's end (every stream ends).
#[tokio::test]
async fn live_event_streams_are_capped_and_their_slots_freed() {
    let sandbox = sandbox().await;
    let port = port(&sandbox);
    let gate = Gate::new();
    let run_id = held_run(&sandbox, &gate).await;
    let mut live = Vec::new();
    for i in 0..MAX_LIVE_CLIENTS {
        let (status, stream, head, _) = watch(port, &run_id).await;
        assert_eq!(status, 200, "stream {i}: {head}");
        assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
        live.push(stream);
    }
    let (status, mut stream, head, mut body) = watch(port, &run_id).await;
    assert_eq!(status, 503, "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after: 5"), "{head}");
    // The refusal's JSON (its length from the head).
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .expect("a content-length");
    while body.len() < length {
        let mut chunk = [0u8; 1024];
        let n = stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the refusal's body");
        body.extend_from_slice(&chunk[..n]);
    }
    let refusal: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(refusal["code"], "UNAVAILABLE", "{refusal}");
    let message = refusal["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("serves {MAX_LIVE_CLIENTS} at once")), "{message}");
    // Unary calls are not streams: still answered.
    let (status, body) = exchange(
        port,
        &format!(
            "POST /api/GetRun HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
            json!({"runId": run_id}).to_string().len(),
            json!({"runId": run_id})
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // A client leaving frees its slot (soon: the server sees the connection close).
    drop(live.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, stream, head, _) = watch(port, &run_id).await;
        if status == 200 {
            live.push(stream);
            break;
        }
        assert_eq!(status, 503, "{head}");
        assert!(Instant::now() < deadline, "a slot is freed within 10 s of a client leaving");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The run ends: every stream ends, and with them their slots.
    gate.open();
    for stream in &mut live {
        assert!(ended_within(stream, Duration::from_secs(20)).await, "the stream ends with the run");
    }
    drop(live);
    let mut streams = Vec::new();
    for _ in 0..MAX_LIVE_CLIENTS {
        let (status, stream, head, _) = watch(port, &run_id).await;
        assert_eq!(status, 200, "{head}");
        streams.push(stream);
    }
    sandbox.shutdown().await.unwrap();
}
