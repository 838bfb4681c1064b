//! `--junit FILE` end to end: the real `assay` binary against a scripted OpenAI-compatible backend
//! on loopback (`eval`, `score`, `debate`, `refine`, `refine-text`) or on results files
//! (`compare`); every report is validated with
//! the `xmlschema` package (PyPI; scripts/setup-deps.sh installs it) against the two JUnit schemas
//! CI systems read, vendored in tests/fixtures (Jenkins' xunit `junit-10.xsd` and the strict Ant
//! `JUnit.xsd`), and its test cases checked against the run's own results (`--out`, `--json`).

use std::path::{Path, PathBuf};
use std::process::Command;

use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, hash_embedding, schema_reply};
use serde_json::{Value, json};

mod common;
use assay_testkit::prompts::{edited_text, judged_sections, prompt_of};
use common::{assay, assay_async, config_file, lines, stderr};

const SCHEMAS: [&str; 2] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/jenkins-junit-10.xsd"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/windyroad-JUnit.xsd"),
];

/// Validates the report against every schema, then prints it as JSON: per suite its attributes,
/// properties, output and test cases (outcome, type, message, detail).
const VALIDATE: &str = r#"
import json, sys
import xml.etree.ElementTree as ET
import xmlschema
path, schemas = sys.argv[1], sys.argv[2:]
for s in schemas:
    xmlschema.XMLSchema(s).validate(path)
root = ET.parse(path).getroot()
suites = []
for s in root.findall("testsuite"):
    cases = []
    for c in s.findall("testcase"):
        k = next((k for k in c if k.tag in ("failure", "error", "skipped")), None)
        cases.append({
            "classname": c.get("classname"), "name": c.get("name"), "time": c.get("time"),
            "outcome": "passed" if k is None else k.tag,
            "type": None if k is None else k.get("type"),
            "message": None if k is None else k.get("message"),
            "detail": None if k is None else k.text,
        })
    suites.append({
        "attrib": dict(s.attrib),
        "properties": {p.get("name"): p.get("value") for p in s.iter("property")},
        "out": s.findtext("system-out"),
        "cases": cases,
    })
print(json.dumps({"root": root.tag, "root_attrib": dict(root.attrib), "suites": suites}))
"#;

/// The report at `path`, validated against both schemas, as [`VALIDATE`] prints it.
fn validated(path: &Path) -> Value {
    let o = Command::new("python3")
        .arg("-c")
        .arg(VALIDATE)
        .arg(path)
        .args(SCHEMAS)
        .output()
        .expect("python3 runs (scripts/setup-deps.sh installs xmlschema)");
    assert!(
        o.status.success(),
        "{} is not valid JUnit XML (or xmlschema is missing: scripts/setup-deps.sh):\n{}\n{}",
        path.display(),
        String::from_utf8_lossy(&o.stderr),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["root"], "testsuites");
    v
}

/// The test cases of suite `i`, by name.
fn cases(report: &Value, i: usize) -> std::collections::BTreeMap<String, Value> {
    report["suites"][i]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().into(), c.clone()))
        .collect()
}

/// Suite `i`'s tests, failures and errors as its attributes say them.
fn counts(report: &Value, i: usize) -> (u64, u64, u64) {
    let a = &report["suites"][i]["attrib"];
    let n = |k: &str| a[k].as_str().unwrap().parse::<u64>().unwrap();
    (n("tests"), n("failures"), n("errors"))
}

/// What a results line should be as a test case at `threshold`: an error when the record failed or
/// has no score, a failure below the threshold, else a pass.
fn expected_outcome(line: &Value, threshold: f64) -> &'static str {
    match line["primary_score"].as_f64() {
        _ if !line["error"].is_null() => "error",
        None => "error",
        Some(s) if s < threshold => "failure",
        Some(_) => "passed",
    }
}

/// Nothing but `keep` in `dir`: no temporary file of a report was left behind.
fn only(dir: &Path, keep: &[&str]) {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let mut keep: Vec<String> = keep.iter().map(|s| s.to_string()).collect();
    keep.sort();
    assert_eq!(names, keep);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The judge: a record whose target says `yes=K` gets the first K of its 4 questions YES and the
/// rest NO, each with a reason; `FAIL-ME` gets 503 on every attempt (the record fails); `GARBLED`
/// a reply that is no answer at all (the record is left unscored).
fn judge(req: &RecordedRequest) -> Reply {
    if req.raw_body.contains("FAIL-ME") {
        return Reply::status(503);
    }
    if req.raw_body.contains("GARBLED") {
        return Reply::text("I would rather not say.");
    }
    let k = req.raw_body.split("yes=").nth(1).and_then(|s| s.get(..1)).and_then(|d| d.parse::<usize>().ok());
    let answers: Vec<Value> = (1..=4)
        .map(|i| {
            let yes = k.is_some_and(|k| i <= k);
            json!({"question_index": i, "answer": if yes { "YES" } else { "NO" }, "reasoning": format!("reason {i}")})
        })
        .collect();
    Reply::json(json!({ "answers": answers }))
}

async fn assay_async_owned(config: &Path, args: &[String]) -> std::process::Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assay_async(config, &args).await
}

/// The record id that needs escaping (markup, an ampersand, a CDATA end, quotes).
const MARKUP_ID: &str = "a<b&c]]>d \"q\"";

fn score_inputs(dir: &Path) -> (PathBuf, PathBuf) {
    let checklist = dir.join("checklist.json");
    std::fs::write(
        &checklist,
        json!({"id": "c1", "items": [
            {"id": "q1", "question": "Is it short?"},
            {"id": "q2", "question": "Is it kind?"},
            {"id": "q3", "question": "Is it true?"},
            {"id": "q4", "question": "Is it <clear> & fair?"}
        ]})
        .to_string(),
    )
    .unwrap();
    let data = dir.join("records.jsonl");
    let records = [
        ("r-all", "yes=4"),
        ("r-three", "yes=3"),
        (MARKUP_ID, "yes=1"),
        ("r-zero", "yes=0"),
        ("r-fail", "FAIL-ME"),
        ("r-garbled", "GARBLED"),
        ("ctl\u{1}id", "yes=4"),
    ];
    let text: String = records
        .iter()
        .map(|(id, target)| format!("{}\n", json!({"id": id, "input": "Say it.", "target": target})))
        .collect();
    std::fs::write(&data, text).unwrap();
    (checklist, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn score_reports_one_case_per_record_failed_below_the_threshold_and_errors_for_unscored_records() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(judge);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let (checklist, data) = score_inputs(dir.path());
    let (out, report) = (dir.path().join("out.jsonl"), dir.path().join("junit.xml"));
    let base = [
        "score",
        "--checklist",
        s(&checklist),
        "--data",
        s(&data),
        "--out",
        s(&out),
        "--mode",
        "batch",
        "--metric",
        "pass",
        "--reasoning",
    ];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|a| a.to_string()).collect() };

    // Without the report: the exit code the report must not change (3: a record failed).
    let o = assay_async_owned(&config, &with(&[])).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let o = assay_async_owned(&config, &with(&["--junit", s(&report), "--pass-threshold", "0.7"])).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    only(dir.path(), &["assay.toml", "checklist.json", "records.jsonl", "out.jsonl", "junit.xml"]);

    let results = lines(&out);
    assert_eq!(results.len(), 7);
    let v = validated(&report);
    assert_eq!(v["suites"].as_array().unwrap().len(), 1);
    let got = cases(&v, 0);
    // Every result is a test case, with the outcome its line calls for.
    assert_eq!(got.len(), results.len());
    for line in &results {
        let id = line["id"].as_str().unwrap().replace('\u{1}', "\u{FFFD}");
        let case = &got[&id];
        assert_eq!(case["outcome"], expected_outcome(line, 0.7), "{id}: {case} for {line}");
        assert_eq!(case["classname"], "assay.score.records");
    }
    // The results as planted: 4 and 3 of 4 pass, 1 and 0 of 4 fail, the 503 and the unreadable
    // reply are errors.
    let outcome = |id: &str| got[id]["outcome"].as_str().unwrap().to_string();
    assert_eq!(
        ["r-all", "r-three", MARKUP_ID, "r-zero", "r-fail", "r-garbled"].map(outcome),
        ["passed", "passed", "failure", "failure", "error", "error"]
    );
    assert_eq!(counts(&v, 0), (7, 2, 2));
    let markup = &got[MARKUP_ID];
    assert_eq!(markup["type"], "below_threshold");
    assert_eq!(
        markup["message"],
        "primary score 0.2500 (pass_rate) below --pass-threshold 0.7; answered NO: q2, q3, q4"
    );
    let detail = markup["detail"].as_str().unwrap();
    assert!(detail.contains("q4: Is it <clear> & fair?\n    judge: reason 4"), "{detail}");
    assert!(got["r-zero"]["message"].as_str().unwrap().contains("answered NO: q1, q2, q3, q4"));
    assert_eq!(got["r-fail"]["type"], "failed");
    assert_eq!(got["r-garbled"]["type"], "unscored");
    // Escaped, not dropped into the markup.
    let xml = std::fs::read_to_string(&report).unwrap();
    assert!(xml.contains(r#"name="a&lt;b&amp;c]]&gt;d &quot;q&quot;""#), "{xml}");
    assert!(!xml.contains("]]>d"), "{xml}");
    // The suite: a partial run, its summary and its threshold.
    let suite = &v["suites"][0];
    assert_eq!(suite["properties"]["state"], "partial");
    assert_eq!(suite["properties"]["pass_threshold"], "0.7");
    assert_eq!(suite["attrib"]["name"], "assay score records.jsonl");
    assert!(suite["out"].as_str().unwrap().contains("7 records, 1 failed, 1 unscored"), "{suite}");

    // An open run (results read back in pages) makes the same cases.
    let paged = dir.path().join("paged.xml");
    let o = assay_async_owned(&config, &with(&["--open", "--junit", s(&paged), "--pass-threshold", "0.7"])).await;
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let p = validated(&paged);
    let outcomes = |c: &std::collections::BTreeMap<String, Value>| -> Vec<(String, String)> {
        c.iter().map(|(k, v)| (k.clone(), v["outcome"].as_str().unwrap().to_string())).collect()
    };
    assert_eq!(outcomes(&cases(&p, 0)), outcomes(&got));
    assert_eq!(cases(&p, 0)[MARKUP_ID]["message"], markup["message"]);
    assert_eq!(counts(&p, 0), (7, 2, 2));
}

/// The responders' backend: the checklist as the schema gives it; a judge answering YES to every
/// question but the first of a weak answer; responder `cand` answering weakly every record whose
/// number is not a multiple of 3.
fn responders(r: &RecordedRequest) -> Reply {
    match r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str) {
        Some("checklist") => schema_reply(r),
        Some(_) => {
            let prompt = r.last_user_message().unwrap_or_default();
            let n = prompt.lines().filter(|l| l.starts_with('Q') && l.contains(':')).count().max(1);
            let weak = prompt.contains("weak answer");
            let answers: Vec<Value> = (1..=n)
                .map(|i| json!({"question_index": i, "answer": if weak && i == 1 { "NO" } else { "YES" }}))
                .collect();
            Reply::json(json!({ "answers": answers }))
        }
        None => {
            let model = r.body["model"].as_str().unwrap_or_default().to_string();
            let prompt = r.last_user_message().unwrap_or_default();
            let n: usize =
                prompt.trim_end_matches('?').split_whitespace().last().and_then(|w| w.parse().ok()).unwrap_or(0);
            let how = if model == "cand" && !n.is_multiple_of(3) { "weak" } else { "strong" };
            Reply::text(format!("A {how} answer about {n}, by {model}."))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_with_responders_reports_a_case_per_record_and_responder_and_one_per_comparison() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(responders);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = dir.path().join("prompts.jsonl");
    let text: String = (1..=12)
        .map(|i| format!("{}\n", json!({"id": format!("p{i}"), "input": format!("Tell me about {i}?")})))
        .collect();
    std::fs::write(&data, text).unwrap();
    let (out, report) = (dir.path().join("out.jsonl"), dir.path().join("eval.xml"));
    let o = assay_async(
        &config,
        &[
            "eval",
            "--preset",
            "tick",
            "--data",
            s(&data),
            "--respond",
            "openai:base",
            "--respond",
            "openai:cand",
            "--out",
            s(&out),
            "--json",
            "--junit",
            s(&report),
            "--pass-threshold",
            "0.9",
        ],
    )
    .await;
    // All scored, no --fail-on-regression: 0, whatever the report says.
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    let results = lines(&out);
    assert_eq!(results.len(), 24);
    let v = validated(&report);
    assert_eq!(v["suites"].as_array().unwrap().len(), 2);
    let records = v["suites"][0]["cases"].as_array().unwrap();
    assert_eq!(records.len(), 24);
    let mut failures = 0;
    for line in &results {
        let (id, responder) = (line["id"].as_str().unwrap(), line["responder"].as_str().unwrap());
        let class = format!("assay.eval.prompts.{responder}");
        let case = records.iter().find(|c| c["name"] == id && c["classname"] == class.as_str()).expect("a case");
        let want = expected_outcome(line, 0.9);
        failures += usize::from(want == "failure");
        assert_eq!(case["outcome"], want, "{case} for {line}");
    }
    // The weak answers (8 of cand's 12) fall below 0.9, each naming item 1 (the NO) in its message.
    assert_eq!(failures, 8);
    assert_eq!(counts(&v, 0), (24, 8, 0));
    for c in records.iter().filter(|c| c["outcome"] == "failure") {
        assert_eq!(c["classname"], "assay.eval.prompts.cand");
        assert!(c["message"].as_str().unwrap().ends_with("answered NO: 1"), "{c}");
    }
    // The comparison: cand regressed against base, the numbers those of the run's summary.
    let comparison = &v["suites"][1]["cases"][0];
    assert_eq!(counts(&v, 1), (1, 1, 0));
    assert_eq!(comparison["name"], "cand vs base");
    assert_eq!(comparison["classname"], "assay.eval.prompts.comparisons");
    assert_eq!(comparison["type"], "regression");
    let c = &summary["comparisons"][0];
    let (diff, low, high) = (c["diff"].as_f64().unwrap(), c["ciLow"].as_f64().unwrap(), c["ciHigh"].as_f64().unwrap());
    assert!(high < 0.0, "{c}");
    let message = comparison["message"].as_str().unwrap();
    let numbers = format!("regression: diff {diff:+.4}, 95% CI [{low:+.4}, {high:+.4}], p = ");
    assert!(message.starts_with(&numbers) && message.ends_with("12 pairs)"), "{message} / {numbers}");
}

/// One record's line as `assay eval --out` writes it: 8 items, the score their pass rate.
fn result_line(id: &str, yes: usize) -> Value {
    let answers: serde_json::Map<String, Value> =
        (0..8).map(|i| (format!("q{}", i + 1), json!(if i < yes { "yes" } else { "no" }))).collect();
    let score = yes as f64 / 8.0;
    json!({"index": 0, "id": id, "checklist_id": "c", "error": null, "pass_rate": score, "weighted_score": score,
           "normalized_score": score, "primary_score": score, "unanswered": 0, "answers": answers})
}

/// Two results files of 40 records, the candidate `shift` items (of 8) better on every record
/// (varying with the record, so the interval has width).
fn compared_files(dir: &Path, shift: i64) -> (PathBuf, PathBuf) {
    let write = |name: &str, delta: i64| {
        let path = dir.join(name);
        let text: String = (0..40)
            .map(|i| {
                let yes = (3 + i % 3 + if i % 4 == 0 { 0 } else { delta }).clamp(0, 8) as usize;
                format!("{}\n", result_line(&format!("r{i:02}"), yes))
            })
            .collect();
        std::fs::write(&path, text).unwrap();
        path
    };
    (write("baseline.jsonl", 0), write("candidate.jsonl", shift))
}

#[test]
fn compare_reports_the_comparison_failed_when_it_regressed_and_an_error_when_it_cannot_compare() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("compare.xml");
    let (b, c) = compared_files(dir.path(), -2);

    // A regression: the case fails with the numbers of `--json`, the exit code unchanged (0).
    let json: Value = serde_json::from_slice(&assay(&["compare", s(&b), s(&c), "--json"]).stdout).unwrap();
    let o = assay(&["compare", s(&b), s(&c), "--junit", s(&report)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    only(dir.path(), &["baseline.jsonl", "candidate.jsonl", "compare.xml"]);
    let v = validated(&report);
    assert_eq!(counts(&v, 0), (1, 1, 0));
    let case = &v["suites"][0]["cases"][0];
    assert_eq!(case["classname"], "assay.compare.primary_score");
    assert_eq!(case["name"], format!("{} vs {}", c.display(), b.display()));
    assert_eq!(case["type"], "regression");
    let n = |k: &str| json[k].as_f64().unwrap();
    // p is far below 0.0001 here: said as a bound.
    assert!(n("p_value") < 1e-4);
    let numbers = format!(
        "regression: diff {:+.4}, 95% CI [{:+.4}, {:+.4}], p < 0.0001 (paired_t, 40 pairs)",
        n("diff"),
        n("ci_low"),
        n("ci_high"),
    );
    assert_eq!(case["message"], numbers);
    assert!(case["detail"].as_str().unwrap().contains("lies entirely below 0"), "{case}");
    assert_eq!(v["suites"][0]["properties"]["diff"], n("diff").to_string());
    // Under the gate: exit 1, the same verdict.
    let o = assay(&["compare", s(&b), s(&c), "--fail-on-regression", "--junit", s(&report)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(validated(&report)["suites"][0]["cases"][0]["message"], numbers);
    // Below a larger minimum effect, it passes.
    let o = assay(&["compare", s(&b), s(&c), "--fail-on-regression", "--min-effect", "0.9", "--junit", s(&report)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(validated(&report)["suites"][0]["cases"][0]["outcome"], "passed");

    // An improvement passes.
    let (b, c) = compared_files(dir.path(), 2);
    let o = assay(&["compare", s(&b), s(&c), "--junit", s(&report)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = validated(&report);
    assert_eq!(counts(&v, 0), (1, 0, 0));
    assert_eq!(v["suites"][0]["cases"][0]["outcome"], "passed");

    // No comparison (a file that is not there): exit 2 as before, and the report replaced by one
    // case in error, never the last run's pass.
    let missing = dir.path().join("missing.jsonl");
    let o = assay(&["compare", s(&b), s(&missing), "--junit", s(&report)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let v = validated(&report);
    assert_eq!(counts(&v, 0), (1, 0, 1));
    let case = &v["suites"][0]["cases"][0];
    assert_eq!(case["type"], "run_failed");
    assert!(case["message"].as_str().unwrap().contains("missing.jsonl"), "{case}");
}

#[test]
fn a_verb_that_fails_writes_a_report_of_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("score.xml");
    std::fs::write(&report, "an older report").unwrap();
    let missing = dir.path().join("nothing.json");
    let data = dir.path().join("records.jsonl");
    std::fs::write(&data, "{\"id\": \"r1\", \"target\": \"x\"}\n").unwrap();
    let o = assay(&["score", "--checklist", s(&missing), "--data", s(&data), "--junit", s(&report)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = validated(&report);
    assert_eq!(counts(&v, 0), (1, 0, 1));
    let case = &v["suites"][0]["cases"][0];
    assert_eq!((case["classname"].as_str(), case["name"].as_str()), (Some("assay.score.records"), Some("assay score")));
    assert!(case["message"].as_str().unwrap().contains("nothing.json"), "{case}");
    // A report that cannot be written is said before the run starts (no mesh, no model call).
    let checklist = dir.path().join("checklist.json");
    std::fs::write(&checklist, r#"["Is it short?"]"#).unwrap();
    let nowhere = dir.path().join("no-such-dir").join("j.xml");
    let o = assay(&["score", "--checklist", s(&checklist), "--data", s(&data), "--junit", s(&nowhere)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("--junit {}", nowhere.display())), "{}", stderr(&o));
    assert!(!stderr(&o).contains("started"), "{}", stderr(&o));
    // --pass-threshold shapes a report: without --junit, or outside 0 to 1, it is a usage error.
    let o = assay(&["score", "--checklist", s(&missing), "--data", s(&data), "--pass-threshold", "0.5"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--junit"), "{}", stderr(&o));
    let o = assay(&[
        "score",
        "--checklist",
        s(&missing),
        "--data",
        s(&data),
        "--junit",
        s(&report),
        "--pass-threshold",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("give a primary score from 0 to 1"), "{}", stderr(&o));
}

/// Embedding calls get deterministic vectors.
fn embeddings(r: &RecordedRequest) -> Reply {
    Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect())
}

// --- assay debate ---------------------------------------------------------------------------------

/// A debated problem: the reference (if any), what the three solvers answer first and after
/// refinement; the judge picks solver_1.
struct Debated {
    id: &'static str,
    problem: &'static str,
    reference: Option<&'static str>,
    original: [&'static str; 3],
    refined: [&'static str; 3],
}

/// Right with agreement; wrong, solvers split; no reference (ungraded).
const DEBATED: [Debated; 3] = [
    Debated {
        id: "mul",
        problem: "What is 17 * 23?",
        reference: Some("391"),
        original: ["391", "391", "390"],
        refined: ["391", "391", "391"],
    },
    Debated {
        id: "add",
        problem: "What is 2 + 2?",
        reference: Some("4"),
        original: ["5", "5", "4"],
        refined: ["5", "5", "4"],
    },
    Debated {
        id: "colour",
        problem: "What colour is the sky?",
        reference: None,
        original: ["blue", "blue", "blue"],
        refined: ["blue", "blue", "blue"],
    },
];

fn debate_backend(r: &RecordedRequest) -> Reply {
    if r.is_embeddings() {
        return embeddings(r);
    }
    let p = r.first_user_message();
    let d = DEBATED.iter().find(|d| p.contains(d.problem)).unwrap_or_else(|| panic!("no known problem in {p}"));
    let who = r.debate_speaker();
    let solver = || ["solver_1", "solver_2", "solver_3"].iter().position(|s| *s == who).expect("a solver");
    let reply = match r.schema_name() {
        "debate_solution" => json!({"approach": "direct", "reasoning_steps": ["step"],
                                    "final_answer": d.original[solver()], "confidence": 0.7}),
        "debate_review" => json!({"strengths": ["clear"], "weaknesses": [], "errors": [],
                                  "suggested_changes": ["double-check"]}),
        "debate_refinement" => {
            let i = solver();
            json!({"critiques_accepted": ["double-check"], "critiques_rejected": [],
                   "refinement_reasoning": "checked again", "reasoning_steps": ["checked"],
                   "final_answer": d.refined[i], "confidence": 0.8,
                   "changed_from_original": d.refined[i] != d.original[i], "improvement_explanation": "checked"})
        }
        "debate_judgment" => json!({"reasoning": "solver_1 is careful", "winner": "solver_1", "confidence": 0.9}),
        other => panic!("unexpected stage {other}"),
    };
    Reply::json(reply).usage(50, 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debate_reports_a_case_per_problem_failed_when_wrong_and_in_error_when_ungraded() {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(debate_backend);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let data = dir.path().join("problems.jsonl");
    let text: String = DEBATED
        .iter()
        .map(|d| format!("{}\n", json!({"id": d.id, "problem": d.problem, "reference": d.reference})))
        .collect();
    std::fs::write(&data, text).unwrap();
    let (out, report) = (dir.path().join("out.jsonl"), dir.path().join("debate.xml"));
    let o = assay_async(&config, &["debate", "--data", s(&data), "--out", s(&out), "--junit", s(&report)]).await;
    // Every problem debated: 0, as without the report.
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    only(dir.path(), &["assay.toml", "problems.jsonl", "out.jsonl", "debate.xml"]);
    let results = lines(&out);
    assert_eq!(results.len(), 3);
    let v = validated(&report);
    let got = cases(&v, 0);
    assert_eq!(got.len(), 3);
    // Each problem's case as its line says: graded right passes, wrong fails, ungraded is an error.
    for line in &results {
        let case = &got[line["id"].as_str().unwrap()];
        assert_eq!(case["classname"], "assay.debate.problems");
        let want = match line["correct"].as_bool() {
            Some(true) => "passed",
            Some(false) => "failure",
            None => "error",
        };
        assert_eq!(case["outcome"], want, "{case} for {line}");
    }
    assert_eq!(
        ["mul", "add", "colour"].map(|id| got[id]["outcome"].as_str().unwrap().to_string()),
        ["passed", "failure", "error"]
    );
    assert_eq!(counts(&v, 0), (3, 1, 1));
    let add = &got["add"];
    assert_eq!(add["type"], "wrong_answer");
    assert_eq!(add["message"], "wrong answer: final answer \"5\", reference \"4\"; the solvers disagreed");
    assert!(add["detail"].as_str().unwrap().contains("decided by judge"), "{add}");
    let colour = &got["colour"];
    assert_eq!(colour["type"], "ungraded");
    assert_eq!(colour["message"], "no reference to grade against; final answer \"blue\"");
    let suite = &v["suites"][0];
    assert_eq!(suite["attrib"]["name"], "assay debate problems.jsonl");
    assert_eq!(
        (suite["properties"]["graded"].as_str(), suite["properties"]["correct"].as_str()),
        (Some("2"), Some("1"))
    );
    assert!(suite["out"].as_str().unwrap().contains("debate accuracy      50.0% (1/2)"), "{suite}");

    // A problem file refused: exit 2 as before, and the report replaced by one case in error.
    std::fs::write(&data, "{\"id\": \"b\", \"reference\": \"4\"}\n").unwrap();
    let o = assay_async(&config, &["debate", "--data", s(&data), "--junit", s(&report)]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let v = validated(&report);
    assert_eq!(counts(&v, 0), (1, 0, 1));
    let case = &v["suites"][0]["cases"][0];
    assert_eq!(
        (case["classname"].as_str(), case["name"].as_str()),
        (Some("assay.debate.problems"), Some("assay debate"))
    );
    assert!(case["message"].as_str().unwrap().contains("field \"problem\" is required"), "{case}");
}

// --- assay refine ---------------------------------------------------------------------------------

/// The lesson the refinement tests work on (tests/fixtures of the workspace's test crate), and the
/// passages its judges find wrong: a factual error in rule72 (critical), a missing step in example
/// (major).
const LESSON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/lesson_compound_interest.json");
const TRIPLE: &str = "for money to triple at a given yearly rate";
const DOUBLE: &str = "for money to double at a given yearly rate";
const MISSING_STEP: &str = "The growth factor is 1.004, so";
const WITH_STEP: &str = "The growth factor per period is 1 + 0.048 / 12 = 1.004, so";
const RULE72_ISSUE: &str = "The Rule of 72 estimates the doubling time, not the tripling time.";
const EXAMPLE_ISSUE: &str = "Step 3 uses the growth factor 1.004 without showing how it comes from 0.048 / 12.";
/// [`EXAMPLE_ISSUE`] as a test case's name: shortened to 80 characters.
const EXAMPLE_NAME: &str = "Step 3 uses the growth factor 1.004 without showing how it comes from 0.048 /...";
const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

/// A judge's verdict: the two planted problems wherever their passages still stand.
fn lesson_verdict(prompt: &str) -> Value {
    let mut criterion: serde_json::Map<String, Value> = CRITERIA.iter().map(|c| (c.to_string(), json!(0.9))).collect();
    let mut issues = Vec::new();
    let mut section_scores = Vec::new();
    for (id, text) in judged_sections(prompt) {
        let found: Vec<(&str, &str, &str, &str)> = [
            (id == "rule72" && text.contains(TRIPLE)).then_some(("factual_accuracy", "critical", RULE72_ISSUE, TRIPLE)),
            (id == "example" && text.contains(MISSING_STEP)).then_some((
                "completeness",
                "major",
                EXAMPLE_ISSUE,
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

/// The refinement's backend: judges that find the planted problems; with `fix`, editors that fix
/// them and a delta judge that verifies; without, editors that only add a sentence and a delta
/// judge that answers NO (every fix rejected).
fn refinement_backend(fix: bool) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r| {
        if r.is_embeddings() {
            return embeddings(r);
        }
        let prompt = prompt_of(r);
        let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str);
        let reply = if schema == Some("section_verdict") {
            Reply::json(lesson_verdict(&prompt))
        } else if schema == Some("section_instruction") {
            Reply::json(json!({"instruction": "Correct the problem the judges found and keep everything else."}))
        } else if prompt.starts_with("You are a writer.") || prompt.starts_with("You are a careful editor. Fix one") {
            let current = edited_text(&prompt).unwrap_or_default();
            let edited = if fix {
                current.replace(TRIPLE, DOUBLE).replace(MISSING_STEP, WITH_STEP)
            } else {
                format!("{current}\n\nRead this section twice.")
            };
            Reply::text(format!("<section>\n{edited}\n</section>"))
        } else if prompt.starts_with("You are checking one section of a document after the section before it")
            || prompt.starts_with("You are verifying an edit")
        {
            let (yes, no) = if fix { (-0.02, -4.5) } else { (-4.5, -0.02) };
            Reply::with_logprobs(if fix { "YES" } else { "NO" }, vec![("YES", yes), ("NO", no)])
        } else {
            Reply::status(500).body(json!({"error": {"message": "unexpected call"}}).to_string())
        };
        reply.usage((prompt.len() / 4) as u64, 50)
    }
}

/// `assay refine` of the lesson with `--junit`, the backend fixing or not: the exit code, the
/// result on standard output and the validated report.
async fn refine_with_report(fix: bool) -> (Option<i32>, Value, Value, String) {
    let backend = ScriptedLlm::start().await;
    backend.set_handler(refinement_backend(fix));
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &backend, ":memory:");
    let doc = dir.path().join("lesson.json");
    std::fs::copy(LESSON, &doc).unwrap();
    let report = dir.path().join("refine.xml");
    let o = assay_async(&config, &["refine", "--doc", s(&doc), "--max-iterations", "1", "--junit", s(&report)]).await;
    let result: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&o)));
    only(dir.path(), &["assay.toml", "lesson.json", "refine.xml"]);
    (o.status.code(), result, validated(&report), stderr(&o))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refine_reports_each_issue_raised_and_the_run_failed_when_left_unresolved() {
    let (code, result, v, err) = refine_with_report(false).await;
    // Best effort: 3, as without the report.
    assert_eq!(code, Some(3), "{err}");
    assert_eq!(result["outcome"], "REFINEMENT_OUTCOME_BEST_EFFORT", "{result}");
    let unresolved = result["unresolvedIssues"].as_array().unwrap();
    assert_eq!(unresolved.len(), 2, "{result}");
    let all = v["suites"][0]["cases"].as_array().unwrap();
    // A case per unresolved issue (the same problems raised again are one issue), then the run.
    assert_eq!(all.len(), 3, "{v}");
    assert_eq!(counts(&v, 0), (3, 3, 0));
    for u in unresolved {
        let section = u["sectionId"].as_str().unwrap();
        let class = format!("assay.refine.{section}");
        let case = all.iter().find(|c| c["classname"] == class.as_str()).unwrap_or_else(|| panic!("{class}: {v}"));
        assert_eq!(case["outcome"], "failure");
        assert_eq!(case["type"], "unresolved");
        let severity = u["severity"].as_str().unwrap().trim_start_matches("SEVERITY_").to_lowercase();
        let message = case["message"].as_str().unwrap();
        let head = format!(
            "unresolved {severity} issue ({}) in section {section}; tried: iteration 1 ",
            u["criterion"].as_str().unwrap()
        );
        assert!(message.starts_with(&head), "{message} / {head}");
        assert!(message.contains("(not kept: "), "{message}");
        assert!(case["detail"].as_str().unwrap().starts_with(u["description"].as_str().unwrap()), "{case}");
    }
    // In document order, a long description shortened.
    assert_eq!([&all[0]["name"], &all[1]["name"]], [EXAMPLE_NAME, RULE72_ISSUE]);
    let run = &all[2];
    assert_eq!((run["classname"].as_str(), run["name"].as_str()), (Some("assay.refine.lesson"), Some("refinement")));
    assert_eq!(run["type"], "best_effort");
    let score = result["finalScore"].as_f64().unwrap();
    let message = run["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "best effort: final score {score:.4} below the acceptance threshold 0.85 (0.75 with no critical issue open); \
             2 unresolved issues (1 critical)"
        )),
        "{message}"
    );
    let suite = &v["suites"][0];
    assert_eq!(suite["properties"]["outcome"], "best_effort");
    assert_eq!(suite["attrib"]["name"], "assay refine lesson.json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refine_reports_fixed_issues_and_an_accepted_run_as_passed() {
    let (code, result, v, err) = refine_with_report(true).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(result["outcome"], "REFINEMENT_OUTCOME_ACCEPTED", "{result}");
    assert_eq!(result["unresolvedIssues"], json!([]), "{result}");
    let got: Vec<(String, String, String)> = v["suites"][0]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let t = |k: &str| c[k].as_str().unwrap().to_string();
            (t("classname"), t("name"), t("outcome"))
        })
        .collect();
    let passed = |class: &str, name: &str| (class.to_string(), name.to_string(), "passed".to_string());
    assert_eq!(
        got,
        [
            passed("assay.refine.example", EXAMPLE_NAME),
            passed("assay.refine.rule72", RULE72_ISSUE),
            passed("assay.refine.lesson", "refinement"),
        ]
    );
    assert_eq!(counts(&v, 0), (3, 0, 0));
    assert_eq!(v["suites"][0]["properties"]["final_score"], format!("{:.4}", result["finalScore"].as_f64().unwrap()));
}

// --- assay refine-text ----------------------------------------------------------------------------

const DRAFT: &str = "Photosynthesis is how plants make food. They use light. Water and carbon dioxide go in and \
                     sugar and oxygen come out. This happens in the leaves of the plant, inside small parts of the \
                     cells that hold a green pigment.\n";

/// Self-refine: `revise` the draft into the revision, with a two-point critique.
fn refine_text_backend(revised: &'static str) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r| {
        if r.is_embeddings() {
            embeddings(r)
        } else {
            Reply::text(format!(
                "<critique>\n- Too vague\n- No example & no <b>\n</critique>\n<revised>\n{revised}\n</revised>"
            ))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refine_text_reports_one_case_passed_when_converged_and_failed_with_the_critique_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("draft.txt");
    std::fs::write(&input, DRAFT).unwrap();
    let report = dir.path().join("text.xml");
    let run = |revised: &'static str| {
        let (dir, input, report) = (dir.path().to_path_buf(), input.clone(), report.clone());
        async move {
            let backend = ScriptedLlm::start().await;
            backend.set_handler(refine_text_backend(revised));
            let config = config_file(&dir, &backend, ":memory:");
            let o = assay_async(&config, &["refine-text", "--input", s(&input), "--json", "--junit", s(&report)]).await;
            assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
            let result: Value = serde_json::from_slice(&o.stdout).unwrap();
            (result, validated(&report))
        }
    };

    // The revision is the draft itself: converged, passed.
    let (result, v) = run(DRAFT.trim_end()).await;
    assert_eq!(result["stopReason"], "SELF_REFINE_STOP_REASON_CONVERGED", "{result}");
    assert_eq!(counts(&v, 0), (1, 0, 0));
    let case = &v["suites"][0]["cases"][0];
    assert_eq!(
        (case["classname"].as_str(), case["name"].as_str()),
        (Some("assay.refine-text.draft"), Some("draft.txt"))
    );
    assert_eq!(case["outcome"], "passed");
    assert_eq!(v["suites"][0]["properties"]["stop_reason"], "converged");

    // A different text after the one pass allowed: not converged, failed with the critique.
    let (result, v) =
        run("Plants make their own food from light, water and air, a process called photosynthesis.").await;
    let stop = result["stopReason"].as_str().unwrap();
    assert_ne!(stop, "SELF_REFINE_STOP_REASON_CONVERGED", "{result}");
    assert_eq!(counts(&v, 0), (1, 1, 0));
    let case = &v["suites"][0]["cases"][0];
    assert_eq!(case["type"], "not_converged");
    let reason = stop.trim_start_matches("SELF_REFINE_STOP_REASON_").to_lowercase();
    assert_eq!(
        case["message"],
        format!("not converged: {reason} after 1 pass; last critique: Too vague; No example & no <b>")
    );
    assert!(case["detail"].as_str().unwrap().contains("\n  - No example & no <b>"), "{case}");
    only(dir.path(), &["assay.toml", "draft.txt", "text.xml"]);
}
