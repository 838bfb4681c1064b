//! `assay agreement` end to end: the real binary on a generated `assay eval --out` file from a
//! judge with a known bias and a gold file of true labels (per record and per item, items named by
//! id or by question text); the report's figures recomputed here, the corrected mean covering the
//! truth where the judge's does not; and the bad-input exits naming file and line.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

mod common;
use common::{Lcg, assay, stderr};

const ITEMS: usize = 4;

/// One record: its id, the true answers and the judge's (a yes missed 25% of the time, a no
/// taken for yes 5% of the time).
struct Record {
    id: String,
    truth: Vec<bool>,
    judge: Vec<bool>,
}

fn records(n: usize, seed: u64) -> Vec<Record> {
    let mut rng = Lcg(seed);
    (0..n)
        .map(|i| {
            let p = 0.3 + 0.6 * rng.next();
            let truth: Vec<bool> = (0..ITEMS).map(|_| rng.next() < p).collect();
            let judge = truth.iter().map(|t| if *t { rng.next() >= 0.25 } else { rng.next() < 0.05 }).collect();
            Record { id: format!("r{i:04}"), truth, judge }
        })
        .collect()
}

fn share(a: &[bool]) -> f64 {
    a.iter().filter(|x| **x).count() as f64 / a.len() as f64
}

fn yes_no(x: bool) -> &'static str {
    if x { "yes" } else { "no" }
}

fn question(i: usize) -> String {
    format!("Does the answer satisfy requirement {}?", i + 1)
}

/// The judge's `--out` line of a record (score: the pass rate of its answers).
fn out_line(r: &Record) -> Value {
    let answers: serde_json::Map<String, Value> =
        r.judge.iter().enumerate().map(|(i, a)| (format!("q{}", i + 1), json!(yes_no(*a)))).collect();
    let questions: serde_json::Map<String, Value> =
        (0..ITEMS).map(|i| (format!("q{}", i + 1), json!(question(i)))).collect();
    let s = share(&r.judge);
    json!({"index": 0, "id": r.id, "checklist_id": "c", "error": null, "pass_rate": s, "weighted_score": s,
           "normalized_score": s, "primary_score": s, "unanswered": 0, "answers": answers, "questions": questions})
}

fn write_lines(dir: &Path, name: &str, lines: &[Value]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn the_report_recomputed_and_the_corrected_mean_covers_the_truth() {
    let dir = tempfile::tempdir().unwrap();
    let all = records(3000, 17);
    let labelled = 200;
    let results = write_lines(dir.path(), "run.jsonl", &all.iter().map(out_line).collect::<Vec<_>>());
    // Gold: the true score and the true items, named by question text on even records, by id on odd.
    let gold: Vec<Value> = all[..labelled]
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let items: serde_json::Map<String, Value> = r
                .truth
                .iter()
                .enumerate()
                .map(|(i, t)| (if k % 2 == 0 { question(i) } else { format!("q{}", i + 1) }, json!(yes_no(*t))))
                .collect();
            json!({"id": r.id, "score": share(&r.truth), "items": items})
        })
        .collect();
    let gold = write_lines(dir.path(), "gold.jsonl", &gold);

    let out = assay(&["agreement", "--labels", s(&gold), s(&results), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!((v["records_judged"].as_u64(), v["records_labelled"].as_u64()), (Some(3000), Some(200)));

    // The confusion table, accuracy and kappa, recomputed.
    let pairs: Vec<(bool, bool)> =
        all[..labelled].iter().flat_map(|r| r.judge.iter().copied().zip(r.truth.iter().copied())).collect();
    let count = |j: bool, g: bool| pairs.iter().filter(|p| **p == (j, g)).count() as u64;
    let c = &v["items"]["confusion"];
    assert_eq!(c["judge_yes_gold_yes"].as_u64(), Some(count(true, true)));
    assert_eq!(c["judge_yes_gold_no"].as_u64(), Some(count(true, false)));
    assert_eq!(c["judge_no_gold_yes"].as_u64(), Some(count(false, true)));
    assert_eq!(c["judge_no_gold_no"].as_u64(), Some(count(false, false)));
    let n = pairs.len() as f64;
    assert_eq!(v["items"]["n"].as_u64(), Some(800));
    let po = (count(true, true) + count(false, false)) as f64 / n;
    let (jy, gy) =
        ((count(true, true) + count(true, false)) as f64 / n, (count(true, true) + count(false, true)) as f64 / n);
    let pe = jy * gy + (1.0 - jy) * (1.0 - gy);
    assert!((v["items"]["accuracy"].as_f64().unwrap() - po).abs() < 1e-12, "{v}");
    assert!((v["items"]["kappa"].as_f64().unwrap() - (po - pe) / (1.0 - pe)).abs() < 1e-12, "{v}");
    let alpha = v["items"]["krippendorff_alpha"].as_f64().unwrap();
    assert!(alpha > 0.3 && alpha < 0.95, "{alpha}");
    assert_eq!(v["scores"]["n"].as_u64(), Some(200));

    // The estimates of the mean score, recomputed; the truth: the mean true score of all records.
    let est = v["estimates"].as_array().unwrap();
    let score = est.iter().find(|e| e["quantity"] == "primary_score").expect("primary_score estimate");
    let judge_mean = all.iter().map(|r| share(&r.judge)).sum::<f64>() / all.len() as f64;
    let correction = all[..labelled].iter().map(|r| share(&r.truth) - share(&r.judge)).sum::<f64>() / labelled as f64;
    let gold_mean = all[..labelled].iter().map(|r| share(&r.truth)).sum::<f64>() / labelled as f64;
    assert!((score["ppi"]["mean"].as_f64().unwrap() - (judge_mean + correction)).abs() < 1e-12, "{score}");
    assert!((score["judge_only"]["mean"].as_f64().unwrap() - judge_mean).abs() < 1e-12);
    assert!((score["gold_only"]["mean"].as_f64().unwrap() - gold_mean).abs() < 1e-12);
    assert_eq!((score["n_judged"].as_u64(), score["n_labelled"].as_u64()), (Some(3000), Some(200)));
    let truth = all.iter().map(|r| share(&r.truth)).sum::<f64>() / all.len() as f64;
    let covers = |e: &Value| e["ci_low"].as_f64().unwrap() <= truth && truth <= e["ci_high"].as_f64().unwrap();
    assert!(covers(&score["ppi"]), "truth {truth}: {score}");
    assert!(!covers(&score["judge_only"]), "the biased judge's interval should miss {truth}: {score}");
    let width = |e: &Value| e["ci_high"].as_f64().unwrap() - e["ci_low"].as_f64().unwrap();
    assert!(width(&score["ppi"]) < width(&score["gold_only"]), "{score}");
    // With score labels the record score is the corrected quantity, not the item yes-share.
    assert_eq!(est.len(), 1, "{v}");

    // Item labels alone: the corrected item yes-share, recomputed.
    let items_only: Vec<Value> = all[..labelled]
        .iter()
        .map(|r| {
            let items: serde_json::Map<String, Value> =
                r.truth.iter().enumerate().map(|(i, t)| (format!("q{}", i + 1), json!(yes_no(*t)))).collect();
            json!({"id": r.id, "items": items})
        })
        .collect();
    let items_only = write_lines(dir.path(), "items_only.jsonl", &items_only);
    let out = assay(&["agreement", "--labels", s(&items_only), s(&results), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let e = &v["estimates"][0];
    assert_eq!(e["quantity"], "item_yes_share", "{v}");
    assert_eq!((e["n_judged"].as_u64(), e["n_labelled"].as_u64()), (Some(12_000), Some(800)));
    let judge_yes = all.iter().flat_map(|r| &r.judge).filter(|x| **x).count() as f64 / 12_000.0;
    let err = pairs.iter().map(|(j, g)| f64::from(u8::from(*g)) - f64::from(u8::from(*j))).sum::<f64>() / 800.0;
    assert!((e["ppi"]["mean"].as_f64().unwrap() - (judge_yes + err)).abs() < 1e-12, "{e}");
    assert!(v["notes"].to_string().contains("treat the items as independent"), "{v}");
    assert_eq!(v["scores"], Value::Null);

    // The text report.
    let out = assay(&["agreement", "--labels", s(&gold), s(&results)]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in
        ["200 labelled of 3000 judged records", "Cohen's kappa", "judge yes", "prediction-powered", "gold only"]
    {
        assert!(text.contains(needle), "no {needle:?} in {text}");
    }
}

#[test]
fn score_labels_alone_and_unscored_records() {
    let dir = tempfile::tempdir().unwrap();
    let all = records(50, 3);
    let mut lines: Vec<Value> = all.iter().map(out_line).collect();
    // r0000 failed: no score, no answers.
    lines[0] = json!({"index": 0, "id": "r0000", "checklist_id": "c", "error": "scorer down", "pass_rate": null,
                      "weighted_score": null, "normalized_score": null, "primary_score": null, "unanswered": null,
                      "answers": {}});
    let results = write_lines(dir.path(), "run.jsonl", &lines);
    let gold: Vec<Value> = all[..10].iter().map(|r| json!({"id": r.id, "score": share(&r.truth)})).collect();
    let gold = write_lines(dir.path(), "gold.jsonl", &gold);
    let out = assay(&["agreement", "--labels", s(&gold), s(&results), "--json", "--alpha", "0.1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["items"], Value::Null);
    assert_eq!(v["unscored_labelled"], json!(["r0000"]));
    assert_eq!(v["scores"]["n"].as_u64(), Some(9));
    let e = &v["estimates"][0];
    assert_eq!((e["n_judged"].as_u64(), e["n_labelled"].as_u64()), (Some(49), Some(9)));
    // 90% intervals: z = 1.6449.
    let half = (e["ppi"]["ci_high"].as_f64().unwrap() - e["ppi"]["ci_low"].as_f64().unwrap()) / 2.0;
    assert!((half / e["ppi"]["se"].as_f64().unwrap() - 1.6448536269514722).abs() < 1e-9, "{e}");
}

#[test]
fn bad_input_exits_2_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let all = records(5, 9);
    let results = write_lines(dir.path(), "run.jsonl", &all.iter().map(out_line).collect::<Vec<_>>());
    let gold = |name: &str, lines: &[Value]| write_lines(dir.path(), name, lines);
    let ok = json!({"id": "r0000", "score": 0.5});
    let unknown = gold("unknown.jsonl", &[ok.clone(), json!({"id": "nope", "score": 1.0})]);
    let maybe = gold("maybe.jsonl", &[json!({"id": "r0001", "items": {"q1": "maybe"}})]);
    let no_item = gold("no_item.jsonl", &[ok.clone(), ok.clone()]);
    let missing_item = gold("missing_item.jsonl", &[json!({"id": "r0001", "items": {"q9": "yes"}})]);
    let empty = gold("empty_label.jsonl", &[json!({"id": "r0001"})]);
    let bad_score = gold("bad_score.jsonl", &[json!({"id": "r0001", "score": "high"})]);
    let malformed = dir.path().join("malformed.jsonl");
    std::fs::write(&malformed, format!("{}\n{{\"id\": ", out_line(&all[0]))).unwrap();
    let good = gold("good.jsonl", &[ok.clone(), json!({"id": "r0001", "score": 0.25})]);
    let missing = dir.path().join("missing.jsonl");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["--labels", s(&unknown), s(&results)], "unknown.jsonl line 2: record \"nope\" is not in".into()),
        (vec!["--labels", s(&maybe), s(&results)], "maybe.jsonl line 1: item \"q1\" must be labelled".into()),
        (vec!["--labels", s(&no_item), s(&results)], "no_item.jsonl line 2: record \"r0000\" is labelled again".into()),
        (
            vec!["--labels", s(&missing_item), s(&results)],
            "missing_item.jsonl line 1: record \"r0001\" has no item \"q9\"".into(),
        ),
        (vec!["--labels", s(&empty), s(&results)], "empty_label.jsonl line 1: a label needs".into()),
        (
            vec!["--labels", s(&bad_score), s(&results)],
            "bad_score.jsonl line 1: \"score\" must be a finite number".into(),
        ),
        (vec!["--labels", s(&good), s(&malformed)], "malformed.jsonl line 2".into()),
        (vec!["--labels", s(&missing), s(&results)], "missing.jsonl".into()),
        (vec!["--labels", s(&good), s(&results), "--alpha", "2"], "--alpha must be in (0, 1)".into()),
    ];
    for (args, message) in cases {
        let mut full = vec!["agreement"];
        full.extend(args);
        let out = assay(&full);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&message), "{full:?}: want {message:?} in {}", stderr(&out));
    }
}
