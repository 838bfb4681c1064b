//! Self-refine (REFERENCE section 5): a critique -> revise loop over one draft, stopped by the
//! convergence cascade ([`crate::similarity`]) and guarded against drifting away from the original.
//!
//! A pass asks the refiner model for a `<critique>` and a `<revised>` text, then:
//! 1. the cascade compares the revision with the draft the pass started from;
//! 2. when more than one pass may run, or the revision diverged from the draft it started from,
//!    the regression guard measures the revision's similarity to the original (embedding cosine
//!    through the cascade's cache and breaker; Jaccard when embeddings are unavailable for it or
//!    for an earlier revision). Below [`ROLLBACK_RATIO`] x the best similarity of the revisions
//!    kept so far (on pass 1, for a diverged revision measured by cosine: x 1, the original's own;
//!    a pass-1 revision measured by Jaccard is never rolled back, only flagged `degraded_from`), the revision is
//!    discarded (`rolled_back`) and the loop stops returning the BEST draft seen, not the previous
//!    one: of the original and every kept revision, the one the guard scored highest (its
//!    similarity to the original in the guard's measure). The original is the measure's reference,
//!    so it is returned when no revision was kept; among kept revisions the highest score wins, the
//!    earlier one on a tie. [`SelfRefineOutcome::returned_pass`] says which draft came back. A
//!    revision that diverges from the original is never kept without passing this test;
//! 3. otherwise the revision becomes the draft; converged stops the loop, anything else (diverged
//!    included) goes on to the next pass.
//!
//! A refiner error (failed call, empty revision, reply cut at the token limit, a reply without a
//! `<revised>` block that diverged from the draft: a refusal or an answer rather than a rewrite)
//! keeps the previous draft, is reported in its pass, and stops the loop. Only when the very first
//! call fails outright (nothing was produced and nothing can be reported but the backend's
//! failure) does the stage return the error itself.

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::error::{StageError, Violations};
use crate::judge::check_model_spec;
use crate::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};
use crate::model::{ModelRecord, ModelSpec};
use crate::similarity::{CompareOutcome, ConvergenceMode, DecidedBy};
use crate::stage::EventSink;

/// Configuration phase of the refiner model (`models.phases.self_refine`).
pub const SELF_REFINE_PHASE: &str = "self_refine";
/// Passes when the caller sets none.
pub const DEFAULT_MAX_PASSES: u32 = 1;
/// Most passes one request may ask for (the reference recommends at most 2; beyond 3 a loop
/// rarely converges and only costs).
pub const MAX_PASSES: u32 = 5;
/// Drafts shorter than this (bytes) are returned unchanged when the caller sets no minimum.
pub const DEFAULT_MIN_BYTES: u32 = 200;
/// A revision whose similarity to the original falls below this share of the best so far is
/// rolled back.
pub const ROLLBACK_RATIO: f64 = 0.85;
/// Whether the convergence cascade runs its embedding step (step 3) when neither the request nor
/// the service's configuration (`convergence.embedding_step`) says. Off, by measurement on the
/// embedded backend (`cargo bench -p assay-refiners --bench self_refine_similarity`): on 175
/// labelled revision pairs of the lesson fixtures, 118 reached step 3 and the step changed 91
/// decisions, leaving 94 right against 139 without it (a same-topic revision scores a cosine of
/// 0.92 or more whatever it changed: an added example, a corrected fact, a removed step; and MiniLM
/// reads only a text's first 256 tokens), at 0.36 to 0.69 s a comparison.
/// The regression guard's similarity to the original still uses embeddings when available.
pub const DEFAULT_EMBEDDING_STEP: bool = false;

/// Critique-and-revise one draft.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfRefineRequest {
    pub draft: String,
    /// What the draft is meant to do; may be empty.
    pub instruction: String,
    /// 1 to [`MAX_PASSES`].
    pub max_passes: u32,
    /// Drafts shorter than this many bytes are returned unchanged (0: never skip).
    pub min_bytes: u32,
    pub mode: ConvergenceMode,
    /// Run the cascade's embedding step; `None`: the service's configuration
    /// (`convergence.embedding_step`, default [`DEFAULT_EMBEDDING_STEP`]). Off, a comparison that
    /// Jaccard leaves undecided is decided as permissive / strict mode decide without embeddings,
    /// with nothing recorded as degraded.
    #[serde(default)]
    pub embedding_step: Option<bool>,
    pub model: ModelSpec,
    /// Unset fields: the configured embedding backend.
    pub embedding_model: ModelSpec,
    /// Passes an earlier call already ran over this draft (1, 2, ... in order, fewer than
    /// `max_passes`, none of them one that ends the loop): taken as they are (the draft they left,
    /// the guard's figures, their usage) with no model call, the loop going on from the next pass.
    /// A caller that pauses between passes runs them one call at a time and hands them back here.
    #[serde(default)]
    pub prior_passes: Vec<SelfRefinePass>,
    /// Most passes this call runs (0: up to `max_passes`). A call cut short by it reports
    /// [`StopReason::MaxPasses`]; see [`SelfRefineOutcome::finished`].
    #[serde(default)]
    pub passes_this_call: u32,
}

impl Default for SelfRefineRequest {
    fn default() -> Self {
        Self {
            draft: String::new(),
            instruction: String::new(),
            max_passes: DEFAULT_MAX_PASSES,
            min_bytes: DEFAULT_MIN_BYTES,
            mode: ConvergenceMode::default(),
            embedding_step: None,
            model: ModelSpec::default(),
            embedding_model: ModelSpec::default(),
            prior_passes: Vec::new(),
            passes_this_call: 0,
        }
    }
}

impl SelfRefineRequest {
    /// Every check the domain requires; field paths are relative to `prefix` (may be empty).
    pub fn check(&self, prefix: &str, v: &mut Violations) {
        let f = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        if self.draft.trim().is_empty() {
            v.push(f("draft"), "must not be empty");
        }
        for (name, text) in [("draft", &self.draft), ("instruction", &self.instruction)] {
            if text.len() > MAX_TEXT_BYTES {
                v.push(f(name), format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()));
            }
        }
        if !(1..=MAX_PASSES).contains(&self.max_passes) {
            v.push(f("max_passes"), format!("is {}; it must be between 1 and {MAX_PASSES}", self.max_passes));
        }
        check_model_spec(&self.model, &f("model"), v);
        check_model_spec(&self.embedding_model, &f("embedding_model"), v);
        if !self.prior_passes.is_empty() && self.prior_passes.len() >= self.max_passes as usize {
            v.push(
                f("prior_passes"),
                format!(
                    "has {} passes; at most max_passes - 1 ({}) can be continued",
                    self.prior_passes.len(),
                    self.max_passes.saturating_sub(1)
                ),
            );
        }
        for (i, p) in self.prior_passes.iter().enumerate() {
            let name = f(&format!("prior_passes[{i}]"));
            if p.pass as usize != i + 1 {
                v.push(format!("{name}.pass"), format!("is {}; prior passes are numbered 1, 2, ... in order", p.pass));
            }
            if !p.kept() || p.converged {
                v.push(name.clone(), "ended the loop (converged, rolled back or failed); nothing to continue");
            }
            if p.revised.len() > MAX_TEXT_BYTES {
                v.push(
                    format!("{name}.revised"),
                    format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", p.revised.len()),
                );
            }
        }
    }

    /// [`Self::check`] as a result.
    pub fn validate(&self) -> Result<(), StageError> {
        let mut v = Violations::new();
        self.check("", &mut v);
        v.into_result()
    }

    /// Whether the draft is too short to refine.
    pub fn too_short(&self) -> bool {
        self.draft.len() < self.min_bytes as usize
    }
}

/// What the regression guard measured for one revision.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct OriginalSimilarity {
    /// Similarity of the revision to the original draft.
    pub similarity: f64,
    /// [`DecidedBy::Embedding`] (cosine) or [`DecidedBy::Jaccard`].
    pub measure: DecidedBy,
    /// [`ROLLBACK_RATIO`] x the best similarity so far; on pass 1 [`ROLLBACK_RATIO`] for a
    /// revision that diverged from the draft, `None` otherwise (no guard yet).
    pub threshold: Option<f64>,
    /// Why the guard measured by Jaccard, when it did.
    pub degraded_reason: String,
}

/// One critique/revise pass.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SelfRefinePass {
    /// 1-based.
    pub pass: u32,
    pub critique: Vec<String>,
    /// The model's revision (empty when the call failed).
    pub revised: String,
    /// No `<revised>` block: the whole reply (without its critique block) was the revision.
    pub revised_block_missing: bool,
    /// The cascade between the draft this pass started from and the revision; `None` when the
    /// call failed or its reply was unusable.
    pub comparison: Option<CompareOutcome>,
    /// The regression guard's figures; `None` when no guard ran (one pass, a first pass that
    /// converged) or no usable revision came.
    pub original_similarity: Option<OriginalSimilarity>,
    pub converged: bool,
    pub rolled_back: bool,
    /// Why the pass produced no usable revision (the previous draft is kept); empty otherwise.
    /// `revised` may still hold the model's text (a reply that was not a revision of the draft).
    pub error: String,
    /// The refiner call of this pass.
    pub usage: Usage,
}

impl SelfRefinePass {
    /// The revision became the draft.
    pub fn kept(&self) -> bool {
        self.error.is_empty() && !self.rolled_back
    }

    /// `"embedding"` when this pass's cascade decided without embeddings.
    pub fn degraded_from(&self) -> Option<&str> {
        self.comparison.as_ref().and_then(|c| c.degraded_from.as_deref())
    }
}

/// Why the loop stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum StopReason {
    Converged,
    #[default]
    MaxPasses,
    RolledBack,
    RefinerError,
    TooShort,
}

/// Most entries of a hook's exclude list.
pub const MAX_HOOK_EXCLUDES: usize = 64;

/// The producers a hook with no exclude list leaves alone: text a human wrote or edited is not
/// polished after it was accepted (the seed's default excludes, `formatter`, `deps`, `refiner`,
/// `verifier`, name agents no Assay pipeline has).
pub const DEFAULT_HOOK_EXCLUDES: &[&str] = &["human"];

/// Self-refine as post-processing of a pipeline's text outputs: every output that is not excluded
/// (by its name or its producer) and is at least `min_bytes` long goes through one loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfRefineHook {
    pub max_passes: u32,
    pub min_bytes: u32,
    /// Output names (section or problem ids) and producers left alone.
    pub exclude: Vec<String>,
    pub mode: ConvergenceMode,
    /// As [`SelfRefineRequest::embedding_step`].
    #[serde(default)]
    pub embedding_step: Option<bool>,
    pub model: ModelSpec,
    pub embedding_model: ModelSpec,
}

impl Default for SelfRefineHook {
    fn default() -> Self {
        Self {
            max_passes: DEFAULT_MAX_PASSES,
            min_bytes: DEFAULT_MIN_BYTES,
            exclude: Vec::new(),
            mode: ConvergenceMode::default(),
            embedding_step: None,
            model: ModelSpec::default(),
            embedding_model: ModelSpec::default(),
        }
    }
}

impl SelfRefineHook {
    /// The checks of the hook's own fields (not its model specs), named under `prefix`.
    pub fn check_fields(&self, prefix: &str, v: &mut Violations) {
        let f = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        if !(1..=MAX_PASSES).contains(&self.max_passes) {
            v.push(f("max_passes"), format!("is {}; it must be between 1 and {MAX_PASSES}", self.max_passes));
        }
        if self.exclude.len() > MAX_HOOK_EXCLUDES {
            v.push(f("exclude"), format!("has {} entries; the limit is {MAX_HOOK_EXCLUDES}", self.exclude.len()));
        }
        for (i, e) in self.exclude.iter().enumerate() {
            if e.trim().is_empty() {
                v.push(f(&format!("exclude[{i}]")), "must not be empty");
            } else if e.len() > MAX_ID_BYTES {
                v.push(f(&format!("exclude[{i}]")), format!("is {} bytes; the limit is {MAX_ID_BYTES}", e.len()));
            }
        }
    }

    pub fn check(&self, prefix: &str, v: &mut Violations) {
        self.check_fields(prefix, v);
        let f = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        check_model_spec(&self.model, &f("model"), v);
        check_model_spec(&self.embedding_model, &f("embedding_model"), v);
    }

    /// Whether the output `target`, written by `producer`, is left alone: named by the exclude
    /// list, or, with no list, written by a producer of [`DEFAULT_HOOK_EXCLUDES`] (a list given
    /// replaces them, as the seed's `ExcludeAgents`; name anything else, `["-"]`, to polish every
    /// output).
    pub fn excludes(&self, target: &str, producer: &str) -> bool {
        if self.exclude.is_empty() {
            return DEFAULT_HOOK_EXCLUDES.contains(&producer);
        }
        self.exclude.iter().any(|e| e.trim() == target || e.trim() == producer)
    }

    /// The loop's request for one output.
    pub fn request(&self, draft: String, instruction: String) -> SelfRefineRequest {
        SelfRefineRequest {
            draft,
            instruction,
            max_passes: self.max_passes,
            min_bytes: self.min_bytes,
            mode: self.mode,
            embedding_step: self.embedding_step,
            model: self.model.clone(),
            embedding_model: self.embedding_model.clone(),
            prior_passes: Vec::new(),
            passes_this_call: 0,
        }
    }
}

/// The refined text and how it came about.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SelfRefineOutcome {
    pub final_text: String,
    pub passes: Vec<SelfRefinePass>,
    pub converged: bool,
    pub skipped_too_short: bool,
    pub rolled_back: bool,
    /// `"embedding"` when any pass's cascade decided without embeddings.
    pub degraded_from: Option<String>,
    pub stop_reason: StopReason,
    /// `final_text` differs from the draft.
    pub changed: bool,
    /// Which draft `final_text` is: 0 the original, `n` pass `n`'s revision. After a rollback, the
    /// best draft seen (see the module's rule), not necessarily the last kept one.
    #[serde(default)]
    pub returned_pass: u32,
    /// Every refiner call.
    pub usage: Usage,
    /// The refiner model's record (default when skipped).
    pub model: ModelRecord,
}

impl SelfRefineOutcome {
    /// Whether the loop is over (as opposed to a call cut short by `passes_this_call`): skipped,
    /// `max_passes` passes ran, or its last pass ended it (converged, rolled back or failed).
    pub fn finished(&self, max_passes: u32) -> bool {
        self.skipped_too_short
            || self.passes.len() >= max_passes as usize
            || self.passes.last().is_none_or(|p| !p.kept() || p.converged)
    }
}

/// Progress of a self-refine call.
#[derive(Debug, Clone, PartialEq)]
pub enum SelfRefinePassEvent {
    /// A pass finished (whatever its result).
    PassFinished(SelfRefinePass),
}

/// The self-refine stage (the refiners service).
#[async_trait::async_trait]
pub trait SelfRefiner: Send + Sync {
    /// Refine `request.draft`; calls `events` after each pass.
    async fn self_refine(
        &self,
        request: SelfRefineRequest,
        events: EventSink<'_, SelfRefinePassEvent>,
    ) -> Result<SelfRefineOutcome, StageError>;
}

/// The self-refiner's instruction for polishing one section (`id`, `title`) of a refined
/// sectioned document (the self-refine hook of targeted refinement), with the document's brief
/// as prompt text (left out when blank).
pub fn polish_instruction(id: &str, title: &str, brief: &str) -> String {
    let mut instruction = format!(
        "Polish section {id:?} (\"{title}\") of a sectioned document. Return only this section's text, in its \
         own format and language; keep its headings, facts and place in the document."
    );
    if !brief.trim().is_empty() {
        instruction.push_str("\nThe document's brief:\n");
        instruction.push_str(brief);
    }
    instruction
}

/// The self-refiner's instruction for polishing a debate's final answer to `problem` (the
/// self-refine hook of the debate pipeline).
pub fn final_answer_instruction(problem: &str) -> String {
    format!(
        "The text is the final answer to this problem. Keep the answer itself (its value or conclusion) \
         unchanged.\nProblem:\n{problem}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook instructions the gateway wrote before they moved here, word for word.
    #[test]
    fn the_hook_instructions_keep_their_text() {
        assert_eq!(
            polish_instruction("s1", "Intro", " "),
            "Polish section \"s1\" (\"Intro\") of a sectioned document. Return only this section's text, in its \
             own format and language; keep its headings, facts and place in the document."
        );
        assert_eq!(
            polish_instruction("s\"2", "T", "Objectives: x"),
            "Polish section \"s\\\"2\" (\"T\") of a sectioned document. Return only this section's text, in its \
             own format and language; keep its headings, facts and place in the document.\nThe document's brief:\n\
             Objectives: x"
        );
        assert_eq!(
            final_answer_instruction("What is 2 + 2?"),
            "The text is the final answer to this problem. Keep the answer itself (its value or conclusion) \
             unchanged.\nProblem:\nWhat is 2 + 2?"
        );
    }

    fn request(draft: &str) -> SelfRefineRequest {
        SelfRefineRequest { draft: draft.into(), ..Default::default() }
    }

    #[test]
    fn defaults_follow_the_reference() {
        let r = SelfRefineRequest::default();
        assert_eq!((r.max_passes, r.min_bytes, r.mode), (1, 200, ConvergenceMode::Permissive));
        assert!(request("x").validate().is_ok());
        assert!(request("x").too_short());
        assert!(!SelfRefineRequest { min_bytes: 0, ..request("x") }.too_short());
        assert!(!request(&"x".repeat(200)).too_short(), "exactly min_bytes is refined");
    }

    #[test]
    fn checks_name_every_field() {
        let r = SelfRefineRequest {
            draft: " \n".into(),
            instruction: "i".repeat(MAX_TEXT_BYTES + 1),
            max_passes: 0,
            model: ModelSpec { temperature: Some(2.5), ..Default::default() },
            embedding_model: ModelSpec { max_tokens: Some(0), ..Default::default() },
            ..Default::default()
        };
        let mut v = Violations::new();
        r.check("request", &mut v);
        let e = v.into_result().unwrap_err().to_string();
        for field in [
            "request.draft: must not be empty",
            "request.instruction: is 262145 bytes; the limit is 262144 bytes",
            "request.max_passes: is 0; it must be between 1 and 5",
            "request.model.temperature",
            "request.embedding_model.max_tokens",
        ] {
            assert!(e.contains(field), "{field} missing from {e}");
        }
        let e = SelfRefineRequest { max_passes: MAX_PASSES + 1, ..request("x".repeat(MAX_TEXT_BYTES + 1).as_str()) }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("draft: is 262145 bytes") && e.contains("max_passes: is 6"), "{e}");
    }

    #[test]
    fn a_pass_is_kept_unless_it_failed_or_was_rolled_back() {
        assert!(SelfRefinePass::default().kept());
        assert!(!SelfRefinePass { rolled_back: true, ..Default::default() }.kept());
        assert!(!SelfRefinePass { error: "down".into(), ..Default::default() }.kept());
    }

    #[test]
    fn a_hook_without_an_exclude_list_leaves_human_text_alone() {
        let hook = SelfRefineHook::default();
        assert!(hook.excludes("intro", "human"));
        assert!(!hook.excludes("intro", "model") && !hook.excludes("intro", "original"));
        // A list given replaces the defaults.
        let named = SelfRefineHook { exclude: vec!["summary".into()], ..SelfRefineHook::default() };
        assert!(named.excludes("summary", "model") && !named.excludes("intro", "human"));
        let all = SelfRefineHook { exclude: vec!["-".into()], ..SelfRefineHook::default() };
        assert!(!all.excludes("intro", "human"));
    }
}
