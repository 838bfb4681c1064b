//! Stopping a comparison of responders once it is decided. The records are taken in a seeded random
//! order; as each record's responses are all settled, the records are fed in that order (a record
//! enters once every record before it has) to one anytime-valid confidence sequence per responder
//! after the first (`assay_domain::stats::sequential`): the paired difference of the record's
//! scores, each responder's mean over its scored samples. Feeding in the run's order, not in the
//! order results arrive, makes a resumed run (which reads its stored results back) reach the same
//! decision at the same record. Once every sequence is decided, the source admits no new record.

use std::collections::HashMap;

use assay_domain::Violations;
use assay_domain::stats::sequential::{
    DEFAULT_ALPHA, DEFAULT_MIN_PAIRS, Decision, PairedSequence, SequentialError, SequentialOptions,
};
use assay_proto::gateway::v1 as gw;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sha2::Digest;

use super::super::responders::{Responder, target_of};

/// A run's stopping rule, as parsed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stop {
    pub(super) options: SequentialOptions,
    pub(super) seed: u64,
}

/// The request's `stop_when_decided`, checked (fields named `pipeline.stop_when_decided.*`).
pub(super) fn parse(
    s: gw::StopWhenDecided,
    responders: &[Responder],
    records: &[gw::EvalRecord],
    open: bool,
    v: &mut Violations,
) -> Option<Stop> {
    const F: &str = "pipeline.stop_when_decided";
    if responders.len() < 2 {
        v.push(F, "needs at least two responders: the first is the baseline the others are compared with");
    }
    if open {
        v.push(F, "is for inline runs only: a run created open cannot stop when decided");
    }
    let options = SequentialOptions {
        alpha: if s.alpha == 0.0 { DEFAULT_ALPHA } else { s.alpha },
        margin: s.margin,
        min_pairs: if s.min_records == 0 { DEFAULT_MIN_PAIRS } else { s.min_records },
    };
    match PairedSequence::new(options) {
        Ok(_) => {}
        Err(e @ SequentialError::Alpha(_)) => v.push(format!("{F}.alpha"), e.to_string()),
        Err(e @ SequentialError::Margin(_)) => v.push(format!("{F}.margin"), e.to_string()),
        Err(e @ SequentialError::Difference(_)) => v.push(F, e.to_string()),
    }
    if !open && options.min_pairs as usize > records.len() {
        v.push(
            format!("{F}.min_records"),
            format!("is {}; the run has {} records, so it could never decide", options.min_pairs, records.len()),
        );
    }
    // Without a seed, one the records make: the same request shuffles its records the same way.
    let seed = s.seed.unwrap_or_else(|| {
        let mut h = sha2::Sha256::new();
        for r in records {
            for part in [&r.id, &r.input] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        let digest = h.finalize();
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    });
    Some(Stop { options, seed })
}

/// The run's order of `n` records under `seed`.
pub(super) fn order(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    order
}

/// The sequences of a run that stops when decided, fed in the run's order.
pub(super) struct Decider {
    stop: Stop,
    /// One per responder after the first.
    sequences: Vec<PairedSequence>,
    /// Responses per record (every responder's samples).
    per: usize,
    /// The run's order, and how many records of it were fed.
    order: Vec<usize>,
    fed: usize,
    /// Per record not fed yet: each response's primary score once settled (None: failed or
    /// unscored), by position within the record.
    settled: HashMap<usize, Vec<Option<Option<f64>>>>,
}

impl Decider {
    pub(super) fn new(stop: Stop, responders: &[Responder], records: usize) -> Self {
        let sequences = (1..responders.len())
            .map(|_| PairedSequence::new(stop.options).expect("options checked when parsed"))
            .collect();
        let per = super::super::responders::per_record(responders).max(1);
        Self { stop, sequences, per, order: order(records, stop.seed), fed: 0, settled: HashMap::new() }
    }

    pub(super) fn seed(&self) -> u64 {
        self.stop.seed
    }

    /// The run's order of records.
    pub(super) fn order(&self) -> &[usize] {
        &self.order
    }

    /// Pairs a comparison needs before it decides.
    pub(super) fn min_pairs(&self) -> u32 {
        self.stop.options.min_pairs
    }

    /// Records fed to the sequences.
    pub(super) fn records_used(&self) -> usize {
        self.fed
    }

    /// A response's result settled (position `t`); then every record whose turn has come and whose
    /// responses are all settled is fed.
    pub(super) fn settle(&mut self, t: usize, result: &gw::RecordResult, responders: &[Responder]) {
        let record = t / self.per;
        let scores = self.settled.entry(record).or_insert_with(|| vec![None; self.per]);
        let score = result.score.as_ref().filter(|s| s.answered_count > 0).map(|s| s.primary_score);
        scores[t % self.per] = Some(score);
        self.feed(responders);
    }

    fn feed(&mut self, responders: &[Responder]) {
        // Once decided the sequences stand: what finishes after is not fed, so the decision and
        // its record count are the same whenever the run is resumed.
        while let Some(&record) = self.order.get(self.fed).filter(|_| !self.decided()) {
            let complete = self.settled.get(&record).is_some_and(|s| s.iter().all(Option::is_some));
            if !complete {
                break;
            }
            let scores = self.settled.remove(&record).unwrap_or_default();
            // Each responder's mean over its scored samples.
            let mut sums = vec![(0.0f64, 0u32); responders.len()];
            for (k, score) in scores.into_iter().enumerate() {
                if let (Some((_, j, _)), Some(Some(s))) = (target_of(record * self.per + k, responders), score) {
                    sums[j].0 += s;
                    sums[j].1 += 1;
                }
            }
            let mean = |j: usize| (sums[j].1 > 0).then(|| sums[j].0 / f64::from(sums[j].1));
            if let Some(base) = mean(0) {
                for (k, sequence) in self.sequences.iter_mut().enumerate() {
                    if let Some(candidate) = mean(k + 1) {
                        // Scores are in [0, 1]: the difference is in [-1, 1].
                        let _ = sequence.push((candidate - base).clamp(-1.0, 1.0));
                    }
                }
            }
            self.fed += 1;
        }
    }

    /// Every comparison is decided: no new record need be asked.
    pub(super) fn decided(&self) -> bool {
        self.sequences.iter().all(|s| s.decision() != Decision::Undecided)
    }

    /// The comparisons as they stand, named by their responders.
    pub(super) fn comparisons(&self, responders: &[Responder]) -> Vec<gw::SequentialComparison> {
        self.sequences
            .iter()
            .enumerate()
            .map(|(k, s)| {
                let (low, high) = s.interval();
                gw::SequentialComparison {
                    baseline: responders[0].name.clone(),
                    candidate: responders[k + 1].name.clone(),
                    pairs: s.pairs(),
                    mean_difference: s.mean(),
                    low,
                    high,
                    decision: decision_to(s.decision()) as i32,
                }
            })
            .collect()
    }
}

fn decision_to(d: Decision) -> gw::SequentialDecision {
    match d {
        Decision::Undecided => gw::SequentialDecision::Undecided,
        Decision::Better => gw::SequentialDecision::Better,
        Decision::Worse => gw::SequentialDecision::Worse,
        Decision::Equivalent => gw::SequentialDecision::Equivalent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_a_permutation_fixed_by_its_seed() {
        let a = order(100, 7);
        assert_eq!(a, order(100, 7), "the same seed, the same order");
        assert_ne!(a, order(100, 8), "another seed, another order");
        assert_ne!(a, (0..100).collect::<Vec<_>>(), "shuffled");
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>(), "every record once");
    }
}

#[cfg(test)]
mod feeding {
    use super::*;

    fn responder(name: &str) -> Responder {
        Responder {
            name: name.into(),
            model: Default::default(),
            system_prompt: String::new(),
            template: String::new(),
            samples: 1,
        }
    }

    fn scored(primary: f64) -> gw::RecordResult {
        gw::RecordResult {
            score: Some(assay_proto::common::v1::Score {
                primary_score: primary,
                answered_count: 1,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Records are fed in the run's order, each once both its responses are settled, whatever
    /// order the results come in.
    #[test]
    fn records_are_fed_in_the_runs_order_once_complete() {
        let responders = [responder("a"), responder("b")];
        let stop = Stop { options: SequentialOptions { min_pairs: 1, ..Default::default() }, seed: 3 };
        let mut d = Decider::new(stop, &responders, 10);
        let order = d.order().to_vec();
        // The second record of the order, complete: nothing fed (the first is not).
        d.settle(order[1] * 2, &scored(0.0), &responders);
        d.settle(order[1] * 2 + 1, &scored(1.0), &responders);
        assert_eq!(d.records_used(), 0);
        // The first, half then whole: both fed.
        d.settle(order[0] * 2 + 1, &scored(1.0), &responders);
        assert_eq!(d.records_used(), 0);
        d.settle(order[0] * 2, &scored(0.0), &responders);
        assert_eq!(d.records_used(), 2);
        assert_eq!(d.comparisons(&responders)[0].pairs, 2);
        assert!((d.comparisons(&responders)[0].mean_difference - 1.0).abs() < 1e-12);
    }
}
