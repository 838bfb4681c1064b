//! Self-refine: a critique -> revise loop over one draft, stopped by the
//! convergence cascade ([`crate::similarity`]) and guarded against drifting away from the original.
//!
//! A pass asks the refiner model for a `<critique>` and a `<revised>` text, then:
//! 1. the cascade compares the revision with the draft the pass started from;
//! 2. on pass 1, a revision that diverged from the draft (character similarity under 0.3) must
//!    still be recognisably a revision of it ([`is_a_revision`]: close in meaning, or keeping a
//!    fair share of the draft's content words); one that is not (a refusal, a bare "YES", an
//!    answer instead of a rewrite) is a refiner error and the draft is kept. A faithful expansion
//!    or summary is kept whatever its cosine: pass 1 is never rolled back;
//! 3. when more than one pass may run, or the revision diverged from the draft it started from,
//!    the regression guard measures the revision's similarity to the original (embedding cosine
//!    through the cascade's cache and breaker; Jaccard when embeddings are unavailable for it or
//!    for an earlier revision). From pass 2 on, below [`ROLLBACK_RATIO`] x the best similarity of
//!    the revisions kept so far, the revision is discarded (`rolled_back`) and the loop stops
//!    returning the BEST draft seen, not the previous one: of the original and every kept
//!    revision, the one the guard scored highest (its similarity to the original in the guard's
//!    measure), the earlier one on a tie. [`SelfRefineOutcome::returned_pass`] says which draft
//!    came back. Pass 1's figures are the baseline later passes are held to;
//! 4. otherwise the revision becomes the draft; converged stops the loop, anything else (diverged
//!    included) goes on to the next pass.
//!
//! A refiner error keeps the previous draft, is reported in its pass, and stops the loop: a failed
//! call (the backend down or overloaded, the request refused: a 400 for a context too long, a 401
//! for bad credentials; a timeout, the budget refused), an empty revision, a reply cut at the token
//! limit, a reply that is not a revision of the draft (above; or without a `<revised>` block and
//! diverged from the draft), a reply that echoes the prompt's own scaffold in a way that cannot be
//! stripped exactly. The same rule holds on every pass. The stage itself returns the error of a
//! very first call that failed outright (nothing was produced); a caller that owns a run keeps the
//! draft for it as for any other pass ([`SelfRefineOutcome::refiner_failed`]).

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::error::{StageError, Violations};
use crate::judge::check_model_spec;
use crate::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};
use crate::model::{ModelRecord, ModelSpec};
use crate::similarity::{CHAR_DIVERGED, CompareOutcome, ConvergenceMode, DecidedBy, tokens};
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
/// Least share of the draft's content words ([`crate::similarity::tokens`]) a pass-1 revision that
/// diverged from the draft by characters must keep to be recognised as a revision of it by its
/// words: a faithful expansion keeps nearly all of them, a summary a quarter or more; a refusal, a
/// bare "YES" or an answer about something else keeps next to none.
pub const REVISION_MIN_KEPT_WORDS: f64 = 0.2;
/// Least embedding cosine to the draft at which a pass-1 revision that diverged from the draft by
/// characters is recognised as a revision of it whatever its words (a paraphrase). Far below the
/// rollback ratio: on pass 1 it tells a revision from a reply about something else, not a better
/// revision from a worse one (that is the regression guard's business, from pass 2 on).
pub const REVISION_MIN_COSINE: f64 = 0.5;
/// Whether the convergence cascade runs its embedding step (step 3) when neither the request nor
/// the service's configuration (`convergence.embedding_step`) says. Off, by measurement on the
/// embedded backend (`cargo bench -p assay-refiners --bench self_refine_similarity`): on 175
/// labelled revision pairs of the lesson fixtures, 118 reached step 3 and the step changed 91
/// decisions, leaving 94 right against 139 without it (a same-topic revision scores a cosine of
/// 0.92 or more whatever it changed: an added example, a corrected fact, a removed step; and MiniLM
/// reads only a text's first 256 tokens), at 0.36 to 0.69 s a comparison.
/// The regression guard's similarity to the original still uses embeddings when available.
pub const DEFAULT_EMBEDDING_STEP: bool = false;
/// Slack for threshold comparisons.
const EPS: f64 = 1e-9;

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

/// Share of `draft`'s content words (the normalised tokens of [`crate::similarity::tokens`]: lower
/// case, stop words and one-character tokens dropped) that `revised` keeps; 1 when the draft has
/// none (nothing to lose).
pub fn kept_words(draft: &str, revised: &str) -> f64 {
    let words = tokens(draft);
    if words.is_empty() {
        return 1.0;
    }
    let kept = tokens(revised);
    words.intersection(&kept).count() as f64 / words.len() as f64
}

/// Whether a pass-1 reply that diverged from the draft by characters is still recognisably a
/// revision of it (pass 1 refuses only replies that are not a revision at all): close
/// in meaning (embedding `cosine` to the draft at least [`REVISION_MIN_COSINE`], when measured) or
/// keeping at least [`REVISION_MIN_KEPT_WORDS`] of the draft's content words ([`kept_words`]). A
/// faithful expansion, a summary or a paraphrase is one; a refusal, a bare "YES" or an answer
/// instead of a rewrite is not. Without embeddings the words alone decide.
pub fn is_a_revision(kept_words: f64, cosine: Option<f64>) -> bool {
    cosine.is_some_and(|c| c >= REVISION_MIN_COSINE - EPS) || kept_words >= REVISION_MIN_KEPT_WORDS - EPS
}

/// The error of a pass-1 reply with a `<revised>` block that diverged from `draft` (character
/// similarity `char_similarity`) and is not a revision of it ([`is_a_revision`]); `None` when it
/// is one.
pub fn not_a_revision(draft: &str, revised: &str, char_similarity: f64, cosine: Option<f64>) -> Option<String> {
    let kept = kept_words(draft, revised);
    if is_a_revision(kept, cosine) {
        return None;
    }
    let meaning = match cosine {
        Some(c) => format!("its embedding cosine to the draft is {c:.2}, under {REVISION_MIN_COSINE}"),
        None => "no embedding measured it".to_string(),
    };
    Some(format!(
        "the reply is not a revision of the draft (character similarity {char_similarity:.2}, under \
         {CHAR_DIVERGED}: diverged; it keeps {:.0}% of the draft's content words, under {:.0}%; {meaning}): \
         a refusal or an answer instead of a rewrite, so the draft is kept",
        kept * 100.0,
        REVISION_MIN_KEPT_WORDS * 100.0
    ))
}

/// `"embedding"` when a pass's cascade decided without embeddings, or the guard measured a kept
/// revision by Jaccard because embeddings were unavailable.
pub fn degraded_from(passes: &[SelfRefinePass]) -> Option<String> {
    passes.iter().find_map(|p| p.degraded_from().map(str::to_string)).or_else(|| {
        passes
            .iter()
            .any(|p| p.kept() && p.original_similarity.as_ref().is_some_and(|g| !g.degraded_reason.is_empty()))
            .then(|| "embedding".to_string())
    })
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
/// polished after it was accepted, and text no stage changed (`original`: a section that passed
/// judging as it was given) stays exactly as given (untouched sections remain
/// unchanged, byte for byte). With no list the hook polishes only what a model wrote (`model`,
/// `debate`). Agent names such as `formatter`, `deps`, `refiner` or `verifier` are not defaults:
/// no Assay pipeline has such a producer.
pub const DEFAULT_HOOK_EXCLUDES: &[&str] = &["human", "original"];

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
    /// replaces them; name anything else, `["-"]`, to polish every
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
    /// The outcome of a loop whose next refiner call failed as a whole with `error` (a very first
    /// call that failed outright, or a stage call that failed before its pass could be reported):
    /// a refiner error like any other (it keeps the previous draft and is reported).
    /// `passes` are the passes run before (each kept, none ending the loop); the failed one is
    /// added after them with the error. The text returned is the last kept pass's revision (the
    /// draft when there is none), the stop reason [`StopReason::RefinerError`]; `model` is the
    /// refiner's record when a call reported one.
    pub fn refiner_failed(draft: &str, mut passes: Vec<SelfRefinePass>, error: String, model: ModelRecord) -> Self {
        let (final_text, returned_pass) = passes
            .iter()
            .rev()
            .find(|p| p.kept())
            .map_or_else(|| (draft.to_string(), 0), |p| (p.revised.clone(), p.pass));
        let mut usage = Usage::default();
        for p in &passes {
            usage.add(&p.usage);
        }
        passes.push(SelfRefinePass { pass: passes.len() as u32 + 1, error, ..SelfRefinePass::default() });
        Self {
            changed: final_text != draft,
            final_text,
            degraded_from: degraded_from(&passes),
            converged: false,
            skipped_too_short: false,
            rolled_back: false,
            stop_reason: StopReason::RefinerError,
            returned_pass,
            passes,
            usage,
            model,
        }
    }

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

    /// With no exclude list, the hook leaves a section that passed judging as it
    /// was given (producer "original") exactly as it was, as it leaves a human's text; it polishes
    /// only what a model wrote.
    #[test]
    fn a_hook_without_an_exclude_list_leaves_human_and_untouched_text_alone() {
        let hook = SelfRefineHook::default();
        assert!(hook.excludes("intro", "human"));
        assert!(hook.excludes("intro", "original"), "an untouched section stays untouched");
        assert!(!hook.excludes("intro", "model") && !hook.excludes("p1", "debate"));
        // A list given replaces the defaults.
        let named = SelfRefineHook { exclude: vec!["summary".into()], ..SelfRefineHook::default() };
        assert!(named.excludes("summary", "model") && !named.excludes("intro", "human"));
        assert!(!named.excludes("intro", "original"));
        let all = SelfRefineHook { exclude: vec!["-".into()], ..SelfRefineHook::default() };
        assert!(!all.excludes("intro", "human") && !all.excludes("intro", "original"));
    }

    const DRAFT: &str = "Photosynthesis is how plants make food. They use light. Water and carbon dioxide go in \
                         and sugar and oxygen come out. This happens in the leaves of the plant, inside small \
                         parts of the cells that hold a green pigment.";

    /// Pass 1 refuses only replies that are not a revision at all: a faithful expansion or a summary
    /// is one by its words, whatever its cosine; a paraphrase by its cosine; a refusal or a bare
    /// "YES" by neither.
    #[test]
    fn a_revision_is_recognised_by_its_meaning_or_its_words() {
        let expansion = format!(
            "{DRAFT} The green pigment is chlorophyll, and the small parts are chloroplasts. Light gives the \
             energy that splits water; the oxygen that comes out is what we breathe, and the sugar feeds the \
             plant as it grows new leaves, stems and roots through the spring and the summer months."
        );
        let summary = "Plants make sugar and oxygen from light, water and carbon dioxide, in the leaves.";
        let refusal = "I am sorry, but I cannot help with that request.";
        assert!(kept_words(DRAFT, &expansion) > 0.99);
        assert!(kept_words(DRAFT, summary) >= REVISION_MIN_KEPT_WORDS, "{}", kept_words(DRAFT, summary));
        assert_eq!((kept_words(DRAFT, refusal), kept_words(DRAFT, "YES")), (0.0, 0.0));
        assert_eq!(kept_words("a an the", "anything"), 1.0, "a draft without content words loses none");
        // A faithful expansion far from the draft by cosine (0.3) is still a revision.
        assert!(is_a_revision(kept_words(DRAFT, &expansion), Some(0.3)));
        assert!(is_a_revision(kept_words(DRAFT, summary), None));
        // A paraphrase sharing few words is one by its cosine.
        assert!(is_a_revision(0.05, Some(0.5)) && !is_a_revision(0.05, Some(0.49)));
        for reply in [refusal, "YES"] {
            let why = not_a_revision(DRAFT, reply, 0.05, Some(0.1)).expect("not a revision");
            assert!(why.contains("is not a revision of the draft") && why.contains("keeps 0%"), "{why}");
            assert!(why.contains("cosine to the draft is 0.10, under 0.5"), "{why}");
            let why = not_a_revision(DRAFT, reply, 0.05, None).expect("the words decide without embeddings");
            assert!(why.contains("no embedding measured it"), "{why}");
        }
        assert_eq!(not_a_revision(DRAFT, &expansion, 0.2, Some(0.1)), None);
    }

    /// A refiner call that failed as a whole keeps the text the passes before it left (the draft
    /// when there were none) and is reported in a pass of its own: the same outcome on every pass.
    #[test]
    fn a_failed_call_keeps_the_previous_draft_and_is_reported_on_every_pass() {
        let out = SelfRefineOutcome::refiner_failed(
            DRAFT,
            Vec::new(),
            "failed precondition: 401".into(),
            ModelRecord::default(),
        );
        assert_eq!((out.final_text.as_str(), out.changed, out.returned_pass), (DRAFT, false, 0));
        assert_eq!((out.stop_reason, out.converged, out.rolled_back), (StopReason::RefinerError, false, false));
        assert_eq!(out.passes.len(), 1);
        assert_eq!((out.passes[0].pass, out.passes[0].error.as_str()), (1, "failed precondition: 401"));
        assert!(out.finished(2), "a failed pass ends the loop");

        let first = SelfRefinePass {
            pass: 1,
            revised: "Revision one.".into(),
            usage: Usage { calls: 1, prompt_tokens: 40, ..Usage::default() },
            ..SelfRefinePass::default()
        };
        let model = ModelRecord { model: "editor".into(), ..ModelRecord::default() };
        let out =
            SelfRefineOutcome::refiner_failed(DRAFT, vec![first.clone()], "unavailable: down".into(), model.clone());
        assert_eq!((out.final_text.as_str(), out.changed, out.returned_pass), ("Revision one.", true, 1));
        assert_eq!(
            out.passes,
            vec![first, SelfRefinePass { pass: 2, error: "unavailable: down".into(), ..Default::default() }]
        );
        assert_eq!((out.usage.calls, out.usage.prompt_tokens, out.model), (1, 40, model));
        assert_eq!(out.stop_reason, StopReason::RefinerError);
    }
}
