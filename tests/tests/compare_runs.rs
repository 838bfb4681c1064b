//! `GatewayService.CompareRuns` through the whole mesh: 50 records evaluated by scripted judges of
//! different quality (one run per judge); CompareRuns by run id gives exactly the numbers of the
//! shared comparison core applied to the runs' records as GetRun returns them; a planted regression
//! fails the gate and an improvement passes; bad requests get the status that says why.

use assay_domain::stats::runs::{self, CompareOptions, RecordLine, RunMetric, RunResults};
use assay_domain::stats::{DEFAULT_BOOTSTRAP_SEED, Method};
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::MeshSandbox;
use serde_json::json;
use tonic_types::StatusExt;

const RECORDS: usize = 50;
const ITEMS: usize = 4;

/// Item `k` (0-based) of record `i` as the reference judge answers it: a fixed, varied pattern.
fn good(i: usize, k: usize) -> bool {
    !(i * 7 + k * 3).is_multiple_of(5) && (i + k) % 4 != 1
}

/// The judges, by the scorer model the run names: `good`; `worse` answers NO to items 1 and 2 of
/// every even record (a planted regression); `better` answers YES to every item of the records
/// divisible by 3; `refusing` answers as `good` but refuses the records divisible by 5 (a reply
/// with no answer to read).
fn judge(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    let Some(i) = prompt
        .split("record-")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse::<usize>().ok())
    else {
        // The self-refine run of the bad-request test.
        return Reply::text("<critique>\n- Fine.\n</critique>\n<revised>\nLeaves are green.\n</revised>");
    };
    let model = r.model().unwrap_or_default().to_string();
    if model == "refusing" && i % 5 == 0 {
        return Reply::text("Sorry, I can't help with that.").usage(10, 5);
    }
    let answers: Vec<serde_json::Value> = (0..ITEMS)
        .map(|k| {
            let yes = match model.as_str() {
                "worse" => good(i, k) && !(i % 2 == 0 && (k == 1 || k == 2)),
                "better" => good(i, k) || i % 3 == 0,
                _ => good(i, k),
            };
            json!({"question_index": k + 1, "answer": if yes { "YES" } else { "NO" }})
        })
        .collect();
    Reply::json(json!({ "answers": answers })).usage(10, 5)
}

fn pipeline(judge: &str) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                id: "quality".into(),
                items: (0..ITEMS)
                    .map(|k| pb::ChecklistItem {
                        id: format!("q{k}"),
                        question: format!("Does the answer meet criterion {k}?"),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
        }),
        records: (0..RECORDS)
            .map(|i| gw::EvalRecord {
                id: format!("r{i:02}"),
                input: "Explain photosynthesis.".into(),
                target: format!("answer of record-{i} about leaves"),
                ..Default::default()
            })
            .collect(),
        scorer_model: Some(pb::ModelSpec { model: judge.into(), ..Default::default() }),
        ..Default::default()
    }
}

type Client = gw::gateway_service_client::GatewayServiceClient<tonic::transport::Channel>;

/// One evaluation run by `judge`; its id.
async fn evaluate(sandbox: &MeshSandbox, judge: &str) -> String {
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(judge))).await;
    let done = events.iter().find_map(assay_tests::evaluation).expect("the run completes with an evaluation");
    assert_eq!(done.results.len(), RECORDS);
    assert!(done.results.iter().all(|r| r.error.is_empty()), "every record scored");
    events[0].run_id.clone()
}

/// The run's records as the test reads them from GetRun (not through the gateway's conversion).
async fn records(client: &mut Client, run_id: &str) -> RunResults {
    let run = client.get_run(gw::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap();
    let Some(gw::run_result::Result::ChecklistEval(e)) = run.result.and_then(|r| r.result) else {
        panic!("an evaluation")
    };
    let questions: std::collections::BTreeMap<String, String> =
        e.checklists[0].items.iter().map(|i| (i.id.clone(), i.question.clone())).collect();
    RunResults {
        records: e
            .results
            .iter()
            .map(|r| {
                let s = r.score.as_ref().unwrap();
                RecordLine {
                    id: r.record_id.clone(),
                    score: Some(s.primary_score),
                    samples: Vec::new(),
                    answers: s
                        .item_scores
                        .iter()
                        .map(|i| (i.item_id.clone(), Some(i.answer == pb::Answer::Yes as i32)))
                        .collect(),
                    questions: questions.clone(),
                }
            })
            .collect(),
    }
}

fn request(baseline: &str, candidate: &str, min_effect: Option<f64>) -> gw::CompareRunsRequest {
    gw::CompareRunsRequest {
        baseline_run_id: baseline.into(),
        candidate_run_id: candidate.into(),
        metric: gw::CompareMetric::Primary as i32,
        alpha: 0.0,
        min_effect,
        bootstrap_seed: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_runs_by_id_matches_the_core_and_gates_a_regression() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(judge);
    let good_run = evaluate(&sandbox, "good").await;
    let worse_run = evaluate(&sandbox, "worse").await;
    let better_run = evaluate(&sandbox, "better").await;
    let mut client = Client::new(sandbox.gateway().await);

    // The planted regression: by id, against the core on the records GetRun returns.
    let reply = client.compare_runs(request(&good_run, &worse_run, Some(0.0))).await.unwrap().into_inner();
    let (base, worse) = (records(&mut client, &good_run).await, records(&mut client, &worse_run).await);
    let options =
        CompareOptions { metric: RunMetric::Primary, alpha: 0.05, seed: DEFAULT_BOOTSTRAP_SEED, min_effect: Some(0.0) };
    let core = runs::compare_runs(&base, &worse, options).unwrap();
    let c = &core.comparison;
    assert_eq!(c.method, Method::PairedT);
    assert_eq!(reply.method, gw::CompareMethod::PairedT as i32);
    assert_eq!(reply.n_pairs, Some(RECORDS as u32));
    // Identical numbers, bit for bit: one core.
    assert_eq!(
        (reply.mean_baseline, reply.mean_candidate, reply.diff, reply.ci_low, reply.ci_high, reply.p_value),
        (c.mean_b, c.mean_a, c.diff, c.ci.0, c.ci.1, c.p_value)
    );
    assert_eq!((reply.variance_reduction, reply.effective_n), (c.variance_reduction, c.effective_n));
    let b = reply.bootstrap.unwrap();
    let cb = core.bootstrap.unwrap();
    assert_eq!((b.ci_low, b.ci_high, b.seed, b.resamples as usize), (cb.low, cb.high, cb.seed, cb.resamples));
    // The planted drop: items 1 and 2 on the 25 even records, where the good judge said yes.
    let planted: f64 = (0..RECORDS)
        .filter(|i| i % 2 == 0)
        .map(|i| [1, 2].iter().filter(|k| good(i, **k)).count() as f64 / ITEMS as f64)
        .sum::<f64>()
        / RECORDS as f64;
    assert!((reply.diff + planted).abs() < 1e-12, "diff {} vs planted -{planted}", reply.diff);
    let gate = reply.gate.as_ref().expect("a gate with min_effect");
    assert!(gate.regressed && gate.reason.starts_with("regression: diff -0."), "{gate:?}");
    // Flips by question text: only criteria 1 and 2 went yes->no; the worst records are even.
    let mut flipped: Vec<&str> = reply.items.iter().filter(|i| i.yes_to_no > 0).map(|i| i.item.as_str()).collect();
    flipped.sort_unstable();
    assert_eq!(flipped, ["Does the answer meet criterion 1?", "Does the answer meet criterion 2?"]);
    assert!(reply.items.iter().all(|i| i.no_to_yes == 0 && i.compared == RECORDS as u32));
    let want: Vec<(String, u32, u32)> =
        core.items.iter().map(|i| (i.item.clone(), i.yes_to_no as u32, i.no_to_yes as u32)).collect();
    let got: Vec<(String, u32, u32)> = reply.items.iter().map(|i| (i.item.clone(), i.yes_to_no, i.no_to_yes)).collect();
    assert_eq!(got, want);
    let worst: Vec<&str> = reply.worst_regressions.iter().map(|w| w.record_id.as_str()).collect();
    assert_eq!(worst, core.worst.iter().map(|w| w.id.as_str()).collect::<Vec<_>>());
    assert!(reply.worst_regressions.iter().all(|w| w.record_id[1..].parse::<usize>().unwrap() % 2 == 0));
    assert!(reply.baseline_only.is_empty() && reply.candidate_only.is_empty());

    // The improvement passes the gate (and is significant).
    let reply = client.compare_runs(request(&good_run, &better_run, Some(0.0))).await.unwrap().into_inner();
    assert!(reply.diff > 0.0 && reply.significant, "{reply:?}");
    assert!(!reply.gate.unwrap().regressed);
    // Without min_effect there is no gate; a seed changes only the bootstrap.
    let mut r = request(&good_run, &better_run, None);
    r.bootstrap_seed = Some(7);
    let seeded = client.compare_runs(r).await.unwrap().into_inner();
    assert!(seeded.gate.is_none());
    assert_eq!(seeded.bootstrap.unwrap().seed, 7);
    assert_eq!(seeded.diff, reply.diff);

    sandbox.shutdown().await.unwrap();
}

/// Issue 59, point 1: a judge reply that cannot be read scores nothing. The refusing judge's run
/// has 10 of 50 records unscored: the aggregate's mean is over the 40 scored (the good judge's
/// mean on them, not 4/5 of it), the 10 counted apart; CompareRuns pairs the 40 records scored on
/// both sides and says the 10 were left out. Before, each refusal was a primary score of 0: the
/// mean dropped by a fifth and the comparison reported a regression nobody measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_judge_reply_is_unscored_not_a_zero() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(judge);
    let good_run = evaluate(&sandbox, "good").await;
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline("refusing"))).await;
    let done = events.iter().find_map(assay_tests::evaluation).expect("an evaluation");
    let refusing_run = events[0].run_id.clone();
    let unscored: Vec<&str> = done
        .results
        .iter()
        .filter(|r| r.score.as_ref().is_some_and(|s| s.answered_count == 0))
        .map(|r| r.record_id.as_str())
        .collect();
    assert_eq!(unscored.len(), 10, "{unscored:?}");
    assert!(unscored.iter().all(|id| id[1..].parse::<usize>().unwrap() % 5 == 0));
    assert!(done.results.iter().all(|r| r.error.is_empty()), "judged, not failed");
    let a = done.aggregate.as_ref().unwrap();
    assert_eq!((a.targets, a.unscored_targets, a.unanswered_items), (50, 10, 40));
    let scored_mean = (0..RECORDS)
        .filter(|i| i % 5 != 0)
        .map(|i| (0..ITEMS).filter(|k| good(i, *k)).count() as f64 / ITEMS as f64)
        .sum::<f64>()
        / 40.0;
    assert!((a.mean_primary_score - scored_mean).abs() < 1e-12, "{} vs {scored_mean}", a.mean_primary_score);
    assert_eq!(a.uncertainty.as_ref().map(|u| u.observations), Some(40));

    let mut client = Client::new(sandbox.gateway().await);
    let reply = client.compare_runs(request(&good_run, &refusing_run, Some(0.0))).await.unwrap().into_inner();
    assert!(reply.paired, "{reply:?}");
    assert_eq!((reply.n_pairs, reply.n_baseline, reply.n_candidate), (Some(40), 40, 40));
    assert_eq!(reply.diff, 0.0, "the same answers on the records both scored");
    assert!(!reply.gate.unwrap().regressed);
    let mut left_out = reply.unscored_candidate.clone();
    left_out.sort();
    assert_eq!(left_out, unscored.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert!(
        reply.notes.iter().any(|n| n.starts_with("10 record(s) held by both runs but scored on one side")),
        "{:?}",
        reply.notes
    );
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_compare_requests_say_which_run_or_field() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(judge);
    let good_run = evaluate(&sandbox, "good").await;
    // A run of another kind.
    let events = sandbox
        .run_pipeline(gw::run_pipeline_request::Pipeline::SelfRefine(gw::SelfRefinePipeline {
            request: Some(assay_proto::refiners::v1::SelfRefineRequest {
                draft: "Leaves are green.".into(),
                instruction: "Say what colour leaves are.".into(),
                min_bytes: Some(0),
                ..Default::default()
            }),
        }))
        .await;
    let other = events[0].run_id.clone();
    let mut client = Client::new(sandbox.gateway().await);

    let s = client.compare_runs(request(&good_run, "no-such-run", None)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::NotFound, "{s:?}");
    assert!(s.message().contains("candidate run no-such-run"), "{s:?}");

    let s = client.compare_runs(request(&other, &good_run, None)).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");
    assert!(s.message().contains(&format!("baseline run {other} is a self_refine run")), "{s:?}");

    let mut r = request(&good_run, &good_run, None);
    r.alpha = 1.5;
    let s = client.compare_runs(r).await.unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let fields: Vec<String> =
        s.get_details_bad_request().unwrap().field_violations.iter().map(|v| v.field.clone()).collect();
    assert_eq!(fields, ["alpha"]);

    let s = client.compare_runs(request("", &good_run, Some(-1.0))).await.unwrap_err();
    let fields: Vec<String> =
        s.get_details_bad_request().unwrap().field_violations.iter().map(|v| v.field.clone()).collect();
    assert_eq!(fields, ["baseline_run_id", "min_effect"]);

    sandbox.shutdown().await.unwrap();
}

/// With repeated judging, each record's per-sample primary scores are its observations: CompareRuns
/// averages them per record first (the core's note says so) and matches the core on
/// `Score.sample_primary_scores`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_runs_compare_on_their_per_sample_scores() {
    let sandbox = MeshSandbox::start().await;
    // The sample's seed (0, 1, 2) shifts which items pass; `worse` fails item 0 on even records.
    sandbox.llm.set_handler(|r: &RecordedRequest| {
        let seed = r.body.get("seed").and_then(serde_json::Value::as_u64).unwrap_or(0) as usize;
        let prompt = r.last_user_message().unwrap_or_default();
        let i: usize = prompt
            .split("record-")
            .nth(1)
            .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a record number in {prompt}"));
        let worse = r.model() == Some("worse");
        let answers: Vec<serde_json::Value> = (0..ITEMS)
            .map(|k| {
                let planted = worse && k == 0 && i.is_multiple_of(2);
                let yes = !((i + k + seed).is_multiple_of(3) || planted);
                json!({"question_index": k + 1, "answer": if yes { "YES" } else { "NO" }})
            })
            .collect();
        Reply::json(json!({ "answers": answers }))
    });
    let mut ids = Vec::new();
    for judge in ["good", "worse"] {
        let mut p = pipeline(judge);
        p.scorer = Some(pb::ScorerConfig { samples: Some(3), ..Default::default() });
        let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(p)).await;
        ids.push(events[0].run_id.clone());
    }
    let mut client = Client::new(sandbox.gateway().await);
    let reply = client.compare_runs(request(&ids[0], &ids[1], None)).await.unwrap().into_inner();
    let mut sides = Vec::new();
    for id in &ids {
        let mut r = records(&mut client, id).await;
        let run = client.get_run(gw::GetRunRequest { run_id: id.clone() }).await.unwrap().into_inner().run.unwrap();
        let Some(gw::run_result::Result::ChecklistEval(e)) = run.result.and_then(|r| r.result) else { panic!() };
        for (line, result) in r.records.iter_mut().zip(&e.results) {
            line.samples = result.score.as_ref().unwrap().sample_primary_scores.clone();
            assert_eq!(line.samples.len(), 3, "three samples per record");
        }
        sides.push(r);
    }
    let options =
        CompareOptions { metric: RunMetric::Primary, alpha: 0.05, seed: DEFAULT_BOOTSTRAP_SEED, min_effect: None };
    let core = runs::compare_runs(&sides[0], &sides[1], options).unwrap();
    let c = &core.comparison;
    assert_eq!((reply.diff, reply.ci_low, reply.ci_high, reply.p_value), (c.diff, c.ci.0, c.ci.1, c.p_value));
    assert!(reply.notes.iter().any(|n| n.contains("aggregated to per-item mean")), "{:?}", reply.notes);
    assert!(reply.diff < 0.0, "{reply:?}");
    sandbox.shutdown().await.unwrap();
}
