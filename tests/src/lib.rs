//! MeshSandbox: the whole mesh in-process on port 0, wired to a scripted OpenAI-compatible backend,
//! for whole-mesh tests, external-client tests and benchmarks.

use std::sync::Arc;
use std::time::Duration;

use assay_config::AssayConfig;
use assay_llm::{Backends, ModelHub, OpenAiClient, OpenAiConfig};
use assay_mesh::Mesh;
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm};
use tonic::transport::Channel;

/// Start a pipeline on the gateway behind `channel` and collect its events until the run completes.
pub async fn run_to_end(channel: Channel, pipeline: gw::run_pipeline_request::Pipeline) -> Vec<gw::RunEvent> {
    let mut client = gw::gateway_service_client::GatewayServiceClient::new(channel);
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(pipeline),
            label: "test".into(),
            budget: None,
        })
        .await
        .expect("run starts")
        .into_inner();
    let mut events = Vec::new();
    while let Some(m) = stream.message().await.expect("event stream") {
        events.extend(m.event);
    }
    events
}

/// The checklist evaluation a `RunCompleted` event carries, if it is one.
pub fn evaluation(ev: &gw::RunEvent) -> Option<gw::EvaluateResponse> {
    use gw::run_event::Event;
    let Some(Event::Completed(c)) = &ev.event else { return None };
    let gw::run_result::Result::ChecklistEval(e) = c.result.as_ref()?.result.as_ref()? else { return None };
    Some(e.clone())
}

/// (index, record id, pass rate) of every record of an evaluation.
pub fn scores(r: &gw::EvaluateResponse) -> Vec<(u32, String, Option<f64>)> {
    r.results.iter().map(|x| (x.index, x.record_id.clone(), x.score.as_ref().map(|s| s.pass_rate))).collect()
}

/// Every event of a run from the start, until it completes. A watcher that falls behind is told
/// so (RESOURCE_EXHAUSTED) and reattaches from the last sequence it saw, as the contract says a
/// client should; no event is lost or repeated.
pub async fn watch_all(
    client: &mut gw::gateway_service_client::GatewayServiceClient<Channel>,
    run_id: &str,
) -> Vec<gw::RunEvent> {
    let mut events: Vec<gw::RunEvent> = Vec::new();
    let mut reattached = 0;
    'attach: loop {
        let after_sequence = events.last().map_or(0, |e| e.sequence);
        let mut stream = client
            .watch_run(gw::WatchRunRequest { run_id: run_id.to_string(), after_sequence })
            .await
            .expect("watch")
            .into_inner();
        loop {
            match stream.message().await {
                Ok(Some(m)) => events.extend(m.event),
                Ok(None) => return events,
                Err(s) if s.code() == tonic::Code::ResourceExhausted && reattached < 100 => {
                    reattached += 1;
                    continue 'attach;
                }
                Err(s) => panic!("watch stream: {s:?}"),
            }
        }
    }
}

/// A checklist_eval run created open with `pipeline` (its records inline, more to append) under
/// `budget`: its id and its events.
pub async fn start_open_run(
    client: &mut gw::gateway_service_client::GatewayServiceClient<Channel>,
    pipeline: gw::ChecklistEvalPipeline,
    label: &str,
    budget: Option<gw::RunBudget>,
) -> (String, tonic::Streaming<gw::RunPipelineResponse>) {
    let mut events = client
        .run_pipeline(gw::RunPipelineRequest {
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
            label: label.into(),
            budget,
            open: true,
        })
        .await
        .expect("run starts")
        .into_inner();
    let first = events.message().await.expect("events").expect("a first event").event.expect("an event");
    (first.run_id, events)
}

/// Every result of a checklist_eval run through ListRunResults, `page_size` at a time, and the
/// number of pages read.
pub async fn all_results(
    client: &mut gw::gateway_service_client::GatewayServiceClient<Channel>,
    run_id: &str,
    page_size: u32,
) -> (Vec<gw::RecordResult>, usize) {
    let (mut out, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = client
            .list_run_results(gw::ListRunResultsRequest { run_id: run_id.into(), page_size, page_token: token })
            .await
            .expect("a page of results")
            .into_inner();
        pages += 1;
        assert!(page.results.len() <= page_size as usize, "a page holds at most page_size results");
        out.extend(page.results);
        if page.next_page_token.is_empty() {
            return (out, pages);
        }
        token = page.next_page_token;
    }
}

/// A binary of this workspace from the target directory of the running test (built by
/// `cargo build -p <package>`, and by any workspace test run).
pub fn workspace_binary(name: &str, package: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(std::path::Path::parent).expect("target profile directory");
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing: build it with `cargo build -p {package}`", bin.display());
    bin
}

/// A log writer that keeps what it is given, for tests that read the log lines.
pub struct LogCapture(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A checklist evaluation of one record ("leaves") against one question ("Mentions leaves?").
pub fn one_leaves_record() -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: vec![pb::ChecklistItem {
                    id: "a".into(),
                    question: "Mentions leaves?".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        }),
        records: vec![gw::EvalRecord { id: "r".into(), target: "leaves".into(), ..Default::default() }],
        ..Default::default()
    }
}

/// `assay up` (this workspace's binary) on the OpenAI-compatible `backend` and the run store
/// `store`, every service on a free port, with `env` over the defaults: the child and its
/// gateway's URL.
pub async fn assay_up(store: &std::path::Path, backend: &str, env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    let (child, addr) = spawn_until(
        tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
            .args(["up", "--backend", "openai"])
            .env("OPENAI_BASE_URL", backend)
            .env("OPENAI_API_KEY", "assay-tests")
            .env("OPENAI_MODEL", "scripted")
            .env("ASSAY__GATEWAY__STORE", store)
            .env("ASSAY__CACHE__ENABLED", "false")
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .envs(
                ["GATEWAY", "GENERATOR", "REFINERS", "SCORER", "ARBITER", "DELTA_JUDGE", "DEBATE", "ADMIN"]
                    .map(|p| (format!("ASSAY__PORTS__{p}"), "0")),
            )
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null()),
        "assay up, its gateway address",
        |line| line.split("gateway on ").nth(1).and_then(|rest| rest.split_whitespace().next()).map(str::to_string),
    )
    .await;
    (child, format!("http://{addr}"))
}

/// `assay serve <stage>` (this workspace's binary) started with `env`, and the URL it listens on.
pub async fn serve(stage: &str, env: &[(&str, String)]) -> (tokio::process::Child, String) {
    let (child, addr) = spawn_until(
        tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
            .args(["serve", stage])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null()),
        &format!("assay serve {stage}, its address"),
        |line| {
            let rest = line.split("addr=Some(").nth(1).filter(|_| line.contains("listening"))?;
            rest.split(')').next().map(str::to_string)
        },
    )
    .await;
    (child, format!("http://{addr}"))
}

/// Spawn `command` (its stderr piped) and read its stderr until `found` maps a line to a value;
/// the rest of the output is drained in the background so the child never blocks on a full pipe.
pub async fn spawn_until(
    command: &mut tokio::process::Command,
    what: &str,
    mut found: impl FnMut(&str) -> Option<String>,
) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child = command
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{what} starts: {e}"));
    let mut lines = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let value = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(v) = found(&line) {
                return Some(v);
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: no answer within 60 s"))
    .unwrap_or_else(|| panic!("{what}: exited without printing it"));
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, value)
}

/// A checklist evaluation of `records` records against two questions ("Mentions leaves?", "Is it
/// short?"); every third record mentions leaves. For [`leaves_judge`].
pub fn leaves_eval(records: usize) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: vec![
                    pb::ChecklistItem { id: "a".into(), question: "Mentions leaves?".into(), ..Default::default() },
                    pb::ChecklistItem { id: "b".into(), question: "Is it short?".into(), ..Default::default() },
                ],
                ..Default::default()
            })),
        }),
        records: (0..records)
            .map(|i| gw::EvalRecord {
                id: format!("r{i}"),
                target: if i % 3 == 0 { format!("leaves {i}") } else { format!("stones {i}") },
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The scripted judge of [`leaves_eval`] (batch mode): YES to the first question when the target
/// mentions leaves, YES to the second; each reply after `delay`.
pub fn leaves_judge(delay: Duration) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |req| {
        let prompt = req.last_user_message().unwrap_or_default();
        let first = if prompt.contains("leaves") { "YES" } else { "NO" };
        Reply::json(serde_json::json!({"answers": [
            {"question_index": 1, "answer": first},
            {"question_index": 2, "answer": "YES"},
        ]}))
        .delay(delay)
    }
}

/// A [`leaves_eval`] of `records` records run to the end through `client`, every record scored.
pub async fn clean_leaves_run(
    client: &mut gw::gateway_service_client::GatewayServiceClient<Channel>,
    records: usize,
) -> gw::EvaluateResponse {
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(records))),
        label: "clean".into(),
        budget: None,
    };
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let mut last = None;
    while let Some(m) = stream.message().await.expect("event stream") {
        last = m.event;
    }
    let clean = evaluation(&last.expect("events")).expect("the clean run completes");
    assert_eq!(clean.results.iter().filter(|r| r.score.is_some()).count(), records, "every record scored");
    clean
}

/// A run's events after an interruption (`what`): completed with the clean run's scores, every
/// record reported scored once, one gap-free sequence.
pub fn check_like_clean(events: &[gw::RunEvent], clean: &gw::EvaluateResponse, what: &str) {
    use gw::run_event::Event;
    let done = evaluation(events.last().expect("events")).unwrap_or_else(|| panic!("{what}: the run completes"));
    assert_eq!(scores(&done), scores(clean), "{what}: same records and scores as a clean run");
    assert_eq!(done.aggregate, clean.aggregate, "{what}: same aggregate");
    let indices: Vec<u32> = events
        .iter()
        .filter_map(|e| if let Some(Event::RecordScored(r)) = &e.event { Some(r.index) } else { None })
        .collect();
    let unique: std::collections::HashSet<u32> = indices.iter().copied().collect();
    assert_eq!(unique.len(), indices.len(), "{what}: no record reported scored twice: {indices:?}");
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "{what}: one gap-free sequence");
}

/// The mesh plus its scripted backend.
pub struct MeshSandbox {
    pub llm: ScriptedLlm,
    pub mesh: Option<Mesh>,
    pub config: AssayConfig,
}

/// Sandbox options.
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    /// Require this bearer token on every RPC except health.
    pub auth_token: Option<String>,
    /// Leave every service NOT_SERVING.
    pub not_ready: bool,
    /// Wrap the backend in the response cache.
    pub cache: bool,
    /// SQLite file for gateway runs (default: in memory).
    pub store: Option<String>,
    /// Records the gateway scores at once (default 16).
    pub concurrency: Option<u32>,
    /// Serve the admin page on a free port (guarded by `auth_token`, else by a token generated at
    /// start: [`MeshSandbox::admin_token`]).
    pub admin: bool,
    /// Serve the admin page with no token when `auth_token` is unset (`admin.no_auth`, unsafe).
    pub no_admin_auth: bool,
    /// `admin.allowed_hosts`.
    pub admin_allowed_hosts: Vec<String>,
    /// TLS on every service and between them (`[tls]`); the sandbox's own channels use it too.
    pub tls: Option<assay_config::TlsConfig>,
    /// The API key the backend client sends (`Authorization: Bearer <key>` to the scripted backend).
    pub api_key: Option<String>,
    /// The backend client's adaptive attempt timeouts (default: the client's).
    pub adaptive_timeout: Option<assay_llm::AdaptiveTimeout>,
    /// The backend's price table (default none: every call unpriced). The backend is always
    /// wrapped as `assay up` wraps it: priced, and held to the work's budget.
    pub prices: Option<std::collections::BTreeMap<String, assay_llm::pricing::Price>>,
    /// `backends.openai.daily_spend_usd` (needs `prices`).
    pub daily_spend_usd: Option<f64>,
    /// The backend client's concurrency limit: `Some(n)` fixed at n (default: adaptive).
    pub fixed_concurrency: Option<u32>,
}

impl MeshSandbox {
    pub async fn start() -> MeshSandbox {
        Self::start_with(SandboxOptions::default()).await
    }

    pub async fn start_with(options: SandboxOptions) -> MeshSandbox {
        let llm = ScriptedLlm::start().await;
        let mut config = assay_config::load_from(
            "bind = \"127.0.0.1\"\ndrain_seconds = 5\n[ports]\ngateway = 0\ngenerator = 0\nrefiners = 0\nscorer = 0\narbiter = 0\ndelta_judge = 0\ndebate = 0\n[gateway]\nstore = \":memory:\"\n[models.default]\nbackend = \"openai\"\n",
        )
        .expect("sandbox config");
        config.auth_token = options.auth_token.clone().unwrap_or_default();
        if let Some(c) = options.concurrency {
            config.gateway.concurrency = c;
        }
        if options.admin {
            config.ports.admin = Some(0);
        }
        config.admin.no_auth = options.no_admin_auth;
        config.admin.allowed_hosts = options.admin_allowed_hosts.clone();
        if let Some(path) = &options.store {
            config.gateway.store = path.clone();
        }
        if let Some(tls) = &options.tls {
            config.tls = tls.clone();
        }
        if let Some(backend) = config.backends.get_mut("openai") {
            backend.prices = options.prices.clone().unwrap_or_default();
            backend.daily_spend_usd = options.daily_spend_usd.unwrap_or_default();
        }
        let mut cfg = OpenAiConfig::new(llm.base_url());
        cfg.api_key = options.api_key.clone();
        cfg.default_model = "scripted-judge".into();
        cfg.base_backoff = Duration::from_millis(10);
        cfg.max_backoff = Duration::from_millis(200);
        // The tests count backend calls exactly (one per call, at most N at once); hedged
        // duplicates of stragglers, on by default, would add one whenever the loaded test
        // machine stalls a call. Hedging has its own tests (assay-llm) and the fault harness
        // (fault_costs) runs the default.
        cfg.adaptive_timeout.hedge_factor = 0.0;
        // The scripted backend takes every form, and the tests' replies are written to what the
        // stages read, not always to the last bound of the schema they are sent: the form stays
        // `json_schema` (the ladder and the schema check have their own tests in assay-llm and
        // services/cli/tests/schema_check.rs).
        cfg.structured_output = assay_llm::StructuredOutput::JsonSchema;
        if let Some(adaptive) = options.adaptive_timeout {
            cfg.adaptive_timeout = adaptive;
        }
        if let Some(n) = options.fixed_concurrency {
            cfg.initial_concurrency = 0;
            cfg.max_concurrency = n as usize;
        }
        let client = Arc::new(OpenAiClient::new(cfg).expect("client"));
        let prices = assay_llm::pricing::Prices::new(options.prices.clone().unwrap_or_default());
        let client_chat: Arc<dyn assay_llm::ChatModel> =
            Arc::new(assay_llm::pricing::PricedChat::new(client.clone(), "openai", prices.clone()));
        let client_embed: Arc<dyn assay_llm::EmbeddingModel> =
            Arc::new(assay_llm::pricing::PricedEmbed::new(client, "openai", prices));
        let (chat, embed): (Arc<dyn assay_llm::ChatModel>, Arc<dyn assay_llm::EmbeddingModel>) = if options.cache {
            (
                Arc::new(assay_llm::CachedChat::in_memory(client_chat)),
                Arc::new(assay_llm::CachedEmbed::in_memory(client_embed)),
            )
        } else {
            (client_chat, client_embed)
        };
        let backends = Backends::new().with_chat("openai", chat).with_embedding("openai", embed);
        let hub = Arc::new(ModelHub::new(backends, config.models.clone()));
        let mesh = assay_mesh::start_mesh(&config, hub, !options.not_ready).await.expect("mesh starts");
        MeshSandbox { llm, mesh: Some(mesh), config }
    }

    /// Start a new mesh (fresh ports) on the same scripted backend and configuration: a gateway
    /// restart. The old mesh must have been shut down.
    pub async fn restart(&mut self, hub: Arc<ModelHub>) {
        let mesh = assay_mesh::start_mesh(&self.config, hub, true).await.expect("mesh restarts");
        self.mesh = Some(mesh);
    }

    /// A hub on this sandbox's scripted backend.
    pub fn hub(&self) -> Arc<ModelHub> {
        let mut cfg = OpenAiConfig::new(self.llm.base_url());
        cfg.default_model = "scripted-judge".into();
        cfg.base_backoff = Duration::from_millis(10);
        cfg.structured_output = assay_llm::StructuredOutput::JsonSchema;
        let client = Arc::new(OpenAiClient::new(cfg).expect("client"));
        let backends = Backends::new().with_chat("openai", client.clone()).with_embedding("openai", client);
        Arc::new(ModelHub::new(backends, self.config.models.clone()))
    }

    pub fn mesh(&self) -> &Mesh {
        self.mesh.as_ref().expect("mesh running")
    }

    /// The admin page's base URL (the sandbox must have been started with `admin`).
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.mesh().addrs.admin.expect("the sandbox serves the admin page"))
    }

    /// The token the admin page requires (configured or generated at start); `None` when open.
    pub fn admin_token(&self) -> Option<String> {
        self.mesh().admin_auth().token().map(str::to_string)
    }

    pub fn gateway_url(&self) -> String {
        format!("http://{}", self.mesh().addrs.gateway)
    }

    pub async fn channel(&self, addr: std::net::SocketAddr) -> Channel {
        if self.config.tls.is_configured() {
            // Over TLS, presenting the configured client certificate (connected on first use).
            return assay_runtime::channel(&self.config, &format!("http://{addr}")).expect("tls channel");
        }
        Channel::from_shared(format!("http://{addr}")).expect("url").connect().await.expect("connect")
    }

    pub async fn gateway(&self) -> Channel {
        self.channel(self.mesh().addrs.gateway).await
    }

    /// Start a pipeline through the gateway and collect its events until the run completes.
    pub async fn run_pipeline(&self, pipeline: gw::run_pipeline_request::Pipeline) -> Vec<gw::RunEvent> {
        run_to_end(self.gateway().await, pipeline).await
    }

    /// Graceful stop of every service.
    pub async fn shutdown(mut self) -> Result<(), assay_mesh::MeshError> {
        match self.mesh.take() {
            Some(m) => m.shutdown().await,
            None => Ok(()),
        }
    }
}

/// Run the admin page's browser checks (`tests/python/admin_page.py`, headless Chromium) in `mode`
/// with `args`; `on_line` sees every line the script prints as it comes (`READY` where the mode
/// waits for the test to release the backend). Panics with the script's output when it fails.
pub async fn admin_browser(mode: &str, args: &serde_json::Value, mut on_line: impl FnMut(&str)) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/admin_page.py");
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .arg(mode)
        .arg(args.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs (scripts/setup-deps.sh installs selenium, chromium and chromium-driver)");
    let mut stderr = child.stderr.take().expect("stderr");
    let errors = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut out = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        on_line(&line);
        out.push(line);
    }
    let status = child.wait().await.expect("the browser script ends");
    let errors = errors.await.unwrap_or_default();
    assert!(
        status.success() && out.last().map(String::as_str) == Some("OK"),
        "admin page checks ({mode}) failed:\n{}\n{errors}",
        out.join("\n")
    );
}

/// A lesson fixture (`{"brief": {...}, "sections": [{"id", "title", "content"}]}`): its brief and
/// its sections, numbered in document order.
pub fn lesson_fixture(json: &str) -> (pb::Brief, Vec<pb::Section>) {
    let v: serde_json::Value = serde_json::from_str(json).expect("the fixture is JSON");
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let b = &v["brief"];
    let brief = pb::Brief {
        objectives: b["objectives"].as_array().map(|a| a.iter().map(text).collect()).unwrap_or_default(),
        audience: text(&b["audience"]),
        language: text(&b["language"]),
        description: text(&b["description"]),
    };
    let sections = v["sections"]
        .as_array()
        .expect("the fixture has sections")
        .iter()
        .enumerate()
        .map(|(i, s)| pb::Section {
            id: text(&s["id"]),
            index: i as u32,
            title: text(&s["title"]),
            content: text(&s["content"]),
        })
        .collect();
    (brief, sections)
}

/// Models under test on the scripted backend: a checklist generation gets a schema-shaped
/// checklist; a responder answers "A weak answer about N, by MODEL." when `weak(model, n)` holds
/// (`n`: the last number of its prompt), else a strong one; a judge answers NO to the first
/// question of a weak answer and YES to every other.
pub fn responders_backend(
    weak: impl Fn(&str, usize) -> bool + Send + Sync + 'static,
) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r: &RecordedRequest| match r.body.pointer("/response_format/json_schema/name").and_then(|n| n.as_str()) {
        Some("checklist") => assay_testkit::schema_reply(r),
        Some(_) => {
            let prompt = r.last_user_message().unwrap_or_default();
            let n = prompt.lines().filter(|l| l.starts_with('Q') && l.contains(':')).count().max(1);
            let weak = prompt.contains("weak answer");
            let answers: Vec<serde_json::Value> = (1..=n)
                .map(|i| serde_json::json!({"question_index": i, "answer": if weak && i == 1 { "NO" } else { "YES" }}))
                .collect();
            Reply::json(serde_json::json!({ "answers": answers }))
        }
        None => {
            let model = r.body["model"].as_str().unwrap_or_default().to_string();
            let prompt = r.last_user_message().unwrap_or_default();
            let n: usize =
                prompt.trim_end_matches('?').split_whitespace().last().and_then(|w| w.parse().ok()).unwrap_or(0);
            let how = if weak(&model, n) { "weak" } else { "strong" };
            Reply::text(format!("A {how} answer about {n}, by {model}."))
        }
    }
}
