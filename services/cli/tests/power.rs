//! `assay power` end to end: the real binary on `assay eval --out` files built from the pilots of
//! the evalconfidence fixtures (`tests/fixtures/stats/power_*.json`), whose answers it must give
//! exactly; and the bad-input exits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

mod common;
use common::{assay, stderr};

fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/fixtures/stats/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json")
}

/// An `assay eval --out` file of the observations `[[id, score], ...]`; a repeated id is one
/// line per epoch (`"epoch"` 0, 1, ...).
fn write(dir: &Path, name: &str, obs: &Value) -> PathBuf {
    write_lines(dir, name, obs, true)
}

/// [`write`], the repeated lines of an id with (`epochs`) or without their `"epoch"`.
fn write_lines(dir: &Path, name: &str, obs: &Value, epochs: bool) -> PathBuf {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let text: String = obs
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let s = o[1].as_f64().unwrap();
            let epoch = seen.entry(o[0].to_string()).or_default();
            let mut line = json!({"index": i, "id": o[0], "checklist_id": "c", "error": null, "pass_rate": s,
                   "weighted_score": s, "normalized_score": s, "primary_score": s, "unanswered": 0,
                   "answers": {"q1": if s >= 0.5 { "yes" } else { "no" }}});
            if epochs {
                line["epoch"] = json!(*epoch);
            }
            *epoch += 1;
            format!("{line}\n")
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
        (vec!["--baseline", s(&pilot), "--mde", "0"], "--mde must be a finite number > 0"),
        (vec!["--baseline", s(&pilot), "--n", "1"], "--n must be in [2, 1000000000]"),
        (vec!["--baseline", s(&pilot), "--mde", "0.05", "--power", "1.2"], "--power must be in [0.5, 0.9999]"),
        (vec!["--baseline", s(&pilot), "--mde", "0.05", "--alpha", "0"], "--alpha must be in [1e-9, 0.5]"),
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

/// Issue 44: a pilot whose lines all carry one record id planned "0 records" from a NaN variance.
/// Repeated ids are refused unless each line declares a distinct epoch, and one record (whatever
/// its epochs) says a variance needs two.
#[test]
fn one_record_on_many_lines_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let same: Vec<Value> = (0..50).map(|i| json!(["r1", 0.2 + f64::from(i % 5) / 10.0])).collect();
    let undeclared = write_lines(dir.path(), "same.jsonl", &json!(same), false);
    let out = assay(&["power", "--baseline", s(&undeclared), "--mde", "0.05"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("same.jsonl: record id \"r1\" is on lines 1, 2, 3, 4, 5, 6, 7, 8 and 42 more"), "{err}");
    assert!(err.contains("\"epoch\""), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("0 records"));

    let epochs = write(dir.path(), "epochs.jsonl", &json!(same));
    let out = assay(&["power", "--baseline", s(&epochs), "--mde", "0.05"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the pilot has 1 scored record(s) and a variance needs at least 2"),
        "{}",
        stderr(&out)
    );

    // Two lines of one id declaring the same epoch.
    let twice = dir.path().join("twice.jsonl");
    std::fs::write(
        &twice,
        "{\"id\": \"a\", \"primary_score\": 0.5, \"epoch\": 0}\n{\"id\": \"b\", \"primary_score\": 0.1}\n\
         {\"id\": \"a\", \"primary_score\": 0.7, \"epoch\": 0}\n",
    )
    .unwrap();
    let out = assay(&["power", "--baseline", s(&twice), "--mde", "0.05"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("record id \"a\" repeats epoch 0 on lines 1 and 3"), "{}", stderr(&out));
}

/// Issue 44: `--mde 1e-308` planned 18446744073709551615 records and `--power 1e-300` more records
/// than a power of 0.9999999999999999. Each flag has a range, named with the flag when left.
#[test]
fn edge_values_are_refused_naming_the_flag_and_its_range() {
    let dir = tempfile::tempdir().unwrap();
    let case = fixture("power_paired_n");
    let (b, a) = (write(dir.path(), "baseline.jsonl", &case["b"]), write(dir.path(), "candidate.jsonl", &case["a"]));
    let plan = |extra: &[&str]| {
        let mut args = vec!["power", "--baseline", s(&b), "--candidate", s(&a)];
        args.extend(extra);
        assay(&args)
    };
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--mde", "1e-308"], "--mde 1e-308 is too small for this pilot: it needs more than 1000000000 records"),
        (vec!["--mde", "1e-7"], "--mde must be at least "),
        (vec!["--mde", "1e308"], "--mde 1e308 is too large for this pilot"),
        (vec!["--mde", "inf"], "--mde must be a finite number > 0"),
        (vec!["--mde", "NaN"], "--mde must be a finite number > 0"),
        (vec!["--mde", "0.05", "--power", "1e-300"], "--power must be in [0.5, 0.9999]"),
        (vec!["--mde", "0.05", "--power", "0.9999999999999999"], "--power must be in [0.5, 0.9999]"),
        (vec!["--mde", "0.05", "--power", "0.4"], "--power must be in [0.5, 0.9999]"),
        (vec!["--mde", "0.05", "--alpha", "1e-300"], "--alpha must be in [1e-9, 0.5]"),
        (vec!["--mde", "0.05", "--alpha", "0.7"], "--alpha must be in [1e-9, 0.5]"),
        (vec!["--n", "18446744073709551615"], "--n must be in [2, 1000000000]"),
    ];
    for (extra, message) in cases {
        let out = plan(&extra);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{extra:?}: want {message:?} in {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{extra:?}: {}", String::from_utf8_lossy(&out.stdout));
    }
    // The smallest --mde named is one the plan accepts, and the records it needs are within bounds.
    let out = plan(&["--mde", "1e-308"]);
    let err = stderr(&out);
    let least = err.rsplit("at least ").next().unwrap().split_whitespace().next().unwrap();
    let v = json_of(&plan(&["--mde", &format!("{}", least.parse::<f64>().unwrap() * 1.001), "--json"]));
    let n = v["n_required"].as_u64().unwrap();
    assert!(n > 900_000_000 && n <= 1_000_000_000, "{v}");
    // The ends of the ranges are accepted, and a higher power never needs fewer records.
    let at =
        |power: &str| json_of(&plan(&["--mde", "0.05", "--power", power, "--json"]))["n_required"].as_u64().unwrap();
    assert!(at("0.5") < at("0.8") && at("0.8") < at("0.9999"));
    assert!(json_of(&plan(&["--mde", "0.05", "--alpha", "1e-9", "--json"]))["n_required"].as_u64().is_some());
}
