//! Content refiners of sectioned documents: the patcher (surgical edit of one section) and the
//! section expander (regeneration of one section), REFERENCE section 7, FR-011..FR-017.

use crate::Usage;
use crate::document::{Brief, JudgeIssue, Section};
use crate::error::StageError;
use crate::model::{ModelRecord, ModelSpec};

/// Configuration phase of the patcher.
pub const PATCHER_PHASE: &str = "stage_6_patcher";
/// Configuration phase of the section expander.
pub const EXPANDER_PHASE: &str = "stage_6_section_expander";
/// Most words an expansion may target.
pub const MAX_TARGET_WORDS: u32 = 5_000;
/// Most bytes of an edit's instruction or of one of its constraints (Patch, ExpandSection, and
/// the arbiter instructions that feed them).
pub const MAX_INSTRUCTION_BYTES: usize = 8 * 1024;
/// Most constraints of one edit.
pub const MAX_CONSTRAINTS: usize = 32;
/// Most issues one edit fixes (a section's issues in a Route request feed one edit).
pub const MAX_EDIT_ISSUES: usize = 100;

/// The expander's instruction for a section of a document being regenerated as a whole (the
/// arbiter routed FULL_REGENERATE for `reason`) when the arbiter wrote none for that section.
pub fn regeneration_instruction(reason: &str) -> String {
    format!(
        "The whole document is being rewritten ({reason}). Rewrite this section so that it teaches its part of \
         the brief in a sound order and builds on the previous section."
    )
}

/// Fix one section (patch) or regenerate it (expand).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SectionEditRequest {
    pub section: Section,
    pub issues: Vec<JudgeIssue>,
    pub instruction: String,
    pub constraints: Vec<String>,
    /// Context anchors, read-only; `None` for the first / last section.
    pub previous: Option<Section>,
    pub next: Option<Section>,
    pub brief: Brief,
    /// Expansion only: target length in words (0 = about the current length).
    pub target_words: u32,
    pub model: ModelSpec,
}

/// The edited section, or why the model's reply was refused.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SectionEdit {
    /// `None` when the reply was refused (see `rejected_reason`).
    pub section: Option<Section>,
    pub diff_summary: String,
    pub rejected_reason: String,
    pub usage: Usage,
    pub model: ModelRecord,
}

/// The content refiners.
#[async_trait::async_trait]
pub trait ContentRefiner: Send + Sync {
    /// Surgical edit: change what the instruction asks and nothing else.
    async fn patch(&self, request: SectionEditRequest) -> Result<SectionEdit, StageError>;
    /// Regenerate the section from the brief, the instruction and the anchors.
    async fn expand_section(&self, request: SectionEditRequest) -> Result<SectionEdit, StageError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts the gateway sent before they moved here, word for word.
    #[test]
    fn the_regeneration_instruction_keeps_its_text() {
        assert_eq!(
            regeneration_instruction("structure 0.40"),
            "The whole document is being rewritten (structure 0.40). Rewrite this section so that it teaches its \
             part of the brief in a sound order and builds on the previous section."
        );
    }
}
