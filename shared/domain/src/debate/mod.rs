//! Multi-LLM debate: three solvers solve a problem independently, each
//! reviews the other two, each refines with the two reviews about it, and a judge picks the winner
//! whose refined answer is final. Types, limits, request checks, answer normalisation and the
//! stage trait; the model calls live in the debate service.
//!
//! Layout: `types` (limits, defaults, the stages' types and the trait), `answers` (normalisation,
//! consensus, majority vote), `checks` (request checks); this module only re-exports them.

mod answers;
mod checks;
#[cfg(test)]
mod tests;
mod types;

pub use answers::{Vote, answers_agree, majority_vote, normalize_answer};
pub use checks::{check_problem, check_solvers, solution_ids};
pub use types::*;
