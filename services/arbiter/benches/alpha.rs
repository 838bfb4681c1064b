//! Krippendorff's alpha on large matrices: 3 raters x 10,000 units and 50 raters x 1,000 units,
//! judge-like scores (0.05 steps in [0, 1], 5% missing), every level. Prints the median of 5 runs.
//! `cargo bench -p assay-arbiter --bench alpha`

use std::time::{Duration, Instant};

use assay_arbiter::core::alpha::{Level, alpha};

fn matrix(raters: usize, units: usize, mut state: u64) -> Vec<Vec<Option<f64>>> {
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let truth: Vec<f64> = (0..units).map(|_| (next() % 21) as f64 / 20.0).collect();
    (0..raters)
        .map(|_| {
            truth
                .iter()
                .map(|t| {
                    if next() % 20 == 0 {
                        None
                    } else {
                        let noise = (next() % 5) as f64 / 20.0 - 0.1;
                        Some(((t + noise).clamp(0.0, 1.0) * 20.0).round() / 20.0)
                    }
                })
                .collect()
        })
        .collect()
}

fn main() {
    for (raters, units) in [(3, 10_000), (50, 1_000)] {
        let data = matrix(raters, units, 7);
        for level in [Level::Interval, Level::Nominal, Level::Ordinal, Level::Ratio] {
            let mut times: Vec<Duration> = (0..5)
                .map(|_| {
                    let started = Instant::now();
                    std::hint::black_box(alpha(std::hint::black_box(&data), level)).unwrap();
                    started.elapsed()
                })
                .collect();
            times.sort();
            println!(
                "alpha {raters} x {units} {level:?}: median {:.2} ms (alpha {:.4})",
                times[2].as_secs_f64() * 1e3,
                alpha(&data, level).unwrap()
            );
        }
    }
}
