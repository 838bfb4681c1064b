//! `assay compare` end to end: the real binary on generated `assay eval --out` files; the
//! regression gate's exit codes, the JSON report and the bad-input exits.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

mod common;
use common::{Lcg, assay, stderr};

/// One record's line as `assay eval --out` writes it: 8 items, the score their pass rate.
fn line(id: &str, answers: &[bool]) -> Value {
    let yes = answers.iter().filter(|a| **a).count() as f64 / answers.len() as f64;
    let map: serde_json::Map<String, Value> = answers
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("q{}", i + 1), json!(if *a { "yes" } else { "no" })))
        .collect();
    json!({"index": 0, "id": id, "checklist_id": "c", "error": null, "pass_rate": yes, "weighted_score": yes,
           "normalized_score": yes, "primary_score": yes, "unanswered": 0, "answers": map})
}

fn write(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path
}

/// Baseline and candidate answers for `n` records: the candidate's yes-probability shifted by
/// `shift` per item (shared record difficulty, so the pairing matters).
/// Records of one run: id and the answers to its 8 items.
type Run = Vec<(String, Vec<bool>)>;

fn runs(n: usize, shift: f64, seed: u64) -> (Run, Run) {
    let mut rng = Lcg(seed);
    let (mut base, mut cand) = (Vec::new(), Vec::new());
    for i in 0..n {
        let p = 0.2 + 0.6 * rng.next();
        let b: Vec<bool> = (0..8).map(|_| rng.next() < p).collect();
        let c: Vec<bool> = (0..8).map(|_| rng.next() < (p + shift).clamp(0.0, 1.0)).collect();
        base.push((format!("r{i:03}"), b));
        cand.push((format!("r{i:03}"), c));
    }
    (base, cand)
}

fn files(dir: &Path, n: usize, shift: f64) -> (PathBuf, PathBuf) {
    let (b, c) = runs(n, shift, 7);
    let b: Vec<Value> = b.iter().map(|(id, a)| line(id, a)).collect();
    let c: Vec<Value> = c.iter().map(|(id, a)| line(id, a)).collect();
    (write(dir, "baseline.jsonl", &b), write(dir, "candidate.jsonl", &c))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_planted_regression_fails_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let (b, c) = files(dir.path(), 80, -0.25);
    let out = assay(&["compare", s(&b), s(&c), "--fail-on-regression"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("regression: diff -0."), "{}", stderr(&out));
    // The same drop under a larger minimum effect passes.
    let out = assay(&["compare", s(&b), s(&c), "--fail-on-regression", "--min-effect", "0.9"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("no significant regression"), "{}", stderr(&out));
}

#[test]
fn an_improvement_passes_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let (b, c) = files(dir.path(), 80, 0.2);
    let out = assay(&["compare", s(&b), s(&c), "--fail-on-regression"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("no significant regression: diff +0."), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("paired_t") && table.contains("significant") && table.contains("bootstrap"), "{table}");
    // Swapped, the improvement is a regression.
    let out = assay(&["compare", s(&c), s(&b), "--fail-on-regression"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn json_reports_the_comparison_and_the_detail() {
    let dir = tempfile::tempdir().unwrap();
    let (mut base, mut cand) = runs(60, 0.0, 11);
    // A planted worst record, all yes -> all no; an unmatched record on each side.
    base[5].1 = vec![true; 8];
    cand[5].1 = vec![false; 8];
    base.push(("only-in-baseline".into(), vec![true; 8]));
    cand.push(("only-in-candidate".into(), vec![false; 8]));
    let expected_q1 = (
        base.iter().zip(&cand).take(60).filter(|(b, c)| b.1[0] && !c.1[0]).count(),
        base.iter().zip(&cand).take(60).filter(|(b, c)| !b.1[0] && c.1[0]).count(),
    );
    let score = |a: &[bool]| a.iter().filter(|x| **x).count() as f64 / 8.0;
    let diff: f64 = base.iter().zip(&cand).take(60).map(|(b, c)| score(&c.1) - score(&b.1)).sum::<f64>() / 60.0;
    let b = write(dir.path(), "b.jsonl", &base.iter().map(|(id, a)| line(id, a)).collect::<Vec<_>>());
    let c = write(dir.path(), "c.jsonl", &cand.iter().map(|(id, a)| line(id, a)).collect::<Vec<_>>());
    let out = assay(&["compare", s(&b), s(&c), "--json", "--seed", "42"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for field in [
        "method",
        "n_pairs",
        "mean_baseline",
        "mean_candidate",
        "diff",
        "ci_low",
        "ci_high",
        "p_value",
        "significant",
        "variance_reduction",
        "effective_n",
        "bootstrap_ci_low",
        "bootstrap_ci_high",
        "bootstrap_seed",
        "warnings",
        "items",
        "worst_regressions",
        "unmatched",
    ] {
        assert!(v.get(field).is_some(), "no {field} in {v}");
    }
    assert_eq!(v["method"], "paired_t");
    assert_eq!(v["n_pairs"], 60);
    assert_eq!(v["bootstrap_seed"], 42);
    assert!((v["diff"].as_f64().unwrap() - diff).abs() < 1e-12, "{v}");
    assert!(v["ci_low"].as_f64().unwrap() < diff && diff < v["ci_high"].as_f64().unwrap());
    assert!(v["bootstrap_ci_low"].as_f64().unwrap() < diff && diff < v["bootstrap_ci_high"].as_f64().unwrap());
    assert!(v["variance_reduction"].as_f64().unwrap() > 1.0, "shared difficulty: pairing helps: {v}");
    assert_eq!(v["worst_regressions"][0]["id"], "r005");
    assert_eq!(v["worst_regressions"][0]["diff"], -1.0);
    assert_eq!(v["unmatched"]["baseline_only"], json!(["only-in-baseline"]));
    assert_eq!(v["unmatched"]["candidate_only"], json!(["only-in-candidate"]));
    let q1 = v["items"].as_array().unwrap().iter().find(|i| i["item"] == "q1").expect("q1 flips");
    assert_eq!((q1["yes_to_no"].as_u64().unwrap() as usize, q1["no_to_yes"].as_u64().unwrap() as usize), expected_q1);
    assert_eq!(q1["compared"], 60);
    // The same seed gives the same bootstrap interval.
    let again: Value =
        serde_json::from_slice(&assay(&["compare", s(&b), s(&c), "--json", "--seed", "42"]).stdout).unwrap();
    assert_eq!(again["bootstrap_ci_low"], v["bootstrap_ci_low"]);
}

#[test]
fn binary_scores_use_mcnemar() {
    let dir = tempfile::tempdir().unwrap();
    let (base, cand) = runs(100, -0.3, 3);
    // One item per record: pass rate 0 or 1.
    let b: Vec<Value> = base.iter().map(|(id, a)| line(id, &a[..1])).collect();
    let c: Vec<Value> = cand.iter().map(|(id, a)| line(id, &a[..1])).collect();
    let (b, c) = (write(dir.path(), "b.jsonl", &b), write(dir.path(), "c.jsonl", &c));
    let out = assay(&["compare", s(&b), s(&c), "--metric", "pass_rate", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["method"], "mcnemar", "{v}");
    assert!(v["n_discordant"].as_u64().unwrap() > 0);
}

#[test]
fn a_closed_stdout_ends_the_report_quietly_as_sigpipe_would() {
    let dir = tempfile::tempdir().unwrap();
    let (b, c) = files(dir.path(), 40, 0.0);
    // `assay compare ... | head -0`: the reader is gone before the first line.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_assay"))
        .args(["compare", s(&b), s(&c)])
        .env_remove("RUST_LOG")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(141), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
}

#[test]
fn bad_input_exits_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (b, c) = files(dir.path(), 10, 0.0);
    let other = write(dir.path(), "other.jsonl", &[line("x1", &[true, false]), line("x2", &[false, true])]);
    let malformed = dir.path().join("malformed.jsonl");
    let text = std::fs::read_to_string(&b).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[2] = "{\"id\": \"r002\", \"primary_score\": ";
    std::fs::write(&malformed, lines.join("\n")).unwrap();
    let no_metric = write(dir.path(), "no_metric.jsonl", &[json!({"id": "r000"})]);
    let missing = dir.path().join("missing.jsonl");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![s(&missing), s(&c)], "missing.jsonl"),
        (vec![s(&b), s(&other)], "no shared records"),
        (vec![s(&b), s(&c), "--metric", "accuracy"], "invalid value 'accuracy'"),
        (vec![s(&malformed), s(&c)], "malformed.jsonl line 3: not JSON"),
        (vec![s(&no_metric), s(&c)], "no \"primary_score\" field"),
        (vec![s(&b), s(&c), "--alpha", "1.5"], "--alpha must be in (0, 1)"),
    ];
    for (args, message) in cases {
        let mut full = vec!["compare"];
        full.extend(args);
        full.push("--fail-on-regression");
        let out = assay(&full);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{full:?}: want {message:?} in {}", stderr(&out));
    }
}

/// Issue 44: a candidate whose 50 lines all carry one record id gave `95% CI [NaN, NaN], p = NaN`
/// and passed `--fail-on-regression` with a -0.54 difference. The repeated id is refused, naming
/// the id and its lines; declared as epochs it is one record, whose NaN statistics never pass.
#[test]
fn a_nan_statistic_never_passes_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let (b, _) = files(dir.path(), 50, 0.0);
    let worse = [true, true, true, false, false, false, false, false];
    let same: Vec<Value> = (0..50).map(|_| line("r000", &worse)).collect();
    let c = write(dir.path(), "same.jsonl", &same);
    let out = assay(&["compare", s(&b), s(&c), "--fail-on-regression"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("same.jsonl: record id \"r000\" is on lines 1, 2, 3, 4, 5, 6, 7, 8 and 42 more"), "{err}");
    assert!(out.stdout.is_empty());

    // One line per epoch: one record, compared unpaired; its interval is not a number.
    let epochs: Vec<Value> = same
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut l = l.clone();
            l["epoch"] = json!(i);
            l
        })
        .collect();
    let c = write(dir.path(), "epochs.jsonl", &epochs);
    for json in [false, true] {
        let mut args = vec!["compare", s(&b), s(&c), "--fail-on-regression"];
        if json {
            args.push("--json");
        }
        let out = assay(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("no verdict, the regression gate cannot pass: diff -0."), "{err}");
        assert!(
            err.contains("CI [NaN, NaN], p = NaN (welch_t): the interval and the p-value are not numbers"),
            "{err}"
        );
        assert!(err.contains("the candidate has 1 scored record(s) and the baseline 50"), "{err}");
        assert!(!err.contains("no significant regression"), "{err}");
    }
    // Without the gate the report is printed, with the warning.
    let out = assay(&["compare", s(&b), s(&c)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("warning: diff -0.") && table.contains("are not numbers"), "{table}");

    // A malformed epoch is named with its line.
    let bad = write(dir.path(), "bad.jsonl", &[json!({"id": "r000", "primary_score": 0.5, "epoch": "one"})]);
    let out = assay(&["compare", s(&b), s(&bad)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.jsonl line 1: \"epoch\" must be a non-negative integer"), "{}", stderr(&out));
}

// --- run ids: against a running gateway -------------------------------------------------------

mod runs {
    use std::path::Path;
    use std::process::Output;

    use assay_testkit::{RecordedRequest, Reply, ScriptedLlm};
    use serde_json::{Value, json};

    use super::common::{assay_async as assay, config_file, stderr};

    /// A judge: YES to both items, except (when `worse`) NO to the second item of every third
    /// record (the target says `record-<n>`).
    fn judge(worse: bool) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
        move |r| {
            let prompt = r.last_user_message().unwrap_or_default();
            let n: usize = prompt
                .split("record-")
                .nth(1)
                .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|t| t.parse().ok())
                .unwrap_or_else(|| panic!("a record number in {prompt}"));
            let first = if n % 4 == 1 { "NO" } else { "YES" };
            let second = if worse && n.is_multiple_of(3) { "NO" } else { "YES" };
            Reply::json(json!({"answers": [
                {"question_index": 1, "answer": first},
                {"question_index": 2, "answer": second},
            ]}))
        }
    }

    /// `assay score` through the gateway; (run id, --out file).
    async fn score(config: &Path, dir: &Path, gateway: &str, name: &str) -> (String, std::path::PathBuf) {
        let out = dir.join(format!("{name}.jsonl"));
        let o = assay(
            config,
            &[
                "score",
                "--checklist",
                dir.join("checklist.json").to_str().unwrap(),
                "--data",
                dir.join("records.jsonl").to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--gateway",
                gateway,
            ],
        )
        .await;
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let run_id = err
            .lines()
            .find_map(|l| l.strip_prefix("run ").and_then(|l| l.split_once(": ")).map(|(id, _)| id.to_string()))
            .unwrap_or_else(|| panic!("the run id in {err}"));
        (run_id, out)
    }

    /// The numbers of a `--json` report that must not depend on where the records came from.
    fn numbers(v: &Value) -> Value {
        let mut items: Vec<(u64, u64, u64)> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                (i["yes_to_no"].as_u64().unwrap(), i["no_to_yes"].as_u64().unwrap(), i["compared"].as_u64().unwrap())
            })
            .collect();
        items.sort_unstable();
        let mut out = serde_json::Map::new();
        for k in [
            "method",
            "paired",
            "n_pairs",
            "n_baseline",
            "n_candidate",
            "mean_baseline",
            "mean_candidate",
            "diff",
            "ci_low",
            "ci_high",
            "p_value",
            "significant",
            "variance_reduction",
            "effective_n",
            "n_discordant",
            "bootstrap_ci_low",
            "bootstrap_ci_high",
            "bootstrap_seed",
            "warnings",
            "worst_regressions",
            "unmatched",
            "unscored",
            "regression",
            "gate",
        ] {
            out.insert(k.into(), v[k].clone());
        }
        out.insert("items".into(), json!(items));
        Value::Object(out)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn run_ids_files_and_a_mix_give_the_same_numbers() {
        let backend = ScriptedLlm::start().await;
        let dir = tempfile::tempdir().unwrap();
        let config_path = config_file(dir.path(), &backend, ":memory:");
        std::fs::write(
            dir.path().join("checklist.json"),
            json!({"id": "c", "items": [{"id": "a", "question": "Is it polite?"}, {"id": "b", "question": "Is it short?"}]})
                .to_string(),
        )
        .unwrap();
        let records: String = (0..40)
            .map(|i| {
                format!("{}\n", json!({"id": format!("r{i:02}"), "input": "Greet.", "target": format!("record-{i}")}))
            })
            .collect();
        std::fs::write(dir.path().join("records.jsonl"), records).unwrap();
        let mut config = assay_config::load(Some(&config_path)).unwrap();
        config.ports = assay_config::Ports::ephemeral();
        let (hub, loading) = assay_runtime::build_hub(&config, &[]).unwrap();
        loading.await.unwrap();
        let mesh = assay_cli::start_mesh(&config, std::sync::Arc::new(hub), true).await.unwrap();
        let gateway = format!("http://{}", mesh.addrs.gateway);

        backend.set_handler(judge(false));
        let (base_run, base_file) = score(&config_path, dir.path(), &gateway, "baseline").await;
        backend.set_handler(judge(true));
        let (cand_run, cand_file) = score(&config_path, dir.path(), &gateway, "candidate").await;
        let (bf, cf) = (base_file.to_str().unwrap(), cand_file.to_str().unwrap());

        let report = |o: &Output| -> Value {
            assert_eq!(o.status.code(), Some(1), "a regression under the gate: {}", stderr(o));
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("one JSON object: {e}: {}", stderr(o)))
        };
        let gate = ["--json", "--fail-on-regression", "--gateway", gateway.as_str()];
        let files = report(&assay(&config_path, &[&["compare", bf, cf][..], &gate].concat()).await);
        let ids = report(
            &assay(&config_path, &[&["compare", base_run.as_str(), cand_run.as_str()][..], &gate].concat()).await,
        );
        let mixed = report(&assay(&config_path, &[&["compare", bf, cand_run.as_str()][..], &gate].concat()).await);
        assert_eq!(files["method"], "paired_t", "{files}");
        assert!(files["diff"].as_f64().unwrap() < 0.0, "{files}");
        assert_eq!(numbers(&ids), numbers(&files), "CompareRuns by id and the --out files");
        assert_eq!(numbers(&mixed), numbers(&files), "a file and a run id");
        // By id the items are named by their question text.
        assert!(ids["items"].as_array().unwrap().iter().any(|i| i["item"] == "Is it short?"), "{ids}");

        // The table names the runs.
        let o = assay(&config_path, &["compare", base_run.as_str(), cand_run.as_str(), "--gateway", &gateway]).await;
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let table = String::from_utf8_lossy(&o.stdout);
        assert!(table.contains(&format!("run {base_run}")) && table.contains("paired_t"), "{table}");

        // Bad input: unknown run id, unreachable gateway.
        let o = assay(&config_path, &["compare", bf, "nosuchrun", "--gateway", &gateway]).await;
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("unknown run id \"nosuchrun\""), "{}", stderr(&o));
        let o = assay(&config_path, &["compare", "nosuchrun", base_run.as_str(), "--gateway", &gateway]).await;
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("unknown run id: baseline run nosuchrun"), "{}", stderr(&o));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let o = assay(&config_path, &["compare", bf, cand_run.as_str(), "--gateway", &closed.to_string()]).await;
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("unreachable"), "{}", stderr(&o));

        mesh.shutdown().await.unwrap();
    }
}
