//! The admin page: every run, live, and the human loop from a browser, served by the gateway
//! process on its own port (`ports.admin`) with its assets compiled in.
//!
//! The page speaks the gateway's own contract. This adapter is a thin HTTP face of the gRPC
//! service, not a second API: `POST /api/<Method>` (GetRun, ListRuns, ControlRun, CompareRuns) takes the
//! request message in the canonical proto3 JSON mapping and answers the response message the same
//! way, and `GET /api/WatchRun?run_id=..&after_sequence=..` relays WatchRun as server-sent events
//! (`id` = the event's sequence). Every call goes through the same [`GatewayGrpc`] methods a gRPC
//! client reaches (validation, errors, engine), and the JSON mapping comes from the contracts'
//! descriptors at run time, so a field added to `gateway.proto` reaches the page with no code here.
//!
//! Same-origin only, even on loopback (a web page the operator opens must not drive it): every API
//! call needs `Authorization: Bearer <token>` (the configured `auth_token`, else a token generated
//! per start and printed once with the page's URL as `#token=...`; only `admin.no_auth` serves the
//! page open); POSTs must be `Content-Type: application/json` (a cross-origin page cannot send that
//! without a CORS preflight, which is never granted); an `Origin`, when sent, must be the page's own;
//! and the `Host` must be the bound address, `localhost` on loopback, or one of
//! `admin.allowed_hosts` (so a DNS-rebound name is refused).
//!
//! Bounded for a hostile local client: a request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`] (half-sent requests do not hold connections open); a request with two
//! `Host` or two `Origin` headers, or an absolute-form target (`GET http://host/path`, whose
//! authority would stand for the Host), is refused (400); and at most [`MAX_LIVE_CLIENTS`] event
//! streams are served at once (503 beyond).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_server::GatewayService;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prost_reflect::{DeserializeOptions, DynamicMessage, SerializeOptions};
use serde_json::json;
use tokio::sync::{Semaphore, watch};
use tonic_types::StatusExt;

use crate::grpc::GatewayGrpc;
use assay_runs::Engine;

static INDEX_HTML: &str = include_str!("../admin/index.html");
static APP_CSS: &str = include_str!("../admin/app.css");

/// The page's native ES modules (`admin/js/`, embedded as a directory), each served at its path
/// as JavaScript: `js/main.js` (index.html's `<script type="module">`) and every module it
/// imports, one per view; no bundler, no build step, no list to keep (`tests/tests/admin.rs`
/// follows every import from the served page and fails on one not served).
static SCRIPTS: include_dir::Dir<'static> = include_dir::include_dir!("$CARGO_MANIFEST_DIR/admin/js");

/// Longest a client may take to send a request's line and headers; its connection is then closed.
/// (An idle kept-alive connection is closed after it too.)
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Event streams (`GET /api/WatchRun`) served at once at most; beyond it, 503.
pub const MAX_LIVE_CLIENTS: usize = 256;

/// Scripts, styles and connections from this origin only; no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// How callers of the admin API authenticate.
#[derive(Clone, PartialEq, Eq)]
pub enum AdminAuth {
    /// The mesh's configured `auth_token`, as over gRPC.
    Configured(String),
    /// No `auth_token` configured: a random token made for this process, printed once with the
    /// page's URL ([`AdminAuth::page_url`]).
    Generated(String),
    /// UNSAFE, only with `admin.no_auth` and no `auth_token`: no token at all.
    Open,
}

impl std::fmt::Debug for AdminAuth {
    // Never the token itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAuth::Configured(_) => f.write_str("Configured(<redacted>)"),
            AdminAuth::Generated(_) => f.write_str("Generated(<redacted>)"),
            AdminAuth::Open => f.write_str("Open"),
        }
    }
}

impl AdminAuth {
    /// The mesh's bearer token (`assay_runtime::auth_token`); else open when `no_auth`
    /// (`admin.no_auth`) says so; else a fresh token.
    pub fn resolve(configured: Option<&str>, no_auth: bool) -> AdminAuth {
        if let Some(t) = configured.filter(|t| !t.is_empty()) {
            AdminAuth::Configured(t.to_string())
        } else if no_auth {
            AdminAuth::Open
        } else {
            AdminAuth::generate()
        }
    }

    /// A fresh random token (244 random bits, hex).
    pub fn generate() -> AdminAuth {
        AdminAuth::Generated(format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()))
    }

    /// The token callers must present, if any.
    pub fn token(&self) -> Option<&str> {
        match self {
            AdminAuth::Configured(t) | AdminAuth::Generated(t) => Some(t.as_str()),
            AdminAuth::Open => None,
        }
    }

    /// The page's URL on `addr` (loopback when bound to every interface), carrying a generated
    /// token in the fragment (which browsers never send to a server nor put in a Referer), e.g.
    /// `http://127.0.0.1:50050/#token=...`. A configured token is never printed.
    pub fn page_url(&self, addr: SocketAddr) -> String {
        let host = if addr.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else if addr.is_ipv6() {
            format!("[{}]", addr.ip())
        } else {
            addr.ip().to_string()
        };
        match self {
            AdminAuth::Generated(t) => format!("http://{host}:{}/#token={t}", addr.port()),
            AdminAuth::Configured(_) | AdminAuth::Open => format!("http://{host}:{}/", addr.port()),
        }
    }
}

#[derive(Clone)]
struct Admin {
    grpc: Arc<GatewayGrpc>,
    token: Option<Arc<str>>,
    hosts: Arc<Hosts>,
    /// One permit per event stream served ([`MAX_LIVE_CLIENTS`]).
    live: Arc<Semaphore>,
}

/// The `Host` values the page answers to.
struct Hosts {
    /// `*` in `admin.allowed_hosts`: no check.
    any: bool,
    /// (lowercase host, port it must carry; `None` = any).
    names: Vec<(String, Option<u16>)>,
}

impl Hosts {
    fn new(addr: SocketAddr, allowed: &[String]) -> Hosts {
        let port = Some(addr.port());
        let ip = if addr.is_ipv6() { format!("[{}]", addr.ip()) } else { addr.ip().to_string() };
        let mut names = vec![(ip, port)];
        if addr.ip().is_loopback() || addr.ip().is_unspecified() {
            names.extend(["localhost", "127.0.0.1", "[::1]"].map(|n| (n.to_string(), port)));
        }
        let mut any = false;
        for entry in allowed.iter().map(|e| e.trim().to_ascii_lowercase()).filter(|e| !e.is_empty()) {
            if entry == "*" {
                any = true;
            } else if let Ok(a) = entry.parse::<Authority>() {
                names.push((a.host().to_string(), a.port_u16()));
            } else {
                tracing::warn!(entry = %bounded(&entry, 64), "admin.allowed_hosts: not a host name; ignored");
            }
        }
        Hosts { any, names }
    }

    fn allows(&self, host: &str) -> bool {
        if self.any {
            return true;
        }
        let Ok(a) = host.parse::<Authority>() else { return false };
        let (name, port) = (a.host().to_ascii_lowercase(), a.port_u16().unwrap_or(80));
        self.names.iter().any(|(n, p)| *n == name && p.is_none_or(|p| p == port))
    }
}

/// The admin page and its API over `engine`, served on `addr` (the listener's local address:
/// the Host the page answers to), guarded by `auth`; `allowed_hosts` adds Host names.
pub fn router(engine: Engine, addr: SocketAddr, auth: &AdminAuth, allowed_hosts: &[String]) -> Router {
    if *auth == AdminAuth::Open {
        tracing::warn!(
            "admin page served with no token (admin.no_auth): any local web page or process can control runs"
        );
    }
    let admin = Admin {
        grpc: Arc::new(GatewayGrpc::new(engine)),
        token: auth.token().map(Arc::from),
        hosts: Arc::new(Hosts::new(addr, allowed_hosts)),
        live: Arc::new(Semaphore::new(MAX_LIVE_CLIENTS)),
    };
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/index.html", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .merge(scripts())
        .route("/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/api/config", get(config))
        .route("/api/WatchRun", get(watch_run))
        .route("/api/{method}", post(unary))
        .layer(axum::middleware::from_fn_with_state(admin.clone(), same_origin))
        .with_state(admin)
}

/// Every request: its target a path (origin form), one Host and at most one Origin; the Host one
/// the page answers to, the Origin (when sent) the page's own; every answer says `nosniff`.
async fn same_origin(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let mut response = if let Some(message) = malformed(&request) {
        refused(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", &message)
    } else if let Some(message) = foreign(&admin, request.headers()) {
        refused(StatusCode::FORBIDDEN, "PERMISSION_DENIED", &message)
    } else {
        next.run(request).await
    };
    response.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// What makes the request ambiguous about where it is going or comes from: an absolute-form
/// target (`GET http://other.example/`: its authority, not the Host header, names the server), or
/// two Host or two Origin headers (which one would the checks read, which one the browser sent?).
fn malformed(request: &Request) -> Option<String> {
    let uri = request.uri();
    if uri.scheme().is_some() || uri.authority().is_some() {
        return Some(format!(
            "the request target must be a path (origin form, such as /api/GetRun), not {:?}",
            bounded(&uri.to_string(), 64)
        ));
    }
    [header::HOST, header::ORIGIN].into_iter().find_map(|name| {
        let count = request.headers().get_all(&name).iter().count();
        (count > 1).then(|| format!("the request has {count} {name} headers; send exactly one"))
    })
}

/// Why the request is not the page's own: a Host the page does not answer to (none counts), or an
/// Origin other than the page's.
fn foreign(admin: &Admin, headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !admin.hosts.allows(host) {
        return Some(format!(
            "the admin page does not answer to Host {:?}; add the name to admin.allowed_hosts to serve it",
            bounded(host, 64)
        ));
    }
    let origin = headers.get(header::ORIGIN)?.to_str().unwrap_or("");
    let own = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|authority| authority.eq_ignore_ascii_case(host));
    (!own).then(|| format!("cross-origin request from {:?} refused", bounded(origin, 64)))
}

/// An answer in the error shape, for a refusal before any call.
fn refused(status: StatusCode, code: &str, message: &str) -> Response {
    json_response(status, json!({"code": code, "message": message, "fieldViolations": []}).to_string())
}

/// At most `max` characters of `text` (then `…`): what an error may quote of its input.
fn bounded(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

/// Characters of a message or field violation an error answer carries at most.
const MAX_MESSAGE_CHARS: usize = 300;

/// Serve the page on `listener` (HTTP/1.1, each request's headers within
/// [`HEADER_READ_TIMEOUT`]) until `shutdown` resolves; then stop accepting, let the requests in
/// flight finish, and return once every connection is closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    // Dropped at shutdown: every connection then closes once its request in flight is answered.
    let (stop, stopped) = watch::channel(());
    // A receiver per connection: `all_closed.closed()` resolves when the last one is dropped.
    let (all_closed, open) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // The peer gave up before the accept: nothing to serve.
            Err(e)
                if matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset) =>
            {
                continue;
            }
            // Out of file descriptors, say: wait for connections to close rather than spin.
            Err(e) => {
                tracing::warn!(error = %e, "admin page: accept failed; retrying in 1 s");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router.clone()));
        let (mut stopped, open) = (stopped.clone(), open.clone());
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopped.changed() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
            drop(open);
        });
    }
    drop(listener);
    drop(stop);
    drop(open);
    all_closed.closed().await;
    Ok(())
}

/// Every `.js` file under `dir`, at any depth.
fn modules(dir: &'static include_dir::Dir<'static>) -> Vec<&'static include_dir::File<'static>> {
    let mut files: Vec<_> = dir.files().filter(|f| f.path().extension().is_some_and(|e| e == "js")).collect();
    files.extend(dir.dirs().flat_map(modules));
    files
}

/// A route per ES module of the page ([`SCRIPTS`]), `/js/<its path>`, with the headers of every
/// asset.
fn scripts<S: Clone + Send + Sync + 'static>() -> Router<S> {
    modules(&SCRIPTS).into_iter().fold(Router::new(), |router, file| {
        let body = file.contents_utf8().unwrap_or_default();
        let path = format!("/js/{}", file.path().to_string_lossy().replace('\\', "/"));
        router.route(&path, get(move || async move { asset("text/javascript; charset=utf-8", body) }))
    })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            // Not no-referrer: under it a same-origin POST carries `Origin: null`, which is refused.
            (header::REFERRER_POLICY, HeaderValue::from_static("same-origin")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

async fn config(State(admin): State<Admin>) -> Response {
    json_response(StatusCode::OK, json!({ "authRequired": admin.token.is_some() }).to_string())
}

fn json_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

/// The caller's bearer token matches (or no token is configured); else the 401 to answer.
fn denied(admin: &Admin, headers: &HeaderMap) -> Option<Response> {
    let token = admin.token.as_ref()?;
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    (!assay_rpc::auth::bearer_matches(given, token))
        .then(|| error_response(&tonic::Status::unauthenticated("missing or wrong bearer token")))
}

/// A gRPC status as the page reads it: the HTTP status that means the same, and
/// `{code, message, fieldViolations}`.
fn error_response(status: &tonic::Status) -> Response {
    use tonic::Code;
    let (http, code) = match status.code() {
        Code::InvalidArgument => (StatusCode::BAD_REQUEST, "INVALID_ARGUMENT"),
        Code::OutOfRange => (StatusCode::BAD_REQUEST, "OUT_OF_RANGE"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "UNAUTHENTICATED"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "PERMISSION_DENIED"),
        Code::NotFound => (StatusCode::NOT_FOUND, "NOT_FOUND"),
        Code::FailedPrecondition => (StatusCode::CONFLICT, "FAILED_PRECONDITION"),
        Code::Aborted => (StatusCode::CONFLICT, "ABORTED"),
        Code::AlreadyExists => (StatusCode::CONFLICT, "ALREADY_EXISTS"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "RESOURCE_EXHAUSTED"),
        Code::Unimplemented => (StatusCode::NOT_IMPLEMENTED, "UNIMPLEMENTED"),
        Code::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "DEADLINE_EXCEEDED"),
        Code::Cancelled => (StatusCode::CONFLICT, "CANCELLED"),
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => (StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL"),
    };
    let violations: Vec<serde_json::Value> = status
        .get_details_bad_request()
        .map(|b| {
            b.field_violations
                .iter()
                .map(|v| {
                    json!({
                        "field": bounded(&v.field, MAX_MESSAGE_CHARS),
                        "description": bounded(&v.description, MAX_MESSAGE_CHARS),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let message = bounded(status.message(), MAX_MESSAGE_CHARS);
    json_response(http, json!({"code": code, "message": message, "fieldViolations": violations}).to_string())
}

fn invalid(field: &str, description: String) -> tonic::Status {
    assay_rpc::to_status(assay_domain::StageError::invalid(field, description))
}

/// A request message from its proto3 JSON (an empty body is the empty message).
fn from_json<M: prost::Message + Default>(name: &str, body: &[u8]) -> Result<M, tonic::Status> {
    let pool = assay_proto::descriptor_pool().map_err(tonic::Status::internal)?;
    let desc = pool.get_message_by_name(name).ok_or_else(|| tonic::Status::internal(format!("no message {name}")))?;
    let body = if body.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { body };
    let mut de = serde_json::Deserializer::from_slice(body);
    let message = DynamicMessage::deserialize_with_options(desc, &mut de, &DeserializeOptions::new())
        .and_then(|m| de.end().map(|()| m))
        .map_err(|e| invalid("body", format!("is not a valid {name} in the proto3 JSON mapping: {e}")))?;
    M::decode(prost::Message::encode_to_vec(&message).as_slice())
        .map_err(|e| tonic::Status::internal(format!("re-encoding {name}: {e}")))
}

/// A message in the proto3 JSON mapping (camelCase names, enums by name, 64-bit integers as
/// strings), defaults included so the page never guesses a missing field.
fn to_json<M: prost::Message>(name: &str, message: &M) -> Result<String, tonic::Status> {
    let pool = assay_proto::descriptor_pool().map_err(tonic::Status::internal)?;
    let desc = pool.get_message_by_name(name).ok_or_else(|| tonic::Status::internal(format!("no message {name}")))?;
    let dynamic = DynamicMessage::decode(desc, message.encode_to_vec().as_slice())
        .map_err(|e| tonic::Status::internal(format!("decoding {name}: {e}")))?;
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::new(&mut out);
    dynamic
        .serialize_with_options(&mut ser, &SerializeOptions::new().skip_default_fields(false))
        .map_err(|e| tonic::Status::internal(format!("encoding {name} as JSON: {e}")))?;
    String::from_utf8(out).map_err(|e| tonic::Status::internal(e.to_string()))
}

const PKG: &str = "assay.gateway.v1.";

/// `Content-Type: application/json` (parameters allowed): what no cross-origin page can send
/// without a CORS preflight, and the page never grants one.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

async fn unary(State(admin): State<Admin>, Path(method): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    if !is_json(&headers) {
        return refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "INVALID_ARGUMENT",
            "the admin API takes Content-Type: application/json only",
        );
    }
    if let Some(denied) = denied(&admin, &headers) {
        return denied;
    }
    let grpc = admin.grpc.as_ref();
    let answer = match method.as_str() {
        "GetRun" => call(&body, "GetRunRequest", "GetRunResponse", |r| grpc.get_run(r)).await,
        "ListRuns" => call(&body, "ListRunsRequest", "ListRunsResponse", |r| grpc.list_runs(r)).await,
        "ControlRun" => call(&body, "ControlRunRequest", "ControlRunResponse", |r| grpc.control_run(r)).await,
        "CompareRuns" => call(&body, "CompareRunsRequest", "CompareRunsResponse", |r| grpc.compare_runs(r)).await,
        "DeleteRun" => call(&body, "DeleteRunRequest", "DeleteRunResponse", |r| grpc.delete_run(r)).await,
        "ListRunResults" => {
            call(&body, "ListRunResultsRequest", "ListRunResultsResponse", |r| grpc.list_run_results(r)).await
        }
        other => Err(tonic::Status::not_found(format!(
            "no method {:?} here; the admin API has GetRun, ListRuns, ControlRun, CompareRuns, DeleteRun, ListRunResults (POST) and \
             WatchRun (GET, events)",
            bounded(other, 64)
        ))),
    };
    match answer {
        Ok(json) => json_response(StatusCode::OK, json),
        Err(status) => error_response(&status),
    }
}

async fn call<Req, Resp, F, Fut>(body: &[u8], request: &str, response: &str, method: F) -> Result<String, tonic::Status>
where
    Req: prost::Message + Default,
    Resp: prost::Message,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
{
    let req: Req = from_json(&format!("{PKG}{request}"), body)?;
    let resp = method(tonic::Request::new(req)).await?;
    to_json(&format!("{PKG}{response}"), resp.get_ref())
}

#[derive(serde::Deserialize)]
struct WatchQuery {
    #[serde(default)]
    run_id: String,
    #[serde(default)]
    after_sequence: u64,
}

/// WatchRun as server-sent events: `id` = sequence, `event: run`, `data` = the RunEvent's JSON; a
/// failure after the stream started is one `event: error` with the error's JSON, then the end.
async fn watch_run(State(admin): State<Admin>, headers: HeaderMap, query: Query<WatchQuery>) -> Response {
    if let Some(denied) = denied(&admin, &headers) {
        return denied;
    }
    // Held by the stream: released when the client goes away or the stream ends.
    let Ok(permit) = admin.live.clone().try_acquire_owned() else {
        let mut response = refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            &format!(
                "too many live event streams: the admin page serves {MAX_LIVE_CLIENTS} at once; close another \
                 page's stream or retry later"
            ),
        );
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    };
    let request = gw::WatchRunRequest { run_id: query.run_id.clone(), after_sequence: query.after_sequence };
    let stream = match admin.grpc.watch_run(tonic::Request::new(request)).await {
        Ok(s) => s.into_inner(),
        Err(status) => return error_response(&status),
    };
    let name = format!("{PKG}RunEvent");
    let events = stream.scan(false, move |ended, item| {
        let _live = &permit;
        if *ended {
            return futures::future::ready(None);
        }
        let event = item.and_then(|m| {
            let e = m.event.unwrap_or_default();
            to_json(&name, &e).map(|json| SseEvent::default().id(e.sequence.to_string()).event("run").data(json))
        });
        let event = event.unwrap_or_else(|status| {
            *ended = true;
            let message = bounded(status.message(), MAX_MESSAGE_CHARS);
            let body = json!({"code": format!("{:?}", status.code()), "message": message});
            SseEvent::default().event("error").data(body.to_string())
        });
        futures::future::ready(Some(Ok::<_, std::convert::Infallible>(event)))
    });
    let mut response = Sse::new(events).keep_alive(KeepAlive::default()).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod contract_tests {
    use super::SCRIPTS;

    fn script(path: &str) -> &'static str {
        SCRIPTS.get_file(path).and_then(|f| f.contents_utf8()).unwrap_or_else(|| panic!("admin/js/{path} is embedded"))
    }

    /// The JSON names of the members of `message`'s oneof `oneof`, in the proto's order.
    fn oneof_members(message: &str, oneof: &str) -> Vec<String> {
        let pool = assay_proto::descriptor_pool().expect("the descriptor pool");
        let descriptor = pool.get_message_by_name(message).unwrap_or_else(|| panic!("{message}"));
        let group = descriptor.oneofs().find(|o| o.name() == oneof).unwrap_or_else(|| panic!("{message}.{oneof}"));
        group.fields().map(|f| f.json_name().to_string()).collect()
    }

    /// The page words every event kind of the proto in its event log (that it knows each is
    /// `tests/tests/admin.rs`'s `the_page_knows_every_event_of_the_contract`): a kind added to the
    /// proto fails here until `detail/events.js` has its line.
    #[test]
    fn the_page_words_every_event_kind_of_the_proto() {
        let events = script("detail/events.js");
        for message in ["assay.gateway.v1.RunEvent", "assay.gateway.v1.RefinementEvent"] {
            for member in oneof_members(message, "event") {
                assert!(events.contains(&format!("case '{member}'")), "detail/events.js words {message}'s {member}");
            }
        }
    }

    #[test]
    fn every_module_under_js_is_embedded() {
        let served: Vec<_> = super::modules(&SCRIPTS).iter().map(|f| f.path().to_string_lossy().into_owned()).collect();
        for expected in ["main.js", "constants.js", "detail/events.js", "detail/debate.js"] {
            assert!(served.iter().any(|p| p == expected), "{expected} in {served:?}");
        }
    }
}
