//! An ordered chain of refiners: each step gets the previous step's items. A step that receives no
//! items (an earlier step removed them all) makes no model call and reports 0 in, 0 out.

use assay_domain::{ChecklistItem, EventSink, StageError};

use super::base::ChecklistRefiners;
use super::dedup;
use super::selector;
use super::tagger;
use super::unit_tester;
use assay_domain::refiners::{ChainOutcome, RefinerStep, StepOutcome, StepReport};

pub(super) async fn run(
    core: &ChecklistRefiners,
    items: Vec<ChecklistItem>,
    steps: &[RefinerStep],
    events: EventSink<'_, StepReport>,
) -> Result<ChainOutcome, StageError> {
    let mut items = items;
    let mut out = ChainOutcome::default();
    for (i, step) in steps.iter().enumerate() {
        let items_in = items.len() as u32;
        let outcome = if items.is_empty() {
            StepOutcome::default()
        } else {
            let result = match step {
                RefinerStep::Deduplicate(o) => dedup::run(core, items, o).await,
                RefinerStep::Tag(o) => tagger::run(core, items, o).await,
                RefinerStep::UnitTest(o) => unit_tester::run(core, items, o).await,
                RefinerStep::Select(o) => selector::run(core, items, o).await,
            };
            // Field paths of errors raised while running point at the step.
            result.map_err(|e| e.map_fields(|f| format!("steps[{i}].{}.{f}", step.field())))?
        };
        let StepOutcome { items: next, actions, usage, .. } = outcome;
        let report = StepReport {
            refiner: step.refiner().to_string(),
            items_in,
            items_out: next.len() as u32,
            actions: actions.clone(),
            usage: usage.clone(),
        };
        tracing::debug!(
            step = i,
            refiner = step.refiner(),
            items_in,
            items_out = report.items_out,
            "refiner step done"
        );
        events(report.clone());
        out.usage.add(&usage);
        out.actions.extend(actions);
        out.steps.push(report);
        items = next;
    }
    out.items = items;
    Ok(out)
}
