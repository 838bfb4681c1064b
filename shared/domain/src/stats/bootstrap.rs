//! The paired bootstrap interval on the mean per-record difference: resample records with
//! replacement, a seeded ChaCha8 stream so the same seed gives the same interval everywhere.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Resamples drawn for an interval.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;
/// The seed used when the caller gives none.
pub const DEFAULT_BOOTSTRAP_SEED: u64 = 20_260_326;

/// A percentile bootstrap interval and how it was drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BootstrapInterval {
    pub low: f64,
    pub high: f64,
    pub resamples: usize,
    pub seed: u64,
}

/// Percentile interval at level `1 - alpha` of the mean of `diffs` over `resamples` resamples of
/// the records (with replacement), seeded by `seed`. None with fewer than 2 differences.
pub fn paired_bootstrap(diffs: &[f64], alpha: f64, resamples: usize, seed: u64) -> Option<BootstrapInterval> {
    let n = diffs.len();
    if n < 2 || resamples < 2 || !(alpha > 0.0 && alpha < 1.0) {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> =
        (0..resamples).map(|_| (0..n).map(|_| diffs[rng.random_range(0..n)]).sum::<f64>() / n as f64).collect();
    means.sort_by(f64::total_cmp);
    Some(BootstrapInterval {
        low: percentile(&means, alpha / 2.0),
        high: percentile(&means, 1.0 - alpha / 2.0),
        resamples,
        seed,
    })
}

/// Linear interpolation between order statistics (numpy's default `percentile`).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    sorted[lo] + (pos - lo as f64) * (sorted[hi] - sorted[lo])
}
