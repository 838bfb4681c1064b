//! Content refiners of sectioned documents: the patcher (surgical edit of one section) and the
//! section expander (regeneration of one section), the edits of a targeted refinement.

use crate::Usage;
use crate::asks::{asks_for_content, asks_to_restructure};
use crate::document::{Brief, JudgeIssue, Section};
use crate::error::StageError;
use crate::model::{ModelRecord, ModelSpec};
use crate::text::word_count;
use crate::verify::{DEFAULT_MAX_LENGTH_RATIO, DEFAULT_MIN_LENGTH_RATIO};

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
    /// Expansion only: target length in words ([`crate::text::word_count`]; 0 = about the current
    /// length, at least [`MIN_EXPANSION_WORDS`]). See [`edit_length`].
    pub target_words: u32,
    pub model: ModelSpec,
}

/// Least words a section expansion aims at.
pub const MIN_EXPANSION_WORDS: usize = 40;
/// How many times the length it aims at an edit that grows a section may reach before the delta
/// judge calls it too long (a model told "about 400 words" writes 300 to 600).
pub const GROWTH_SLACK: f64 = 2.0;
/// Least length ratio (after / before) of an edit an issue asked to remove, merge or condense
/// content for.
pub const REMOVAL_MIN_LENGTH_RATIO: f64 = 0.2;
/// Characters a word when the document has no words to measure it by.
const DEFAULT_CHARS_PER_WORD: f64 = 6.0;

/// The length an edit aims at and the length bounds its verification holds it to (issue 59,
/// point 4): the task's kind and issues set them, so that an edit is verified against what it was
/// asked to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EditLength {
    /// The expansion's `target_words` (0 for a patch, which keeps about the section's length
    /// unless the fix needs more: the wire's PatchRequest has no target).
    pub target_words: u32,
    /// Bounds of len(after) / len(before), in characters, for the delta judge.
    pub min_length_ratio: f64,
    pub max_length_ratio: f64,
}

/// The length of an edit of `section` (one of `document`'s sections) that fixes `issues`;
/// `expand` for a regeneration (section expander), else a patch.
///
/// - The target is the section's length in words, raised, when an issue asks for content the
///   section lacks ([`asks_for_content`]: a completeness issue, "add", "missing"...), to the
///   median length of the document's other sections (a stub grows to the size of its
///   neighbours), and for an expansion to at least [`MIN_EXPANSION_WORDS`]; at most
///   [`MAX_TARGET_WORDS`].
/// - A target above the section's length may be reached, by an expansion or by a patch whose
///   issue asks for content: the largest ratio is the target's length in characters (at the
///   document's characters a word) times [`GROWTH_SLACK`] over the section's, never below the
///   default 2.0.
/// - An issue that asks to remove, merge or condense ([`asks_to_restructure`]) lowers the
///   smallest ratio to [`REMOVAL_MIN_LENGTH_RATIO`]; otherwise it is the default 0.5.
pub fn edit_length(expand: bool, section: &Section, document: &[Section], issues: &[JudgeIssue]) -> EditLength {
    let words = word_count(&section.content);
    let mut others: Vec<usize> = document
        .iter()
        .filter(|s| s.id != section.id && !s.content.trim().is_empty())
        .map(|s| word_count(&s.content))
        .collect();
    others.sort_unstable();
    let typical = others.get(others.len() / 2).copied().unwrap_or(0);
    let mut target = words;
    if issues.iter().any(|i| asks_for_content(i).is_some()) {
        target = target.max(typical);
    }
    if expand {
        target = target.max(MIN_EXPANSION_WORDS);
    }
    let target = target.min(MAX_TARGET_WORDS as usize);
    let max_length_ratio = if target > words {
        let (doc_chars, doc_words) = document
            .iter()
            .chain(document.iter().all(|s| s.id != section.id).then_some(section))
            .fold((0usize, 0usize), |(c, w), s| (c + s.content.chars().count(), w + word_count(&s.content)));
        let per_word = if doc_words == 0 { DEFAULT_CHARS_PER_WORD } else { doc_chars as f64 / doc_words as f64 };
        let chars = section.content.chars().count().max(1) as f64;
        DEFAULT_MAX_LENGTH_RATIO.max(GROWTH_SLACK * target as f64 * per_word / chars)
    } else {
        DEFAULT_MAX_LENGTH_RATIO
    };
    let removal = issues.iter().any(|i| asks_to_restructure(&i.description, &i.fix_instruction).is_some());
    EditLength {
        target_words: if expand { target as u32 } else { 0 },
        min_length_ratio: if removal { REMOVAL_MIN_LENGTH_RATIO } else { DEFAULT_MIN_LENGTH_RATIO },
        max_length_ratio,
    }
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

    fn section(id: &str, content: &str) -> Section {
        Section { id: id.into(), content: content.into(), ..Default::default() }
    }

    fn issue(criterion: &str, description: &str, fix: &str) -> JudgeIssue {
        JudgeIssue {
            id: "i".into(),
            criterion: criterion.into(),
            severity: crate::Severity::Critical,
            section_id: "funnel".into(),
            description: description.into(),
            fix_instruction: fix.into(),
            location: String::new(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    /// Five sections of 90 words (six characters a word with its space) and a stub.
    fn document(stub: &Section) -> Vec<Section> {
        let full = |id: &str| section(id, &"words ".repeat(90));
        vec![full("a"), full("b"), stub.clone(), full("c"), full("d")]
    }

    /// Issue 59, point 4: a stub with a completeness issue is expanded to the size of its
    /// neighbours, and the verification lets it grow that far; before, the expander was told about
    /// 40 words and anything over twice the stub's 20 characters was rejected.
    #[test]
    fn a_stub_with_a_completeness_issue_may_grow_to_its_neighbours_size() {
        let stub = section("funnel", "## Funnel\nAwareness.");
        let doc = document(&stub);
        let gap = issue("completeness", "The section names one stage of four.", "Cover all four stages.");
        let l = edit_length(true, &stub, &doc, std::slice::from_ref(&gap));
        assert_eq!(l.target_words, 90);
        assert_eq!(l.min_length_ratio, DEFAULT_MIN_LENGTH_RATIO);
        // A 90-word section of this document (540 characters) is within the bounds, twice that is not
        // far over them, and the bounds are what a 540-character rewrite of 20 characters needs.
        let expansion = format!("## Funnel\n{}", "words ".repeat(90));
        let ratio = expansion.chars().count() as f64 / stub.content.chars().count() as f64;
        assert!(ratio > DEFAULT_MAX_LENGTH_RATIO && ratio <= l.max_length_ratio, "{ratio} within {l:?}");
        assert!(l.max_length_ratio < 2.5 * ratio, "{l:?}");

        // Another issue (a factual one): an expansion aims at the floor of 40 words, and may reach it.
        let fact = issue("factual_accuracy", "Awareness is not the last stage.", "Correct the order.");
        let l = edit_length(true, &stub, &doc, std::slice::from_ref(&fact));
        assert_eq!(l.target_words, MIN_EXPANSION_WORDS as u32);
        assert!(l.max_length_ratio >= 40.0 * 6.0 / 20.0, "{l:?}");
        // A patch of it: about its own length, the default bounds.
        let l = edit_length(false, &stub, &doc, std::slice::from_ref(&fact));
        assert_eq!(
            (l.target_words, l.min_length_ratio, l.max_length_ratio),
            (0, DEFAULT_MIN_LENGTH_RATIO, DEFAULT_MAX_LENGTH_RATIO)
        );
        // A patch asked to add what is missing may grow it too.
        let add = issue("engagement_examples", "No example.", "Add an example from a bakery.");
        let l = edit_length(false, &stub, &doc, std::slice::from_ref(&add));
        assert_eq!(l.target_words, 0);
        assert!(l.max_length_ratio > 20.0, "{l:?}");
    }

    #[test]
    fn full_sections_keep_their_length_and_a_removal_may_shrink() {
        let full = section("funnel", &"words ".repeat(120));
        let doc = document(&full);
        let gap = issue("completeness", "A stage is missing.", "Add the desire stage.");
        // Longer than its neighbours already: the expansion aims at its own length.
        let l = edit_length(true, &full, &doc, std::slice::from_ref(&gap));
        assert_eq!((l.target_words, l.max_length_ratio), (120, DEFAULT_MAX_LENGTH_RATIO));
        let cut = issue("pedagogical_structure", "The list repeats the intro.", "Remove the redundant list.");
        let l = edit_length(false, &full, &doc, std::slice::from_ref(&cut));
        assert_eq!((l.target_words, l.min_length_ratio), (0, REMOVAL_MIN_LENGTH_RATIO));
        // A single-section document: no neighbours to measure, the expansion floor still applies.
        let stub = section("only", "## Funnel\nAwareness.");
        let l = edit_length(true, &stub, &[], std::slice::from_ref(&gap));
        assert_eq!(l.target_words, MIN_EXPANSION_WORDS as u32);
        assert!(l.max_length_ratio > DEFAULT_MAX_LENGTH_RATIO);
        // Never over the largest target a request may carry.
        let huge = section("funnel", &"words ".repeat(6_000));
        assert_eq!(edit_length(true, &huge, &[], &[]).target_words, MAX_TARGET_WORDS);
    }

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
