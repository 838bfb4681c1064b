//! Krippendorff's alpha for nominal, ordinal, interval and ratio data with missing values, as the
//! `krippendorff` Python package computes it (coincidence matrix; ordinal distances from the
//! pairable value counts), to 1e-9 on the fixtures in `services/arbiter/tests/fixtures` (checked by
//! the arbiter's `tests/alpha.rs`, which reaches this module through `assay_arbiter::core::alpha`).
//!
//! alpha = 1 - D_o / D_e, with
//! - D_o = sum over units u with m_u >= 2 values of 1 / (m_u - 1) x the sum of the distances of the
//!   ordered pairs of values in u (the coincidence matrix weighted by the distances, without
//!   building it);
//! - D_e = the sum over ordered pairs of pairable values (n_c of value c) of n_c n_k d(c, k), over
//!   n - 1 (the random coincidences weighted by the distances).
//!
//! Nominal and interval D_e have closed forms (O(n)); ordinal and ratio sum over the distinct
//! pairable values (O(V^2)). Alpha is undefined, and reported as such rather than as NaN, when no
//! unit has two values, when the data hold fewer than two distinct values, or when the pairable
//! values do not disagree at all (D_e = 0).

use std::collections::BTreeMap;

/// Reliability data: one row per rater, one value per unit, `None` where missing.
pub type Ratings = Vec<Vec<Option<f64>>>;

/// Level of measurement: which distance two values are apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Nominal,
    Ordinal,
    Interval,
    Ratio,
}

/// Why alpha has no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Undefined {
    /// No unit was rated by two raters or more.
    NoPairableUnit,
    /// The data hold fewer than two distinct values.
    SingleValue,
    /// The pairable values are all the same: no disagreement is expected by chance.
    NoExpectedDisagreement,
}

impl std::fmt::Display for Undefined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Undefined::NoPairableUnit => "no unit has values from two raters or more",
            Undefined::SingleValue => "the data hold fewer than two distinct values",
            Undefined::NoExpectedDisagreement => "the pairable values are all the same",
        })
    }
}

/// Total order on finite values (callers reject NaN and infinities).
fn key(v: f64) -> u64 {
    // Map the IEEE bits so that integer order is numeric order (and -0.0 == 0.0).
    let v = if v == 0.0 { 0.0 } else { v };
    let bits = v.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | (1 << 63) }
}

/// Alpha with the number of units it could pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    pub alpha: Result<f64, Undefined>,
    /// Units with values from two raters or more.
    pub pairable_units: usize,
}

/// Alpha of `data` (see [`agreement`]).
pub fn alpha(data: &[Vec<Option<f64>>], level: Level) -> Result<f64, Undefined> {
    agreement(data, level).alpha
}

/// Alpha of `data`: one row per rater, one column per unit, `None` for a missing value. Rows may
/// differ in length (a missing tail is missing). Values must be finite.
pub fn agreement(data: &[Vec<Option<f64>>], level: Level) -> Agreement {
    let units = data.iter().map(Vec::len).max().unwrap_or(0);
    // The values of each unit with at least two of them.
    let pairable: Vec<Vec<f64>> = (0..units)
        .map(|u| data.iter().filter_map(|row| row.get(u).copied().flatten()).collect::<Vec<f64>>())
        .filter(|values| values.len() >= 2)
        .collect();
    Agreement { alpha: alpha_of(data, &pairable, level), pairable_units: pairable.len() }
}

fn alpha_of(data: &[Vec<Option<f64>>], pairable: &[Vec<f64>], level: Level) -> Result<f64, Undefined> {
    // Two distinct values anywhere in the data (the value domain) or alpha is undefined.
    let mut values = data.iter().flatten().flatten().map(|v| key(*v));
    let first = values.next();
    if first.is_none_or(|f| values.all(|v| v == f)) {
        return Err(Undefined::SingleValue);
    }
    if pairable.is_empty() {
        return Err(Undefined::NoPairableUnit);
    }
    // n_c: how often each value occurs among the pairable values.
    let mut counts: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for v in pairable.iter().flatten() {
        counts.entry(key(*v)).or_insert((*v, 0.0)).1 += 1.0;
    }
    let n: f64 = counts.values().map(|(_, c)| c).sum();
    let values: Vec<(f64, f64)> = counts.values().copied().collect();
    let distance = Distance::new(level, &values);

    let observed: f64 = pairable
        .iter()
        .map(|u| {
            let mut sum = 0.0;
            for (i, a) in u.iter().enumerate() {
                for b in &u[i + 1..] {
                    sum += 2.0 * distance.between(*a, *b);
                }
            }
            sum / (u.len() as f64 - 1.0)
        })
        .sum();
    let expected = distance.expected(&values, n) / (n - 1.0);
    if expected == 0.0 {
        return Err(Undefined::NoExpectedDisagreement);
    }
    Ok(1.0 - observed / expected)
}

/// The distance function of a level, with what it needs to know of the data.
struct Distance {
    level: Level,
    /// Ordinal: the value's rank among the pairable values and the cumulative counts up to it.
    ranks: BTreeMap<u64, usize>,
    cumulative: Vec<f64>,
    counts: Vec<f64>,
}

impl Distance {
    fn new(level: Level, values: &[(f64, f64)]) -> Self {
        let mut ranks = BTreeMap::new();
        let mut cumulative = Vec::with_capacity(values.len());
        let mut total = 0.0;
        for (i, (v, c)) in values.iter().enumerate() {
            ranks.insert(key(*v), i);
            total += c;
            cumulative.push(total);
        }
        Self { level, ranks, cumulative, counts: values.iter().map(|(_, c)| *c).collect() }
    }

    /// Ordinal distance between ranks i <= j: (n_i + ... + n_j - (n_i + n_j) / 2)^2.
    fn ordinal(&self, i: usize, j: usize) -> f64 {
        let (i, j) = (i.min(j), i.max(j));
        let before = if i == 0 { 0.0 } else { self.cumulative[i - 1] };
        let between = self.cumulative[j] - before;
        (between - (self.counts[i] + self.counts[j]) / 2.0).powi(2)
    }

    fn between(&self, a: f64, b: f64) -> f64 {
        match self.level {
            Level::Nominal => f64::from(u8::from(key(a) != key(b))),
            Level::Interval => (a - b).powi(2),
            Level::Ratio => {
                let s = a + b;
                if s == 0.0 { 0.0 } else { ((a - b) / s).powi(2) }
            }
            Level::Ordinal => self.ordinal(self.ranks[&key(a)], self.ranks[&key(b)]),
        }
    }

    /// The sum over ordered pairs of pairable values of their distance.
    fn expected(&self, values: &[(f64, f64)], n: f64) -> f64 {
        match self.level {
            // Pairs of different values: n^2 - sum n_c^2.
            Level::Nominal => n * n - values.iter().map(|(_, c)| c * c).sum::<f64>(),
            // sum_ab (v_a - v_b)^2 = 2 n sum (v - mean)^2.
            Level::Interval => {
                let mean = values.iter().map(|(v, c)| v * c).sum::<f64>() / n;
                2.0 * n * values.iter().map(|(v, c)| c * (v - mean).powi(2)).sum::<f64>()
            }
            Level::Ordinal | Level::Ratio => {
                let mut sum = 0.0;
                for (i, (a, ca)) in values.iter().enumerate() {
                    for (j, (b, cb)) in values.iter().enumerate().skip(i + 1) {
                        let d = if self.level == Level::Ordinal { self.ordinal(i, j) } else { self.between(*a, *b) };
                        sum += 2.0 * ca * cb * d;
                    }
                }
                sum
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_key_follows_the_numbers() {
        let mut v = [3.5, -1.0, 0.0, -0.0, -7.25, 2.0, 1e-9];
        v.sort_by_key(|x| key(*x));
        assert_eq!(v[..2], [-7.25, -1.0]);
        assert_eq!(key(0.0), key(-0.0));
        assert_eq!(v[4..], [1e-9, 2.0, 3.5]);
    }

    #[test]
    fn undefined_cases_are_named() {
        let d = |rows: &[&[Option<f64>]]| rows.iter().map(|r| r.to_vec()).collect::<Vec<_>>();
        assert_eq!(
            alpha(&d(&[&[Some(3.0), Some(3.0)], &[Some(3.0), None]]), Level::Interval),
            Err(Undefined::SingleValue)
        );
        assert_eq!(
            alpha(&d(&[&[Some(1.0), None], &[None, Some(2.0)]]), Level::Nominal),
            Err(Undefined::NoPairableUnit)
        );
        assert_eq!(
            alpha(&d(&[&[Some(2.0), Some(5.0)], &[Some(2.0), None]]), Level::Ordinal),
            Err(Undefined::NoExpectedDisagreement)
        );
        assert_eq!(alpha(&[], Level::Ratio), Err(Undefined::SingleValue));
    }
}
