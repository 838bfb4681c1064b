//! Selector: a diverse (and, with coverage entries, covering) subset by beam search over the
//! cosine matrix of the questions' embeddings.
//!
//! Semantics follow the original `selector.py`: start from the empty set; `max_questions` times,
//! extend every beam by every unused index in ascending order, stable-sort the candidates by score
//! descending and keep `beam_width` of them (the same set reached along two paths is kept twice,
//! as the original does); return the best (the first maximum), indices ascending.
//! diversity(S) = 1 - mean pairwise cosine (1 for |S| <= 1); score = diversity - lambda*|S|, or with
//! coverage alpha*coverage + (1-alpha)*diversity - lambda*|S|. If n <= max_questions the items are
//! returned unchanged (passthrough).
//!
//! Each beam carries, for every index, the sum of its members' cosines to that index, so scoring a
//! candidate is O(1) for diversity (plus the candidate's observations for coverage) and extending a
//! kept beam is O(n).

use std::cmp::Ordering;
use std::collections::HashMap;

use assay_domain::{ChecklistItem, StageError, Usage};

use super::base::ChecklistRefiners;
use super::dedup::{Similarity, cosine_matrix};
use assay_domain::refiners::{
    ActionKind, CoverageEntry, DEFAULT_ALPHA, DEFAULT_BEAM_WIDTH, DEFAULT_LENGTH_PENALTY, DEFAULT_MAX_QUESTIONS,
    RefinerAction, SelectOptions, StepOutcome, names,
};

/// Beam search parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BeamConfig {
    pub max_questions: usize,
    pub beam_width: usize,
    /// lambda: penalty per selected item.
    pub length_penalty: f64,
    /// Weight of coverage (only with a coverage map).
    pub alpha: f64,
}

impl Default for BeamConfig {
    fn default() -> Self {
        Self {
            max_questions: DEFAULT_MAX_QUESTIONS as usize,
            beam_width: DEFAULT_BEAM_WIDTH as usize,
            length_penalty: DEFAULT_LENGTH_PENALTY,
            alpha: DEFAULT_ALPHA,
        }
    }
}

/// Which observations each item covers.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CoverageMap {
    /// Per item index, the indices of the observations it covers (ascending, distinct).
    pub item_observations: Vec<Vec<usize>>,
    /// Number of observations (the denominator of coverage).
    pub observations: usize,
}

impl CoverageMap {
    /// Map coverage entries onto `items`: an entry's id matches an item by its id or by one of the
    /// ids it was merged from (so coverage survives a Deduplicator step). Unknown ids are ignored.
    pub fn build(items: &[ChecklistItem], entries: &[CoverageEntry]) -> Self {
        let mut index: HashMap<&str, usize> = HashMap::new();
        for (i, it) in items.iter().enumerate() {
            for m in &it.merged_from {
                index.entry(m.as_str()).or_insert(i);
            }
        }
        for (i, it) in items.iter().enumerate() {
            index.insert(it.id.as_str(), i);
        }
        let mut item_observations = vec![Vec::new(); items.len()];
        for (o, e) in entries.iter().enumerate() {
            for id in &e.item_ids {
                if let Some(&i) = index.get(id.as_str())
                    && item_observations[i].last() != Some(&o)
                {
                    item_observations[i].push(o);
                }
            }
        }
        Self { item_observations, observations: entries.len() }
    }

    fn coverage_of(&self, indices: &[usize]) -> f64 {
        if self.observations == 0 {
            return 0.0;
        }
        let mut covered = vec![false; self.observations];
        for &i in indices {
            for &o in &self.item_observations[i] {
                covered[o] = true;
            }
        }
        covered.iter().filter(|c| **c).count() as f64 / self.observations as f64
    }
}

/// Metrics of a set.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectionResult {
    /// Selected indices, ascending.
    pub indices: Vec<usize>,
    pub diversity: f64,
    /// 0 without a coverage map.
    pub coverage: f64,
    pub score: f64,
}

/// Diversity, coverage and score of the set `indices`, computed from scratch (pairs in ascending
/// order).
pub fn set_metrics(
    indices: &[usize],
    sim: &Similarity,
    coverage: Option<&CoverageMap>,
    config: &BeamConfig,
) -> SelectionResult {
    let k = indices.len();
    let diversity = if k <= 1 {
        1.0
    } else {
        let mut total = 0.0;
        for a in 0..k {
            for b in a + 1..k {
                total += sim.get(indices[a], indices[b]);
            }
        }
        1.0 - total / (k * (k - 1) / 2) as f64
    };
    let penalty = config.length_penalty * k as f64;
    let (coverage, score) = match coverage {
        Some(map) => {
            let c = map.coverage_of(indices);
            (c, config.alpha * c + (1.0 - config.alpha) * diversity - penalty)
        }
        None => (0.0, diversity - penalty),
    };
    SelectionResult { indices: indices.to_vec(), diversity, coverage, score }
}

struct Beam {
    members: Vec<usize>,
    used: Vec<bool>,
    /// For every index, the sum of the members' cosines to it.
    acc: Vec<f64>,
    pair_sum: f64,
    covered: Vec<bool>,
    covered_count: usize,
}

/// Beam search over `sim` (see the module docs). Returns the best set of exactly
/// `min(max_questions, n)` items.
pub fn beam_search(sim: &Similarity, coverage: Option<&CoverageMap>, config: &BeamConfig) -> SelectionResult {
    let n = sim.len();
    let observations = coverage.map_or(0, |c| c.observations);
    let mut beams = vec![Beam {
        members: Vec::new(),
        used: vec![false; n],
        acc: vec![0.0; n],
        pair_sum: 0.0,
        covered: vec![false; observations],
        covered_count: 0,
    }];
    // The best `beam_width` candidates of a step, kept sorted by score descending; a candidate goes
    // after every kept one with a score >= its own, which is exactly a stable sort of all candidates
    // in generation order (beam order, then ascending index) followed by a truncation.
    // (beam, index, score, pair sum, covered count)
    let mut candidates: Vec<(usize, usize, f64, f64, usize)> = Vec::with_capacity(config.beam_width + 1);
    for _ in 0..config.max_questions {
        candidates.clear();
        for (b, beam) in beams.iter().enumerate() {
            let k = beam.members.len() + 1;
            let pairs = (k * (k - 1) / 2) as f64;
            let penalty = config.length_penalty * k as f64;
            for idx in 0..n {
                if beam.used[idx] {
                    continue;
                }
                let pair_sum = beam.pair_sum + beam.acc[idx];
                let diversity = if k <= 1 { 1.0 } else { 1.0 - pair_sum / pairs };
                let (score, covered_count) = match coverage {
                    Some(map) => {
                        let new = map.item_observations[idx].iter().filter(|&&o| !beam.covered[o]).count();
                        let count = beam.covered_count + new;
                        let c = if observations == 0 { 0.0 } else { count as f64 / observations as f64 };
                        (config.alpha * c + (1.0 - config.alpha) * diversity - penalty, count)
                    }
                    None => (diversity - penalty, 0),
                };
                let beats = |c: &(usize, usize, f64, f64, usize)| score.partial_cmp(&c.2) == Some(Ordering::Greater);
                if candidates.len() == config.beam_width && !candidates.last().is_some_and(beats) {
                    continue;
                }
                let pos = candidates.iter().position(beats).unwrap_or(candidates.len());
                candidates.insert(pos, (b, idx, score, pair_sum, covered_count));
                candidates.truncate(config.beam_width);
            }
        }
        if candidates.is_empty() {
            break;
        }
        beams = candidates
            .iter()
            .map(|&(b, idx, _, pair_sum, covered_count)| {
                let parent = &beams[b];
                let mut members = parent.members.clone();
                members.push(idx);
                let mut used = parent.used.clone();
                used[idx] = true;
                let acc = parent.acc.iter().zip(sim.row(idx)).map(|(a, s)| a + s).collect();
                let mut covered = parent.covered.clone();
                if let Some(map) = coverage {
                    for &o in &map.item_observations[idx] {
                        covered[o] = true;
                    }
                }
                Beam { members, used, acc, pair_sum, covered, covered_count }
            })
            .collect();
    }
    // The first maximum: candidates were sorted descending, so the first beam.
    let mut best = beams.into_iter().next().map(|b| b.members).unwrap_or_default();
    best.sort_unstable();
    set_metrics(&best, sim, coverage, config)
}

pub(super) async fn run(
    core: &ChecklistRefiners,
    items: Vec<ChecklistItem>,
    options: &SelectOptions,
) -> Result<StepOutcome, StageError> {
    let config = BeamConfig {
        max_questions: options.max_questions.unwrap_or(DEFAULT_MAX_QUESTIONS) as usize,
        beam_width: options.beam_width.unwrap_or(DEFAULT_BEAM_WIDTH) as usize,
        length_penalty: options.length_penalty.unwrap_or(DEFAULT_LENGTH_PENALTY),
        alpha: options.alpha.unwrap_or(DEFAULT_ALPHA),
    };
    let n = items.len();
    let coverage = (!options.coverage.is_empty()).then(|| CoverageMap::build(&items, &options.coverage));
    let mut usage = Usage::default();
    let sim = if n >= 2 {
        let texts = items.iter().map(|i| i.question.clone()).collect();
        let (vectors, u) = core.embed(&options.embedding_model, "embedding_model", texts).await?;
        usage.add(&u);
        cosine_matrix(&vectors)
    } else {
        Similarity::from_rows(&vec![vec![1.0; n]; n])
    };
    let passthrough = n <= config.max_questions;
    let result = if passthrough {
        set_metrics(&(0..n).collect::<Vec<_>>(), &sim, coverage.as_ref(), &config)
    } else {
        beam_search(&sim, coverage.as_ref(), &config)
    };
    let mut selected = vec![false; n];
    for &i in &result.indices {
        selected[i] = true;
    }
    let coverage_note = match &coverage {
        Some(_) => format!(", coverage {:.3}", result.coverage),
        None => String::new(),
    };
    let mut actions = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(result.indices.len());
    for (i, it) in items.into_iter().enumerate() {
        let (kind, reason) = if passthrough {
            (
                ActionKind::Kept,
                format!(
                    "passthrough: {n} items <= max_questions {} (diversity {:.3}{coverage_note})",
                    config.max_questions, result.diversity
                ),
            )
        } else if selected[i] {
            (
                ActionKind::Kept,
                format!(
                    "selected: {} of {n} by beam search (beam width {}; set diversity {:.3}{coverage_note}, score {:.4})",
                    result.indices.len(),
                    config.beam_width,
                    result.diversity,
                    result.score
                ),
            )
        } else {
            (
                ActionKind::Removed,
                format!(
                    "not selected: beam search kept {} of {n} (max_questions {}, beam width {})",
                    result.indices.len(),
                    config.max_questions,
                    config.beam_width
                ),
            )
        };
        actions.push(RefinerAction::new(names::SELECTOR, &it.id, kind, reason));
        if selected[i] {
            out.push(it);
        }
    }
    Ok(StepOutcome {
        items: out,
        actions,
        usage,
        diversity: result.diversity,
        coverage: result.coverage,
        score: result.score,
        passthrough,
        ..Default::default()
    })
}
