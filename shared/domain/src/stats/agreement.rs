//! Agreement of a judge with human (gold) labels, and the judge's mean score corrected by them.
//!
//! - Binary items (yes / no): the confusion table, accuracy and Cohen's kappa; Krippendorff's
//!   alpha comes from [`super::krippendorff`] (judge and gold as two raters).
//! - Prediction-powered inference (Angelopoulos, Bates, Fannjiang, Jordan, Zrnic, "Prediction-powered
//!   inference", Science 382, 2023): with judge scores `f` on all N records and gold scores `y` on
//!   a random subset of n of them, the mean is estimated as `mean_N(f) + mean_n(y - f)` (the judge's
//!   mean corrected by its average error on the labelled records), with the normal interval from
//!   `var_N(f) / N + var_n(y - f) / n`. It is unbiased whatever the judge's bias, and narrower than
//!   the gold-only (classical) interval when the judge tracks the gold labels. The judge-only mean
//!   and the gold-only mean are reported beside it with their naive normal intervals.

use super::{StatsError, dist, mean, var};

/// Judge answers against gold answers on binary items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confusion {
    /// Judge yes, gold yes.
    pub yes_yes: u64,
    /// Judge yes, gold no (false positives).
    pub yes_no: u64,
    /// Judge no, gold yes (false negatives).
    pub no_yes: u64,
    /// Judge no, gold no.
    pub no_no: u64,
}

impl Confusion {
    /// The table of `(judge, gold)` answer pairs (true = yes).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (bool, bool)>) -> Self {
        let mut c = Self::default();
        for (judge, gold) in pairs {
            match (judge, gold) {
                (true, true) => c.yes_yes += 1,
                (true, false) => c.yes_no += 1,
                (false, true) => c.no_yes += 1,
                (false, false) => c.no_no += 1,
            }
        }
        c
    }

    /// Items compared.
    pub fn n(&self) -> u64 {
        self.yes_yes + self.yes_no + self.no_yes + self.no_no
    }

    /// Share of items where judge and gold agree (None when empty).
    pub fn accuracy(&self) -> Option<f64> {
        let n = self.n();
        (n > 0).then(|| (self.yes_yes + self.no_no) as f64 / n as f64)
    }

    /// Cohen's kappa: `(p_o - p_e) / (1 - p_e)`, `p_e` the agreement expected from the two raters'
    /// yes-rates. None when empty or when chance agreement is certain (both answer one value only).
    pub fn kappa(&self) -> Option<f64> {
        let n = self.n() as f64;
        if n == 0.0 {
            return None;
        }
        let observed = (self.yes_yes + self.no_no) as f64 / n;
        let judge_yes = (self.yes_yes + self.yes_no) as f64 / n;
        let gold_yes = (self.yes_yes + self.no_yes) as f64 / n;
        let expected = judge_yes * gold_yes + (1.0 - judge_yes) * (1.0 - gold_yes);
        (expected < 1.0).then(|| (observed - expected) / (1.0 - expected))
    }

    /// Krippendorff's alpha (nominal) of the judge and gold answers as two raters.
    pub fn krippendorff_alpha(&self) -> Result<f64, super::krippendorff::Undefined> {
        let mut judge = Vec::with_capacity(self.n() as usize);
        let mut gold = Vec::with_capacity(self.n() as usize);
        for (count, j, g) in
            [(self.yes_yes, 1.0, 1.0), (self.yes_no, 1.0, 0.0), (self.no_yes, 0.0, 1.0), (self.no_no, 0.0, 0.0)]
        {
            for _ in 0..count {
                judge.push(Some(j));
                gold.push(Some(g));
            }
        }
        super::krippendorff::alpha(&[judge, gold], super::krippendorff::Level::Nominal)
    }
}

/// A mean with its standard error and normal interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanInterval {
    pub mean: f64,
    pub se: f64,
    /// Normal interval at level `1 - alpha`.
    pub ci: (f64, f64),
    /// Values the estimate rests on (labelled ones for the corrected and gold-only estimates).
    pub n: usize,
}

impl MeanInterval {
    fn new(mean: f64, se: f64, z: f64, n: usize) -> Self {
        Self { mean, se, ci: (mean - z * se, mean + z * se), n }
    }

    /// `low <= x <= high`.
    pub fn covers(&self, x: f64) -> bool {
        self.ci.0 <= x && x <= self.ci.1
    }
}

/// The prediction-powered mean beside the judge-only and the gold-only means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PredictionPowered {
    pub alpha: f64,
    /// `mean_N(judge) + mean_n(gold - judge)`; `n` is the labelled count.
    pub ppi: MeanInterval,
    /// `mean_n(gold - judge)`: the judge's average error on the labelled records.
    pub correction: f64,
    /// The judge's mean over all N judged values (biased when the judge is).
    pub judge_only: MeanInterval,
    /// The gold mean over the n labelled values (classical: unbiased, wide).
    pub gold_only: MeanInterval,
}

/// Prediction-powered mean of a score: `judged` holds the judge's value of every judged record (the
/// labelled ones included), `labelled` the `(judge, gold)` values of the records with a gold label,
/// a random subset of the judged ones. Intervals are normal at level `1 - alpha`.
pub fn prediction_powered_mean(
    judged: &[f64],
    labelled: &[(f64, f64)],
    alpha: f64,
) -> Result<PredictionPowered, StatsError> {
    super::check_alpha(alpha)?;
    if judged.len() < 2 {
        return Err(StatsError::TooFew { what: "the judged values", min: 2, got: judged.len() });
    }
    if labelled.len() < 2 {
        return Err(StatsError::TooFew { what: "the labelled values", min: 2, got: labelled.len() });
    }
    if judged.iter().chain(labelled.iter().flat_map(|(j, g)| [j, g])).any(|x| !x.is_finite()) {
        return Err(StatsError::NotFinite("a judged or labelled value".into()));
    }
    let z = dist::z_upper_quantile(alpha / 2.0);
    let (big_n, n) = (judged.len(), labelled.len());
    let errors: Vec<f64> = labelled.iter().map(|(j, g)| g - j).collect();
    let gold: Vec<f64> = labelled.iter().map(|(_, g)| *g).collect();
    let judge_mean = mean(judged);
    let correction = mean(&errors);
    let var_judge = var(judged) / big_n as f64;
    let var_err = var(&errors) / n as f64;
    Ok(PredictionPowered {
        alpha,
        ppi: MeanInterval::new(judge_mean + correction, (var_judge + var_err).sqrt(), z, n),
        correction,
        judge_only: MeanInterval::new(judge_mean, var_judge.sqrt(), z, big_n),
        gold_only: MeanInterval::new(mean(&gold), (var(&gold) / n as f64).sqrt(), z, n),
    })
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn kappa_and_accuracy_of_a_textbook_table() {
        // 50 items: both yes 20, judge yes / gold no 5, judge no / gold yes 10, both no 15:
        // p_o = 0.7, p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5, kappa = 0.4.
        let c = Confusion { yes_yes: 20, yes_no: 5, no_yes: 10, no_no: 15 };
        assert_eq!(c.n(), 50);
        assert!((c.accuracy().unwrap() - 0.7).abs() < 1e-15);
        assert!((c.kappa().unwrap() - 0.4).abs() < 1e-15);
        // Krippendorff's alpha (nominal, two raters): 100 values, 55 yes and 45 no; observed
        // disagreement 2 x 15 ordered pairs, expected (100^2 - 55^2 - 45^2) / 99 = 50: 1 - 30/50.
        let alpha = c.krippendorff_alpha().unwrap();
        assert!((alpha - 0.4).abs() < 1e-12, "{alpha}");
        let pairs = [(true, true), (true, false), (false, false), (false, false)];
        assert_eq!(Confusion::from_pairs(pairs), Confusion { yes_yes: 1, yes_no: 1, no_yes: 0, no_no: 2 });
    }

    #[test]
    fn kappa_is_undefined_when_chance_agreement_is_certain() {
        let c = Confusion { yes_yes: 12, ..Confusion::default() };
        assert_eq!(c.accuracy(), Some(1.0));
        assert_eq!(c.kappa(), None);
        assert_eq!(Confusion::default().accuracy(), None);
        // Perfect agreement with both values present: kappa 1; always-wrong judge: kappa -1.
        assert_eq!(Confusion { yes_yes: 3, no_no: 7, ..Confusion::default() }.kappa(), Some(1.0));
        assert_eq!(Confusion { yes_no: 5, no_yes: 5, ..Confusion::default() }.kappa(), Some(-1.0));
    }

    #[test]
    fn ppi_arithmetic() {
        // Judge 0.5 on average over 4 records; on the 2 labelled ones gold is 0.25 above the judge.
        let judged = [0.0, 1.0, 0.5, 0.5];
        let labelled = [(0.0, 0.5), (1.0, 1.0)];
        let p = prediction_powered_mean(&judged, &labelled, 0.05).unwrap();
        assert!((p.correction - 0.25).abs() < 1e-15);
        assert!((p.ppi.mean - 0.75).abs() < 1e-15);
        assert!((p.judge_only.mean - 0.5).abs() < 1e-15);
        assert!((p.gold_only.mean - 0.75).abs() < 1e-15);
        // var(judged) = 1/6, / 4; errors (0.5, 0) var 0.125, / 2.
        let se = (1.0 / 24.0 + 0.0625_f64).sqrt();
        assert!((p.ppi.se - se).abs() < 1e-15);
        assert!((p.ppi.ci.1 - p.ppi.ci.0 - 2.0 * 1.959963984540054 * se).abs() < 1e-12);
        assert_eq!((p.ppi.n, p.judge_only.n, p.gold_only.n), (2, 4, 2));
        assert!(matches!(prediction_powered_mean(&judged, &labelled[..1], 0.05), Err(StatsError::TooFew { .. })));
        assert!(matches!(prediction_powered_mean(&judged, &labelled, 1.0), Err(StatsError::Alpha(_))));
        assert!(matches!(prediction_powered_mean(&[f64::NAN, 1.0], &labelled, 0.05), Err(StatsError::NotFinite(_))));
    }

    /// One synthetic evaluation: true scores Bernoulli(0.6) on `big_n` records, a judge that turns
    /// a true yes into no with probability 0.2 and a true no into yes with 0.05 (mean 0.5), gold
    /// labels on the first `n` records (the records are exchangeable, so that is a random subset).
    fn trial(rng: &mut ChaCha8Rng, big_n: usize, n: usize) -> PredictionPowered {
        let mut judged = Vec::with_capacity(big_n);
        let mut labelled = Vec::with_capacity(n);
        for i in 0..big_n {
            let truth = rng.random::<f64>() < 0.6;
            let judge = if truth { rng.random::<f64>() >= 0.2 } else { rng.random::<f64>() < 0.05 };
            let j = f64::from(u8::from(judge));
            judged.push(j);
            if i < n {
                labelled.push((j, f64::from(u8::from(truth))));
            }
        }
        prediction_powered_mean(&judged, &labelled, 0.05).unwrap()
    }

    #[test]
    fn ppi_covers_the_truth_where_the_biased_judge_does_not() {
        const TRUTH: f64 = 0.6;
        let mut rng = ChaCha8Rng::seed_from_u64(20_261_126);
        let results: Vec<PredictionPowered> = (0..100).map(|_| trial(&mut rng, 10_000, 150)).collect();
        let ppi = results.iter().filter(|r| r.ppi.covers(TRUTH)).count();
        let judge = results.iter().filter(|r| r.judge_only.covers(TRUTH)).count();
        let gold = results.iter().filter(|r| r.gold_only.covers(TRUTH)).count();
        assert!(ppi >= 93, "prediction-powered interval covered the truth in {ppi} of 100");
        assert!(judge <= 5, "judge-only interval covered the truth in {judge} of 100");
        assert!(gold >= 85, "gold-only interval covered the truth in {gold} of 100");
        // The judge carries information: the corrected interval is narrower than gold alone.
        let width = |f: fn(&PredictionPowered) -> MeanInterval| {
            results.iter().map(|r| f(r).ci.1 - f(r).ci.0).sum::<f64>() / results.len() as f64
        };
        let (w_ppi, w_gold) = (width(|r| r.ppi), width(|r| r.gold_only));
        assert!(w_ppi < 0.85 * w_gold, "ppi width {w_ppi}, gold-only width {w_gold}");
    }
}
