//! Statistics on evaluation results: the standard error of a mean score (naive and cluster-robust
//! with records as clusters) and the comparison of two runs (paired when they share records), as
//! the Python package `evalconfidence` 0.1.1 computes them (`standard_error`, `compare`), matched
//! to 1e-9 by the fixtures in `tests/fixtures/stats`; plus a seeded paired bootstrap interval.
//!
//! Inputs are observations `(record id, score)`; a record may repeat (several samples): records
//! are then clusters for the standard error, and per-record means for a comparison.

pub mod agreement;
mod bootstrap;
pub mod dist;
pub mod krippendorff;
pub mod power;
pub mod runs;
pub mod sequential;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::BTreeMap;

pub use bootstrap::{BOOTSTRAP_RESAMPLES, BootstrapInterval, DEFAULT_BOOTSTRAP_SEED, paired_bootstrap};

/// Pair the runs automatically when at least this share of the larger record set is shared.
pub const PAIRING_COVERAGE_THRESHOLD: f64 = 0.9;
/// At or below this many discordant pairs McNemar uses the exact binomial p-value.
pub const MCNEMAR_EXACT_MAX_DISCORDANT: u64 = 25;

/// Why a statistic cannot be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    /// Fewer observations than the statistic needs.
    #[error("{what} needs at least {min} observations, got {got}")]
    TooFew { what: &'static str, min: usize, got: usize },
    /// `alpha` outside (0, 1).
    #[error("alpha must be in (0, 1), got {0}")]
    Alpha(f64),
    /// A score that is not a finite number.
    #[error("score of record {0:?} is not a finite number")]
    NotFinite(String),
}

/// The standard error of a mean score, naive and (when records repeat) cluster-robust by record.
#[derive(Debug, Clone, PartialEq)]
pub struct StandardError {
    pub mean: f64,
    /// Observations.
    pub n: usize,
    pub alpha: f64,
    /// `sd / sqrt(n)` treating every observation as independent.
    pub se_naive: f64,
    /// t interval (n - 1 degrees of freedom) on the naive standard error.
    pub ci_naive: (f64, f64),
    /// Records (clusters) when the cluster-robust error applies.
    pub n_clusters: Option<usize>,
    /// CR1 cluster-robust standard error, records as clusters.
    pub se_clustered: Option<f64>,
    /// t interval (clusters - 1 degrees of freedom) on the clustered standard error.
    pub ci_clustered: Option<(f64, f64)>,
    /// `se_clustered / se_naive`.
    pub inflation: Option<f64>,
    /// `inflation²`.
    pub design_effect: Option<f64>,
    pub notes: Vec<String>,
}

impl StandardError {
    /// The honest standard error: clustered when available, naive otherwise.
    pub fn se(&self) -> f64 {
        self.se_clustered.unwrap_or(self.se_naive)
    }

    /// The honest interval: clustered when available, naive otherwise.
    pub fn ci(&self) -> (f64, f64) {
        self.ci_clustered.unwrap_or(self.ci_naive)
    }
}

/// `evalconfidence.standard_error(results, cluster="auto", alpha)` for one system: clustered by
/// record when some record repeats.
pub fn standard_error(obs: &[(&str, f64)], alpha: f64) -> Result<StandardError, StatsError> {
    check_alpha(alpha)?;
    check_finite(obs)?;
    standard_error_keyed(&mut obs.to_vec(), alpha)
}

/// [`standard_error`] with records named by any ordered key (a run's aggregates use a 64-bit hash
/// of the record id: 16 bytes per observation instead of the id). The observations are sorted by
/// key in place (stably: a record's scores keep their order), and the clusters summed in key
/// order, as [`standard_error`] does with ids.
pub fn standard_error_keyed<K: Ord>(obs: &mut [(K, f64)], alpha: f64) -> Result<StandardError, StatsError> {
    check_alpha(alpha)?;
    if let Some(i) = obs.iter().position(|(_, v)| !v.is_finite()) {
        return Err(StatsError::NotFinite(format!("observation {i}")));
    }
    if obs.len() < 2 {
        return Err(StatsError::TooFew { what: "a standard error", min: 2, got: obs.len() });
    }
    let scores: Vec<f64> = obs.iter().map(|o| o.1).collect();
    let n = scores.len();
    let mean = mean(&scores);
    let se_naive = sd(&scores) / (n as f64).sqrt();
    let t = dist::t_upper_quantile(alpha / 2.0, (n - 1) as f64);
    let ci_naive = (mean - t * se_naive, mean + t * se_naive);
    let mut result = StandardError {
        mean,
        n,
        alpha,
        se_naive,
        ci_naive,
        n_clusters: None,
        se_clustered: None,
        ci_clustered: None,
        inflation: None,
        design_effect: None,
        notes: Vec::new(),
    };
    // Residual sums per record (sorted ids, as numpy's unique does).
    drop(scores);
    obs.sort_by(|a, b| a.0.cmp(&b.0));
    if obs.windows(2).all(|w| w[0].0 != w[1].0) {
        return Ok(result);
    }
    let mut sums: Vec<(f64, usize)> = Vec::new();
    for (i, (_, s)) in obs.iter().enumerate() {
        match sums.last_mut() {
            Some(e) if i > 0 && obs[i - 1].0 == obs[i].0 => {
                e.0 += s - mean;
                e.1 += 1;
            }
            Some(_) | None => sums.push((s - mean, 1)),
        }
    }
    let g = sums.len();
    if g < 2 {
        result.notes.push("Only one cluster found by item; cluster-robust SE undefined, reporting naive only.".into());
        return Ok(result);
    }
    let sum_sq: f64 = sums.iter().map(|(s, _)| s * s).sum();
    let var = (g as f64 / (g - 1) as f64) * sum_sq / (n * n) as f64;
    let se_cl = var.sqrt();
    let t_cl = dist::t_upper_quantile(alpha / 2.0, (g - 1) as f64);
    let inflation = se_cl / se_naive;
    if inflation < 1.0 {
        result.notes.push(
            "Clustered SE came out below the naive SE (negative within-cluster correlation or noise); \
             this can happen and is not an error."
                .into(),
        );
    }
    result.n_clusters = Some(g);
    result.se_clustered = Some(se_cl);
    result.ci_clustered = Some((mean - t_cl * se_cl, mean + t_cl * se_cl));
    result.inflation = Some(inflation);
    result.design_effect = Some(inflation * inflation);
    Ok(result)
}

/// The test a comparison used (evalconfidence's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Paired t-test on per-record differences, t interval.
    PairedT,
    /// McNemar on binary single-shot paired scores, CLT interval on the difference.
    McNemar,
    /// Unpaired Welch t-test.
    WelchT,
    /// Unpaired two-proportion z-test with Newcombe's interval.
    TwoProportion,
}

impl Method {
    /// The name evalconfidence uses (`paired_t`, `mcnemar`, `welch_t`, `two_proportion`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PairedT => "paired_t",
            Self::McNemar => "mcnemar",
            Self::WelchT => "welch_t",
            Self::TwoProportion => "two_proportion",
        }
    }
}

/// The comparison of system A against system B; `diff` is A minus B.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub method: Method,
    pub paired: bool,
    /// Distinct records of A and of B.
    pub n_records_a: usize,
    pub n_records_b: usize,
    /// Records in the paired analysis (None when unpaired).
    pub n_pairs: Option<usize>,
    pub mean_a: f64,
    pub mean_b: f64,
    pub diff: f64,
    /// Confidence interval on `diff` at level `1 - alpha`.
    pub ci: (f64, f64),
    pub p_value: f64,
    pub alpha: f64,
    /// Unpaired over paired variance of the estimated difference, on the same records.
    pub variance_reduction: Option<f64>,
    /// `n_pairs * variance_reduction`: the unpaired records the pairing is worth.
    pub effective_n: Option<f64>,
    /// McNemar: discordant-pair odds ratio (Haldane-corrected when a cell is 0) and its interval.
    pub odds_ratio: Option<f64>,
    pub ci_odds_ratio: Option<(f64, f64)>,
    pub n_discordant: Option<u64>,
    /// The paired records' ids (sorted) and per-record means, for the bootstrap and the detail.
    pub pairs: Vec<(String, f64, f64)>,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
}

impl Comparison {
    /// `p_value < alpha`.
    pub fn significant(&self) -> bool {
        self.p_value < self.alpha
    }
}

/// `evalconfidence.compare(results_a, results_b, paired="auto", alpha)`: per-record means first;
/// paired when at least 90% of the larger record set is shared (McNemar for binary single-shot
/// scores, else paired t); unpaired otherwise, with a warning (two proportions or Welch t).
pub fn compare(a: &[(&str, f64)], b: &[(&str, f64)], alpha: f64) -> Result<Comparison, StatsError> {
    check_alpha(alpha)?;
    check_finite(a)?;
    check_finite(b)?;
    let sa = Summary::build(a)?;
    let sb = Summary::build(b)?;
    let mut notes = Vec::new();
    let mut warnings = Vec::new();
    if sa.aggregated || sb.aggregated {
        notes.push("Epoch repeats were aggregated to per-item mean scores.".to_string());
    }
    let shared: Vec<&str> = sa.means.keys().filter(|k| sb.means.contains_key(*k)).copied().collect();
    let larger = sa.means.len().max(sb.means.len());
    let coverage = shared.len() as f64 / larger as f64;
    let do_pair = coverage >= PAIRING_COVERAGE_THRESHOLD && shared.len() >= 2;
    if !do_pair {
        warnings.push(format!(
            "Pairing unavailable: only {:.0}% of items are shared (threshold {:.0}%). Falling back to an \
             unpaired comparison, which ignores the covariance from shared item difficulty and therefore \
             widens the interval. Re-running both systems on identical items would tighten this \
             comparison for free.",
            100.0 * coverage,
            100.0 * PAIRING_COVERAGE_THRESHOLD
        ));
    } else if coverage < 1.0 {
        notes.push(format!("{} unshared item(s) dropped from the paired analysis.", larger - shared.len()));
    }
    let binary = sa.binary_single_shot && sb.binary_single_shot;
    let base = Comparison {
        method: Method::PairedT,
        paired: do_pair,
        n_records_a: sa.means.len(),
        n_records_b: sb.means.len(),
        n_pairs: None,
        mean_a: 0.0,
        mean_b: 0.0,
        diff: 0.0,
        ci: (0.0, 0.0),
        p_value: 1.0,
        alpha,
        variance_reduction: None,
        effective_n: None,
        odds_ratio: None,
        ci_odds_ratio: None,
        n_discordant: None,
        pairs: Vec::new(),
        warnings,
        notes,
    };
    if do_pair {
        let pairs: Vec<(String, f64, f64)> =
            shared.iter().map(|id| ((*id).to_string(), sa.means[id], sb.means[id])).collect();
        let xa: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        let xb: Vec<f64> = pairs.iter().map(|p| p.2).collect();
        let c = Comparison { n_pairs: Some(pairs.len()), mean_a: mean(&xa), mean_b: mean(&xb), pairs, ..base };
        return Ok(if binary { mcnemar(&xa, &xb, c) } else { paired_t(&xa, &xb, c) });
    }
    let xa: Vec<f64> = sa.means.values().copied().collect();
    let xb: Vec<f64> = sb.means.values().copied().collect();
    Ok(if binary { two_proportion(&xa, &xb, base) } else { welch_t(&xa, &xb, base) })
}

/// Per-record means of one system and its shape.
struct Summary<'a> {
    means: BTreeMap<&'a str, f64>,
    aggregated: bool,
    binary_single_shot: bool,
}

impl<'a> Summary<'a> {
    fn build(obs: &[(&'a str, f64)]) -> Result<Self, StatsError> {
        if obs.len() < 2 {
            return Err(StatsError::TooFew { what: "each side of a comparison", min: 2, got: obs.len() });
        }
        let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for (id, s) in obs {
            by.entry(id).or_default().push(*s);
        }
        let single = by.values().all(|v| v.len() == 1);
        Ok(Self {
            means: by.iter().map(|(k, v)| (*k, mean(v))).collect(),
            aggregated: !single,
            binary_single_shot: single && obs.iter().all(|o| o.1 == 0.0 || o.1 == 1.0),
        })
    }
}

fn variance_reduction(xa: &[f64], xb: &[f64], var_paired_mean: f64) -> (Option<f64>, Option<f64>) {
    let n = xa.len() as f64;
    let var_unpaired_mean = (var(xa) + var(xb)) / n;
    if var_paired_mean <= 0.0 || var_paired_mean.is_nan() {
        return (None, None);
    }
    let vr = var_unpaired_mean / var_paired_mean;
    (Some(vr), Some(n * vr))
}

fn paired_t(xa: &[f64], xb: &[f64], mut c: Comparison) -> Comparison {
    let d: Vec<f64> = xa.iter().zip(xb).map(|(a, b)| a - b).collect();
    let n = d.len() as f64;
    let mean_d = mean(&d);
    let sd = sd(&d);
    c.method = Method::PairedT;
    c.diff = mean_d;
    if sd == 0.0 {
        c.notes.push(
            "All within-item differences are identical; the paired SE is 0 and the p-value is degenerate.".into(),
        );
        c.ci = (mean_d, mean_d);
        c.p_value = if mean_d != 0.0 { 0.0 } else { 1.0 };
        return c;
    }
    let se = sd / n.sqrt();
    c.p_value = dist::t_two_sided_p(mean_d / se, n - 1.0);
    let t = dist::t_upper_quantile(c.alpha / 2.0, n - 1.0);
    c.ci = (mean_d - t * se, mean_d + t * se);
    (c.variance_reduction, c.effective_n) = variance_reduction(xa, xb, se * se);
    c
}

fn mcnemar(xa: &[f64], xb: &[f64], mut c: Comparison) -> Comparison {
    let n = xa.len() as f64;
    let n10 = xa.iter().zip(xb).filter(|(a, b)| **a == 1.0 && **b == 0.0).count() as u64;
    let n01 = xa.iter().zip(xb).filter(|(a, b)| **a == 0.0 && **b == 1.0).count() as u64;
    let n_disc = n10 + n01;
    let diff = (n10 as f64 - n01 as f64) / n;
    c.method = Method::McNemar;
    c.n_discordant = Some(n_disc);
    if n_disc == 0 {
        c.notes.push("Models agree on every item; no discordant pairs to test.".into());
        c.diff = 0.0;
        c.ci = (0.0, 0.0);
        c.p_value = 1.0;
        c.odds_ratio = Some(1.0);
        c.ci_odds_ratio = Some((0.0, f64::INFINITY));
        return c;
    }
    c.p_value = if n_disc <= MCNEMAR_EXACT_MAX_DISCORDANT {
        c.notes.push(format!(
            "Exact binomial McNemar used ({n_disc} discordant pairs <= {MCNEMAR_EXACT_MAX_DISCORDANT})."
        ));
        dist::binom_two_sided_half(n10, n_disc)
    } else {
        let chi2 = ((n10 as f64 - n01 as f64).abs() - 1.0).powi(2) / n_disc as f64;
        dist::chi2_1_sf(chi2)
    };
    // Haldane-Anscombe correction keeps the odds ratio finite when a cell is 0.
    let (c10, c01) = if n10 == 0 || n01 == 0 { (n10 as f64 + 0.5, n01 as f64 + 0.5) } else { (n10 as f64, n01 as f64) };
    let or = c10 / c01;
    let z = dist::z_upper_quantile(c.alpha / 2.0);
    let log_se = (1.0 / c10 + 1.0 / c01).sqrt();
    c.odds_ratio = Some(or);
    c.ci_odds_ratio = Some((or * (-z * log_se).exp(), or * (z * log_se).exp()));
    let var_d = (n10 as f64 / n + n01 as f64 / n - diff * diff) / n;
    let se_d = var_d.sqrt();
    c.diff = diff;
    c.ci = (diff - z * se_d, diff + z * se_d);
    (c.variance_reduction, c.effective_n) = variance_reduction(xa, xb, var_d);
    c
}

fn welch_t(xa: &[f64], xb: &[f64], mut c: Comparison) -> Comparison {
    let (na, nb) = (xa.len() as f64, xb.len() as f64);
    let (va, vb) = (var(xa), var(xb));
    let se = (va / na + vb / nb).sqrt();
    let df = (va / na + vb / nb).powi(2) / ((va / na).powi(2) / (na - 1.0) + (vb / nb).powi(2) / (nb - 1.0));
    c.method = Method::WelchT;
    c.mean_a = mean(xa);
    c.mean_b = mean(xb);
    c.diff = c.mean_a - c.mean_b;
    c.p_value = dist::t_two_sided_p(c.diff / se, df);
    let t = dist::t_upper_quantile(c.alpha / 2.0, df);
    c.ci = (c.diff - t * se, c.diff + t * se);
    c
}

fn two_proportion(xa: &[f64], xb: &[f64], mut c: Comparison) -> Comparison {
    let (na, nb) = (xa.len() as f64, xb.len() as f64);
    let (pa, pb) = (mean(xa), mean(xb));
    let pooled = (xa.iter().sum::<f64>() + xb.iter().sum::<f64>()) / (na + nb);
    let se_pooled = (pooled * (1.0 - pooled) * (1.0 / na + 1.0 / nb)).sqrt();
    let diff = pa - pb;
    let z_stat = if se_pooled > 0.0 {
        diff / se_pooled
    } else if diff == 0.0 {
        f64::NAN
    } else {
        f64::INFINITY * diff.signum()
    };
    let z = dist::z_upper_quantile(c.alpha / 2.0);
    let (la, ua) = wilson(pa, na, z);
    let (lb, ub) = wilson(pb, nb, z);
    c.method = Method::TwoProportion;
    c.mean_a = pa;
    c.mean_b = pb;
    c.diff = diff;
    c.p_value = 2.0 * dist::normal_sf(z_stat.abs());
    // Newcombe's score-interval difference (method 10).
    c.ci =
        (diff - ((pa - la).powi(2) + (ub - pb).powi(2)).sqrt(), diff + ((ua - pa).powi(2) + (pb - lb).powi(2)).sqrt());
    c
}

fn wilson(p: f64, n: f64, z: f64) -> (f64, f64) {
    let z2 = z * z;
    let center = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
    (center - half, center + half)
}

fn check_alpha(alpha: f64) -> Result<(), StatsError> {
    if alpha > 0.0 && alpha < 1.0 { Ok(()) } else { Err(StatsError::Alpha(alpha)) }
}

fn check_finite(obs: &[(&str, f64)]) -> Result<(), StatsError> {
    match obs.iter().find(|o| !o.1.is_finite()) {
        Some((id, _)) => Err(StatsError::NotFinite((*id).to_string())),
        None => Ok(()),
    }
}

/// Arithmetic mean (NaN when empty).
pub fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// Sample variance (ddof = 1).
pub fn var(x: &[f64]) -> f64 {
    let m = mean(x);
    x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (x.len() as f64 - 1.0)
}

/// Sample standard deviation (ddof = 1).
pub fn sd(x: &[f64]) -> f64 {
    var(x).sqrt()
}
