//! The `assay` binary against a real OpenAI-compatible server: llama-cpp-python's server (PyPI)
//! on loopback, serving the SmolLM2 GGUF that `assay models fetch` downloads. It answers
//! `response_format: json_schema` with a 500 validation error and enforces `json_object` with a
//! schema by grammar, so these tests hold the client to what the protocol owes (no record or
//! problem lost to a request form, every structured reply parsed, usage counted), not the small
//! model's quality.
//!
//! The server's Python is `$ASSAY_LLAMA_CPP_PYTHON` (`scripts/setup-deps.sh` installs
//! llama-cpp-python into `target/llama-venv` when `ASSAY_WITH_LLAMA_CPP=1`, as CI sets it, and
//! `scripts/test.sh` then points the tests at it). Without it the tests say so and pass, unless
//! `ASSAY_REQUIRE_LLAMA_CPP=1` (CI), which makes a missing server a failure.
//!
//! The configuration is what a new user writes: the server's address and model, nothing about
//! its one slot (the client finds it: the server queues what it cannot serve, the limit comes down
//! to it, and no call is given up on, or sent again, for waiting its turn), and its chat model
//! cannot embed (`models.phases.embedding.backend = "local"`). Usage is checked against the
//! server's access log: every chat request it answered, the refused forms' 500s included, is a
//! call in the summary, and no call was abandoned. The tests run one at a time (`.config/nextest.toml`): each starts its own server.
//!
//! The `*_on_llama_server` tests run llama.cpp's own `llama-server` instead, at its defaults: four
//! slots, which it reports at `/props`, and `json_schema` enforced by grammar.
//! `$ASSAY_LLAMA_SERVER` names the binary, which `scripts/setup-deps.sh` builds from the llama.cpp
//! that llama-cpp-python's sdist vendors. CI runs the tick evaluation and logprob scoring on it;
//! the refinement and the debate take longer than CI's time on two cores and are run by hand with
//! `--run-ignored`. Its log has no access lines: every request it serves is
//! one `print_timing` report of a finished task, which is what is counted.
//!
//! The `*_behind_litellm` tests put LiteLLM's proxy (`litellm[proxy]`, PyPI; `$ASSAY_LITELLM` names
//! its `litellm` command, installed beside the server by `scripts/setup-deps.sh`) between Assay and
//! the same server, as many teams run models: its default settings except the master key it
//! requires, Assay's defaults. The proxy retries each 500 twice, so a form the server refuses
//! reaches it three times for one request Assay sent; everything else it forwards once.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::assert_plain;

/// The server process, killed when dropped.
struct LlamaServer {
    child: Child,
    base_url: String,
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Python with llama-cpp-python's server, or `None` (and the reason printed) when the test
/// may be skipped here.
fn server_python() -> Option<PathBuf> {
    let required = std::env::var("ASSAY_REQUIRE_LLAMA_CPP").is_ok_and(|v| v == "1");
    match std::env::var_os("ASSAY_LLAMA_CPP_PYTHON").map(PathBuf::from).filter(|p| p.exists()) {
        Some(p) => Some(p),
        None if required => panic!("ASSAY_REQUIRE_LLAMA_CPP=1 but ASSAY_LLAMA_CPP_PYTHON names no python"),
        None => {
            eprintln!("skipped: set ASSAY_LLAMA_CPP_PYTHON to a python with llama-cpp-python[server]");
            None
        }
    }
}

/// Start the server with the SmolLM2 GGUF on a free loopback port and wait until it lists its
/// model (polling, within two minutes).
fn start_server(python: &Path, log: &Path) -> LlamaServer {
    let gguf = assay_embedded::default_models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{} is missing: run `assay models fetch`", gguf.display());
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let child = Command::new(python)
        .args(["-m", "llama_cpp.server", "--model"])
        .arg(&gguf)
        .args(["--model_alias", "smollm2", "--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--n_ctx", "8192", "--n_threads", "2"])
        // Files, not pipes: the server logs a lot while loading and would block on a full pipe. Its
        // access log goes to standard output.
        .stdout(std::fs::File::create(log).expect("the server's access log"))
        .stderr(std::fs::File::create(log.with_extension("err")).expect("the server's log"))
        .spawn()
        .expect("the llama-cpp-python server starts");
    ready(
        LlamaServer { child, base_url: format!("http://127.0.0.1:{port}/v1") },
        port,
        &log.with_extension("err"),
        "the llama-cpp-python server",
    )
}

/// `server` once it lists its models on `port` (polling, within two minutes); a panic with its
/// log `err_log` when it exits first.
fn ready(mut server: LlamaServer, port: u16, err_log: &Path, what: &str) -> LlamaServer {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if lists_models(port) {
            return server;
        }
        if let Ok(Some(status)) = server.child.try_wait() {
            let err = std::fs::read_to_string(err_log).unwrap_or_default();
            panic!("{what} exited ({status}):\n{err}");
        }
        assert!(Instant::now() < deadline, "{what} did not answer within 120 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The `llama-server` binary, or `None` (and the reason printed) when the test may be skipped
/// here (as [`server_python`]: `ASSAY_REQUIRE_LLAMA_CPP=1` requires it too).
fn llama_server_binary() -> Option<PathBuf> {
    let required = std::env::var("ASSAY_REQUIRE_LLAMA_CPP").is_ok_and(|v| v == "1");
    match std::env::var_os("ASSAY_LLAMA_SERVER").map(PathBuf::from).filter(|p| p.exists()) {
        Some(p) => Some(p),
        None if required => panic!("ASSAY_REQUIRE_LLAMA_CPP=1 but ASSAY_LLAMA_SERVER names no llama-server"),
        None => {
            eprintln!("skipped: set ASSAY_LLAMA_SERVER to llama.cpp's llama-server binary");
            None
        }
    }
}

/// Start llama.cpp's `llama-server` with the SmolLM2 GGUF on a free loopback port at its defaults
/// (slots, context: the model's), two threads, and wait until it lists its model. Its log goes to
/// `log`.
fn start_llama_server(binary: &Path, log: &Path) -> LlamaServer {
    let gguf = assay_embedded::default_models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{} is missing: run `assay models fetch`", gguf.display());
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let child = Command::new(binary)
        .arg("-m")
        .arg(&gguf)
        .args(["--alias", "smollm2", "--host", "127.0.0.1", "--port", &port.to_string(), "-t", "2"])
        .stdout(std::fs::File::create(log.with_extension("out")).expect("the server's output"))
        .stderr(std::fs::File::create(log).expect("the server's log"))
        .spawn()
        .expect("llama-server starts");
    ready(LlamaServer { child, base_url: format!("http://127.0.0.1:{port}/v1") }, port, log, "llama-server")
}

/// Whether the server on `port` answers `GET /v1/models` with 200.
fn lists_models(port: u16) -> bool {
    answers_200(port, "/v1/models")
}

/// Whether the server on `port` answers `GET path` with 200.
fn answers_200(port: u16, path: &str) -> bool {
    use std::io::Write;
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}

/// `assay.toml` in `dir`: every chat model on the server's `smollm2` at default settings,
/// embeddings on the embedded model, the run store in memory, the response cache off. Every call
/// carries a seed, so the server's sampling (and each test's outcome) is the same from run to run.
fn config(dir: &Path, base_url: &str) -> PathBuf {
    let path = dir.join("assay.toml");
    let toml = format!(
        "[backends.openai]\nbase_url = \"{base_url}\"\nmodel = \"smollm2\"\n\n\
         [models.default]\nbackend = \"openai\"\nseed = 7\n\n[models.phases.embedding]\nbackend = \"local\"\n\n\
         [gateway]\nstore = \":memory:\"\n\n[cache]\nenabled = false\n"
    );
    std::fs::write(&path, toml).unwrap();
    path
}

/// The `litellm` command of LiteLLM's proxy, or `None` (and the reason printed) when the test may
/// be skipped here (as [`server_python`]: `ASSAY_REQUIRE_LLAMA_CPP=1` requires it too).
fn litellm_command() -> Option<PathBuf> {
    let required = std::env::var("ASSAY_REQUIRE_LLAMA_CPP").is_ok_and(|v| v == "1");
    match std::env::var_os("ASSAY_LITELLM").map(PathBuf::from).filter(|p| p.exists()) {
        Some(p) => Some(p),
        None if required => panic!("ASSAY_REQUIRE_LLAMA_CPP=1 but ASSAY_LITELLM names no litellm command"),
        None => {
            eprintln!("skipped: set ASSAY_LITELLM to the litellm command of litellm[proxy]");
            None
        }
    }
}

/// The key LiteLLM's proxy is started with (it refuses to start without one) and Assay sends.
const LITELLM_KEY: &str = "sk-assay-loopback-7f3c9d2e8b1a4f6c";

/// Start LiteLLM's proxy on a free loopback port in front of `server`, one model `smollm2`, and
/// wait until it answers its liveness probe (polling, within two minutes). It reads its price
/// table from the package (`LITELLM_LOCAL_MODEL_COST_MAP`: it would fetch it from the network).
fn start_litellm(litellm: &Path, server: &LlamaServer, dir: &Path) -> LlamaServer {
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let config = dir.join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n  - model_name: smollm2\n    litellm_params:\n      model: openai/smollm2\n      \
             api_base: {}\n      api_key: local\ngeneral_settings:\n  master_key: {LITELLM_KEY}\n",
            server.base_url
        ),
    )
    .unwrap();
    let log = dir.join("litellm.log");
    let child = Command::new(litellm)
        .arg("--config")
        .arg(&config)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .stdout(std::fs::File::create(&log).expect("the proxy's log"))
        .stderr(std::fs::File::create(log.with_extension("err")).expect("the proxy's log"))
        .spawn()
        .expect("LiteLLM's proxy starts");
    let mut proxy = LlamaServer { child, base_url: format!("http://127.0.0.1:{port}/v1") };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if answers_200(port, "/health/liveliness") {
            return proxy;
        }
        if let Ok(Some(status)) = proxy.child.try_wait() {
            let err = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
            let out = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("LiteLLM's proxy exited ({status}):\n{out}\n{err}");
        }
        assert!(Instant::now() < deadline, "LiteLLM's proxy did not answer within 120 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Which server, and how Assay reaches it.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Route {
    /// llama-cpp-python's server.
    Direct,
    /// llama-cpp-python's server through LiteLLM's proxy.
    Litellm,
    /// llama.cpp's own `llama-server`.
    LlamaServer,
}

/// A started server (and proxy), the server's access log and the configuration pointing at it, in
/// a scratch directory.
struct Setup {
    dir: tempfile::TempDir,
    log: PathBuf,
    config: PathBuf,
    route: Route,
    // Dropped in order: the proxy first.
    _proxy: Option<LlamaServer>,
    _server: LlamaServer,
}

impl Setup {
    /// `None` when the server is not installed here and may be skipped.
    fn start() -> Option<Setup> {
        Self::start_on(Route::Direct)
    }

    /// The server reached through LiteLLM's proxy; `None` when either is not installed here and
    /// may be skipped.
    fn behind_litellm() -> Option<Setup> {
        Self::start_on(Route::Litellm)
    }

    /// llama.cpp's `llama-server`; `None` when it is not built here and may be skipped.
    fn llama_server() -> Option<Setup> {
        Self::start_on(Route::LlamaServer)
    }

    fn start_on(route: Route) -> Option<Setup> {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        if route == Route::LlamaServer {
            let server = start_llama_server(&llama_server_binary()?, &log);
            let config = config(dir.path(), &server.base_url);
            return Some(Setup { dir, log, config, route, _proxy: None, _server: server });
        }
        let python = server_python()?;
        let litellm = if route == Route::Litellm { Some(litellm_command()?) } else { None };
        let server = start_server(&python, &log);
        let proxy = litellm.map(|command| start_litellm(&command, &server, dir.path()));
        let config = config(dir.path(), &proxy.as_ref().unwrap_or(&server).base_url);
        Some(Setup { dir, log, config, route, _proxy: proxy, _server: server })
    }

    /// Requests the server sees for one request of a form it refuses: LiteLLM retries a 500 twice.
    fn refused_per_fallback(&self) -> usize {
        match self.route {
            Route::Direct | Route::LlamaServer => 1,
            Route::Litellm => 3,
        }
    }

    /// Whether the server refuses `json_schema`, so a run negotiates a weaker form
    /// (llama-cpp-python does; llama-server enforces it).
    fn refuses_json_schema(&self) -> bool {
        self.route != Route::LlamaServer
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Write `lines` as JSON lines into `name`.
    fn jsonl(&self, name: &str, lines: &[serde_json::Value]) -> String {
        let path = self.path(name);
        std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
        path.to_str().unwrap().to_string()
    }

    fn run(&self, args: &[&str]) -> Output {
        let key = match self.route {
            Route::Direct | Route::LlamaServer => "local",
            Route::Litellm => LITELLM_KEY,
        };
        assay(&self.config, key, args)
    }

    /// Chat requests the server answered, and how many of them refused the request's form (500).
    fn served(&self) -> Served {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if self.route == Route::LlamaServer {
            // One report per finished task; a refused request is no task, and it refuses no form.
            let all = log.lines().filter(|l| l.contains("print_timing") && l.contains("total time")).count();
            return Served { all, refused: 0 };
        }
        let chat: Vec<&str> = log.lines().filter(|l| l.contains("POST /v1/chat/completions")).collect();
        Served { all: chat.len(), refused: chat.iter().filter(|l| l.contains(" 500")).count() }
    }
}

impl Setup {
    /// [`Self::served`] once the server's log shows `counted` calls (of which `fallbacks` refused
    /// forms, each seen [`Self::refused_per_fallback`] times), or after 10 s: the server writes a
    /// request's log line after its reply has gone out, so the last line may follow the client's
    /// exit by a moment.
    fn served_settled(&self, counted: usize, fallbacks: usize) -> Served {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let served = self.served();
            if served.all >= counted + fallbacks * (self.refused_per_fallback() - 1) || Instant::now() >= until {
                return served;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[derive(Debug, PartialEq)]
struct Served {
    all: usize,
    refused: usize,
}

/// A run's usage (proto3 JSON) against what the server served: every chat request it answered is
/// a call to the remote backend, and the refused forms are its schema fallbacks (each seen
/// [`Setup::refused_per_fallback`] times). The remote calls
/// are the unpriced ones: that backend has no price table here, while the embedded model's calls
/// (embeddings for the deduplicator, the selector and the judge panel) are priced, at nothing. An
/// attempt given up on (its timeout passed while it queued at the one-slot server) is counted
/// whether or not the server then ran it (llama-cpp-python drops a queued request whose client
/// went away): the count errs high by those alone.
fn assert_usage_is_served(setup: &Setup, usage: &serde_json::Value) {
    let count = |key: &str| usage[key].as_u64().unwrap_or(0) as usize;
    let (fallbacks, per_fallback) = (count("schemaFallbacks"), setup.refused_per_fallback());
    let served = setup.served_settled(count("unpricedCalls"), fallbacks);
    let abandoned = count("abandonedCalls");
    assert_counts_served(
        count("unpricedCalls") - fallbacks,
        abandoned,
        served.all - served.refused,
        &usage.to_string(),
    );
    assert_eq!(fallbacks * per_fallback, served.refused, "every refused form is a schema fallback: {usage}");
    assert!(count("calls") >= count("unpricedCalls"), "{usage}");
}

/// `counted` calls of which `abandoned` were given up on, against the `served` requests the
/// server's log shows: none given up on (none sent again while the server worked on it), and
/// every served one counted.
fn assert_counts_served(counted: usize, abandoned: usize, served: usize, what: &str) {
    assert_eq!(abandoned, 0, "no call given up on: {what}");
    assert_eq!(counted, served, "{counted} calls counted, {served} served: {what}");
}

fn assay(config: &Path, key: &str, args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_assay"))
        .arg("--config")
        .arg(config)
        .args(args)
        .env("OPENAI_API_KEY", key)
        .env_remove("OPENAI_BASE_URL")
        .env_remove("RUST_LOG")
        .output()
        .expect("assay runs");
    assert_plain(&o);
    o
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The tick evaluation of three records against the real server: the structured-output form is
/// negotiated (llama-cpp-python refuses `json_schema` with a 500 and takes `json_object` with the
/// schema), no record fails, every item is answered (the batch schema's one-answer-per-question
/// bounds reach the model's grammar), and the usage is what the server served.
/// Three records every evaluation test scores.
fn records() -> Vec<serde_json::Value> {
    [
        ("Name a planet of the solar system.", "Mars is a planet of the solar system."),
        ("What colour is a clear daytime sky?", "A clear daytime sky is blue."),
        ("Give one word that rhymes with cat.", "Hat rhymes with cat."),
    ]
    .iter()
    .enumerate()
    .map(|(i, (input, target))| serde_json::json!({"id": format!("r{i}"), "input": input, "target": target}))
    .collect()
}

/// `--out` lines.
fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `assay eval` with `preset_args` on the three records: no record failed, every item answered
/// (the schema reached the model's grammar), the usage is what the server served.
fn evaluation(setup: &Setup, preset_args: &[&str]) {
    let data = setup.jsonl("records.jsonl", &records());
    let out = setup.path("scores.jsonl");
    let mut args = vec!["eval", "--data", &data, "--out", out.to_str().unwrap(), "--json"];
    args.extend_from_slice(preset_args);
    let o = setup.run(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON summary");
    assert_eq!(summary["failed"], 0, "no record failed: {summary}");
    if setup.refuses_json_schema() {
        assert!(summary["usage"]["schemaFallbacks"].as_u64() >= Some(1), "the form was negotiated: {summary}");
    } else {
        assert_eq!(summary["usage"]["schemaFallbacks"].as_u64().unwrap_or(0), 0, "json_schema taken: {summary}");
    }
    assert_usage_is_served(setup, &summary["usage"]);
    let scored = lines(&out);
    assert_eq!(scored.len(), 3);
    for r in &scored {
        assert_eq!(r["unanswered"], 0, "every item answered (the schema reached the model): {r}");
        assert!(r["answers"].as_object().is_some_and(|a| !a.is_empty()), "a checklist was generated: {r}");
    }
}

/// The tick evaluation of three records: the structured-output form is negotiated
/// (llama-cpp-python refuses `json_schema` with a 500 and takes `json_object` with the schema), no
/// record fails, every item is answered (the batch schema's one-answer-per-question bounds reach
/// the model's grammar), and the usage is what the server served.
#[test]
fn a_tick_evaluation_runs_on_a_real_llama_cpp_server() {
    let Some(setup) = Setup::start() else { return };
    evaluation(&setup, &["--preset", "tick"]);
}

/// The tick evaluation through LiteLLM's proxy.
#[test]
fn a_tick_evaluation_runs_behind_litellm() {
    let Some(setup) = Setup::behind_litellm() else { return };
    evaluation(&setup, &["--preset", "tick"]);
}

/// Two prompts compared through LiteLLM's proxy (`--respond` with two `--respond-template`s): the
/// model answers each record's input through both, every answer is scored on the record's
/// checklist, the paired comparison is made, and the usage is what the server served.
#[test]
fn a_responders_run_runs_behind_litellm() {
    let Some(setup) = Setup::behind_litellm() else { return };
    let data = setup.jsonl("records.jsonl", &records());
    let terse = setup.path("terse.txt");
    std::fs::write(&terse, "Answer in one short sentence: {input}\n").unwrap();
    let plain = setup.path("plain.txt");
    std::fs::write(&plain, "{input}\n").unwrap();
    let out = setup.path("scores.jsonl");
    let o = setup.run(&[
        "eval",
        "--preset",
        "tick",
        "--data",
        &data,
        "--respond",
        "openai:smollm2",
        "--respond-template",
        terse.to_str().unwrap(),
        "--respond-template",
        plain.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON summary");
    assert_eq!(summary["failed"], 0, "no record failed: {summary}");
    assert_usage_is_served(&setup, &summary["usage"]);
    let scored = lines(&out);
    assert_eq!(scored.len(), 6, "each record answered through both prompts: {scored:?}");
    for r in &scored {
        assert_eq!(r["unanswered"], 0, "every item answered: {r}");
    }
    eprintln!("{summary}");
}

/// The tick evaluation on llama.cpp's `llama-server` at its defaults.
#[test]
fn a_tick_evaluation_runs_on_llama_server() {
    let Some(setup) = Setup::llama_server() else { return };
    evaluation(&setup, &["--preset", "tick"]);
}

/// A corpus preset (feedback: one checklist from six observations in three batches, then every
/// record scored on it).
/// The built-in tagger is left out: it asks the model whether each question applies, and the
/// small model may say no to every one (a quality call, not a protocol failure), which leaves
/// nothing to score.
#[test]
fn a_corpus_preset_evaluation_runs_on_a_real_llama_cpp_server() {
    let Some(setup) = Setup::start() else { return };
    let notes = setup.path("notes.txt");
    let observations = [
        "The answer named no example.",
        "The answer was one word only.",
        "The answer was correct.",
        "The answer did not explain why.",
        "The answer repeated the question.",
        "The answer was polite.",
    ];
    std::fs::write(&notes, observations.join("\n")).unwrap();
    evaluation(
        &setup,
        &[
            "--preset",
            "feedback",
            "--observations",
            notes.to_str().unwrap(),
            "--description",
            "short quiz answers",
            "--max-questions",
            "4",
            "--no-tagging",
            "--batch-size",
            "2",
        ],
    );
}

/// `assay score` with logprob confidence: every record scored with a confidence-weighted score
/// strictly between 0 and 1 (the server's top logprobs read), the usage what the server served.
#[test]
fn scoring_with_logprobs_runs_on_a_real_llama_cpp_server() {
    let Some(setup) = Setup::start() else { return };
    scoring_with_logprobs(&setup);
}

/// [`scoring_with_logprobs_runs_on_a_real_llama_cpp_server`] on llama.cpp's `llama-server`: the
/// answer's grammar and the top logprobs in its own form.
#[test]
fn scoring_with_logprobs_runs_on_llama_server() {
    let Some(setup) = Setup::llama_server() else { return };
    scoring_with_logprobs(&setup);
}

fn scoring_with_logprobs(setup: &Setup) {
    let checklist = setup.path("checklist.json");
    std::fs::write(
        &checklist,
        r#"{"id": "c1", "items": ["Does the response name a planet?", {"id": "true", "question": "Is the response factually correct?", "weight": 2}]}"#,
    )
    .unwrap();
    let data = setup.jsonl("records.jsonl", &records());
    let out = setup.path("scores.jsonl");
    let o = setup.run(&[
        "score",
        "--checklist",
        checklist.to_str().unwrap(),
        "--data",
        &data,
        "--logprobs",
        "--metric",
        "normalized",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON summary");
    assert_eq!(summary["failed"], 0, "{summary}");
    assert_eq!(summary["models"][0]["logprobsRequested"], true, "{summary}");
    assert_usage_is_served(setup, &summary["usage"]);
    let scored = lines(&out);
    assert_eq!(scored.len(), 3);
    for r in &scored {
        let s = r["normalized_score"].as_f64().unwrap_or(f64::NAN);
        assert!(s > 0.0 && s < 1.0, "a confidence from the logprobs, not a bare yes/no: {r}");
        assert_eq!(r["unanswered"], 0, "{r}");
    }
}

/// `assay refine-text` (self-refine: plain-text critique and revision calls).
#[test]
fn self_refine_runs_on_a_real_llama_cpp_server() {
    let Some(setup) = Setup::start() else { return };
    let input = setup.path("draft.txt");
    std::fs::write(
        &input,
        "Compound interest is interest earned on interest. When a bank adds the interest to the principal at the \
         end of each year, the next year earns interest on a larger amount, so the balance grows faster than with \
         simple interest. For example, 100 dollars at 10 percent becomes 110 after one year and 121 after two.",
    )
    .unwrap();
    let o = setup.run(&["refine-text", "--input", input.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let result: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON result");
    assert_eq!(result["state"], "RUN_STATE_SUCCEEDED", "{result}");
    assert!(result["usage"]["calls"].as_u64().unwrap_or(0) >= 1, "{result}");
    // The small model at temperature 0 may answer with the prompt itself: its scaffold is stripped
    // exactly or the reply refused, never returned as the revision (issue 59, point 14).
    let final_text = result["finalText"].as_str().expect("the final text");
    for scaffold in ["<instruction>", "</instruction>", "DRAFT:", "<draft>", "</draft>", "TASK:"] {
        assert!(!final_text.contains(scaffold), "the prompt's {scaffold} is in the result: {result}");
    }
    assert_usage_is_served(&setup, &result["usage"]);
}

/// `assay refine` on the example lesson: the judge panel, the arbiter and whatever fixes follow,
/// at default settings.
#[test]
fn a_targeted_refinement_runs_on_a_real_llama_cpp_server() {
    let Some(setup) = Setup::start() else { return };
    refinement(&setup);
}

/// The refinement of [`a_targeted_refinement_runs_on_a_real_llama_cpp_server`] on llama.cpp's
/// `llama-server`. Not in CI's time: at its defaults its four slots share two cores (about 8
/// tokens a second each) and the small model writes to its token limit; run it with
/// `cargo nextest run -p assay-cli --run-ignored all -E 'test(on_llama_server)'`.
#[test]
#[ignore = "longer than CI's time on two cores: run with --run-ignored"]
fn a_targeted_refinement_runs_on_llama_server() {
    let Some(setup) = Setup::llama_server() else { return };
    refinement(&setup);
}

/// The refinement of [`a_targeted_refinement_runs_on_a_real_llama_cpp_server`] through LiteLLM's
/// proxy.
#[test]
fn a_targeted_refinement_runs_behind_litellm() {
    let Some(setup) = Setup::behind_litellm() else { return };
    refinement(&setup);
}

fn refinement(setup: &Setup) {
    let lesson = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lesson.json");
    let o = setup.run(&["refine", "--doc", lesson.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let result: serde_json::Value = serde_json::from_slice(&o.stdout).expect("a JSON result");
    assert_eq!(result["state"], "RUN_STATE_SUCCEEDED", "{}", text(&o.stderr));
    assert!(result["fullJudgings"].as_u64().unwrap_or(0) >= 1, "the document was judged: {}", text(&o.stderr));
    assert_usage_is_served(setup, &result["usage"]);
}

/// `assay debate` on the three short problems: no problem fails (every solution, review,
/// refinement and judgement parsed), and the summary's usage is what the server served.
#[test]
fn a_debate_runs_on_a_real_llama_cpp_server() {
    let Some(setup) = Setup::start() else { return };
    debate(&setup);
}

/// The debate of [`a_debate_runs_on_a_real_llama_cpp_server`] on llama.cpp's `llama-server`. Not
/// in CI's time (see [`a_targeted_refinement_runs_on_llama_server`]).
#[test]
#[ignore = "longer than CI's time on two cores: run with --run-ignored"]
fn a_debate_runs_on_llama_server() {
    let Some(setup) = Setup::llama_server() else { return };
    debate(&setup);
}

/// The debate of [`a_debate_runs_on_a_real_llama_cpp_server`] through LiteLLM's proxy.
#[test]
fn a_debate_runs_behind_litellm() {
    let Some(setup) = Setup::behind_litellm() else { return };
    debate(&setup);
}

fn debate(setup: &Setup) {
    let problems = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/problems-short.jsonl");
    let out = setup.path("debate.jsonl");
    let o = setup.run(&["debate", "--data", problems.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let results = lines(&out);
    assert_eq!(results.len(), 3);
    for r in &results {
        assert_eq!(r["error"], "", "no problem failed: {r}");
        assert!(r["finalAnswer"].as_str().is_some_and(|a| !a.trim().is_empty()), "{r}");
    }
    let line = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("debate usage"))
        .unwrap_or_else(|| panic!("a usage line: {stderr}"));
    let calls: usize = line.split_whitespace().next().and_then(|n| n.parse().ok()).expect("calls");
    let abandoned: usize = line
        .split_once(" abandoned call")
        .and_then(|(before, _)| before.rsplit('(').next()?.trim().parse().ok())
        .unwrap_or(0);
    // The summary line does not split out the refused forms: the server's log does, each seen
    // refused_per_fallback times for one call counted.
    let mut served = setup.served();
    let until = Instant::now() + Duration::from_secs(10);
    while served.all - served.refused + served.refused / setup.refused_per_fallback() < calls && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
        served = setup.served();
    }
    assert_eq!(served.refused % setup.refused_per_fallback(), 0, "{served:?}");
    assert_counts_served(
        calls,
        abandoned,
        served.all - served.refused + served.refused / setup.refused_per_fallback(),
        &format!("the summary counts every call served ({served:?}): {stderr}"),
    );
}
