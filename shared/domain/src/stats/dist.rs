//! The few distribution functions the tests need, on `statrs`. Student's t quantiles are polished
//! by Newton steps on the survival function (statrs' inverse incomplete beta alone falls short of
//! scipy's precision), so they agree with scipy to about 1e-13; tails come from the regularized
//! incomplete beta and gamma functions.

use statrs::distribution::{Continuous, ContinuousCDF, Normal, StudentsT};
use statrs::function::beta::beta_reg;
use statrs::function::gamma::gamma_ur;

/// Two-sided p-value of a t statistic with `df` degrees of freedom: `2 * P(T > |t|)`.
pub fn t_two_sided_p(t: f64, df: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    if t.is_infinite() {
        return 0.0;
    }
    beta_reg(df / 2.0, 0.5, df / (df + t * t))
}

/// The upper `q` quantile of Student's t with `df` degrees of freedom (`t` with `P(T > t) = q`).
pub fn t_upper_quantile(q: f64, df: f64) -> f64 {
    let Ok(dist) = StudentsT::new(0.0, 1.0, df) else {
        return f64::NAN;
    };
    polish(dist.inverse_cdf(1.0 - q), q, |x| dist.sf(x), |x| dist.pdf(x))
}

/// The upper `q` quantile of the standard normal distribution.
pub fn z_upper_quantile(q: f64) -> f64 {
    let Ok(dist) = Normal::new(0.0, 1.0) else {
        return f64::NAN;
    };
    // statrs' inverse error function is accurate to machine precision already.
    dist.inverse_cdf(1.0 - q)
}

/// `P(Z > z)` for a standard normal `Z`.
pub fn normal_sf(z: f64) -> f64 {
    // The regularized upper incomplete gamma: statrs' erfc is good to about 1e-11 relative only.
    let half_tail = 0.5 * gamma_ur(0.5, z * z / 2.0);
    if z >= 0.0 { half_tail } else { 1.0 - half_tail }
}

/// `P(X > x)` for a chi-square `X` with one degree of freedom.
pub fn chi2_1_sf(x: f64) -> f64 {
    if x <= 0.0 { 1.0 } else { gamma_ur(0.5, x / 2.0) }
}

/// Two-sided exact binomial test of `k` successes in `n` trials against p = 1/2 (scipy's
/// `binomtest(k, n, 0.5).pvalue`: by symmetry twice the smaller tail, at most 1).
pub fn binom_two_sided_half(k: u64, n: u64) -> f64 {
    if n == 0 || 2 * k == n {
        return 1.0;
    }
    let m = k.min(n - k);
    // log C(n, i) - n log 2, summed in probability space (n is small here: at most 25).
    let mut c = 1.0_f64;
    let mut tail = 1.0_f64;
    for i in 1..=m {
        c = c * (n - i + 1) as f64 / i as f64;
        tail += c;
    }
    (2.0 * tail / 2f64.powi(n as i32)).min(1.0)
}

fn polish(mut x: f64, q: f64, sf: impl Fn(f64) -> f64, pdf: impl Fn(f64) -> f64) -> f64 {
    for _ in 0..8 {
        let density = pdf(x);
        if !x.is_finite() || density <= 0.0 {
            break;
        }
        let step = (sf(x) - q) / density;
        x += step;
        if step.abs() <= 1e-15 * x.abs().max(1.0) {
            break;
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_scipy() {
        // scipy.stats.t.ppf(0.975, df) / norm.ppf(0.975) / binomtest.
        assert!((t_upper_quantile(0.025, 10.0) - 2.228138851986274).abs() < 1e-12);
        assert!((t_upper_quantile(0.025, 3.5) - 2.9400886379827282).abs() < 1e-12);
        assert!((z_upper_quantile(0.025) - 1.959963984540054).abs() < 1e-14);
        assert!((z_upper_quantile(0.005) - 2.5758293035489004).abs() < 1e-14);
        assert!((binom_two_sided_half(2, 10) - 0.109375).abs() < 1e-15);
        assert_eq!(binom_two_sided_half(5, 10), 1.0);
        assert!((chi2_1_sf(3.841458820694124) - 0.05).abs() < 1e-14);
        assert!((normal_sf(1.959963984540054) - 0.025).abs() < 1e-14);
        assert!((normal_sf(-1.959963984540054) - 0.975).abs() < 1e-14);
    }
}
