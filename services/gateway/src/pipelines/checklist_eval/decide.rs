//! Stopping a comparison of responders once it is decided. The records are taken in a seeded random
//! order; as each record's responses are all settled, the records are fed in that order (a record
//! enters once every record before it has) to one anytime-valid confidence sequence per responder
//! after the first (`assay_domain::stats::sequential`): the paired difference of the record's
//! scores, each responder's mean over its scored samples. Feeding in the run's order, not in the
//! order results arrive, makes a resumed run (which reads its stored results back) reach the same
//! decision at the same record. Once every sequence is decided, the source admits no new record.
//!
//! An inline run's order is one permutation of all its records. An open run's records arrive over
//! time, so its order is made a block at a time: each block of [`BLOCK`] records, as appended, is
//! shuffled once it is whole (or the run is sealed), under the run's seed and the block's number;
//! blocks are taken in the order they were appended. The same stored records give the same order
//! whenever the run is resumed.

use std::collections::HashMap;

use assay_domain::Violations;
use assay_domain::stats::sequential::{
    DEFAULT_ALPHA, DEFAULT_MIN_PAIRS, Decision, PairedSequence, SequentialError, SequentialOptions,
};
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use assay_runs::{RunCtx, Writes};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use sha2::Digest;

use super::super::responders::{Responder, target_of};

/// Records an open run shuffles at a time.
pub(super) const BLOCK: usize = 1024;

/// A run's stopping rule, as parsed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stop {
    pub(super) options: SequentialOptions,
    /// The caller's seed, or (an inline run) one its records make; an open run without one uses
    /// one its id makes ([`Stop::seed_for`]).
    pub(super) seed: Option<u64>,
}

impl Stop {
    /// The run's seed: the one given or made from its records, else one its id makes.
    pub(super) fn seed_for(&self, run_id: &str) -> u64 {
        self.seed.unwrap_or_else(|| digest_seed([run_id.as_bytes()]))
    }
}

/// A seed from the first 8 bytes of the SHA-256 of `parts`, each length-prefixed.
fn digest_seed<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = sha2::Sha256::new();
    for part in parts {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let digest = h.finalize();
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
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
    // Without a seed, an inline run's is one its records make: the same request shuffles its
    // records the same way. An open run's records are not known yet: its id makes one.
    let seed = s
        .seed
        .or_else(|| (!open).then(|| digest_seed(records.iter().flat_map(|r| [r.id.as_bytes(), r.input.as_bytes()]))));
    Some(Stop { options, seed })
}

/// The run's order of `n` records under `seed`.
pub(super) fn order(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    order
}

/// An open run's order of block `block` (its records from `block * BLOCK`, `len` of them) under
/// `seed`: the block's records' indices, shuffled by the seed's stream for that block.
pub(super) fn block_order(block: u64, len: usize, seed: u64) -> Vec<usize> {
    let base = usize::try_from(block).unwrap_or(usize::MAX).saturating_mul(BLOCK);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(block);
    let mut order: Vec<usize> = (base..base + len).collect();
    order.shuffle(&mut rng);
    order
}

/// The sequences of a run that stops when decided, fed in the run's order.
pub(super) struct Decider {
    stop: Stop,
    /// One per responder after the first.
    sequences: Vec<PairedSequence>,
    /// Responses per record (every responder's samples).
    per: usize,
    seed: u64,
    /// The run's order (so far, for an open run), and how many records of it were fed.
    order: Vec<usize>,
    fed: usize,
    /// Per record not fed yet: each response's primary score once settled (None: failed or
    /// unscored), by position within the record.
    settled: HashMap<usize, Vec<Option<Option<f64>>>>,
}

impl Decider {
    /// Sequences for `responders`, fed in `order` (an open run's grows with [`Decider::extend`]).
    pub(super) fn new(stop: Stop, seed: u64, responders: &[Responder], order: Vec<usize>) -> Self {
        let sequences = (1..responders.len())
            .map(|_| PairedSequence::new(stop.options).expect("options checked when parsed"))
            .collect();
        let per = super::super::responders::per_record(responders).max(1);
        Self { stop, seed, sequences, per, order, fed: 0, settled: HashMap::new() }
    }

    pub(super) fn seed(&self) -> u64 {
        self.seed
    }

    /// More of the run's order (an open run's next block): records already settled are fed.
    pub(super) fn extend(&mut self, records: &[usize], responders: &[Responder]) {
        self.order.extend_from_slice(records);
        self.feed(responders);
    }

    /// Records a run asks ahead of those fed: the pairs a decision needs at least, or a quarter
    /// of those fed so far, at most `concurrency` (what is in flight when it decides is what the
    /// decision wastes). The position in the run's order up to which records may be asked.
    pub(super) fn lead(&self, concurrency: usize) -> usize {
        let ahead = (self.min_pairs() as usize).max(self.fed / 4).min(concurrency).max(1);
        self.fed + ahead
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
    /// What stopping when decided did: the sequences, the records not asked (by id) and the
    /// calls that saved, at the run's calls so far per record asked.
    pub(super) fn result(
        &self,
        ctx: &RunCtx,
        responders: &[Responder],
        asked: usize,
        not_asked: Vec<String>,
        stopped: bool,
    ) -> gw::SequentialResult {
        let calls = u64::from(ctx.spending.usage().calls);
        gw::SequentialResult {
            comparisons: self.comparisons(responders),
            seed: self.seed,
            stopped_early: stopped && !not_asked.is_empty(),
            records_used: self.fed as u32,
            calls_saved: calls * not_asked.len() as u64 / asked.max(1) as u64,
            records_not_asked: not_asked,
        }
    }
}

/// The `comparison_updated` events of a run: at most one a second, while records are fed and
/// when the run ends.
#[derive(Default)]
pub(super) struct Said {
    at: Option<std::time::Instant>,
    used: usize,
}

impl Said {
    pub(super) fn update(&mut self, ctx: &RunCtx, d: &Decider, responders: &[Responder], writes: &mut Writes) {
        let due = self.at.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(1));
        if due && d.records_used() > self.used {
            self.say(ctx, d, responders, writes);
        }
    }

    /// The run ends: the sequences as they end, unless said less than a second ago (the run's
    /// result holds them too).
    pub(super) fn last(&mut self, ctx: &RunCtx, d: &Decider, responders: &[Responder], writes: &mut Writes) {
        self.update(ctx, d, responders, writes);
    }

    fn say(&mut self, ctx: &RunCtx, d: &Decider, responders: &[Responder], writes: &mut Writes) {
        self.at = Some(std::time::Instant::now());
        self.used = d.records_used();
        writes.push(ctx.log.emit_queued(Event::ComparisonUpdated(gw::ComparisonUpdated {
            comparisons: d.comparisons(responders),
            records_used: self.used as u32,
        })));
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

    #[test]
    fn an_open_runs_blocks_are_each_shuffled_by_the_seed_and_the_blocks_number() {
        let first = block_order(0, BLOCK, 7);
        let second = block_order(1, BLOCK, 7);
        assert_eq!(first, block_order(0, BLOCK, 7), "the same seed and block, the same order");
        let mut sorted = second.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (BLOCK..2 * BLOCK).collect::<Vec<_>>(), "the second block's records, each once");
        let shifted: Vec<usize> = second.iter().map(|i| i - BLOCK).collect();
        assert_ne!(first, shifted, "each block its own shuffle");
        assert_ne!(first, block_order(0, BLOCK, 8), "another seed, another order");
        // The last block, shorter: still every record of it once.
        let mut last = block_order(2, 10, 7);
        last.sort_unstable();
        assert_eq!(last, (2 * BLOCK..2 * BLOCK + 10).collect::<Vec<_>>());
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
        let stop = Stop { options: SequentialOptions { min_pairs: 1, ..Default::default() }, seed: Some(3) };
        let mut d = Decider::new(stop, 3, &responders, order(10, 3));
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

    /// An open run's sequences are given its stored results before the order is known; each
    /// record is fed once its block joins the order, in the block's order.
    #[test]
    fn stored_results_are_fed_once_their_block_joins_the_order() {
        let responders = [responder("a"), responder("b")];
        let stop = Stop { options: SequentialOptions { min_pairs: 1, ..Default::default() }, seed: None };
        let mut d = Decider::new(stop, 9, &responders, Vec::new());
        for t in 0..6 {
            d.settle(t, &scored(if t % 2 == 0 { 0.0 } else { 1.0 }), &responders);
        }
        assert_eq!(d.records_used(), 0, "no order yet");
        let block = block_order(0, 5, d.seed());
        d.extend(&block, &responders);
        // Records 0..3 are complete; fed in the block's order up to the first that is not.
        let fed = block.iter().take_while(|i| **i < 3).count();
        assert_eq!(d.records_used(), fed);
    }
}
