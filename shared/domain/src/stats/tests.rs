//! Side by side with evalconfidence 0.1.1: every fixture in `tests/fixtures/stats` (written by
//! `make_stats_fixtures.py`) recomputed here to 1e-9; and the bootstrap's determinism and coverage.

use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

use super::*;

const TOL: f64 = 1e-9;

/// Every fixture case (the `kind` field says which function it checks).
pub(super) fn fixtures() -> Vec<Value> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/stats");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures directory")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files.iter().map(|p| serde_json::from_str(&std::fs::read_to_string(p).expect("read")).expect("json")).collect()
}

/// A fixture's observations `[[record id, score], ...]`.
pub(super) fn obs(v: &Value) -> Vec<(&str, f64)> {
    v.as_array()
        .expect("observations")
        .iter()
        .map(|o| (o[0].as_str().expect("id"), o[1].as_f64().expect("score")))
        .collect()
}

/// `got` equals the fixture's `want` to 1e-9 (null: unset; "inf": infinite).
#[track_caller]
pub(super) fn close(name: &str, field: &str, got: Option<f64>, want: &Value) {
    match (got, want.as_f64()) {
        (None, None) => assert!(want.is_null(), "{name}.{field}: got None, want {want}"),
        (Some(g), Some(w)) => assert!((g - w).abs() <= TOL, "{name}.{field}: got {g:.17}, want {w:.17}"),
        (Some(g), None) if want.as_str() == Some("inf") => assert!(g == f64::INFINITY, "{name}.{field}: {g}"),
        (g, _) => panic!("{name}.{field}: got {g:?}, want {want}"),
    }
}

#[test]
fn compare_matches_evalconfidence() {
    let mut methods = Vec::new();
    for case in fixtures().iter().filter(|c| c["kind"] == "compare") {
        let name = case["name"].as_str().unwrap();
        let e = &case["expected"];
        let r = compare(&obs(&case["a"]), &obs(&case["b"]), case["alpha"].as_f64().unwrap()).unwrap();
        assert_eq!(r.method.as_str(), e["method"], "{name}");
        assert_eq!(r.paired, e["paired"].as_bool().unwrap(), "{name}");
        assert_eq!(r.n_records_a as u64, e["n_items_a"].as_u64().unwrap(), "{name}");
        assert_eq!(r.n_records_b as u64, e["n_items_b"].as_u64().unwrap(), "{name}");
        assert_eq!(r.n_pairs.map(|n| n as u64), e["n_pairs"].as_u64(), "{name}");
        assert_eq!(r.n_discordant, e["n_discordant"].as_u64(), "{name}");
        assert_eq!(r.significant(), e["significant"].as_bool().unwrap(), "{name}");
        assert_eq!(r.warnings.len() as u64, e["n_warnings"].as_u64().unwrap(), "{name}");
        close(name, "mean_a", Some(r.mean_a), &e["mean_a"]);
        close(name, "mean_b", Some(r.mean_b), &e["mean_b"]);
        close(name, "diff", Some(r.diff), &e["diff"]);
        close(name, "ci_low", Some(r.ci.0), &e["ci_low"]);
        close(name, "ci_high", Some(r.ci.1), &e["ci_high"]);
        close(name, "p_value", Some(r.p_value), &e["p_value"]);
        close(name, "variance_reduction", r.variance_reduction, &e["variance_reduction"]);
        close(name, "effective_n", r.effective_n, &e["effective_n"]);
        close(name, "odds_ratio", r.odds_ratio, &e["odds_ratio"]);
        close(name, "or_low", r.ci_odds_ratio.map(|c| c.0), &e["ci_odds_ratio"][0]);
        close(name, "or_high", r.ci_odds_ratio.map(|c| c.1), &e["ci_odds_ratio"][1]);
        methods.push(name.to_string());
    }
    // The cases the issue names: paired t, McNemar on both sides of 25 discordant pairs, unpaired.
    for needed in ["paired_t", "mcnemar_large", "mcnemar_exact", "welch_t", "two_proportion"] {
        assert!(methods.iter().any(|m| m == needed), "fixture {needed} missing: {methods:?}");
    }
    let fx = fixtures();
    let disc = |n: &str| fx.iter().find(|c| c["name"] == n).unwrap()["expected"]["n_discordant"].as_u64().unwrap();
    assert!(disc("mcnemar_large") > MCNEMAR_EXACT_MAX_DISCORDANT && disc("mcnemar_exact") <= 25);
}

#[test]
fn standard_error_matches_evalconfidence() {
    let mut seen = 0;
    for case in fixtures().iter().filter(|c| c["kind"] == "standard_error") {
        let name = case["name"].as_str().unwrap();
        let e = &case["expected"];
        let r = standard_error(&obs(&case["obs"]), case["alpha"].as_f64().unwrap()).unwrap();
        assert_eq!(r.n as u64, e["n"].as_u64().unwrap(), "{name}");
        assert_eq!(r.n_clusters.map(|n| n as u64), e["n_clusters"].as_u64(), "{name}");
        close(name, "mean", Some(r.mean), &e["mean"]);
        close(name, "se_naive", Some(r.se_naive), &e["se_naive"]);
        close(name, "ci_naive_low", Some(r.ci_naive.0), &e["ci_naive"][0]);
        close(name, "ci_naive_high", Some(r.ci_naive.1), &e["ci_naive"][1]);
        close(name, "se_clustered", r.se_clustered, &e["se_clustered"]);
        close(name, "ci_clustered_low", r.ci_clustered.map(|c| c.0), &e["ci_clustered"][0]);
        close(name, "ci_clustered_high", r.ci_clustered.map(|c| c.1), &e["ci_clustered"][1]);
        close(name, "inflation", r.inflation, &e["inflation"]);
        close(name, "design_effect", r.design_effect, &e["design_effect"]);
        seen += 1;
    }
    assert!(seen >= 2, "standard_error fixtures missing");
}

#[test]
fn bad_input_is_refused() {
    assert!(matches!(compare(&[("a", 1.0)], &[("a", 1.0), ("b", 0.0)], 0.05), Err(StatsError::TooFew { .. })));
    assert_eq!(standard_error(&[("a", 1.0), ("b", 0.0)], 1.5), Err(StatsError::Alpha(1.5)));
    assert!(matches!(standard_error(&[("a", f64::NAN), ("b", 0.0)], 0.05), Err(StatsError::NotFinite(_))));
}

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let v: f64 = rng.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[test]
fn bootstrap_is_deterministic_per_seed() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let d: Vec<f64> = (0..60).map(|_| normal(&mut rng)).collect();
    let a = paired_bootstrap(&d, 0.05, BOOTSTRAP_RESAMPLES, 7).unwrap();
    let b = paired_bootstrap(&d, 0.05, BOOTSTRAP_RESAMPLES, 7).unwrap();
    let c = paired_bootstrap(&d, 0.05, BOOTSTRAP_RESAMPLES, 8).unwrap();
    assert_eq!(a, b);
    assert_ne!((a.low, a.high), (c.low, c.high));
    assert_eq!((a.resamples, a.seed), (BOOTSTRAP_RESAMPLES, 7));
    // Close to the t interval on the same differences.
    let m = mean(&d);
    let se = sd(&d) / (d.len() as f64).sqrt();
    assert!(a.low < m && m < a.high);
    assert!((a.high - a.low) / (2.0 * 1.96 * se) > 0.85 && (a.high - a.low) / (2.0 * 1.96 * se) < 1.15);
    assert!(paired_bootstrap(&[1.0], 0.05, 100, 1).is_none());
}

#[test]
fn bootstrap_interval_covers_the_true_mean() {
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let truth = 0.3;
    let trials = 200;
    let covered = (0..trials)
        .filter(|t| {
            let d: Vec<f64> = (0..50).map(|_| truth + normal(&mut rng)).collect();
            let ci = paired_bootstrap(&d, 0.05, 1_000, *t as u64).unwrap();
            ci.low <= truth && truth <= ci.high
        })
        .count();
    // Nominal 95%; the percentile bootstrap runs a little under at n = 50.
    assert!((180..=198).contains(&covered), "covered {covered} of {trials}");
}
