//! The delta judge's pure logic: no transport types here.

pub mod answer;
pub use assay_domain::asks;
pub mod consistency;
pub mod readability;
pub mod verify;

/// Model phase of every delta-judge model call: the issue checks, the consistency check and
/// CompareTexts' embeddings.
pub const PHASE: &str = "stage_6_delta_judge";
