//! Krippendorff's alpha against the `krippendorff` Python package's results
//! (`fixtures/make_alpha_fixtures.py` wrote them): every level, missing values, two raters, a
//! single pairable unit, and the cases where alpha is undefined.

use assay_arbiter::core::alpha::{Level, alpha};
use serde_json::Value;

#[test]
fn alpha_agrees_with_the_python_package() {
    let fixtures: Value = serde_json::from_str(include_str!("fixtures/alpha_fixtures.json")).unwrap();
    let cases = fixtures.as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut checked = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let data: Vec<Vec<Option<f64>>> = case["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row.as_array().unwrap().iter().map(Value::as_f64).collect())
            .collect();
        for (level, key) in [
            (Level::Nominal, "nominal"),
            (Level::Ordinal, "ordinal"),
            (Level::Interval, "interval"),
            (Level::Ratio, "ratio"),
        ] {
            let want = case["alpha"][key].as_f64();
            let got = alpha(&data, level);
            match (want, got) {
                (Some(w), Ok(g)) => assert!((w - g).abs() < 1e-9, "{name} {key}: python {w}, ours {g}"),
                (None, Err(_)) => {}
                (w, g) => panic!("{name} {key}: python {w:?}, ours {g:?}"),
            }
            checked += 1;
        }
    }
    assert_eq!(checked, cases.len() * 4);
}
