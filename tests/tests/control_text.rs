//! The caller's text of a ControlRun (actor, reason) against log injection, over the whole mesh on
//! loopback: a control character in either (NUL, ESC, CR, LF, DEL, a C1 control) is refused with
//! INVALID_ARGUMENT naming the field in its BadRequest details, before the run is touched (it was
//! written raw into the gateway's INFO line: a forged log line); and the text that is accepted
//! reaches the log line quoted and escaped, never raw.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::control_run_request::Action;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_testkit::{Gate, RecordedRequest, Reply};
use assay_tests::MeshSandbox;
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

type Client = GatewayServiceClient<Channel>;

/// Every formatted log record of this process (plain text, as a terminal or a file shows it).
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || assay_tests::LogCapture(sink.clone()))
            .finish();
        tracing_subscriber::util::SubscriberInitExt::try_init(subscriber).expect("the only subscriber");
        buffer
    })
}

fn answer(_: &RecordedRequest) -> Reply {
    Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})).usage(10, 5)
}

/// A checklist evaluation of one record whose model call is held at `gate`: its run id, live.
async fn held_run(sandbox: &MeshSandbox, client: &mut Client, gate: &Gate) -> String {
    let g = gate.clone();
    sandbox.llm.set_handler(move |r| answer(r).gated(&g));
    let pipeline = assay_tests::one_leaves_record();
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
        label: "control text".into(),
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

async fn get(client: &mut Client, run_id: &str) -> gw::Run {
    client.get_run(gw::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap()
}

fn control(run_id: &str, action: Action, actor: &str, reason: &str) -> gw::ControlRunRequest {
    gw::ControlRunRequest { run_id: run_id.into(), action: Some(action), actor: actor.into(), reason: reason.into() }
}

#[tokio::test]
async fn control_characters_in_actor_or_reason_are_refused_and_accepted_text_is_logged_escaped() {
    let logs = logs();
    let sandbox = MeshSandbox::start().await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let gate = Gate::new();
    let run_id = held_run(&sandbox, &mut client, &gate).await;
    let pause = || Action::Pause(gw::PauseRun {});

    // A forged INFO line, a terminal escape (clear screen), a NUL, a tab, a DEL, a C1 control.
    let forged = "ops\n2026-01-01T00:00:00.000000Z  INFO assay_gateway: run control run_id=x actor=admin";
    let cases = [
        ("actor", forged, "U+000A at character 3"),
        ("actor", "ops\r", "U+000D at character 3"),
        ("actor", "\u{1b}[2Jops", "U+001B at character 0"),
        ("actor", "o\0ps", "U+0000 at character 1"),
        ("actor", "o\tps", "U+0009 at character 1"),
        ("reason", "routine\u{7f}", "U+007F at character 7"),
        ("reason", "routine\u{9b}31m", "U+009B at character 7"),
        ("reason", "fine\r\n\u{1b}[1A\u{1b}[2K forged", "U+000D at character 4"),
    ];
    for (field, text, says) in cases {
        let (actor, reason) = if field == "actor" { (text, "routine") } else { ("ops", text) };
        for run in [run_id.as_str(), "no-such-run"] {
            let status = client.control_run(control(run, pause(), actor, reason)).await.expect_err("refused");
            assert_eq!(status.code(), Code::InvalidArgument, "{field} {text:?} on {run}: {status:?}");
            let violations = status.get_details_bad_request().expect("BadRequest details").field_violations;
            assert_eq!(violations.len(), 1, "{violations:?}");
            assert_eq!(violations[0].field, field, "{violations:?}");
            let description = &violations[0].description;
            assert!(
                description.contains("must not contain control characters") && description.contains(says),
                "{description}"
            );
        }
    }
    // Nothing was taken: the run still runs, its audit log empty, and no line logged the text.
    let run = get(&mut client, &run_id).await;
    assert_eq!(run.state, gw::RunState::Running as i32, "{run:?}");
    assert!(run.audit_log.is_empty(), "{:?}", run.audit_log);
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
    assert!(!text.contains("actor=admin") && !text.contains('\u{1b}'), "{text}");

    // Text without control characters is taken, and logged quoted and escaped: a line or
    // paragraph separator, a right-to-left override, quotes and a backslash are shown as escapes.
    let actor = "Zoë \"lead\" \\ ops\u{2028}INFO forged";
    let reason = "checking\u{202e}txt.exe";
    let paused = client.control_run(control(&run_id, pause(), actor, reason)).await.expect("taken").into_inner();
    assert_eq!(paused.run.expect("the run").state, gw::RunState::Paused as i32);
    let run = get(&mut client, &run_id).await;
    let entry = run.audit_log.last().expect("an audit entry");
    assert_eq!(entry.actor, actor, "stored as sent");
    assert!(entry.detail.contains(reason), "{entry:?}");
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).to_string();
    let line =
        text.lines().find(|l| l.contains("run control") && l.contains(&run_id)).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(r#"actor="Zoë \"lead\" \\ ops\u{2028}INFO forged""#), "{line}");
    assert!(line.contains(r#"reason="checking\u{202e}txt.exe""#), "{line}");
    assert!(!text.contains('\u{2028}') && !text.contains('\u{202e}'), "{text}");

    let resumed = client.control_run(control(&run_id, Action::Resume(gw::ResumeRun {}), "ops", "")).await;
    assert_eq!(resumed.expect("resumed").into_inner().run.expect("the run").state, gw::RunState::Running as i32);
    gate.open();
    sandbox.shutdown().await.unwrap();
}
