//! `assay report`: a finished run as one file, read through a real mesh on loopback (scripted
//! OpenAI-compatible backend). A checklist evaluation with two responders (1,040 results: two
//! pages in the page), one that stopped when decided, and a targeted refinement are written as
//! HTML and Markdown by the `assay` binary; headless Chromium opens each HTML file from file://
//! (tests/python/report_page.py): no console error, the aggregates and counts the run holds, the
//! forest plots, the pager, the refinement's sections before and after, and record ids holding
//! markup shown as characters (on the page written as HTML and on the one the script builds).

use std::collections::BTreeMap;
use std::path::Path;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_testkit::prompts::{edited_text, judged_sections, prompt_of};
use assay_testkit::{RecordedRequest, Reply, hash_embedding};
use assay_tests::{MeshSandbox, SandboxOptions, responders_backend, workspace_binary};
use serde_json::{Value, json};

/// Record ids that try to run: one on the first page (written as HTML), one on the second (built
/// by the page's script).
const HOSTILE_FIRST: &str = r#"<script>window.__pwned=1</script>"#;
const HOSTILE_SECOND: &str = r#"<img src=x onerror="window.__pwned=2">|`x`"#;
/// Records of the evaluation: with two responders, 1,040 results (a page of 1,000 and one of 40).
const RECORDS: usize = 520;

fn responder(model: &str) -> gw::Responder {
    gw::Responder { model: Some(pb::ModelSpec { model: model.into(), ..Default::default() }), ..Default::default() }
}

/// `records` records answered by model-a (the baseline) and model-b, tick checklists (one per
/// distinct input: ten inputs).
fn responders_pipeline(records: usize, stop: Option<gw::StopWhenDecided>) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        records: (0..records)
            .map(|i| gw::EvalRecord {
                id: match i {
                    3 => HOSTILE_FIRST.to_string(),
                    i if i == records - 1 && stop.is_none() => HOSTILE_SECOND.to_string(),
                    i => format!("q{i}"),
                },
                input: format!("What about topic {}?", i % 10),
                ..Default::default()
            })
            .collect(),
        responders: vec![responder("model-a"), responder("model-b")],
        stop_when_decided: stop,
        ..Default::default()
    }
}

/// model-b gives a weak answer on odd topics; a weak answer fails the first question.
fn responders_handler(r: &RecordedRequest) -> Reply {
    responders_backend(|model, n| model == "model-b" && n % 2 == 1)(r).usage(40, 10)
}

// ---------------------------------------------------------------------------------------------
// A refinement world (as tests/tests/refinement_defaults.rs plays it): judges that find a factual
// error in rule72 and a missing step in example, an expander that fixes them, a delta judge that
// verifies, consistency checks that agree.
// ---------------------------------------------------------------------------------------------

const LESSON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/lesson_compound_interest.json");
const TRIPLE: &str = "for money to triple at a given yearly rate";
const DOUBLE: &str = "for money to double at a given yearly rate";
const MISSING_STEP: &str = "The growth factor is 1.004, so";
const WITH_STEP: &str = "The growth factor per period is 1 + 0.048 / 12 = 1.004, so";
const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

fn judge(prompt: &str) -> Value {
    let mut criterion: serde_json::Map<String, Value> = CRITERIA.iter().map(|c| (c.to_string(), json!(0.9))).collect();
    let mut issues = Vec::new();
    let mut section_scores = Vec::new();
    for (id, text) in judged_sections(prompt) {
        let found: Vec<(&str, &str, &str, &str)> = [
            (id == "rule72" && text.contains(TRIPLE)).then_some((
                "factual_accuracy",
                "critical",
                "The Rule of 72 estimates the doubling time, not the tripling time.",
                TRIPLE,
            )),
            (id == "example" && text.contains(MISSING_STEP)).then_some((
                "completeness",
                "major",
                "Step 3 uses the growth factor 1.004 without showing how it comes from 0.048 / 12.",
                MISSING_STEP,
            )),
        ]
        .into_iter()
        .flatten()
        .collect();
        for (c, severity, description, quote) in &found {
            criterion.insert(c.to_string(), json!(if *severity == "critical" { 0.6 } else { 0.65 }));
            issues.push(json!({"section_id": id, "criterion": c, "severity": severity,
                "description": description, "fix_instruction": format!("{description} Correct it."),
                "location": quote}));
        }
        let section = if found.is_empty() { 0.92 } else { 0.3 };
        section_scores.extend(CRITERIA.iter().map(|c| json!({"section_id": id, "criterion": c, "score": section})));
    }
    json!({"criterion_scores": criterion, "issues": issues, "section_scores": section_scores})
}

fn refinement_handler(r: &RecordedRequest) -> Reply {
    if r.is_embeddings() {
        return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
    }
    let prompt = prompt_of(r);
    let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str);
    let reply = if schema == Some("section_verdict") {
        Reply::json(judge(&prompt))
    } else if schema == Some("section_instruction") {
        Reply::json(json!({"instruction": "Correct the problem the judges found and keep everything else."}))
    } else if prompt.starts_with("You are a writer.") || prompt.starts_with("You are a careful editor. Fix one") {
        let current = edited_text(&prompt).unwrap_or_default();
        Reply::text(format!(
            "<section>\n{}\n</section>",
            current.replace(TRIPLE, DOUBLE).replace(MISSING_STEP, WITH_STEP)
        ))
    } else if prompt.starts_with("You are checking one section of a document after the section before it")
        || prompt.starts_with("You are verifying an edit")
    {
        Reply::with_logprobs("YES", vec![("YES", -0.02), ("NO", -4.5)])
    } else {
        Reply::status(500).body(json!({"error": {"message": "unexpected call"}}).to_string())
    };
    reply.usage((prompt.len() / 4) as u64, 50)
}

// ---------------------------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------------------------

async fn get_run(sandbox: &MeshSandbox, run_id: &str) -> gw::Run {
    let mut c = GatewayServiceClient::new(sandbox.gateway().await);
    c.get_run(gw::GetRunRequest { run_id: run_id.into() }).await.expect("GetRun").into_inner().run.expect("a run")
}

/// `assay report <args>` against the sandbox's gateway: its standard output.
async fn report(sandbox: &MeshSandbox, args: &[&str]) -> String {
    let out = tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
        .arg("report")
        .args(args)
        .arg("--gateway")
        .arg(sandbox.gateway_url())
        .output()
        .await
        .expect("assay runs");
    assert!(out.status.success(), "assay report {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_of_an_evaluation_and_a_refinement_open_in_chromium_and_keep_markup_as_text() {
    let prices =
        BTreeMap::from([("*".to_string(), assay_llm::pricing::Price { input: 2.0, output: 8.0, cached_input: None })]);
    let sandbox =
        MeshSandbox::start_with(SandboxOptions { prices: Some(prices), concurrency: Some(64), ..Default::default() })
            .await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = |name: &str| dir.path().join(name);

    // A checklist evaluation with two responders.
    sandbox.llm.set_handler(responders_handler);
    let events = sandbox
        .run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(responders_pipeline(RECORDS, None)))
        .await;
    let eval_id = events[0].run_id.clone();
    let run = get_run(&sandbox, &eval_id).await;
    let Some(gw::run_result::Result::ChecklistEval(e)) = run.result.and_then(|r| r.result) else {
        panic!("an evaluation")
    };
    assert_eq!(e.results.len(), 2 * RECORDS);
    let aggregate = e.aggregate.clone().expect("an aggregate");
    let ci = aggregate.uncertainty.expect("an interval");
    let comparison = e.comparisons.first().expect("model-b against model-a");
    assert!(comparison.ci_high < 0.0, "model-b is worse: {comparison:?}");

    let eval_html = path("eval.html");
    report(&sandbox, &[&eval_id, "--out", eval_html.to_str().unwrap()]).await;
    let html = read(&eval_html);
    assert_eq!(html.matches("<script").count(), 2, "the page's script and its records' data, no other");
    assert!(!html.contains("http://") && !html.contains("https://"), "nothing from the network");
    assert!(!html.contains(HOSTILE_FIRST) && !html.contains("<img"), "record ids are escaped");

    // The same run as Markdown.
    let md = report(&sandbox, &[&eval_id, "--format", "md"]).await;
    println!("{md}");
    assert!(md.starts_with(&format!("### Assay report: checklist_eval run `{eval_id}` (succeeded)\n")), "{md}");
    assert!(md.contains("| **Responses** | 1,040 (0 without a score) |"), "{md}");
    assert!(
        md.contains(&format!(
            "| `model-b` | `model-a` | {:+.4} | 95% \\[{:+.4}, {:+.4}\\] |",
            comparison.diff, comparison.ci_low, comparison.ci_high
        )),
        "{md}"
    );
    assert!(md.contains("**significantly worse**"), "{md}");
    assert!(md.contains("#### Worst records (lowest primary scores of 1,040)"), "{md}");
    // Markup in a record id is quoted as code (characters), never raw HTML.
    assert!(md.contains("| `<script>window.__pwned=1</script>` | `model-b` | 0.833 |"), "{md}");
    assert!(md.lines().filter(|l| l.contains("<script>")).all(|l| l.contains("`<script>")), "{md}");

    // A run that stopped when decided.
    let events = sandbox
        .run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(responders_pipeline(
            200,
            Some(gw::StopWhenDecided { seed: Some(3), ..Default::default() }),
        )))
        .await;
    let sequential_id = events[0].run_id.clone();
    let updates = events.iter().filter(|e| matches!(e.event, Some(gw::run_event::Event::ComparisonUpdated(_)))).count();
    let run = get_run(&sandbox, &sequential_id).await;
    let Some(gw::run_result::Result::ChecklistEval(s)) = run.result.and_then(|r| r.result) else {
        panic!("an evaluation")
    };
    let q = s.sequential.expect("the sequential result");
    assert!(q.stopped_early, "{q:?}");
    let sequential_html = path("sequential.html");
    report(&sandbox, &[&sequential_id, "--out", sequential_html.to_str().unwrap()]).await;

    // A targeted refinement, reported with the document as given.
    sandbox.llm.set_handler(refinement_handler);
    let (brief, sections) = assay_tests::lesson_fixture(&read(Path::new(LESSON)));
    let pipeline = gw::TargetedRefinementPipeline { sections, brief: Some(brief), ..Default::default() };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)).await;
    let refine_id = events[0].run_id.clone();
    let run = get_run(&sandbox, &refine_id).await;
    let Some(gw::run_result::Result::TargetedRefinement(t)) = run.result.and_then(|r| r.result) else {
        panic!("a refinement")
    };
    assert_eq!(t.outcome(), gw::RefinementOutcome::Accepted, "{t:#?}");
    assert_eq!(t.changed_section_ids, ["example", "rule72"]);
    let refinement_html = path("refinement.html");
    report(&sandbox, &[&refine_id, "--out", refinement_html.to_str().unwrap(), "--document", LESSON]).await;
    let md = report(&sandbox, &[&refine_id, "--format", "md"]).await;
    println!("{md}");
    assert!(md.contains("| **Outcome** | **accepted** (good) |"), "{md}");
    assert!(md.contains("| **Sections changed** | 2 of 8 |"), "{md}");
    assert!(
        md.contains("| `rule72` | The Rule of 72 estimates the doubling time, not the tripling time. | 0 | 1 of 1 |"),
        "{md}"
    );

    // An unfinished or unknown run is refused with exit code 2.
    let out = tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
        .args(["report", "no-such-run", "--gateway", &sandbox.gateway_url()])
        .output()
        .await
        .expect("assay runs");
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown run id \"no-such-run\""));

    let args = json!({
        "eval": eval_html,
        "sequential": sequential_html,
        "refinement": refinement_html,
        "hostile": [HOSTILE_FIRST, HOSTILE_SECOND],
        "results": "1,040",
        "mean": format!("{:.3}", aggregate.mean_primary_score),
        "ci": format!("[{:.3}, {:.3}]", ci.ci_low, ci.ci_high),
        "diff": format!("{:+.4}", comparison.diff),
        "records_used": q.records_used,
        "updates": updates,
        "triple": TRIPLE,
        "double": DOUBLE,
        "shots": format!("{}/report-screenshots", env!("CARGO_TARGET_TMPDIR")),
    });
    browser_checks(&args).await;
    sandbox.shutdown().await.unwrap();
}

/// Run tests/python/report_page.py with `args`; it must end with "OK".
async fn browser_checks(args: &Value) {
    let out = tokio::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/python/report_page.py"))
        .arg(args.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .expect("python3 runs (scripts/setup-deps.sh installs selenium, chromium and chromium-driver)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().last() == Some("OK"),
        "report page checks failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A debate (every solver answers 42, the judge picks solver_1), a self-refine (one revision that
/// appends a sentence) and a checklist generation on the scripted backend.
fn debate_polish_generate(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    if prompt.starts_with("TASK:") {
        return Reply::text(
            "<critique>\n- Say what the answer means.\n</critique>\n<revised>\nThe answer is 42, the product of 6 and 7.\n</revised>",
        );
    }
    let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str).unwrap_or("");
    let reply = match schema {
        "checklist" => return assay_testkit::schema_reply(r),
        "debate_solution" => json!({"approach": "direct", "reasoning_steps": ["6 * 7 = 42"], "final_answer": "42",
                                    "confidence": 0.9}),
        "debate_review" => {
            json!({"strengths": ["clear"], "weaknesses": ["<b>terse</b>"], "errors": [], "suggested_changes": []})
        }
        "debate_refinement" => {
            json!({"critiques_accepted": [], "critiques_rejected": [], "refinement_reasoning": "kept",
                                      "reasoning_steps": ["6 * 7 = 42"], "final_answer": "42", "confidence": 0.9,
                                      "changed_from_original": false, "improvement_explanation": "none"})
        }
        "debate_judgment" => json!({"reasoning": "all agree", "winner": "solver_1", "confidence": 0.9}),
        other => {
            return Reply::status(500)
                .body(json!({"error": {"message": format!("unexpected call {other}")}}).to_string());
        }
    };
    Reply::json(reply)
}

/// Every other pipeline kind with a result has a report too: a debate (a problem id holding
/// markup stays text), a self-refine and a checklist generation, each opened in Chromium with no
/// console error; the debate as Markdown lists its problems.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_a_debate_a_self_refine_and_a_generated_checklist() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(debate_polish_generate);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let hostile = "<img src=x onerror=\"window.__pwned=3\">";
    let debate = gw::DebatePipeline {
        problems: vec![
            gw::DebateProblem { id: "p1".into(), problem: "What is 6 * 7?".into(), reference: Some("42".into()) },
            gw::DebateProblem { id: hostile.into(), problem: "What is 7 * 6?".into(), reference: Some("42".into()) },
        ],
        ..Default::default()
    };
    let polish = gw::SelfRefinePipeline {
        request: Some(assay_proto::refiners::v1::SelfRefineRequest {
            draft: "The answer is 42.".into(),
            instruction: "Answer: what is 6 * 7?".into(),
            min_bytes: Some(0),
            ..Default::default()
        }),
    };
    let generate = gw::GenerateChecklistPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        record: Some(gw::EvalRecord { input: "Write a haiku about <b>rain</b>.".into(), ..Default::default() }),
        ..Default::default()
    };
    let mut files = serde_json::Map::new();
    for (name, pipeline) in [
        ("debate", gw::run_pipeline_request::Pipeline::Debate(debate)),
        ("self_refine", gw::run_pipeline_request::Pipeline::SelfRefine(polish)),
        ("checklist", gw::run_pipeline_request::Pipeline::GenerateChecklist(generate)),
    ] {
        let events = sandbox.run_pipeline(pipeline).await;
        let run_id = events[0].run_id.clone();
        assert_eq!(get_run(&sandbox, &run_id).await.state(), gw::RunState::Succeeded, "{name}");
        let file = dir.path().join(format!("{name}.html"));
        report(&sandbox, &[&run_id, "--out", file.to_str().unwrap()]).await;
        let html = read(&file);
        assert_eq!(html.matches("<script").count(), 1, "{name}: the page's own script only");
        assert!(!html.contains("<img") && !html.contains("<b>"), "{name}: markup escaped");
        files.insert(name.into(), json!(file));
        if name == "debate" {
            let md = report(&sandbox, &[&run_id, "--format", "md"]).await;
            assert!(md.contains("| **Accuracy** | 100.0% (2/2) |"), "{md}");
            assert!(md.contains("| `p1` | 42 | 42 | correct | judge |"), "{md}");
            assert!(md.contains("| `<img src=x onerror=\"window.__pwned=3\">` | 42 |"), "{md}");
        }
    }
    let mut args = Value::Object(files);
    args["problem_ids"] = json!(["p1", hostile]);
    args["final_text"] = json!("The answer is 42, the product of 6 and 7.");
    args["shots"] = json!(format!("{}/report-screenshots", env!("CARGO_TARGET_TMPDIR")));
    browser_checks(&args).await;
    sandbox.shutdown().await.unwrap();
}
