//! Verify and CompareTexts.
//!
//! Verify = heuristics + one YES/NO "was issue X fixed?" model call per issue, concurrently, with
//! first-token logprobs + quality locks. The fix is accepted when every heuristic passes, no lock
//! is broken and every issue is fixed; every reason it is not is named. A failed call leaves its
//! issue unverified (a rejection reason), never a silent pass. What is rejected, and only that
//! (issue 31, point 6):
//!
//! - **Issue verdict**: the model's YES/NO answer, whether or not the backend gives
//!   logprobs; the answer's probability is reported as its confidence. A request may demand more
//!   with `min_fix_confidence` (off by default): a YES below it, or a YES without logprobs, then
//!   counts as not fixed, with that reason.
//! - **Length** ratio and **language**: hard checks.
//! - **Length** bounds come with the request: the gateway sets them from the task (issue 59: an
//!   expansion may grow to the length it was asked for, a removal an issue asked for may shrink).
//! - **Structure**: a drop of headings, list items or code blocks rejects the fix only when no
//!   issue of the request asks to remove, merge or restructure (see [`super::asks`]); when one
//!   does, the drop is a note naming the issue. A reworded heading is not a dropped one
//!   ([`assay_domain::headings`]: same level and place, a close edit or one an issue asks for);
//!   the rewording is a note.
//! - **Readability** rejects only a move away from the targets: a new sentence over 25 words, the
//!   average sentence length leaving the 15-20 band upwards (from <= 20 to > 20), or the text
//!   turning dense. Sentences shortened under 15 words on average are a note. A sentence revised
//!   past 25 words is judged against the sentence it revises: it may be longer by what a fix
//!   adds ([`REVISION_EXTRA_WORDS`], or a fifth of it), not by more. A text grown past twice its
//!   length (an expanded stub, which only a task's own bounds let through) is new text: its long
//!   sentences are flagged in a note, and it is held to the average and density targets.
//!
//! CompareTexts runs the shared convergence cascade ([`assay_llm::convergence`]); the core holds
//! one cascade (embedding cache and breaker) for its lifetime.
//!
//! Layout: `heuristics` (the checks' result, length and language), `structure`, `readability_check`
//! (the readability check and report), `issues` (the YES/NO issue checks), `judge` (the delta judge
//! core, which runs them all); this module only declares and re-exports them.

mod heuristics;
mod issues;
mod judge;
mod readability_check;
mod structure;
#[cfg(test)]
mod tests;

pub use heuristics::{Checked, language_check, length_check};
pub use issues::{VERIFY_TEMPLATE, prompt};
pub use judge::{DEFAULT_CONCURRENCY, DeltaJudgeCore};
pub use readability_check::{REVISION_EXTRA_SHARE, REVISION_EXTRA_WORDS, readability_check, readability_input, report};
pub use structure::{Restructuring, Structure, restructuring, structure_check, structure_of};
