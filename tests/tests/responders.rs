//! Responders: a checklist evaluation that asks the models under test itself. Two responders x 30
//! inputs with the tick preset through the whole mesh on the scripted backend: one checklist
//! generation per input (not per responder), one response and one scoring per (input, responder);
//! the responders' comparison equals CompareRuns' analysis of their results; a re-run with a third
//! responder (response cache on) asks only the new one.

use std::collections::BTreeMap;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, SandboxOptions, responders_backend};

const INPUTS: usize = 30;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Calls {
    generations: usize,
    responses: usize,
    scorings: usize,
}

/// What kind of call a request is: a checklist generation (its schema is named `checklist`), a
/// scoring (another schema), or a responder's answer (free text).
fn kind(r: &RecordedRequest) -> &'static str {
    match r.body.pointer("/response_format/json_schema/name").and_then(|n| n.as_str()) {
        Some("checklist") => "generation",
        Some(_) => "scoring",
        None => "response",
    }
}

fn count(calls: &[RecordedRequest]) -> Calls {
    let mut c = Calls::default();
    for r in calls {
        match kind(r) {
            "generation" => c.generations += 1,
            "scoring" => c.scorings += 1,
            _ => c.responses += 1,
        }
    }
    c
}

/// Generations: a schema-shaped checklist; responses: model-a answers well, model-b well on two
/// inputs in three, model-c badly on every other; scorings: YES to every question of a good answer,
/// NO to the first question of a weak one.
fn handler(r: &RecordedRequest) -> Reply {
    let weak = |model: &str, n: usize| match model {
        "model-b" => n.is_multiple_of(3),
        "model-c" => n.is_multiple_of(2),
        _ => false,
    };
    responders_backend(weak)(r)
}

fn responder(model: &str) -> gw::Responder {
    gw::Responder {
        model: Some(assay_proto::common::v1::ModelSpec { model: model.into(), ..Default::default() }),
        template: "Please answer: {input}".into(),
        ..Default::default()
    }
}

fn pipeline(responders: Vec<gw::Responder>) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        records: (0..INPUTS)
            .map(|i| gw::EvalRecord {
                id: format!("q{i}"),
                input: format!("What about topic {i}?"),
                ..Default::default()
            })
            .collect(),
        responders,
        ..Default::default()
    }
}

async fn evaluate(sandbox: &MeshSandbox, responders: Vec<gw::Responder>) -> gw::EvaluateResponse {
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    client
        .evaluate(gw::EvaluateRequest { pipeline: Some(pipeline(responders)), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_responders_share_each_inputs_checklist_and_are_compared_as_compare_runs_does() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { cache: true, ..Default::default() }).await;
    sandbox.llm.set_handler(handler);
    let e = evaluate(&sandbox, vec![responder("model-a"), responder("model-b")]).await;

    // One generation per input, shared; one response and one scoring per (input, responder).
    assert_eq!(
        count(&sandbox.llm.requests()),
        Calls { generations: INPUTS, responses: 2 * INPUTS, scorings: 2 * INPUTS }
    );
    // Each response went through the responder's template to its model.
    let asked: Vec<(String, String)> = sandbox
        .llm
        .requests()
        .iter()
        .filter(|r| kind(r) == "response")
        .map(|r| (r.body["model"].as_str().unwrap_or_default().to_string(), r.last_user_message().unwrap_or_default()))
        .collect();
    assert!(asked.iter().any(|(m, p)| m == "model-a" && p == "Please answer: What about topic 7?"), "{asked:?}");

    // One result per (record, responder), record by record, with the response; both responders of
    // a record were scored against the same checklist.
    assert_eq!(e.results.len(), 2 * INPUTS);
    for i in 0..INPUTS {
        let (a, b) = (&e.results[2 * i], &e.results[2 * i + 1]);
        assert_eq!((a.record_id.as_str(), a.responder.as_str()), (format!("q{i}").as_str(), "model-a"));
        assert_eq!((b.record_id.as_str(), b.responder.as_str()), (format!("q{i}").as_str(), "model-b"));
        assert_eq!(a.checklist_id, b.checklist_id, "one checklist per input");
        assert_eq!(a.response, format!("A strong answer about {i}, by model-a."));
        assert!(a.score.is_some() && b.score.is_some(), "{a:?} {b:?}");
    }

    // Per responder: its aggregate, its answering cost.
    let names: Vec<&str> = e.responders.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["model-a", "model-b"]);
    for r in &e.responders {
        assert_eq!((r.responses, r.failed), (INPUTS as u32, 0));
        assert_eq!(r.usage.as_ref().unwrap().calls, INPUTS as u32, "answering calls of {}", r.name);
    }
    let (ma, mb) = (
        e.responders[0].aggregate.as_ref().unwrap().mean_primary_score,
        e.responders[1].aggregate.as_ref().unwrap().mean_primary_score,
    );
    assert!(ma > mb, "model-b is weaker on a third of the inputs: {ma} vs {mb}");

    // The comparison is CompareRuns' on the two responders' results, to 1e-12.
    assert_eq!(e.comparisons.len(), 1);
    let c = &e.comparisons[0];
    assert_eq!((c.baseline_run_id.as_str(), c.candidate_run_id.as_str()), ("model-a", "model-b"));
    let side = |name: &str| gw::EvaluateResponse {
        results: e.results.iter().filter(|r| r.responder == name).cloned().collect(),
        ..Default::default()
    };
    use assay_domain::stats::runs::{CompareOptions, RunMetric, compare_runs};
    let metric = RunMetric::Primary;
    let report = compare_runs(
        &assay_proto::convert::runs::run_results(&side("model-a"), metric),
        &assay_proto::convert::runs::run_results(&side("model-b"), metric),
        CompareOptions {
            metric,
            alpha: 0.05,
            seed: assay_domain::stats::DEFAULT_BOOTSTRAP_SEED,
            min_effect: Some(0.0),
        },
    )
    .unwrap();
    let want = assay_proto::convert::runs::comparison_to("model-a".into(), "model-b".into(), &report);
    assert_eq!(c.n_pairs, Some(INPUTS as u32));
    for (x, y, what) in
        [(c.diff, want.diff, "diff"), (c.ci_low, want.ci_low, "ci_low"), (c.ci_high, want.ci_high, "ci_high")]
    {
        assert!((x - y).abs() < 1e-12, "{what}: {x} vs {y}");
    }
    assert_eq!(c.method, want.method);
    assert!(c.diff < 0.0 && c.gate.as_ref().is_some_and(|g| g.regressed), "{c:?}");

    // A third responder: only its responses and scorings are new (checklists, the first two
    // responders' answers and scorings come from the response cache).
    let before = count(&sandbox.llm.requests());
    let again = evaluate(&sandbox, vec![responder("model-a"), responder("model-b"), responder("model-c")]).await;
    let after = count(&sandbox.llm.requests());
    assert_eq!(
        Calls {
            generations: after.generations - before.generations,
            responses: after.responses - before.responses,
            scorings: after.scorings - before.scorings,
        },
        Calls { generations: 0, responses: INPUTS, scorings: INPUTS }
    );
    assert_eq!(again.comparisons.len(), 2);
    let by: BTreeMap<&str, f64> = again.comparisons.iter().map(|c| (c.candidate_run_id.as_str(), c.diff)).collect();
    assert!((by["model-b"] - c.diff).abs() < 1e-12, "the same comparison again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_responders_are_named() {
    let sandbox = MeshSandbox::start().await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut p = pipeline(vec![
        gw::Responder { name: "x".into(), samples: 11, ..responder("model-a") },
        gw::Responder { name: "x".into(), ..responder("model-b") },
    ]);
    p.records[3].input = String::new();
    let status =
        client.evaluate(gw::EvaluateRequest { pipeline: Some(p), ..Default::default() }).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    use tonic_types::StatusExt;
    let fields: Vec<String> =
        status.get_details_bad_request().unwrap().field_violations.into_iter().map(|f| f.field).collect();
    for f in ["pipeline.responders[0].samples", "pipeline.responders[1].name", "pipeline.records[3].input"] {
        assert!(fields.iter().any(|x| x == f), "{f} in {fields:?}");
    }
    // A matrix past the results a run holds: refused, the count and the limit stated.
    let mut p = pipeline(vec![responder("model-a"), responder("model-b")]);
    p.records = (0..5_001)
        .map(|i| gw::EvalRecord { id: format!("q{i}"), input: format!("What about topic {i}?"), ..Default::default() })
        .collect();
    let status =
        client.evaluate(gw::EvaluateRequest { pipeline: Some(p), ..Default::default() }).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let v = status.get_details_bad_request().unwrap().field_violations;
    assert_eq!(v[0].field, "pipeline.responders");
    assert!(v[0].description.contains("10002 responses") && v[0].description.contains("limit is 10000"), "{v:?}");
    assert_eq!(sandbox.llm.request_count(), 0);
}

/// `assay eval --respond A --respond B`: the per-responder lines and comparison on standard
/// error, `--out` one line per (record, responder) with its response, `--json` the summary with
/// `responders` and `comparisons`; `--fail-on-regression` exits 1 when the second is significantly
/// worse, 0 when it is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assay_eval_respond_compares_models_and_gates_on_a_regression() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { cache: true, ..Default::default() }).await;
    sandbox.llm.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = (0..INPUTS)
        .map(|i| serde_json::json!({"id": format!("q{i}"), "input": format!("What about topic {i}?")}).to_string())
        .collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let template = dir.path().join("v1.txt");
    std::fs::write(&template, "Please answer: {input}\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let eval = |models: &[&str], gate: bool, json: bool| {
        let mut cmd = tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"));
        cmd.args(["eval", "--preset", "tick", "--gateway", &sandbox.gateway_url()]);
        cmd.arg("--data").arg(&data).arg("--out").arg(&out).arg("--respond-template").arg(&template);
        for m in models {
            cmd.args(["--respond", m]);
        }
        if gate {
            cmd.arg("--fail-on-regression");
        }
        if json {
            cmd.arg("--json");
        }
        cmd.output()
    };
    let run = eval(&["openai:model-a", "openai:model-b"], true, false).await.unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "model-b is worse: {stderr}");
    assert!(stderr.contains(&format!(": {} responses, 0 failed;", 2 * INPUTS)), "{stderr}");
    assert!(stderr.contains("responder model-a: mean primary"), "{stderr}");
    assert!(stderr.contains("model-b vs model-a: diff -"), "{stderr}");
    assert!(stderr.contains("significantly worse"), "{stderr}");
    // Lines come as records are scored: in record order once sorted by index.
    let mut written: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    written.sort_by_key(|l| l["index"].as_u64());
    assert_eq!(written.len(), 2 * INPUTS);
    assert_eq!((written[1]["id"].as_str(), written[1]["responder"].as_str()), (Some("q0"), Some("model-b")));
    assert_eq!(written[0]["response"], "A strong answer about 0, by model-a.");

    // Without the gate: 0; and --json carries the responders and the comparison.
    let run = eval(&["openai:model-a", "openai:model-b"], false, true).await.unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let stdout = String::from_utf8_lossy(&run.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["responders"].as_array().unwrap().len(), 2, "{summary}");
    assert_eq!(summary["comparisons"][0]["candidateRunId"], "model-b");
    assert_eq!(summary["comparisons"][0]["nPairs"], INPUTS);

    // `assay compare RUN RUN --responder model-a --responder model-b` gives the run's comparison.
    let run_id = summary["runId"].as_str().unwrap().to_string();
    let compared = tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"))
        .args(["compare", &run_id, &run_id, "--responder", "model-a", "--responder", "model-b", "--json"])
        .args(["--gateway", &sandbox.gateway_url()])
        .output()
        .await
        .unwrap();
    assert_eq!(compared.status.code(), Some(0), "{}", String::from_utf8_lossy(&compared.stderr));
    let report: serde_json::Value = serde_json::from_slice(&compared.stdout).unwrap();
    let (d1, d2) = (report["diff"].as_f64().unwrap(), summary["comparisons"][0]["diff"].as_f64().unwrap());
    assert!((d1 - d2).abs() < 1e-12, "{d1} vs {d2}");
    let unknown = tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"))
        .args(["compare", &run_id, &run_id, "--responder", "model-a", "--responder", "model-z"])
        .args(["--gateway", &sandbox.gateway_url()])
        .output()
        .await
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("no responder \"model-z\"; its responders: model-a, model-b")
    );

    // A candidate that is not worse passes the gate.
    let run = eval(&["openai:model-a", "openai:model-a2"], true, false).await.unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));

    // Streamed into an open run (`--open`, as a file past the request limit is): the same lines,
    // the same comparison, the same gate.
    let streamed = tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"))
        .args([
            "eval",
            "--preset",
            "tick",
            "--open",
            "--json",
            "--fail-on-regression",
            "--gateway",
            &sandbox.gateway_url(),
        ])
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .arg("--respond-template")
        .arg(&template)
        .args(["--respond", "openai:model-a", "--respond", "openai:model-b"])
        .output()
        .await
        .unwrap();
    assert_eq!(streamed.status.code(), Some(1), "model-b is worse: {}", String::from_utf8_lossy(&streamed.stderr));
    let open: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&streamed.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(
        (open["resultsPaged"].as_bool(), open["comparisons"][0]["nPairs"].as_u64()),
        (Some(true), Some(INPUTS as u64))
    );
    let (d1, d2) =
        (open["comparisons"][0]["diff"].as_f64().unwrap(), summary["comparisons"][0]["diff"].as_f64().unwrap());
    assert!((d1 - d2).abs() < 1e-12, "{d1} vs {d2}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2 * INPUTS);
    assert_eq!((lines[3]["id"].as_str(), lines[3]["responder"].as_str()), (Some("q1"), Some("model-b")));
}

/// A dataset as it comes: a CSV file with its own column names, mapped with `--input-field`,
/// `--target-field` and `--id-field`, evaluates; a column that is not there is refused before any
/// run, naming it, its flag and the line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csv_with_its_own_column_names_evaluates_and_a_missing_column_is_named() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(assay_tests::leaves_judge(std::time::Duration::ZERO));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("hub.csv");
    std::fs::write(
        &data,
        "qid,question,answer\nk1,\"Describe autumn, briefly.\",Falling leaves.\nk2,Describe stone.,Grey stones.\n",
    )
    .unwrap();
    let checklist = dir.path().join("checklist.json");
    std::fs::write(&checklist, r#"["Mentions leaves?", "Is it short?"]"#).unwrap();
    let out = dir.path().join("out.jsonl");
    let score = |input_field: &str| {
        tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"))
            .args(["score", "--gateway", &sandbox.gateway_url()])
            .arg("--checklist")
            .arg(&checklist)
            .arg("--data")
            .arg(&data)
            .arg("--out")
            .arg(&out)
            .args(["--input-field", input_field, "--target-field", "answer", "--id-field", "qid"])
            .output()
    };
    let ok = score("question").await.unwrap();
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut ids: Vec<&str> = lines.iter().map(|l| l["id"].as_str().unwrap()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["k1", "k2"]);
    let asked = sandbox.llm.requests();
    assert!(asked.iter().any(|r| r.last_user_message().unwrap_or_default().contains("Falling leaves.")));

    let before = sandbox.llm.request_count();
    let bad = score("prompt").await.unwrap();
    assert_eq!(bad.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("hub.csv:1") && stderr.contains("\"prompt\"") && stderr.contains("--input-field"),
        "{stderr}"
    );
    assert_eq!(sandbox.llm.request_count(), before, "nothing asked");
}

/// A budget that runs out midway through a two-responder evaluation: the records are answered and
/// judged together, so those before it have both responders scored (at most the few in flight when
/// it ran out are split), checklists are generated only a round (`concurrency`) ahead of the records
/// judged, the spend stays within the budget, and each responder names the records it has no
/// scored response for; the comparison is paired on exactly the complete records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_stopped_matrix_keeps_complete_pairs_and_names_the_missing_ones() {
    const PER_CALL: u64 = 110;
    const BUDGET: u64 = 70 * PER_CALL;
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| handler(r).usage(100, 10));
    let mut p = pipeline(vec![responder("model-a"), responder("model-b")]);
    p.concurrency = 4;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let e = client
        .evaluate(gw::EvaluateRequest {
            pipeline: Some(p),
            budget: Some(gw::RunBudget { max_tokens: Some(BUDGET), max_cost_usd: None }),
        })
        .await
        .unwrap()
        .into_inner();

    // What the scripted server served is what the run says it spent, within the budget.
    let served = count(&sandbox.llm.requests());
    let calls = served.generations + served.responses + served.scorings;
    let usage = e.usage.clone().unwrap();
    assert_eq!(u64::from(usage.calls), calls as u64, "{usage:?}");
    assert!(calls as u64 * PER_CALL <= BUDGET, "{calls} calls of {PER_CALL} tokens against {BUDGET}");
    assert!(e.budget_exhausted.starts_with("budget exhausted"), "{}", e.budget_exhausted);
    let answering: u32 = e.responders.iter().map(|r| r.usage.as_ref().unwrap().calls).sum();
    assert_eq!(answering as usize, served.responses, "answering calls per responder add up");

    // Every (record, responder) has its result: scored, or not run because the budget stopped.
    assert_eq!(e.results.len(), 2 * INPUTS);
    let scored = |i: usize, name: &str| {
        e.results.iter().any(|r| r.record_id == format!("q{i}") && r.responder == name && r.score.is_some())
    };
    for r in e.results.iter().filter(|r| r.score.is_none()) {
        assert!(r.error.starts_with("not run: budget exhausted"), "{r:?}");
    }
    let complete: Vec<usize> = (0..INPUTS).filter(|i| scored(*i, "model-a") && scored(*i, "model-b")).collect();
    let split = (0..INPUTS).filter(|i| scored(*i, "model-a") != scored(*i, "model-b")).count();
    assert!(complete.len() >= 5, "records answered and judged by both before the budget ran out: {complete:?}");
    assert!(complete.len() < INPUTS, "the budget stopped the run: {complete:?}");
    // Checklists are generated a round of records ahead of those judged, not for every input.
    let judged = (0..INPUTS).filter(|i| scored(*i, "model-a")).count();
    assert!(served.generations <= judged + 4, "{} generations for {judged} records judged", served.generations);
    assert!(split <= 2, "only records in flight when it ran out are split: {split}");

    // Each responder names the records it has no scored response for; the comparison pairs the
    // complete records.
    for r in &e.responders {
        let want: Vec<String> = (0..INPUTS).filter(|i| !scored(*i, &r.name)).map(|i| format!("q{i}")).collect();
        assert_eq!(r.missing, want, "{}", r.name);
    }
    let c = &e.comparisons[0];
    assert!(c.paired && c.n_pairs == Some(complete.len() as u32), "paired on the complete records: {c:?}");
    let unscored = |name: &str| -> Vec<String> {
        let mut ids: Vec<String> = (0..INPUTS).filter(|i| !scored(*i, name)).map(|i| format!("q{i}")).collect();
        ids.sort_unstable(); // by id
        ids
    };
    assert_eq!((c.unscored_baseline.clone(), c.unscored_candidate.clone()), (unscored("model-a"), unscored("model-b")));
}

/// An open run with two responders: records come inline and in an append that seals it; every
/// record x responder is answered and scored once, each result stored as its own row (paged by
/// ListRunResults, labelled with its responder and response); the run's verdict (per-responder
/// aggregates, the comparison) equals that of the same records evaluated whole, which the
/// response cache then serves without a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_takes_responders_and_gives_the_same_verdict_as_a_whole_one() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { cache: true, ..Default::default() }).await;
    sandbox.llm.set_handler(handler);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut p = pipeline(vec![responder("model-a"), responder("model-b")]);
    let rest = p.records.split_off(10);
    let (run_id, mut events) = assay_tests::start_open_run(&mut client, p, "open matrix", None).await;
    let reply = client
        .append_records(futures::stream::iter(vec![gw::AppendRecordsRequest {
            run_id: run_id.clone(),
            records: rest,
            seal: true,
        }]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((reply.records_total, reply.sealed), (INPUTS as u64, true));
    while events.message().await.unwrap().is_some() {}
    let run = client.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner().run.unwrap();
    assert_eq!((run.state, run.records_total, run.records_done), (gw::RunState::Succeeded as i32, 60, 60));
    assert_eq!(
        count(&sandbox.llm.requests()),
        Calls { generations: INPUTS, responses: 2 * INPUTS, scorings: 2 * INPUTS }
    );
    let Some(gw::run_result::Result::ChecklistEval(open)) = run.result.and_then(|r| r.result) else {
        panic!("no evaluation")
    };
    assert!(open.results_paged && open.results.is_empty());

    // One row per (record, responder), in record order, labelled.
    let (rows, pages) = assay_tests::all_results(&mut client, &run_id, 25).await;
    assert_eq!(pages, 3);
    assert_eq!(rows.len(), 2 * INPUTS);
    for (t, r) in rows.iter().enumerate() {
        let (i, name) = (t / 2, if t % 2 == 0 { "model-a" } else { "model-b" });
        assert_eq!((r.index as usize, r.record_id.clone(), r.responder.as_str()), (t, format!("q{i}"), name));
        assert_eq!(
            r.response,
            format!(
                "A {} answer about {i}, by {name}.",
                if name == "model-b" && i % 3 == 0 { "weak" } else { "strong" }
            )
        );
        assert!(r.score.is_some(), "{r:?}");
    }

    // The same verdict as the records evaluated whole (every call now from the cache).
    let before = sandbox.llm.request_count();
    let whole = evaluate(&sandbox, vec![responder("model-a"), responder("model-b")]).await;
    assert_eq!(sandbox.llm.request_count(), before, "the whole run is served by the cache");
    assert_eq!(open.responders.len(), 2);
    for (a, b) in open.responders.iter().zip(&whole.responders) {
        assert_eq!((&a.name, a.responses, a.failed, &a.missing), (&b.name, b.responses, b.failed, &b.missing));
        let (ma, mb) =
            (a.aggregate.as_ref().unwrap().mean_primary_score, b.aggregate.as_ref().unwrap().mean_primary_score);
        assert!((ma - mb).abs() < 1e-12, "{}: {ma} vs {mb}", a.name);
        assert_eq!(a.usage.as_ref().unwrap().calls, INPUTS as u32, "answering calls of {}", a.name);
    }
    let (c, w) = (&open.comparisons[0], &whole.comparisons[0]);
    assert_eq!((c.n_pairs, c.method), (Some(INPUTS as u32), w.method));
    for (x, y, what) in [(c.diff, w.diff, "diff"), (c.ci_low, w.ci_low, "ci_low"), (c.ci_high, w.ci_high, "ci_high")] {
        assert!((x - y).abs() < 1e-12, "{what}: {x} vs {y}");
    }
    assert!(c.gate.as_ref().is_some_and(|g| g.regressed), "model-b is worse: {c:?}");
}

/// An open run with two responders through `assay up` on SQLite, killed (SIGKILL) once a third of
/// its calls are served and started again on the same store: the run is taken back, every
/// (record, responder) has one scored result, in order, and what is asked again is at most what
/// was in flight at the kill (stored answers are not asked again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_matrix_killed_midway_resumes_asking_only_what_was_in_flight() {
    const N: usize = 600;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let llm = assay_testkit::ScriptedLlm::start().await;
    llm.set_handler(|r| handler(r).delay(std::time::Duration::from_millis(5)));
    let (mut up, gateway) = assay_tests::assay_up(&store, &llm.base_url(), &[]).await;
    let mut client = GatewayServiceClient::connect(gateway).await.unwrap();
    let mut p = pipeline(vec![responder("model-a"), responder("model-b")]);
    p.records.clear();
    let (run_id, _events) = assay_tests::start_open_run(&mut client, p, "open matrix", None).await;
    let records: Vec<gw::EvalRecord> = (0..N)
        .map(|i| gw::EvalRecord { id: format!("q{i}"), input: format!("What about topic {i}?"), ..Default::default() })
        .collect();
    let message = gw::AppendRecordsRequest { run_id: run_id.clone(), records, seal: true };
    client.append_records(futures::stream::iter(vec![message])).await.unwrap();
    let all = 5 * N; // a generation, two answers and two scorings per input
    assert!(assay_testkit::eventually(std::time::Duration::from_secs(60), || llm.request_count() >= all / 3).await);
    up.start_kill().unwrap();
    up.wait().await.unwrap();
    let before = count(&llm.requests());
    assert!(before.scorings < 2 * N, "killed before the end: {before:?}");

    let (mut up, gateway) = assay_tests::assay_up(&store, &llm.base_url(), &[]).await;
    let mut client = GatewayServiceClient::connect(gateway).await.unwrap();
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 0 }).await.unwrap().into_inner();
    while watch.message().await.unwrap().is_some() {}
    let run = client.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(
        (run.state, run.records_total, run.records_done),
        (gw::RunState::Succeeded as i32, 2 * N as u32, 2 * N as u32)
    );
    let (rows, _) = assay_tests::all_results(&mut client, &run_id, 500).await;
    let got: Vec<(String, String)> = rows.iter().map(|r| (r.record_id.clone(), r.responder.clone())).collect();
    let want: Vec<(String, String)> =
        (0..N).flat_map(|i| ["model-a", "model-b"].map(|m| (format!("q{i}"), m.to_string()))).collect();
    assert_eq!(got, want, "one result per (record, responder), in order");
    assert!(rows.iter().all(|r| r.score.is_some() && !r.response.is_empty()));
    let after = count(&llm.requests());
    for (what, served, once) in [
        ("answers", after.responses, 2 * N),
        ("scorings", after.scorings, 2 * N),
        ("generations", after.generations, N),
    ] {
        assert!(served >= once && served - once <= 512, "{what}: {served} served for {once}");
    }
    let Some(gw::run_result::Result::ChecklistEval(e)) = run.result.and_then(|r| r.result) else {
        panic!("no evaluation")
    };
    assert_eq!(e.responders.iter().map(|r| r.responses).collect::<Vec<_>>(), [N as u32, N as u32]);
    assert_eq!(e.comparisons[0].n_pairs, Some(N as u32));
    up.kill().await.unwrap();
}

/// One responder's model fails on the server (500 for it alone): it is shown unscored (no mean,
/// compared with nothing), and the backend stays open to the other models: the next, unrelated
/// run succeeds, every record scored (before, its breaker opened for the whole backend and the
/// next runs failed every record with "circuit open" for 20-40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_responder_model_is_unscored_and_leaves_the_backend_to_the_others() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| match r.model() {
        Some("broken-model") => {
            Reply::status(500).body(r#"{"error":{"message":"model broken-model could not be loaded"}}"#)
        }
        _ => handler(r),
    });
    let e = evaluate(&sandbox, vec![responder("model-a"), responder("broken-model")]).await;
    let broken = &e.responders[1];
    assert_eq!(broken.name, e.responders[1].name);
    assert!(broken.aggregate.is_none(), "an unscored responder has no mean: {:?}", broken.aggregate);
    assert_eq!(broken.failed, INPUTS as u32, "{broken:?}");
    assert!(e.responders[0].aggregate.is_some());
    assert!(e.comparisons.is_empty(), "nothing to compare: {:?}", e.comparisons);
    // An unrelated run right after: served, not refused by an open breaker.
    let after = evaluate(&sandbox, vec![responder("model-a")]).await;
    let failed: Vec<&str> = after.results.iter().filter(|r| r.score.is_none()).map(|r| r.error.as_str()).collect();
    assert!(failed.is_empty(), "the next run's records failed: {failed:?}");
    sandbox.shutdown().await.unwrap();
}
