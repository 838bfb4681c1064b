//! A comparison of two responders that stops once decided (`stop_when_decided`): the records are
//! taken in a seeded random order, an anytime-valid confidence sequence is fed record by record,
//! and once it decides no new record is asked. Through the whole mesh on the scripted backend,
//! where model-b answers well every time and model-a weakly on two inputs in three.

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm};
use assay_tests::{MeshSandbox, assay_up, evaluation, responders_backend, watch_all};
use tonic::transport::Channel;

const RECORDS: usize = 300;

/// Generations: a schema-shaped checklist; responses: model-a weak on two inputs in three, model-b
/// strong; scorings: NO to the first question of a weak answer, YES to the rest.
fn handler(r: &RecordedRequest) -> Reply {
    responders_backend(|model, n| model == "model-a" && !n.is_multiple_of(3))(r)
}

fn responder(model: &str) -> gw::Responder {
    gw::Responder {
        model: Some(assay_proto::common::v1::ModelSpec { model: model.into(), ..Default::default() }),
        template: "Please answer: {input}".into(),
        ..Default::default()
    }
}

fn pipeline(stop: Option<gw::StopWhenDecided>) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        records: (0..RECORDS)
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

fn stop(seed: u64) -> gw::StopWhenDecided {
    gw::StopWhenDecided { seed: Some(seed), ..Default::default() }
}

fn request(p: gw::ChecklistEvalPipeline) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest {
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)),
        ..Default::default()
    }
}

async fn run(client: &mut GatewayServiceClient<Channel>, p: gw::ChecklistEvalPipeline) -> Vec<gw::RunEvent> {
    let mut stream = client.run_pipeline(request(p)).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        events.extend(m.event);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_difference_stops_the_run_early_and_the_backend_serves_less_than_half() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);

    let events = run(&mut client, pipeline(Some(stop(7)))).await;
    let served = sandbox.llm.request_count();
    let e = evaluation(events.last().unwrap()).expect("an evaluation");
    let q = e.sequential.clone().expect("the sequential result");
    let c = &q.comparisons[0];
    assert_eq!((c.baseline.as_str(), c.candidate.as_str()), ("model-a", "model-b"));
    assert_eq!(c.decision, gw::SequentialDecision::Better as i32, "{q:?}");
    assert!(c.low > 0.0 && c.mean_difference > 0.0, "{c:?}");
    assert!(q.stopped_early && q.records_used >= 30 && (q.records_used as usize) < RECORDS, "{q:?}");
    assert_eq!(q.seed, 7);
    // Every record asked has both responses judged; the others are listed, not failed.
    let asked = RECORDS - q.records_not_asked.len();
    assert_eq!(e.results.len(), 2 * asked);
    assert!(e.results.iter().all(|r| r.score.is_some()), "no record failed");
    assert!(e.responders.iter().all(|r| r.missing.is_empty()), "records not asked are not missing: {:?}", e.responders);
    let Some(Event::Completed(done)) = &events.last().unwrap().event else { panic!("no completion") };
    assert_eq!(done.state, gw::RunState::Succeeded as i32);
    // What the backend served: a generation, two responses and two scorings per record asked, less
    // than half of the full run's, and what the run says it spent.
    let full = RECORDS * 5;
    assert_eq!(served, asked * 5, "{asked} records asked");
    assert!(served * 2 < full, "served {served} of a full run's {full}");
    assert_eq!(e.usage.as_ref().unwrap().calls as usize, served);
    assert_eq!(q.calls_saved as usize, 5 * q.records_not_asked.len());
    // The interval as it narrowed: at most one update a second, records used growing.
    let updates: Vec<(&gw::ComparisonUpdated, &prost_types::Timestamp)> = events
        .iter()
        .filter_map(|ev| match &ev.event {
            Some(Event::ComparisonUpdated(u)) => Some((u, ev.time.as_ref().unwrap())),
            _ => None,
        })
        .collect();
    assert!(!updates.is_empty(), "the comparison was said");
    for pair in updates.windows(2) {
        let gap = (pair[1].1.seconds - pair[0].1.seconds) as f64 + f64::from(pair[1].1.nanos - pair[0].1.nanos) / 1e9;
        assert!(gap >= 0.99, "updates {gap:.3} s apart");
        assert!(pair[1].0.records_used > pair[0].0.records_used);
    }

    // The same request again: the same order, the same decision at the same record.
    let again = evaluation(run(&mut client, pipeline(Some(stop(7)))).await.last().unwrap()).unwrap();
    let q2 = again.sequential.unwrap();
    assert_eq!((q2.records_used, q2.comparisons[0].decision), (q.records_used, c.decision));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_settings_are_checked_naming_the_field() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut one = pipeline(Some(stop(1)));
    one.responders.truncate(1);
    let alpha = pipeline(Some(gw::StopWhenDecided { alpha: 0.9, ..stop(1) }));
    let margin = pipeline(Some(gw::StopWhenDecided { margin: Some(1.5), ..stop(1) }));
    let min = pipeline(Some(gw::StopWhenDecided { min_records: 1000, ..stop(1) }));
    for (p, field) in [
        (one, "pipeline.stop_when_decided"),
        (alpha, "pipeline.stop_when_decided.alpha"),
        (margin, "pipeline.stop_when_decided.margin"),
        (min, "pipeline.stop_when_decided.min_records"),
    ] {
        let e = client.run_pipeline(request(p)).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    let open = gw::RunPipelineRequest { open: true, ..request(pipeline(Some(stop(1)))) };
    let e = client.run_pipeline(open).await.expect_err("refused");
    assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("inline runs only"), "{e:?}");
    assert_eq!(sandbox.llm.request_count(), 0, "nothing asked");
    sandbox.shutdown().await.unwrap();
}

/// SIGKILL of `assay up` mid-run: the restarted gateway reads the stored results back in the run's
/// order and reaches the same decision at the same record as a run never killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_midway_reaches_the_same_decision_at_the_same_record() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let (mut child, url) = assay_up(&store, &llm.base_url(), &[]).await;
    let connect = |url: String| async move {
        GatewayServiceClient::new(Channel::from_shared(url).unwrap().connect().await.expect("connect"))
    };
    let mut client = connect(url).await;
    let clean = evaluation(run(&mut client, pipeline(Some(stop(11)))).await.last().unwrap()).unwrap();
    let clean = clean.sequential.unwrap();

    // Kill early, and late: after three quarters of the clean run's results (past its decision).
    let total = 2 * (RECORDS - clean.records_not_asked.len());
    for kill_at in [20, total * 3 / 4] {
        let mut stream = client.run_pipeline(request(pipeline(Some(stop(11))))).await.unwrap().into_inner();
        let (mut run_id, mut scored) = (String::new(), 0);
        while scored < kill_at {
            let ev = stream.message().await.unwrap().expect("the run goes on").event.unwrap();
            run_id.clone_from(&ev.run_id);
            scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
        }
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reaped");
        drop(stream);
        let (next, url) = assay_up(&store, &llm.base_url(), &[]).await;
        child = next;
        client = connect(url).await;
        let events = watch_all(&mut client, &run_id).await;
        let resumed = evaluation(events.last().unwrap()).expect("an evaluation").sequential.unwrap();
        assert_eq!(resumed.records_used, clean.records_used, "killed after {kill_at}: {resumed:?} vs {clean:?}");
        assert_eq!(resumed.comparisons[0].decision, clean.comparisons[0].decision);
        assert_eq!(resumed.comparisons[0].pairs, clean.comparisons[0].pairs);
        assert!(resumed.stopped_early);
    }
    child.start_kill().ok();
    child.wait().await.ok();
}
