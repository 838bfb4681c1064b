//! The self-refine hook: post-processing of a pipeline's text outputs (targeted refinement's final
//! sections, the debate's final answers). Every output that is neither excluded (by its name or its
//! producer) nor shorter than `min_bytes` goes through one self-refine loop whose instruction is
//! what the output is for. With no exclude list, text a human wrote and text no stage changed
//! (`human`, `original`) is left alone: a section that passed judging as it was given stays exactly
//! as given (byte for byte), only what a model wrote is polished. A failed loop keeps the text
//! (whatever the error: a 401 from the refiner's backend fails no finished document; the entry
//! says why), and so does a loop whose model answered or refused instead of revising (the stage
//! keeps the draft: REFINER_ERROR or ROLLED_BACK in the entry's `refine`). The hook runs after the pipeline's last judging: a caller that reports a
//! score next to the hook's text says it predates the hook (targeted refinement's
//! `score_predates_self_refine`). Each output leaves a `self_refined` entry:
//! what it was, who wrote it, the text before and after, and the loop's passes (which pass changed
//! what), relayed as an event as it finishes.

use assay_domain::StageError;
use assay_domain::self_refine::SelfRefineHook;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;

use super::stages::Stages;
use assay_runs::RunCtx;

/// Why an output was not refined.
pub const SKIPPED_EXCLUDED: &str = "excluded";
pub const SKIPPED_TOO_SHORT: &str = "too_short";

/// One output offered to the hook.
pub struct Output {
    /// Its name: a section id or a problem id.
    pub target: String,
    /// Who wrote it ("original", "human", "model", "debate").
    pub producer: &'static str,
    pub text: String,
    /// What the text is for: the loop's instruction.
    pub instruction: String,
}

/// Run the hook over one output: the loop's usage and model land on the run, the entry is emitted.
/// Only cancellation fails; any other error of the loop is reported in the entry, text kept.
pub async fn refine(
    stages: &Stages,
    ctx: &RunCtx,
    hook: &SelfRefineHook,
    output: Output,
) -> Result<gw::SelfRefined, StageError> {
    let Output { target, producer, text, instruction } = output;
    let mut entry = gw::SelfRefined {
        target,
        producer: producer.to_string(),
        before: text.clone(),
        after: text.clone(),
        ..Default::default()
    };
    if hook.excludes(&entry.target, producer) {
        entry.skipped = SKIPPED_EXCLUDED.into();
    } else if text.trim().is_empty() || text.len() < hook.min_bytes as usize {
        entry.skipped = SKIPPED_TOO_SHORT.into();
    } else {
        let refined = stages.self_refiner()?.self_refine(hook.request(text, instruction), &|_| {}).await;
        match refined {
            Ok(outcome) => {
                ctx.spending.add_usage(&outcome.usage);
                if !outcome.skipped_too_short {
                    ctx.progress.add_model(&outcome.model);
                }
                entry.after.clone_from(&outcome.final_text);
                entry.refine = Some(convert::self_refine::self_refine_response_to(&outcome));
            }
            Err(e @ StageError::Cancelled(_)) => return Err(e),
            Err(e) => entry.error = e.to_string(),
        }
    }
    ctx.log.emit(Event::SelfRefined(entry.clone())).await?;
    Ok(entry)
}
