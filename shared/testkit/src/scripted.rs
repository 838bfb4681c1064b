//! A scripted OpenAI-compatible HTTP server on a real loopback port, for tests.
//!
//! The server answers every request (any method, any path) from a FIFO queue of [`Reply`] values,
//! then from an optional handler function, and otherwise with HTTP 500 saying the script is
//! exhausted. Every request is recorded, including the ones answered with faults, and requests
//! whose client went away before the reply was sent are counted in
//! [`ScriptedLlm::cancelled_count`]. [`ScriptedLlm::exchanges`] adds when each request arrived and
//! was answered (for concurrency assertions), and a [`Gate`] holds chosen replies until a test
//! opens it (to keep a call in flight while the test acts).
//!
//! ```no_run
//! # async fn demo() {
//! use assay_testkit::{Reply, ScriptedLlm};
//! let server = ScriptedLlm::start().await;
//! server.push(Reply::status(429).retry_after(1));
//! server.push(Reply::text("hello"));
//! let base_url = server.base_url(); // http://127.0.0.1:PORT/v1
//! # let _ = base_url;
//! # }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// One request the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// HTTP method, upper case (`POST`).
    pub method: String,
    /// Request path without the query (`/v1/chat/completions`).
    pub path: String,
    /// Headers with lower-case names (repeated headers keep the last value).
    pub headers: BTreeMap<String, String>,
    /// The body parsed as JSON, or `Value::Null` when it is not JSON.
    pub body: Value,
    /// The body as text (lossy UTF-8).
    pub raw_body: String,
}

impl RecordedRequest {
    /// A header value by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    /// Whether this is a chat completion call.
    pub fn is_chat(&self) -> bool {
        self.path.ends_with("/chat/completions")
    }

    /// Whether this is an embeddings call.
    pub fn is_embeddings(&self) -> bool {
        self.path.ends_with("/embeddings")
    }

    /// The `model` field of the body.
    pub fn model(&self) -> Option<&str> {
        self.body.get("model").and_then(Value::as_str)
    }

    /// The chat messages as (role, content) pairs.
    pub fn messages(&self) -> Vec<(String, String)> {
        self.body
            .get("messages")
            .and_then(Value::as_array)
            .map(|messages| {
                messages
                    .iter()
                    .map(|m| {
                        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
                        let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
                        (role.to_owned(), content.to_owned())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Content of the last message with role `user`.
    pub fn last_user_message(&self) -> Option<String> {
        self.messages().into_iter().rev().find(|(role, _)| role == "user").map(|(_, c)| c)
    }

    /// The first user message: a stage's prompt (a retry adds messages after it); empty when none.
    pub fn first_user_message(&self) -> String {
        self.messages().into_iter().find(|(role, _)| role == "user").map(|(_, c)| c).unwrap_or_default()
    }

    /// The name of the JSON schema the reply must follow (`response_format.json_schema.name`),
    /// which names the stage of a structured call (`debate_review`); "?" when there is none.
    pub fn schema_name(&self) -> &str {
        self.body.pointer("/response_format/json_schema/name").and_then(Value::as_str).unwrap_or("?")
    }

    /// Whom a debate prompt addresses: "solver_2" from "You are solver_2, ...", "baseline_4"; else
    /// "judge".
    pub fn debate_speaker(&self) -> String {
        let prompt = self.first_user_message();
        match prompt.strip_prefix("You are ").and_then(|p| p.split(',').next()) {
            Some(s) if !s.contains(' ') => s.to_string(),
            Some(_) | None => "judge".into(),
        }
    }

    /// The embeddings `input` as a list of texts (a single string input gives one text).
    pub fn embedding_inputs(&self) -> Vec<String> {
        match self.body.get("input") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => {
                items.iter().map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())).collect()
            }
            _ => Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Chat { content: String, logprobs: Option<Vec<(String, f64)>> },
    Embeddings { vectors: Vec<Vec<f32>>, reversed: bool },
    Status,
    Malformed,
    Truncated,
    Hang,
}

/// One scripted answer. Build with the constructors, adjust with the builder methods.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    kind: Kind,
    status: u16,
    body: Option<String>,
    headers: Vec<(String, String)>,
    finish_reason: Option<Option<String>>,
    usage: Option<(u64, u64)>,
    no_usage: bool,
    model: Option<String>,
    delay: Option<Duration>,
    gate: Option<Gate>,
}

impl Reply {
    fn new(kind: Kind, status: u16) -> Self {
        Self {
            kind,
            status,
            body: None,
            headers: Vec::new(),
            finish_reason: None,
            usage: None,
            no_usage: false,
            model: None,
            delay: None,
            gate: None,
        }
    }

    /// A chat completion whose content is `text`.
    pub fn text(text: impl Into<String>) -> Self {
        Self::new(Kind::Chat { content: text.into(), logprobs: None }, 200)
    }

    /// A chat completion whose content is `value` serialised as JSON.
    pub fn json(value: Value) -> Self {
        Self::text(value.to_string())
    }

    /// A chat completion whose first token carries these `top_logprobs` alternatives (the first
    /// alternative is reported as the chosen token).
    pub fn with_logprobs<S: Into<String>>(text: impl Into<String>, alternatives: Vec<(S, f64)>) -> Self {
        let alternatives = alternatives.into_iter().map(|(t, l)| (t.into(), l)).collect();
        Self::new(Kind::Chat { content: text.into(), logprobs: Some(alternatives) }, 200)
    }

    /// An embeddings reply with these vectors (index = position).
    pub fn embeddings(vectors: Vec<Vec<f32>>) -> Self {
        Self::new(Kind::Embeddings { vectors, reversed: false }, 200)
    }

    /// A bare HTTP status with an OpenAI-style error body (override with [`Reply::body`]).
    pub fn status(code: u16) -> Self {
        Self::new(Kind::Status, code)
    }

    /// HTTP 200 whose body is not JSON (what a misbehaving proxy sends).
    pub fn malformed() -> Self {
        Self::new(Kind::Malformed, 200)
    }

    /// HTTP 200 whose body is a chat completion cut in half.
    pub fn truncated() -> Self {
        Self::new(Kind::Truncated, 200)
    }

    /// Never answers; the request stays open until the client goes away (or the server stops).
    pub fn hang() -> Self {
        Self::new(Kind::Hang, 200)
    }

    /// Set the `finish_reason` of a chat reply (any string, kept verbatim).
    pub fn finish_reason(mut self, reason: impl Into<String>) -> Self {
        self.finish_reason = Some(Some(reason.into()));
        self
    }

    /// Send `"finish_reason": null`.
    pub fn null_finish_reason(mut self) -> Self {
        self.finish_reason = Some(None);
        self
    }

    /// Leave the `usage` object out.
    pub fn no_usage(mut self) -> Self {
        self.no_usage = true;
        self
    }

    /// Report these token counts.
    pub fn usage(mut self, prompt_tokens: u64, completion_tokens: u64) -> Self {
        self.usage = Some((prompt_tokens, completion_tokens));
        self
    }

    /// Report this model name (default: the requested model).
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Wait this long before answering.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Hold the reply until `gate` is open (after any [`Reply::delay`]). The request counts as
    /// received at once; it is answered when the gate opens.
    pub fn gated(mut self, gate: &Gate) -> Self {
        self.gate = Some(gate.clone());
        self
    }

    /// Add a `Retry-After: secs` header.
    pub fn retry_after(self, secs: u64) -> Self {
        self.header("retry-after", secs.to_string())
    }

    /// Add a response header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Replace the response body with this raw text.
    pub fn body(mut self, body: impl Into<String>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// List embedding `data` items in reverse index order (clients must sort by `index`).
    pub fn reversed_data(mut self) -> Self {
        if let Kind::Embeddings { reversed, .. } = &mut self.kind {
            *reversed = true;
        }
        self
    }

    /// The HTTP status this reply is sent with.
    pub fn status_code(&self) -> u16 {
        self.status
    }

    /// Whether this reply never answers ([`Reply::hang`]).
    pub fn is_hang(&self) -> bool {
        self.kind == Kind::Hang
    }
}

/// A gate that scripted replies can wait on ([`Reply::gated`]): closed when created, open with
/// [`Gate::open`]. Clones share one gate. Lets a test keep chosen calls in flight (a request is
/// recorded when it arrives, answered only once the gate opens) and act meanwhile.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<GateInner>,
}

struct GateInner {
    open: tokio::sync::watch::Sender<bool>,
    waiting: AtomicUsize,
    passed: AtomicUsize,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        let inner = GateInner {
            open: tokio::sync::watch::channel(false).0,
            waiting: AtomicUsize::new(0),
            passed: AtomicUsize::new(0),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Let every held reply go, and every later one through at once.
    pub fn open(&self) {
        self.inner.open.send_replace(true);
    }

    /// Hold later replies again (replies already let through are not affected).
    pub fn close(&self) {
        self.inner.open.send_replace(false);
    }

    pub fn is_open(&self) -> bool {
        *self.inner.open.borrow()
    }

    /// Replies held at the gate now.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::SeqCst)
    }

    /// Replies that went through the gate so far.
    pub fn passed(&self) -> usize {
        self.inner.passed.load(Ordering::SeqCst)
    }

    async fn wait(&self) {
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let mut open = self.inner.open.subscribe();
        self.inner.waiting.fetch_add(1, Ordering::SeqCst);
        let held = Waiting(&self.inner.waiting);
        // The sender lives in `self`: the channel cannot close while we wait.
        let _ = open.wait_for(|o| *o).await;
        drop(held);
        self.inner.passed.fetch_add(1, Ordering::SeqCst);
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gate").field("open", &self.is_open()).field("waiting", &self.waiting()).finish()
    }
}

impl PartialEq for Gate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// One request with when it arrived and when its reply was handed to the connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    pub request: RecordedRequest,
    pub received: Instant,
    /// `None` while the request is still open, or when its client went away first.
    pub answered: Option<Instant>,
}

impl Exchange {
    /// Whether the two exchanges were open at the same time (an unanswered one is open until
    /// now).
    pub fn overlaps(&self, other: &Exchange) -> bool {
        let now = Instant::now();
        let (a_end, b_end) = (self.answered.unwrap_or(now), other.answered.unwrap_or(now));
        self.received < b_end && other.received < a_end
    }
}

/// Most exchanges open at one time among `exchanges`.
pub fn max_in_flight<'a>(exchanges: impl IntoIterator<Item = &'a Exchange>) -> usize {
    let now = Instant::now();
    // +1 at arrival, -1 at answer; answers sort before arrivals at the same instant.
    let mut points: Vec<(Instant, i32)> = Vec::new();
    for e in exchanges {
        points.push((e.received, 1));
        points.push((e.answered.unwrap_or(now), -1));
    }
    points.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in points {
        open += d;
        most = most.max(open);
    }
    most as usize
}

/// A reply function consulted when the queue is empty.
pub type Handler = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync + 'static>;

/// A deterministic, unit-length embedding of `text` with `dim` dimensions (hash-seeded).
pub fn hash_embedding(text: &str, dim: usize) -> Vec<f32> {
    // FNV-1a seed, then splitmix64 for the components.
    let mut seed: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in text.bytes() {
        seed ^= u64::from(byte);
        seed = seed.wrapping_mul(0x0100_0000_01b3);
    }
    let mut state = seed;
    let mut v: Vec<f32> = (0..dim)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            // Top 24 bits -> [-1, 1).
            ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// A handler answering embedding calls with [`hash_embedding`] vectors of `dim` dimensions and
/// chat calls with `"ok"`.
pub fn embedding_handler(dim: usize) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |request: &RecordedRequest| {
        if request.is_embeddings() {
            Reply::embeddings(request.embedding_inputs().iter().map(|t| hash_embedding(t, dim)).collect())
        } else {
            Reply::text("ok")
        }
    }
}

#[derive(Default)]
struct State {
    queue: Mutex<VecDeque<Reply>>,
    handler: Mutex<Option<Handler>>,
    requests: Mutex<Vec<RecordedRequest>>,
    /// Requests received, recorded or not.
    received: AtomicUsize,
    /// Keep no request (a long benchmark): only the count.
    unrecorded: std::sync::atomic::AtomicBool,
    /// (arrival, answer) of each request, index-aligned with `requests`.
    times: Mutex<Vec<(Instant, Option<Instant>)>>,
    cancelled: AtomicUsize,
    /// When each cancelled request's connection went away, in order.
    cancelled_times: Mutex<Vec<Instant>>,
    completed: AtomicUsize,
    next_id: AtomicU64,
    /// Requests served at once at most (0 = unlimited); beyond it, an immediate 429.
    capacity: AtomicUsize,
    in_flight: AtomicUsize,
    peak_in_flight: AtomicUsize,
    over_capacity: AtomicUsize,
    /// A server that queues: this many replies made at once, the rest wait their turn in order.
    slots: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
    /// Most replies in the making at once (under the slots).
    peak_serving: AtomicUsize,
    serving: AtomicUsize,
    /// What `GET /props` answers (llama.cpp's `llama-server` reports its slots there); 404 when
    /// unset. Neither recorded nor taken from the script.
    props: Mutex<Option<Value>>,
    props_asked: AtomicUsize,
}

/// Holds one of the server's slots while a request is served.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The scripted server. Stops (and drops all open connections) when dropped.
pub struct ScriptedLlm {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl fmt::Debug for ScriptedLlm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedLlm")
            .field("addr", &self.addr)
            .field("requests", &self.request_count())
            .finish_non_exhaustive()
    }
}

impl ScriptedLlm {
    /// When each cancelled request was dropped by its client, in order.
    pub fn cancelled_times(&self) -> Vec<Instant> {
        lock(&self.state.cancelled_times).clone()
    }

    /// Serve at most `n` requests at once, like a server with `n` slots: a request arriving while
    /// `n` are in flight gets an immediate 429 (0 = unlimited, the default).
    pub fn set_capacity(&self, n: usize) {
        self.state.capacity.store(n, Ordering::SeqCst);
    }

    /// Serve like a server with `n` slots that queues the rest (llama.cpp's `llama-server`,
    /// llama-cpp-python with one): at most `n` replies are made at once (their delay is the time
    /// to make them), the others wait their turn first come, first served, and none is refused.
    pub fn set_slots(&self, n: usize) {
        *lock(&self.state.slots) = Some(Arc::new(tokio::sync::Semaphore::new(n.max(1))));
    }

    /// Most replies made at once under [`Self::set_slots`].
    /// Answer `GET /props` with `props` (as llama.cpp's `llama-server` does: `{"total_slots": n,
    /// ...}`); until then it is a 404, as from other servers.
    pub fn set_props(&self, props: Value) {
        *lock(&self.state.props) = Some(props);
    }

    /// `GET /props` requests received.
    pub fn props_asked(&self) -> usize {
        self.state.props_asked.load(Ordering::SeqCst)
    }

    pub fn peak_serving(&self) -> usize {
        self.state.peak_serving.load(Ordering::SeqCst)
    }

    /// Most requests served at once so far (requests refused for capacity not counted).
    pub fn peak_in_flight(&self) -> usize {
        self.state.peak_in_flight.load(Ordering::SeqCst)
    }

    /// Requests refused with a 429 for capacity.
    pub fn over_capacity_count(&self) -> usize {
        self.state.over_capacity.load(Ordering::SeqCst)
    }

    /// Bind 127.0.0.1:0 and start serving. Panics if the port cannot be bound (tests only).
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(State::default());
        let task = tokio::spawn(accept_loop(listener, state.clone()));
        Self { addr, state, task }
    }

    /// Base URL for an OpenAI-compatible client: `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queue a reply (FIFO).
    pub fn push(&self, reply: Reply) -> &Self {
        lock(&self.state.queue).push_back(reply);
        self
    }

    /// Queue several replies.
    pub fn push_all(&self, replies: impl IntoIterator<Item = Reply>) -> &Self {
        lock(&self.state.queue).extend(replies);
        self
    }

    /// Replies still queued.
    pub fn queued(&self) -> usize {
        lock(&self.state.queue).len()
    }

    /// Answer with `handler` whenever the queue is empty.
    pub fn set_handler(&self, handler: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static) {
        *lock(&self.state.handler) = Some(Arc::new(handler));
    }

    /// Remove the handler.
    pub fn clear_handler(&self) {
        *lock(&self.state.handler) = None;
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.requests).clone()
    }

    /// Every request received so far with its arrival and answer times, in arrival order.
    pub fn exchanges(&self) -> Vec<Exchange> {
        let requests = lock(&self.state.requests);
        let times = lock(&self.state.times);
        requests
            .iter()
            .zip(times.iter())
            .map(|(r, (received, answered))| Exchange { request: r.clone(), received: *received, answered: *answered })
            .collect()
    }

    /// Number of requests received so far.
    pub fn request_count(&self) -> usize {
        self.state.received.load(Ordering::SeqCst)
    }

    /// Count requests without keeping them (`requests()` then stays empty), so a server
    /// answering millions of calls (a benchmark) holds no memory per call.
    pub fn stop_recording(&self) {
        self.state.unrecorded.store(true, Ordering::SeqCst);
    }

    /// Requests whose client went away before the reply was sent.
    pub fn cancelled_count(&self) -> usize {
        self.state.cancelled.load(Ordering::SeqCst)
    }

    /// Requests answered (reply handed to the connection).
    pub fn completed_count(&self) -> usize {
        self.state.completed.load(Ordering::SeqCst)
    }
}

impl Drop for ScriptedLlm {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

/// Poll `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
pub async fn eventually(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _peer)) = accepted else { continue };
                let state = state.clone();
                connections.spawn(async move {
                    let service = service_fn(move |request| handle(state.clone(), request));
                    // Errors here are clients going away; nothing to report.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts the request as cancelled if dropped before [`PendingGuard::finish`].
struct PendingGuard {
    state: Arc<State>,
    armed: bool,
}

impl PendingGuard {
    /// A request that is neither completed nor cancelled (the `/props` probe).
    fn disarm(mut self) {
        self.armed = false;
    }

    fn finish(mut self) {
        self.armed = false;
        self.state.completed.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for PendingGuard {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.state.cancelled_times).push(Instant::now());
            self.state.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let guard = PendingGuard { state: state.clone(), armed: true };
    let (parts, body) = request.into_parts();
    let raw = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let raw_body = String::from_utf8_lossy(&raw).into_owned();
    if parts.method == http::Method::GET && parts.uri.path().ends_with("/props") {
        state.props_asked.fetch_add(1, Ordering::SeqCst);
        let props = lock(&state.props).clone();
        let (status, body) = match props {
            Some(props) => (200, props.to_string()),
            None => (404, json!({"error": {"message": "File Not Found", "type": "not_found_error"}}).to_string()),
        };
        guard.disarm();
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND);
        return Ok(response);
    }
    let recorded = RecordedRequest {
        method: parts.method.as_str().to_owned(),
        path: parts.uri.path().to_owned(),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect(),
        body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
        raw_body,
    };
    let index = if state.unrecorded.load(Ordering::SeqCst) {
        state.received.fetch_add(1, Ordering::SeqCst);
        usize::MAX
    } else {
        let mut requests = lock(&state.requests);
        requests.push(recorded.clone());
        state.received.fetch_add(1, Ordering::SeqCst);
        let mut times = lock(&state.times);
        times.push((Instant::now(), None));
        requests.len() - 1
    };

    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _slot = Slot(&state.in_flight);
    let capacity = state.capacity.load(Ordering::SeqCst);
    let reply = if capacity > 0 && now > capacity {
        state.over_capacity.fetch_add(1, Ordering::SeqCst);
        Reply::status(429).body(
            json!({"error": {"message": format!("scripted llm: {capacity} requests at once at most"),
                             "type": "rate_limit", "code": null}})
            .to_string(),
        )
    } else {
        state.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        next_reply(&state, &recorded)
    };
    let slots = lock(&state.slots).clone();
    let turn = match &slots {
        Some(slots) => Some(slots.clone().acquire_owned().await.expect("the slots are never closed")),
        None => None,
    };
    let serving = turn.as_ref().map(|_| {
        let now = state.serving.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak_serving.fetch_max(now, Ordering::SeqCst);
        Slot(&state.serving)
    });
    if let Some(delay) = reply.delay {
        tokio::time::sleep(delay).await;
    }
    drop((serving, turn));
    if let Some(gate) = &reply.gate {
        gate.wait().await;
    }
    if reply.kind == Kind::Hang {
        std::future::pending::<()>().await;
    }
    let id = state.next_id.fetch_add(1, Ordering::SeqCst);
    let response = render(&reply, &recorded, id);
    if let Some(t) = lock(&state.times).get_mut(index) {
        t.1 = Some(Instant::now());
    }
    guard.finish();
    Ok(response)
}

fn next_reply(state: &State, request: &RecordedRequest) -> Reply {
    if let Some(reply) = lock(&state.queue).pop_front() {
        return reply;
    }
    let handler = lock(&state.handler).clone();
    match handler {
        Some(handler) => handler(request),
        None => Reply::status(500).body(
            json!({"error": {"message": "scripted llm: script exhausted (no queued reply and no handler)",
                             "type": "script_exhausted", "code": null}})
            .to_string(),
        ),
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

fn chat_body(
    reply: &Reply,
    content: &str,
    logprobs: Option<&[(String, f64)]>,
    request: &RecordedRequest,
    id: u64,
) -> Value {
    let model =
        reply.model.clone().or_else(|| request.model().map(str::to_owned)).unwrap_or_else(|| "scripted-model".into());
    let finish_reason = match &reply.finish_reason {
        Some(Some(reason)) => Value::String(reason.clone()),
        Some(None) => Value::Null,
        None => Value::String("stop".into()),
    };
    let logprobs = match logprobs {
        Some(alternatives) => {
            let top: Vec<Value> = alternatives
                .iter()
                .map(|(token, logprob)| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()}))
                .collect();
            let (token, logprob) = alternatives.first().cloned().unwrap_or_else(|| (content.to_owned(), 0.0));
            json!({"content": [{"token": token, "logprob": logprob, "bytes": token.as_bytes(), "top_logprobs": top}],
                   "refusal": null})
        }
        None => Value::Null,
    };
    let mut body = json!({
        "id": format!("chatcmpl-scripted-{id}"),
        "object": "chat.completion",
        "created": now_secs(),
        "model": model,
        "system_fingerprint": "fp_scripted",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": null},
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }],
    });
    if !reply.no_usage {
        let (prompt, completion) = reply.usage.unwrap_or_else(|| {
            let prompt = (request.raw_body.len() as u64 / 4).max(1);
            let completion = (content.split_whitespace().count() as u64).max(1);
            (prompt, completion)
        });
        body["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                               "total_tokens": prompt + completion});
    }
    body
}

fn embeddings_body(reply: &Reply, vectors: &[Vec<f32>], reversed: bool, request: &RecordedRequest) -> Value {
    let model = reply
        .model
        .clone()
        .or_else(|| request.model().map(str::to_owned))
        .unwrap_or_else(|| "scripted-embedding".into());
    let mut data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| json!({"object": "embedding", "index": index, "embedding": v}))
        .collect();
    if reversed {
        data.reverse();
    }
    let mut body = json!({"object": "list", "data": data, "model": model});
    if !reply.no_usage {
        let prompt = reply.usage.map(|(p, _)| p).unwrap_or_else(|| (request.raw_body.len() as u64 / 4).max(1));
        body["usage"] = json!({"prompt_tokens": prompt, "total_tokens": prompt});
    }
    body
}

fn render(reply: &Reply, request: &RecordedRequest, id: u64) -> Response<Full<Bytes>> {
    let (content_type, body) = match &reply.body {
        Some(body) => ("application/json", body.clone()),
        None => match &reply.kind {
            Kind::Chat { content, logprobs } => {
                ("application/json", chat_body(reply, content, logprobs.as_deref(), request, id).to_string())
            }
            Kind::Embeddings { vectors, reversed } => {
                ("application/json", embeddings_body(reply, vectors, *reversed, request).to_string())
            }
            Kind::Status => (
                "application/json",
                json!({"error": {"message": format!("scripted status {}", reply.status),
                                 "type": "scripted_error", "code": reply.status}})
                .to_string(),
            ),
            Kind::Malformed => ("text/html", "<html><body>502 bad gateway (scripted)</body></html>".to_owned()),
            Kind::Truncated => {
                let full = chat_body(reply, "this reply was cut", None, request, id).to_string();
                let half = full.len() / 2;
                ("application/json", full[..half].to_owned())
            }
            Kind::Hang => ("application/json", String::new()),
        },
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for (name, value) in &reply.headers {
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_embedding_is_deterministic_and_normalised() {
        let a = hash_embedding("hello", 16);
        assert_eq!(a, hash_embedding("hello", 16));
        assert_ne!(a, hash_embedding("world", 16));
        let norm: f32 = a.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }

    /// One HTTP/1.1 POST over a plain TCP connection; the response text.
    async fn post(addr: SocketAddr, body: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_gate_holds_replies_until_opened_and_exchanges_record_the_times() {
        let server = ScriptedLlm::start().await;
        let gate = Gate::new();
        let g = gate.clone();
        server.set_handler(move |r| {
            if r.body["hold"] == json!(true) { Reply::text("held").gated(&g) } else { Reply::text("free") }
        });
        let addr = server.addr();
        let held = tokio::spawn(async move { post(addr, r#"{"hold": true}"#).await });
        assert!(eventually(Duration::from_secs(5), || gate.waiting() == 1).await);
        // Another call goes through while the first one is held.
        assert!(post(addr, r#"{"hold": false}"#).await.contains("free"));
        assert!(!held.is_finished());
        let open = server.exchanges();
        assert_eq!(open.len(), 2);
        assert!(open[0].answered.is_none() && open[1].answered.is_some());
        assert!(open[0].overlaps(&open[1]));
        gate.open();
        assert!(held.await.unwrap().contains("held"));
        assert_eq!((gate.waiting(), gate.passed()), (0, 1));
        let done = server.exchanges();
        assert!(done.iter().all(|e| e.answered.is_some_and(|a| a >= e.received)));
        assert_eq!(max_in_flight(&done), 2);
        assert_eq!(max_in_flight(&done[1..]), 1);
        // An open gate lets later replies through at once.
        server.set_handler(move |_| Reply::text("again").gated(&gate));
        assert!(post(addr, "{}").await.contains("again"));
    }

    #[test]
    fn truncated_body_is_not_json() {
        let request = RecordedRequest {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: BTreeMap::new(),
            body: Value::Null,
            raw_body: String::new(),
        };
        let full = chat_body(&Reply::text("x"), "x", None, &request, 1);
        assert!(full["usage"]["total_tokens"].is_u64());
        let text = full.to_string();
        assert!(serde_json::from_str::<Value>(&text[..text.len() / 2]).is_err());
        assert_eq!(render(&Reply::truncated(), &request, 1).status(), StatusCode::OK);
    }
}
