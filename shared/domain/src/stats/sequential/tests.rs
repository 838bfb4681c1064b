//! The sequence's guarantees by simulation (seeded ChaCha8 streams): the false-decision rate under
//! no difference stays below alpha, where a fixed-n test re-run after every record does not; the
//! records saved when there is a difference; and the unit behaviour.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::stats::{compare, dist};

/// Records of a simulated run.
const RECORDS: usize = 500;

/// One binary pair: A passes with probability `pa`, B with `pb`; with probability `shared` both
/// are decided by one uniform (a record's shared difficulty), otherwise independently. The
/// correlation of the two scores is `shared * (min(pa, pb) - pa pb) / (sd_a sd_b)`.
fn binary_pair(rng: &mut ChaCha8Rng, pa: f64, pb: f64, shared: f64) -> (f64, f64) {
    let u: f64 = rng.random();
    let (ua, ub) = if rng.random::<f64>() < shared { (u, u) } else { (u, rng.random()) };
    (f64::from(u8::from(ua < pa)), f64::from(u8::from(ub < pb)))
}

/// One continuous pair, both scores from one skewed distribution on [0, 1]: a record difficulty
/// `p` shared by both, plus each responder's own uniform, `((p + u) / 2)^2`.
fn continuous_pair(rng: &mut ChaCha8Rng) -> (f64, f64) {
    let p: f64 = rng.random();
    let (ua, ub): (f64, f64) = (rng.random(), rng.random());
    (((p + ua) / 2.0).powi(2), ((p + ub) / 2.0).powi(2))
}

/// The naive procedure: a two-sided paired t test at 0.05 after every record from 30 on, stopping
/// at the first significant one.
struct NaiveRepeatedT {
    critical: Vec<f64>,
}

impl NaiveRepeatedT {
    fn new(records: usize) -> Self {
        let critical =
            (0..=records).map(|n| if n < 2 { f64::INFINITY } else { dist::t_upper_quantile(0.025, n as f64 - 1.0) });
        Self { critical: critical.collect() }
    }

    /// Whether the test is ever significant on `d` from the 30th difference on.
    fn ever_significant(&self, d: &[f64]) -> bool {
        let (mut sum, mut sum_sq) = (0.0, 0.0);
        for (i, v) in d.iter().enumerate() {
            sum += v;
            sum_sq += v * v;
            let n = (i + 1) as f64;
            if i + 1 < 30 {
                continue;
            }
            let mean = sum / n;
            let var = (sum_sq - n * mean * mean) / (n - 1.0);
            if var > 0.0 && mean.abs() / (var / n).sqrt() > self.critical[i + 1] {
                return true;
            }
        }
        false
    }
}

/// Whether the sequence ever decides Better or Worse on `d` (from `min_pairs` on).
fn ever_decides_a_sign(d: &[f64]) -> bool {
    let mut s = PairedSequence::new(SequentialOptions::default()).expect("options");
    d.iter().any(|v| {
        s.push(*v).expect("difference");
        matches!(s.decision(), Decision::Better | Decision::Worse)
    })
}

/// False-decision rates (sequence, naive) over `runs` runs of `RECORDS` pairs drawn by `pair`.
fn false_decision_rates(runs: u64, seed: u64, mut pair: impl FnMut(&mut ChaCha8Rng) -> (f64, f64)) -> (f64, f64) {
    let naive = NaiveRepeatedT::new(RECORDS);
    let (mut sequence_false, mut naive_false) = (0u32, 0u32);
    for run in 0..runs {
        let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(run));
        let d: Vec<f64> = (0..RECORDS)
            .map(|_| {
                let (a, b) = pair(&mut rng);
                b - a
            })
            .collect();
        sequence_false += u32::from(ever_decides_a_sign(&d));
        naive_false += u32::from(naive.ever_significant(&d));
    }
    (f64::from(sequence_false) / runs as f64, f64::from(naive_false) / runs as f64)
}

fn check_validity(runs: u64, sequence_bound: f64) {
    let alpha = DEFAULT_ALPHA;
    for (name, seed) in [("binary Bernoulli(0.6) each", 1u64), ("continuous ((p + u) / 2)^2", 2)] {
        let (sequence, naive) = if seed == 1 {
            false_decision_rates(runs, seed, |rng| binary_pair(rng, 0.6, 0.6, 0.0))
        } else {
            false_decision_rates(runs, seed, continuous_pair)
        };
        println!(
            "no difference, {name}: {runs} runs x {RECORDS} records: sequence decided a sign in {:.2}% of runs, \
             naive t test re-run after every record from 30 in {:.2}%",
            100.0 * sequence,
            100.0 * naive
        );
        assert!(sequence <= sequence_bound, "{name}: sequence false-decision rate {sequence} > {sequence_bound}");
        assert!(naive > alpha, "{name}: naive repeated test false-decision rate {naive} <= {alpha}");
    }
}

/// 2,000 runs of 500 records, no true difference: the sequence decides a sign in at most alpha of
/// the runs; the naive repeated t test in more. About 3 s in debug.
#[test]
fn sequence_keeps_the_false_decision_rate_below_alpha_where_a_repeated_test_does_not() {
    check_validity(2_000, DEFAULT_ALPHA);
}

/// Stopping time, decision (None when undecided after all records), and the full differences.
fn run_to_decision(seed: u64, pa: f64, pb: f64, shared: f64) -> (usize, Decision, Vec<(f64, f64)>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pairs: Vec<(f64, f64)> = (0..RECORDS).map(|_| binary_pair(&mut rng, pa, pb, shared)).collect();
    let mut s = PairedSequence::new(SequentialOptions::default()).expect("options");
    for (i, (a, b)) in pairs.iter().enumerate() {
        s.push(b - a).expect("difference");
        if s.decision() != Decision::Undecided {
            return (i + 1, s.decision(), pairs);
        }
    }
    (RECORDS + 1, Decision::Undecided, pairs)
}

/// The fixed-n paired test on all records (`compare`: McNemar for binary scores): the sign it
/// establishes at 0.05, B against A.
fn fixed_n_decision(pairs: &[(f64, f64)]) -> Decision {
    let ids: Vec<String> = (0..pairs.len()).map(|i| i.to_string()).collect();
    let a: Vec<(&str, f64)> = ids.iter().zip(pairs).map(|(id, p)| (id.as_str(), p.0)).collect();
    let b: Vec<(&str, f64)> = ids.iter().zip(pairs).map(|(id, p)| (id.as_str(), p.1)).collect();
    let c = compare(&a, &b, 0.05).expect("compare");
    match (c.significant(), c.diff < 0.0) {
        (false, _) => Decision::Undecided,
        (true, true) => Decision::Better,
        (true, false) => Decision::Worse,
    }
}

/// Stopping points over `seeds` seeds: (share stopped Better by 200 records, median stop, share
/// agreeing with the fixed-n test among the decided).
fn savings(seeds: u64, shared: f64) -> (f64, usize, f64) {
    let mut stops = Vec::new();
    let (mut by_200, mut decided, mut agree) = (0u32, 0u32, 0u32);
    for seed in 0..seeds {
        let (stop, decision, pairs) = run_to_decision(1_000 + seed, 0.5, 0.65, shared);
        stops.push(stop);
        by_200 += u32::from(decision == Decision::Better && stop <= 200);
        if decision != Decision::Undecided {
            decided += 1;
            agree += u32::from(fixed_n_decision(&pairs) == decision);
        }
    }
    stops.sort_unstable();
    let median = stops[stops.len() / 2];
    (f64::from(by_200) / seeds as f64, median, f64::from(agree) / f64::from(decided.max(1)))
}

/// A 0.15 difference in pass rate (A ~ Bernoulli(0.5), B ~ Bernoulli(0.65)) on records whose
/// difficulty the responders share (score correlation about 0.55, as two models on one benchmark
/// commonly show): the sequence decides Better within 40% of the 500 records in at least 90% of
/// 200 seeds, agreeing with the fixed-n test on all 500. With independent scores (correlation 0)
/// no test can: even a single fixed-n test at 200 records has only about 87% power
/// (0.15 sqrt(200) / 0.69 = 3.07 standard errors); those figures are printed, and checked loosely.
#[test]
fn sequence_stops_early_on_a_real_difference() {
    let seeds = 200;
    let (share, median, agree) = savings(seeds, 0.75);
    println!(
        "difference 0.15, correlated scores (shared difficulty 0.75): decided Better within 200 of {RECORDS} \
         records in {:.1}% of {seeds} seeds, median stop {median}, agreeing with the fixed-n test in {:.1}%",
        100.0 * share,
        100.0 * agree
    );
    assert!(share >= 0.9, "decided within 200 records in {share} of seeds");
    assert!(median <= 200, "median stop {median}");
    assert_eq!(agree, 1.0, "the sequence's decision disagrees with the fixed-n test");

    let (share, median, agree) = savings(seeds, 0.0);
    println!(
        "difference 0.15, independent scores: decided Better within 200 records in {:.1}% of {seeds} seeds, \
         median stop {median}, agreeing with the fixed-n test in {:.1}%",
        100.0 * share,
        100.0 * agree
    );
    assert!(share >= 0.4, "independent scores: decided within 200 records in {share} of seeds");
    assert_eq!(agree, 1.0, "independent scores: the sequence's decision disagrees with the fixed-n test");
}

#[test]
fn bad_options_are_refused_naming_the_field() {
    for alpha in [0.0, -0.1, 0.6, 1.0, f64::NAN, f64::INFINITY] {
        let e = PairedSequence::new(SequentialOptions { alpha, ..Default::default() }).unwrap_err();
        assert!(matches!(e, SequentialError::Alpha(_)), "{alpha}: {e:?}");
        assert!(e.to_string().starts_with("alpha must be in (0, 0.5]"), "{e}");
    }
    for margin in [0.0, -0.1, 1.0, 1.5, f64::NAN] {
        let e = PairedSequence::new(SequentialOptions { margin: Some(margin), ..Default::default() }).unwrap_err();
        assert!(matches!(e, SequentialError::Margin(_)), "{margin}: {e:?}");
        assert!(e.to_string().starts_with("margin must be in (0, 1)"), "{e}");
    }
    let ok = SequentialOptions { alpha: 0.5, margin: Some(0.05), min_pairs: 0 };
    assert_eq!(PairedSequence::new(ok).expect("valid").options(), &ok);
    assert_eq!(
        SequentialOptions::default(),
        SequentialOptions { alpha: 0.05, margin: None, min_pairs: 30 },
        "the documented defaults"
    );
}

#[test]
fn differences_outside_minus_one_one_or_not_finite_are_refused() {
    let mut s = PairedSequence::new(SequentialOptions::default()).expect("options");
    for d in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0001, -1.5] {
        let e = s.push(d).unwrap_err();
        assert!(matches!(e, SequentialError::Difference(_)), "{d}: {e:?}");
        assert!(e.to_string().starts_with("difference must be a finite number in [-1, 1]"), "{e}");
    }
    assert_eq!((s.pairs(), s.mean(), s.interval()), (0, 0.0, (-1.0, 1.0)), "refusals leave the state as it was");
    for d in [-1.0, 1.0, 0.0] {
        s.push(d).expect("in range");
    }
    assert_eq!(s.pairs(), 3);
}

#[test]
fn undecided_before_min_pairs() {
    let mut s = PairedSequence::new(SequentialOptions::default()).expect("options");
    for _ in 0..29 {
        s.push(1.0).expect("difference");
        assert_eq!(s.decision(), Decision::Undecided);
    }
    assert!(s.interval().0 > 0.0, "the interval excludes 0 long before: {:?}", s.interval());
    s.push(1.0).expect("difference");
    assert_eq!(s.decision(), Decision::Better);
    // B always worse: mirrored.
    let mut s = PairedSequence::new(SequentialOptions { min_pairs: 5, ..Default::default() }).expect("options");
    for _ in 0..4 {
        s.push(-1.0).expect("difference");
    }
    assert_eq!(s.decision(), Decision::Undecided);
    for _ in 0..20 {
        s.push(-1.0).expect("difference");
    }
    assert_eq!(s.decision(), Decision::Worse);
}

/// The interval only shrinks, and negated differences give the mirrored interval, on binary and
/// continuous pairs with and without a difference. It holds the running mean nearly always, but
/// not by construction: the interval is centred on a bet-weighted mean, and the running
/// intersection keeps what earlier pairs excluded after the mean has moved (as a miss of the true
/// mean does, at most alpha of runs): the runs where it ever leaves the mean are counted and bounded.
#[test]
fn interval_shrinks_mirrors_and_nearly_always_holds_the_mean() {
    let runs = 90u64;
    let (mut runs_leaving_the_mean, mut furthest) = (0u32, 0.0_f64);
    for seed in 0..runs {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let d: Vec<f64> = (0..400)
            .map(|_| match seed % 3 {
                0 => {
                    let (a, b) = binary_pair(&mut rng, 0.5, 0.6, 0.5);
                    b - a
                }
                1 => {
                    let (a, b) = continuous_pair(&mut rng);
                    b - a
                }
                _ => rng.random::<f64>() * 2.0 - 1.0,
            })
            .collect();
        let mut s = PairedSequence::new(SequentialOptions::default()).expect("options");
        let mut mirror = PairedSequence::new(SequentialOptions::default()).expect("options");
        let mut previous = s.interval();
        assert_eq!(previous, (-1.0, 1.0));
        let mut left_the_mean = false;
        for v in &d {
            s.push(*v).expect("difference");
            mirror.push(-v).expect("difference");
            let (low, high) = s.interval();
            assert!(low < high, "seed {seed}: empty {:?}", (low, high));
            assert!(low >= previous.0 && high <= previous.1, "seed {seed}: {:?} grew to {:?}", previous, (low, high));
            let (m_low, m_high) = mirror.interval();
            let step = 2.0 / GRID_STEPS as f64 + 1e-12;
            assert!((m_low + high).abs() <= step && (m_high + low).abs() <= step, "seed {seed}: mirror");
            let outside = (low - s.mean()).max(s.mean() - high);
            if outside > 0.0 {
                left_the_mean = true;
                furthest = furthest.max(outside);
            }
            previous = (low, high);
        }
        runs_leaving_the_mean += u32::from(left_the_mean);
        let (low, high) = s.interval();
        assert!(high - low < 0.5, "seed {seed}: still {:?} after 400 pairs", (low, high));
    }
    println!("the interval left the running mean in {runs_leaving_the_mean} of {runs} runs, by at most {furthest:.3}");
    assert!(f64::from(runs_leaving_the_mean) <= 0.1 * runs as f64, "{runs_leaving_the_mean} runs left the mean");
    assert!(furthest < 0.1, "the running mean was {furthest} outside the interval");
}

/// The incremental grid (excluded points dropped, interval from the neighbouring excluded points)
/// against the capital computed from scratch at every grid point: the interval is the smallest grid
/// bracket of the points never excluded by the theorem's hedged capital.
#[test]
fn incremental_interval_matches_the_capital_computed_from_scratch() {
    let alpha: f64 = 0.1;
    for seed in 0..3u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(40 + seed);
        let d: Vec<f64> = (0..150).map(|_| (rng.random::<f64>() * 1.6 - 0.6).clamp(-1.0, 1.0)).collect();
        let x: Vec<f64> = d.iter().map(|v| (v + 1.0) / 2.0).collect();
        // The predictable bets: l_t from s2_{t-1}.
        let mut bets = Vec::new();
        let (mut sum, mut sum_sq, mut s2) = (0.0, 0.0, 0.25);
        for (i, xi) in x.iter().enumerate() {
            let t = (i + 1) as f64;
            bets.push((2.0 * (2.0 / alpha).ln() / (s2 * t * (1.0 + t).ln())).sqrt());
            sum += xi;
            let mu = (0.5 + sum) / (t + 1.0);
            sum_sq += (xi - mu) * (xi - mu);
            s2 = (0.25 + sum_sq) / (t + 1.0);
        }
        let mut s = PairedSequence::new(SequentialOptions { alpha, ..Default::default() }).expect("options");
        let mut excluded_low = vec![false; GRID_STEPS + 1];
        let mut excluded_high = vec![false; GRID_STEPS + 1];
        for (t, dt) in d.iter().enumerate() {
            s.push(*dt).expect("difference");
            for j in 0..=GRID_STEPS {
                let m = j as f64 / GRID_STEPS as f64;
                let (mut k_plus, mut k_minus) = (1.0_f64, 1.0_f64);
                for (bet, xi) in bets[..=t].iter().zip(&x) {
                    k_plus *= 1.0 + bet.min(0.5 / m) * (xi - m);
                    k_minus *= 1.0 - bet.min(0.5 / (1.0 - m)) * (xi - m);
                }
                excluded_low[j] |= 0.5 * k_plus >= 1.0 / alpha;
                excluded_high[j] |= 0.5 * k_minus >= 1.0 / alpha;
            }
            let below = (0..=GRID_STEPS).rev().find(|&j| excluded_low[j]).map_or(0.0, |j| j as f64);
            let above = (0..=GRID_STEPS).find(|&j| excluded_high[j]).map_or(GRID_STEPS as f64, |j| j as f64);
            let expected = (2.0 * below / GRID_STEPS as f64 - 1.0, 2.0 * above / GRID_STEPS as f64 - 1.0);
            let (low, high) = s.interval();
            assert!(
                (low - expected.0).abs() < 1e-9 && (high - expected.1).abs() < 1e-9,
                "seed {seed}, pair {}: {:?} != {expected:?}",
                t + 1,
                (low, high)
            );
        }
        assert!(s.interval().0 > -1.0 && s.interval().1 < 1.0, "the check saw both ends move");
    }
}

/// With a margin and no true difference, enough pairs decide Equivalent (and never a sign).
#[test]
fn equivalent_within_a_margin_when_there_is_no_difference() {
    let options = SequentialOptions { margin: Some(0.1), ..Default::default() };
    for seed in 0..5u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(70 + seed);
        let mut s = PairedSequence::new(options).expect("options");
        let mut decided_at = None;
        for i in 1..=2_000 {
            let (a, b) = continuous_pair(&mut rng);
            s.push(b - a).expect("difference");
            match s.decision() {
                Decision::Equivalent => {
                    decided_at.get_or_insert(i);
                }
                Decision::Undecided => assert!(decided_at.is_none(), "seed {seed}: equivalence is kept once reached"),
                d @ (Decision::Better | Decision::Worse) => panic!("seed {seed}: decided {d:?} at {i}"),
            }
        }
        let at =
            decided_at.unwrap_or_else(|| panic!("seed {seed}: no equivalence after 2,000 pairs: {:?}", s.interval()));
        println!("seed {seed}: equivalent within 0.1 after {at} pairs, interval {:?}", s.interval());
    }
    // Without a margin the same data stay undecided.
    let mut rng = ChaCha8Rng::seed_from_u64(70);
    let mut s = PairedSequence::new(SequentialOptions::default()).expect("options");
    for _ in 0..2_000 {
        let (a, b) = continuous_pair(&mut rng);
        s.push(b - a).expect("difference");
    }
    assert_eq!(s.decision(), Decision::Undecided);
}
