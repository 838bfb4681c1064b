//! Power and sample-size planning for a comparison of two runs, as evalconfidence 0.1.1's `power`
//! computes it (normal approximation), matched by the `power_*.json` fixtures in
//! `tests/fixtures/stats`: the records needed to detect a minimum detectable effect (`mde` -> n),
//! the smallest effect n records can detect (n -> mde), or, with both, the power achieved.
//!
//! The per-record variance of the compared quantity comes from a pilot: two runs of the same
//! records (the variance of the per-record differences on the shared records: a paired design), one
//! run (twice the variance of its per-record scores: a two-arm unpaired design, n records per arm),
//! or a variance given as is. Repeated lines of a record (samples) are averaged first.
//! evalconfidence also inflates the variance by a design effect when the pilot's records carry
//! cluster labels; Assay's results carry none, so that step never applies here.

use statrs::distribution::{ContinuousCDF, Normal};

use super::{StatsError, Summary, check_alpha, check_finite, dist, var};

/// Which design the variance describes (evalconfidence's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// Both systems on the same records: the variance of the per-record differences.
    Paired,
    /// Two arms of different records: twice one system's per-record variance.
    Unpaired,
    /// A variance given by the caller.
    Specified,
}

impl Design {
    /// `paired`, `unpaired` or `specified`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paired => "paired",
            Self::Unpaired => "unpaired",
            Self::Specified => "specified",
        }
    }
}

/// Where the variance comes from.
#[derive(Debug, Clone, Copy)]
pub enum Pilot<'a> {
    /// Two runs of (mostly) the same records, observations `(record id, score)`.
    Paired { a: &'a [(&'a str, f64)], b: &'a [(&'a str, f64)] },
    /// One run; plans a two-arm unpaired comparison.
    Single(&'a [(&'a str, f64)]),
    /// The per-record variance of the compared quantity, used as is.
    Variance(f64),
}

/// What to plan: give `mde` for the records needed, `n` for the detectable effect, both for the
/// power achieved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Question {
    /// The smallest difference worth detecting, in score units (> 0).
    pub mde: Option<f64>,
    /// Records (per arm when unpaired), at least 2.
    pub n: Option<u64>,
    /// Significance level of the planned two-sided test, in (0, 1).
    pub alpha: f64,
    /// Target power, in (0, 1).
    pub power: f64,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PowerError {
    #[error(transparent)]
    Stats(#[from] StatsError),
    /// Neither `mde` nor `n`.
    #[error("give mde (records needed), n (detectable effect) or both (power achieved)")]
    NoQuestion,
    #[error("mde must be a positive finite number, got {0}")]
    Mde(f64),
    #[error("n must be at least 2, got {0}")]
    N(u64),
    #[error("power must be in (0, 1), got {0}")]
    Power(f64),
    #[error("the given variance must be a positive finite number, got {0}")]
    Variance(f64),
    /// A paired pilot whose runs share fewer than two records.
    #[error("a paired pilot needs at least 2 shared records, found {0}")]
    TooFewShared(usize),
    /// The pilot's scores (or differences) do not vary: nothing to plan from.
    #[error("the pilot's {0} variance is 0; cannot plan from it")]
    ZeroVariance(&'static str),
}

/// A plan: exactly one of `n_required`, `mde_detectable`, `power_achieved` is set.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub design: Design,
    /// Per-record variance of the compared quantity.
    pub variance: f64,
    pub alpha: f64,
    pub target_power: f64,
    /// Records needed (per arm when unpaired) to detect `mde`.
    pub n_required: Option<u64>,
    /// The smallest difference `n` records detect.
    pub mde_detectable: Option<f64>,
    /// The power of `n` records against a true difference of `mde`.
    pub power_achieved: Option<f64>,
    pub mde: Option<f64>,
    pub n: Option<u64>,
    /// Records the pilot's variance was estimated from (shared records when paired).
    pub pilot_records: Option<usize>,
    /// Every pilot score lies in [0, 1] (effects read as points out of 100).
    pub scores_are_unit_scale: bool,
    pub notes: Vec<String>,
}

/// `evalconfidence.power(pilot, mde=, n=, alpha=, power=)`.
pub fn power(pilot: Pilot<'_>, q: Question) -> Result<Plan, PowerError> {
    check_alpha(q.alpha)?;
    if !(q.power > 0.0 && q.power < 1.0) {
        return Err(PowerError::Power(q.power));
    }
    if q.mde.is_none() && q.n.is_none() {
        return Err(PowerError::NoQuestion);
    }
    if let Some(m) = q.mde
        && !(m.is_finite() && m > 0.0)
    {
        return Err(PowerError::Mde(m));
    }
    if let Some(n) = q.n
        && n < 2
    {
        return Err(PowerError::N(n));
    }
    let mut notes = Vec::new();
    let (design, variance, pilot_records, unit) = match pilot {
        Pilot::Variance(v) => {
            if !(v.is_finite() && v > 0.0) {
                return Err(PowerError::Variance(v));
            }
            (Design::Specified, v, None, false)
        }
        Pilot::Paired { a, b } => paired_variance(a, b, &mut notes)?,
        Pilot::Single(obs) => single_variance(obs, &mut notes)?,
    };
    let z_a = dist::z_upper_quantile(q.alpha / 2.0);
    let z_b = Normal::standard().inverse_cdf(q.power);
    let mut plan = Plan {
        design,
        variance,
        alpha: q.alpha,
        target_power: q.power,
        n_required: None,
        mde_detectable: None,
        power_achieved: None,
        mde: q.mde,
        n: q.n,
        pilot_records,
        scores_are_unit_scale: unit,
        notes,
    };
    match (q.mde, q.n) {
        (Some(mde), Some(n)) => {
            // P(Z < mde / se - z_a), the standard normal distribution function.
            plan.power_achieved = Some(dist::normal_sf(-(mde / (variance / n as f64).sqrt() - z_a)));
        }
        (Some(mde), None) => {
            let needed = ((z_a + z_b).powi(2) * variance / (mde * mde)).ceil();
            // A float to integer cast saturates; a plan beyond u64 is no plan anyway.
            plan.n_required = Some(needed as u64);
        }
        (None, Some(n)) => plan.mde_detectable = Some((z_a + z_b) * (variance / n as f64).sqrt()),
        (None, None) => return Err(PowerError::NoQuestion),
    }
    Ok(plan)
}

/// Every observation in [0, 1].
fn unit_scale(obs: &[(&str, f64)]) -> bool {
    obs.iter().all(|o| (0.0..=1.0).contains(&o.1))
}

type Variance = (Design, f64, Option<usize>, bool);

fn paired_variance(a: &[(&str, f64)], b: &[(&str, f64)], notes: &mut Vec<String>) -> Result<Variance, PowerError> {
    check_finite(a)?;
    check_finite(b)?;
    let sa = Summary::build(a)?;
    let sb = Summary::build(b)?;
    let d: Vec<f64> = sa.means.iter().filter_map(|(id, x)| sb.means.get(id).map(|y| x - y)).collect();
    if d.len() < 2 {
        return Err(PowerError::TooFewShared(d.len()));
    }
    if sa.aggregated || sb.aggregated {
        notes.push("Repeated lines of a record (samples) were averaged per record first.".into());
    }
    let variance = var(&d);
    if variance == 0.0 {
        return Err(PowerError::ZeroVariance("per-record difference"));
    }
    notes.push(format!("Variance estimated from a paired pilot of {} shared records.", d.len()));
    Ok((Design::Paired, variance, Some(d.len()), unit_scale(a) && unit_scale(b)))
}

fn single_variance(obs: &[(&str, f64)], notes: &mut Vec<String>) -> Result<Variance, PowerError> {
    check_finite(obs)?;
    let s = Summary::build(obs)?;
    if s.aggregated {
        notes.push("Repeated lines of a record (samples) were averaged per record first.".into());
    }
    let values: Vec<f64> = s.means.values().copied().collect();
    let variance = var(&values);
    if variance == 0.0 {
        return Err(PowerError::ZeroVariance("per-record score"));
    }
    notes.push(format!(
        "Variance estimated from a one-run pilot of {} records; planning a two-arm unpaired comparison \
         (n = records per arm, variance doubled for the second arm). A paired design (both systems on the \
         same records) would need fewer.",
        values.len()
    ));
    Ok((Design::Unpaired, 2.0 * variance, Some(values.len()), unit_scale(obs)))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::stats::tests::{close, fixtures, obs};

    #[test]
    fn power_matches_evalconfidence() {
        let cases: Vec<Value> = fixtures().into_iter().filter(|c| c["kind"] == "power").collect();
        let mut seen = Vec::new();
        for case in &cases {
            let name = case["name"].as_str().unwrap();
            let e = &case["expected"];
            let (a, b) = (case.get("a").map(obs), case.get("b").map(obs));
            let single = case.get("obs").map(obs);
            let pilot = match case["pilot"].as_str().unwrap() {
                "paired" => Pilot::Paired { a: a.as_deref().unwrap(), b: b.as_deref().unwrap() },
                "single" => Pilot::Single(single.as_deref().unwrap()),
                _ => Pilot::Variance(case["baseline_var"].as_f64().unwrap()),
            };
            let q = Question {
                mde: case["mde"].as_f64(),
                n: case["n"].as_u64(),
                alpha: case["alpha"].as_f64().unwrap(),
                power: case["power"].as_f64().unwrap(),
            };
            let p = power(pilot, q).unwrap_or_else(|err| panic!("{name}: {err}"));
            assert_eq!(p.design.as_str(), e["design"], "{name}");
            assert_eq!(p.n_required, e["n_required"].as_u64(), "{name}: records needed");
            assert_eq!(p.scores_are_unit_scale, e["scores_are_unit_scale"].as_bool().unwrap(), "{name}");
            assert_eq!(p.notes.len() as u64, e["n_notes"].as_u64().unwrap(), "{name}");
            close(name, "variance", Some(p.variance), &e["variance"]);
            close(name, "mde_detectable", p.mde_detectable, &e["mde_detectable"]);
            close(name, "power_achieved", p.power_achieved, &e["power_achieved"]);
            seen.push((name.to_string(), p));
        }
        // Every variance source and every direction is covered.
        for needed in [
            "power_paired_n",
            "power_paired_mde",
            "power_paired_achieved",
            "power_single_n",
            "power_single_mde",
            "power_single_achieved",
            "power_variance",
        ] {
            assert!(seen.iter().any(|(n, _)| n == needed), "fixture {needed} missing");
        }
        // The three directions agree with each other on one pilot: n records detect their own MDE.
        let paired = &seen.iter().find(|(n, _)| n == "power_paired_n").unwrap().1;
        assert!(paired.n_required.unwrap() > 50, "{paired:?}");
    }

    #[test]
    fn the_directions_are_consistent() {
        let q = |mde, n| Question { mde, n, alpha: 0.05, power: 0.8 };
        let n = power(Pilot::Variance(0.2), q(Some(0.05), None)).unwrap().n_required.unwrap();
        // (1.95996 + 0.84162)^2 * 0.2 / 0.0025 = 627.9 -> 628.
        assert_eq!(n, 628);
        let mde = power(Pilot::Variance(0.2), q(None, Some(n))).unwrap().mde_detectable.unwrap();
        assert!(mde > 0.0499 && mde < 0.05, "{mde}");
        let achieved = power(Pilot::Variance(0.2), q(Some(0.05), Some(n))).unwrap().power_achieved.unwrap();
        assert!((0.8..0.801).contains(&achieved), "{achieved}");
    }

    #[test]
    fn bad_questions_are_refused() {
        let q = |mde, n, alpha, p| Question { mde, n, alpha, power: p };
        let v = Pilot::Variance(0.2);
        assert_eq!(power(v, q(None, None, 0.05, 0.8)), Err(PowerError::NoQuestion));
        assert_eq!(power(v, q(Some(0.0), None, 0.05, 0.8)), Err(PowerError::Mde(0.0)));
        assert_eq!(power(v, q(None, Some(1), 0.05, 0.8)), Err(PowerError::N(1)));
        assert_eq!(power(v, q(Some(0.1), None, 0.05, 1.0)), Err(PowerError::Power(1.0)));
        assert_eq!(power(v, q(Some(0.1), None, 0.0, 0.8)), Err(PowerError::Stats(StatsError::Alpha(0.0))));
        assert_eq!(power(Pilot::Variance(0.0), q(Some(0.1), None, 0.05, 0.8)), Err(PowerError::Variance(0.0)));
        let a = [("r1", 1.0), ("r2", 0.0), ("r3", 1.0)];
        let b = [("r1", 1.0), ("x2", 0.0), ("x3", 1.0)];
        assert_eq!(
            power(Pilot::Paired { a: &a, b: &b }, q(Some(0.1), None, 0.05, 0.8)),
            Err(PowerError::TooFewShared(1))
        );
        assert_eq!(
            power(Pilot::Paired { a: &a, b: &a }, q(Some(0.1), None, 0.05, 0.8)),
            Err(PowerError::ZeroVariance("per-record difference"))
        );
        let flat = [("r1", 0.5), ("r2", 0.5)];
        assert_eq!(
            power(Pilot::Single(&flat), q(Some(0.1), None, 0.05, 0.8)),
            Err(PowerError::ZeroVariance("per-record score"))
        );
    }
}
