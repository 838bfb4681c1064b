//! `assay power` end to end: the real binary on `assay eval --out` files built from the pilots of
//! the evalconfidence fixtures (`tests/fixtures/stats/power_*.json`), whose answers it must give
//! exactly; and the bad-input exits.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

mod common;
use common::{assay, stderr};

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/stats/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

/// An `assay eval --out` file of the observations `[[id, score], ...]` (a repeated id: samples).
fn write(dir: &Path, name: &str, obs: &Value) -> PathBuf {
    let text: String = obs
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let s = o[1].as_f64().unwrap();
            format!(
                "{}\n",
                json!({"index": i, "id": o[0], "checklist_id": "c", "error": null, "pass_rate": s,
                       "weighted_score": s, "normalized_score": s, "primary_score": s, "unanswered": 0,
                       "answers": {"q1": if s >= 0.5 { "yes" } else { "no" }}})
            )
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json_of(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[track_caller]
fn close(got: &Value, want: &Value) {
    let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
    assert!((g - w).abs() <= 1e-9, "got {g:.17}, evalconfidence {w:.17}");
}

#[test]
fn a_paired_pilot_gives_evalconfidences_answers() {
    let dir = tempfile::tempdir().unwrap();
    let case = fixture("power_paired_n");
    // evalconfidence's pair is (a, b): a is the candidate.
    let (b, a) = (write(dir.path(), "baseline.jsonl", &case["b"]), write(dir.path(), "candidate.jsonl", &case["a"]));
    let v = json_of(&assay(&["power", "--baseline", s(&b), "--candidate", s(&a), "--mde", "0.05", "--json"]));
    assert_eq!(v["design"], "paired");
    assert_eq!(v["n_required"], case["expected"]["n_required"], "{v}");
    close(&v["variance"], &case["expected"]["variance"]);
    assert_eq!(v["pilot_records"], 80);

    // The detectable effect for a given n, at another level and power.
    let case = fixture("power_paired_mde");
    let v = json_of(&assay(&[
        "power",
        "--baseline",
        s(&b),
        "--candidate",
        s(&a),
        "--n",
        "500",
        "--alpha",
        "0.01",
        "--power",
        "0.9",
        "--json",
    ]));
    close(&v["mde_detectable"], &case["expected"]["mde_detectable"]);
    assert_eq!(v["n_required"], Value::Null);

    // Both: the power achieved.
    let case = fixture("power_paired_achieved");
    let v =
        json_of(&assay(&["power", "--baseline", s(&b), "--candidate", s(&a), "--mde", "0.04", "--n", "300", "--json"]));
    close(&v["power_achieved"], &case["expected"]["power_achieved"]);

    // The text says the same.
    let out = assay(&["power", "--baseline", s(&b), "--candidate", s(&a), "--mde", "0.05"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let n = fixture("power_paired_n")["expected"]["n_required"].as_u64().unwrap();
    assert!(
        text.contains(&format!("records needed: {n} paired records to detect a difference of 0.0500 (5.0 points)")),
        "{text}"
    );
}

#[test]
fn a_single_pilot_with_samples_plans_an_unpaired_comparison() {
    let dir = tempfile::tempdir().unwrap();
    let case = fixture("power_single_n");
    // Three lines per record: samples, averaged per record first.
    let b = write(dir.path(), "pilot.jsonl", &case["obs"]);
    let v =
        json_of(&assay(&["power", "--baseline", s(&b), "--mde", "0.05", "--alpha", "0.1", "--power", "0.9", "--json"]));
    assert_eq!(v["design"], "unpaired");
    assert_eq!(v["n_required"], case["expected"]["n_required"], "{v}");
    close(&v["variance"], &case["expected"]["variance"]);
    assert_eq!(v["pilot_records"], 40);
    let out = assay(&["power", "--baseline", s(&b), "--mde", "0.05", "--alpha", "0.1", "--power", "0.9"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("unpaired records per run"), "{text}");

    // Scores beyond [0, 1]: effects are not read as points.
    let case = fixture("power_single_achieved");
    let b = write(dir.path(), "wide.jsonl", &case["obs"]);
    let v = json_of(&assay(&["power", "--baseline", s(&b), "--mde", "0.5", "--n", "120", "--json"]));
    close(&v["power_achieved"], &case["expected"]["power_achieved"]);
    assert_eq!(v["scores_are_unit_scale"], false);
}

#[test]
fn bad_input_exits_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let pilot = write(dir.path(), "pilot.jsonl", &json!([["r1", 0.2], ["r2", 0.9], ["r3", 0.4]]));
    let flat = write(dir.path(), "flat.jsonl", &json!([["r1", 0.5], ["r2", 0.5]]));
    let other = write(dir.path(), "other.jsonl", &json!([["x1", 0.5], ["x2", 0.1]]));
    let malformed = dir.path().join("malformed.jsonl");
    std::fs::write(&malformed, "{\"id\": \"r1\", \"primary_score\": 0.5}\nnot json\n").unwrap();
    let missing = dir.path().join("missing.jsonl");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--baseline", s(&missing), "--mde", "0.05"], "missing.jsonl"),
        (vec!["--baseline", s(&malformed), "--mde", "0.05"], "malformed.jsonl line 2"),
        (vec!["--baseline", s(&pilot)], "--mde"),
        (vec!["--baseline", s(&pilot), "--mde", "0"], "--mde must be a positive number"),
        (vec!["--baseline", s(&pilot), "--n", "1"], "--n must be at least 2"),
        (vec!["--baseline", s(&pilot), "--mde", "0.05", "--power", "1.2"], "--power must be in (0, 1)"),
        (vec!["--baseline", s(&pilot), "--mde", "0.05", "--alpha", "0"], "--alpha must be in (0, 1)"),
        (vec!["--baseline", s(&flat), "--mde", "0.05"], "variance is 0"),
        (vec!["--baseline", s(&pilot), "--candidate", s(&other), "--mde", "0.05"], "at least 2 shared records"),
    ];
    for (args, message) in cases {
        let mut full = vec!["power"];
        full.extend(args);
        let out = assay(&full);
        assert_eq!(out.status.code(), Some(2), "{full:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{full:?}: want {message:?} in {}", stderr(&out));
    }
}
