//! An anytime-valid sequential comparison of two responders on paired records: after every pair, a
//! confidence sequence (CS) for the mean paired difference `d = score_B - score_A`, valid at every
//! stopping time, and the decision it supports (B better, B worse, the two equivalent within a
//! margin, or not yet decided). A run may stop as soon as the decision is made, or look after every
//! record, without inflating the error rate: that is what a fixed-n test re-run after each record
//! cannot do (its false-decision rate grows well past `alpha`).
//!
//! # Construction
//!
//! The hedged-capital betting CS of I. Waudby-Smith and A. Ramdas, "Estimating means of bounded
//! random variables by betting", JRSS-B 86(1), 2024 (arXiv:2010.09686), with its predictable
//! plug-in bets (as the authors' `confseq` package's `betting_cs` computes them):
//!
//! - a difference `d` in [-1, 1] is mapped to `x = (d + 1) / 2` in [0, 1], the CS is built for
//!   `E[x]`, and mapped back (`mean_d = 2 mean_x - 1`);
//! - for each candidate mean `m`, two capital processes bet that the mean is above (`K+`) or below
//!   (`K-`) `m`: `K+_t(m) = prod_i (1 + l+_i(m) (x_i - m))`, `K-_t(m) = prod_i (1 - l-_i(m) (x_i - m))`,
//!   with `l+_i(m) = min(l_i, c / m)`, `l-_i(m) = min(l_i, c / (1 - m))`, `c = 1/2`, and the
//!   predictable plug-in bet `l_t = sqrt(2 ln(2 / alpha) / (s2_{t-1} t ln(1 + t)))`, where
//!   `s2_t = (1/4 + sum_{i<=t} (x_i - mu_i)^2) / (t + 1)` and `mu_t = (1/2 + sum_{i<=t} x_i) / (t + 1)`;
//! - the hedged capital is `max(K+ / 2, K- / 2)`; `m` leaves the CS once it reaches `1 / alpha`. Under
//!   the true mean `K+` and `K-` are nonnegative martingales starting at 1 (the bets are
//!   predictable and keep every factor at least `1 - c > 0`), so is `K+ / 2 + K- / 2`, which is at
//!   least the hedged capital: by Ville's inequality the true mean is ever excluded with
//!   probability at most `alpha`;
//! - `K+_t(m)` is nonincreasing and `K-_t(m)` nondecreasing in `m` (each factor is), so the CS is
//!   an interval: the means below the lower end are excluded by `K+`, those above the upper end by
//!   `K-`.
//!
//! The capital is kept on a grid of [`GRID_STEPS`] + 1 candidate means `m_j = j / GRID_STEPS`, and
//! updated incrementally: a pair costs O(grid points still in the interval). The interval reported
//! is a superset of the exact CS: from the largest grid point excluded below to the smallest
//! excluded above (so the grid never makes it anti-conservative; it costs at most one step,
//! 2 / [`GRID_STEPS`] in difference units, per end). It is the running intersection over time
//! (still valid, and weakly shrinking): a grid point once excluded stays out and is no longer
//! updated.
//!
//! # Assumptions
//!
//! - Every difference lies in [-1, 1] (scores in [0, 1]); [`PairedSequence::push`] refuses others.
//! - The pairs are independent draws from one population of records (more generally: each
//!   difference has the same conditional mean given the earlier ones). A benchmark's records,
//!   regarded as a random sample of the population they represent and taken in a uniformly random
//!   order, fit this; the random order is what makes the sequence exchangeable. This is why a run
//!   takes its records in a seeded random order: in file order (easy ones first, one topic after
//!   another) the early records are not representative and the guarantee does not hold.
//! - The CS covers the mean difference over that population, not specifically the finite
//!   dataset's own mean (for that, under sampling without replacement, Waudby-Smith & Ramdas give a
//!   different, tighter construction, not implemented here).
//! - The guarantee is on the whole sequence: with probability at least `1 - alpha` the interval
//!   contains the true mean at every pair, so a decision taken at any data-dependent time is wrong
//!   with probability at most `alpha`.
//!
//! Everything is deterministic: no clock, no randomness, no environment.

#[cfg(test)]
mod tests;

/// The grid of candidate means for `x = (d + 1) / 2` has `GRID_STEPS + 1` points `j / GRID_STEPS`.
pub const GRID_STEPS: usize = 1000;
/// The default level: the CS holds at every pair with probability at least `1 - alpha`.
pub const DEFAULT_ALPHA: f64 = 0.05;
/// Pairs before any decision, by default.
pub const DEFAULT_MIN_PAIRS: u32 = 30;
/// Truncation of the bets, `c` in `min(l, c / m)` (Waudby-Smith & Ramdas use 1/2 or 3/4).
const TRUNCATION: f64 = 0.5;

/// The options of a sequential comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SequentialOptions {
    /// The CS misses the mean difference at some pair with probability at most `alpha`, in
    /// (0, 0.5]. Default 0.05.
    pub alpha: f64,
    /// The equivalence margin, in (0, 1) difference units: the responders are equivalent once the
    /// interval lies inside (-margin, +margin). None (the default) never decides equivalence.
    pub margin: Option<f64>,
    /// No decision before this many pairs (the interval is valid from the first pair; the floor
    /// only keeps early, fragile stops out). Default 30.
    pub min_pairs: u32,
}

impl Default for SequentialOptions {
    fn default() -> Self {
        Self { alpha: DEFAULT_ALPHA, margin: None, min_pairs: DEFAULT_MIN_PAIRS }
    }
}

/// What the interval so far says about B against A.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Fewer than `min_pairs` pairs, or the interval still straddles the question.
    Undecided,
    /// B scores higher than A: the whole interval is above 0.
    Better,
    /// B scores lower than A: the whole interval is below 0.
    Worse,
    /// The whole interval lies inside (-margin, +margin) (and does not exclude 0: a sign, when
    /// established, is reported as `Better` or `Worse` first).
    Equivalent,
}

/// Options or a difference refused.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum SequentialError {
    /// `alpha` outside (0, 0.5].
    #[error("alpha must be in (0, 0.5], got {0}")]
    Alpha(f64),
    /// `margin` outside (0, 1).
    #[error("margin must be in (0, 1), got {0}")]
    Margin(f64),
    /// A difference that is not a finite number in [-1, 1].
    #[error("difference must be a finite number in [-1, 1] (score B - score A), got {0}")]
    Difference(f64),
}

/// The incremental state of a sequential paired comparison (see the module documentation).
#[derive(Debug, Clone)]
pub struct PairedSequence {
    options: SequentialOptions,
    /// `ln(2 / alpha)`, numerator of the bets.
    log_two_over_alpha: f64,
    /// `2 / alpha`: `max(K+ / 2, K- / 2) >= 1 / alpha` is `K+ >= 2 / alpha` or `K- >= 2 / alpha`.
    threshold: f64,
    pairs: u32,
    /// Sum of the differences.
    sum_d: f64,
    /// Sum of `x` (for the plug-in mean).
    sum_x: f64,
    /// `sum (x_i - mu_i)^2` (for the plug-in variance).
    sum_sq: f64,
    /// `s2_t`, the plug-in variance after the pairs so far (1/4 before any).
    s2: f64,
    /// Capital betting above / below each grid point; only `lo..end` are kept up to date.
    k_plus: Vec<f64>,
    k_minus: Vec<f64>,
    /// The grid points not yet excluded, `lo..end`.
    lo: usize,
    end: usize,
}

impl PairedSequence {
    /// A comparison with no pair yet; refuses `alpha` outside (0, 0.5] and `margin` outside (0, 1).
    pub fn new(options: SequentialOptions) -> Result<Self, SequentialError> {
        let alpha = options.alpha;
        if !(alpha > 0.0 && alpha <= 0.5) {
            return Err(SequentialError::Alpha(alpha));
        }
        if let Some(m) = options.margin
            && !(m > 0.0 && m < 1.0)
        {
            return Err(SequentialError::Margin(m));
        }
        Ok(Self {
            options,
            log_two_over_alpha: (2.0 / alpha).ln(),
            threshold: 2.0 / alpha,
            pairs: 0,
            sum_d: 0.0,
            sum_x: 0.0,
            sum_sq: 0.0,
            s2: 0.25,
            k_plus: vec![1.0; GRID_STEPS + 1],
            k_minus: vec![1.0; GRID_STEPS + 1],
            lo: 0,
            end: GRID_STEPS + 1,
        })
    }

    /// The options it was built with.
    pub fn options(&self) -> &SequentialOptions {
        &self.options
    }

    /// Adds one pair's difference `score_B - score_A`; refuses a non-finite value or one outside
    /// [-1, 1] (the state is then unchanged).
    pub fn push(&mut self, difference: f64) -> Result<(), SequentialError> {
        if !(difference.is_finite() && (-1.0..=1.0).contains(&difference)) {
            return Err(SequentialError::Difference(difference));
        }
        let x = (difference + 1.0) / 2.0;
        let t = f64::from(self.pairs) + 1.0;
        // The bet for this pair uses the pairs before it only (predictable).
        let bet = (2.0 * self.log_two_over_alpha / (self.s2 * t * t.ln_1p())).sqrt();
        let step = 1.0 / GRID_STEPS as f64;
        for j in self.lo..self.end {
            let m = j as f64 * step;
            let up = if m * bet > TRUNCATION { TRUNCATION / m } else { bet };
            let down = if (1.0 - m) * bet > TRUNCATION { TRUNCATION / (1.0 - m) } else { bet };
            self.k_plus[j] *= 1.0 + up * (x - m);
            self.k_minus[j] *= 1.0 - down * (x - m);
        }
        // K+ is nonincreasing in m: the excluded points below are a prefix of lo..end; K- the mirror.
        // A point kept by rounding where its neighbour went out only widens the interval.
        let mut lo = self.lo;
        while lo < self.end && self.k_plus[lo] >= self.threshold {
            lo += 1;
        }
        let mut end = self.end;
        while end > self.lo && self.k_minus[end - 1] >= self.threshold {
            end -= 1;
        }
        // Keep the interval nonempty: when the data exclude every candidate mean, a grid step apart
        // from both sides (probability at most alpha under the assumptions), it keeps its last value.
        if lo <= end {
            self.lo = lo;
            self.end = end;
        }
        self.pairs += 1;
        self.sum_d += difference;
        self.sum_x += x;
        let mu = (0.5 + self.sum_x) / (t + 1.0);
        self.sum_sq += (x - mu) * (x - mu);
        self.s2 = (0.25 + self.sum_sq) / (t + 1.0);
        Ok(())
    }

    /// Pairs added so far.
    pub fn pairs(&self) -> u32 {
        self.pairs
    }

    /// The mean difference `score_B - score_A` over the pairs so far (0 before any).
    pub fn mean(&self) -> f64 {
        if self.pairs == 0 { 0.0 } else { self.sum_d / f64::from(self.pairs) }
    }

    /// The confidence interval on the mean difference (`score_B - score_A`, in [-1, 1]) after the
    /// pairs so far: with probability at least `1 - alpha` every interval of the sequence holds the
    /// true mean difference. [-1, 1] before any pair; weakly shrinking (the running intersection).
    /// It is centred on a bet-weighted mean, not on [`Self::mean`], and keeps what earlier pairs
    /// excluded: it nearly always holds the running mean, but not always.
    pub fn interval(&self) -> (f64, f64) {
        let step = 1.0 / GRID_STEPS as f64;
        // The largest excluded grid point below the kept ones (or 0), the smallest above (or 1).
        let low = self.lo.saturating_sub(1) as f64 * step;
        let high = self.end.min(GRID_STEPS) as f64 * step;
        (2.0 * low - 1.0, 2.0 * high - 1.0)
    }

    /// The decision the interval supports: `Undecided` before `min_pairs` pairs; then `Better`
    /// (interval above 0), `Worse` (below 0), `Equivalent` (inside (-margin, +margin), when a margin
    /// is set), else `Undecided`.
    pub fn decision(&self) -> Decision {
        if self.pairs < self.options.min_pairs {
            return Decision::Undecided;
        }
        let (low, high) = self.interval();
        if low > 0.0 {
            Decision::Better
        } else if high < 0.0 {
            Decision::Worse
        } else if self.options.margin.is_some_and(|m| low > -m && high < m) {
            Decision::Equivalent
        } else {
            Decision::Undecided
        }
    }
}
