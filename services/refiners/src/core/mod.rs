//! Checklist refiners: Deduplicator, Tagger, UnitTester and Selector, alone or
//! as an ordered chain. No transport types here.
//!
//! Every refiner reports exactly one [`RefinerAction`] per input item (kept, removed, merged or
//! error), sums the [`Usage`] of every model call it made, and resolves its models through the
//! [`ModelHub`] under the phase [`PHASE`].

mod base;
mod chain;
pub mod content;
mod dedup;
mod selector;
pub mod self_refine;
mod tagger;
mod unit_tester;

use assay_domain::{ChecklistItem, EventSink, StageError, Violations};

pub use assay_domain::refiners::*;
pub use base::{ChecklistRefiners, PHASE};
pub use dedup::{Clustering, Similarity, cluster, cosine_matrix};
pub use selector::{BeamConfig, CoverageMap, SelectionResult, beam_search, set_metrics};
pub use unit_tester::sample_indices;

impl ChecklistRefiners {
    /// Merge near-duplicate questions.
    pub async fn deduplicate(
        &self,
        items: Vec<ChecklistItem>,
        options: &DedupOptions,
    ) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_dedup(options, "", &mut v);
        v.into_result()?;
        dedup::run(self, items, options).await
    }

    /// Keep items that are generally applicable and section specific.
    pub async fn tag(&self, items: Vec<ChecklistItem>, options: &TagOptions) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_tag(options, "", &mut v);
        v.into_result()?;
        tagger::run(self, items, options).await
    }

    /// Keep items whose failures the scorer detects on rewritten samples.
    pub async fn unit_test(
        &self,
        items: Vec<ChecklistItem>,
        options: &UnitTestOptions,
    ) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_unit_test(options, "", &mut v);
        v.into_result()?;
        unit_tester::run(self, items, options).await
    }

    /// Pick a diverse (and covering) subset by beam search.
    pub async fn select(&self, items: Vec<ChecklistItem>, options: &SelectOptions) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_select(options, "", &mut v);
        v.into_result()?;
        selector::run(self, items, options).await
    }

    /// Runs steps in order, feeding each the previous step's items; calls `events` after each step.
    pub async fn run_chain(
        &self,
        items: Vec<ChecklistItem>,
        steps: &[RefinerStep],
        events: EventSink<'_, StepReport>,
    ) -> Result<ChainOutcome, StageError> {
        validate_chain(&items, steps)?;
        chain::run(self, items, steps, events).await
    }
}

#[async_trait::async_trait]
impl ChecklistRefiner for ChecklistRefiners {
    async fn refine(
        &self,
        items: Vec<ChecklistItem>,
        steps: Vec<RefinerStep>,
        events: EventSink<'_, StepReport>,
    ) -> Result<ChainOutcome, StageError> {
        self.run_chain(items, &steps, events).await
    }
}

#[cfg(test)]
mod tests;
