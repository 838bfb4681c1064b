//! Text convergence between two drafts: the measures and decisions of the
//! cascade self-refine and the delta judge's CompareTexts share.
//!
//! 1. Character similarity: `>= 0.99` converged, `< 0.3` diverged.
//! 2. Jaccard over normalised token sets (lower case, punctuation removed, English and Portuguese
//!    stop words and one-character tokens dropped): `>= 0.95` with confidence `>= 0.6` converged.
//! 3. Embedding cosine: `>= 0.92` converged, otherwise not.
//!
//! Embeddings unavailable (backend error, circuit breaker open, no backend): permissive mode decides
//! by Jaccard alone (`>= 0.95`) and records `degraded_from = "embedding"`; strict mode refuses to
//! converge. The embedding step may also be turned off (self-refine's `embedding_step`): the same
//! decision is then taken by choice, with nothing recorded as degraded ([`skip_embedding_step`]).
//! Everything here is pure: [`text_steps`] runs steps 1 and 2, [`embedding_step`] decides step 3
//! from a cosine (or the reason there is none). Fetching and caching vectors behind a circuit
//! breaker is the model crate's (`assay_llm::convergence::Cascade`).
//!
//! Character similarity is `1 - levenshtein / max(len)` over Unicode scalar values, exact at every
//! length: the distance comes from a bit-parallel algorithm (Hyyrö's, crate `rapidfuzz`) that takes
//! milliseconds on 20 KB drafts, so a long draft with an early insertion scores one edit per inserted
//! character, as a short one does (the original scorer's positional count, which called any early
//! insertion "diverged", is gone).

use std::collections::{BTreeSet, HashSet};
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use crate::StageError;

/// Character similarity at or above which drafts have converged.
pub const CHAR_CONVERGED: f64 = 0.99;
/// Character similarity under which drafts have diverged.
pub const CHAR_DIVERGED: f64 = 0.3;
/// Jaccard similarity at or above which drafts have converged (with enough confidence).
pub const JACCARD_CONVERGED: f64 = 0.95;
/// Least Jaccard confidence for the Jaccard step to decide convergence.
pub const JACCARD_MIN_CONFIDENCE: f64 = 0.6;
/// Embedding cosine at or above which drafts have converged.
pub const EMBEDDING_CONVERGED: f64 = 0.92;
/// Slack for threshold comparisons (1 - 1/100 must count as 0.99).
const EPS: f64 = 1e-9;

/// English stop words (the original scorer's list).
const STOP_WORDS_EN: &[&str] = &[
    "a", "an", "the", "and", "or", "but", "if", "then", "else", "as", "at", "by", "for", "in", "of", "on", "to",
    "with", "from", "is", "was", "are", "were", "be", "been", "being", "i", "you", "he", "she", "we", "they", "it",
    "this", "that", "do", "does", "did", "not", "no",
];

/// Portuguese stop words (the Jaccard measure drops English and Portuguese ones): articles, contractions
/// of prepositions and articles, prepositions, conjunctions, pronouns and the commonest forms of
/// ser / estar / ter / haver. Words that are also English content words ("era", "sim") are left out.
const STOP_WORDS_PT: &[&str] = &[
    "o", "os", "as", "um", "uma", "uns", "umas", "de", "do", "da", "dos", "das", "em", "no", "na", "nos", "nas", "num",
    "numa", "ao", "aos", "à", "às", "pelo", "pela", "pelos", "pelas", "por", "para", "com", "sem", "sob", "sobre",
    "entre", "até", "desde", "e", "ou", "mas", "nem", "se", "que", "como", "quando", "onde", "porque", "pois", "não",
    "é", "são", "foi", "foram", "ser", "sendo", "está", "estão", "estar", "esteve", "tem", "têm", "ter", "tinha", "há",
    "havia", "eu", "tu", "ele", "ela", "nós", "vós", "eles", "elas", "você", "vocês", "me", "te", "lhe", "lhes", "seu",
    "sua", "seus", "suas", "meu", "minha", "meus", "minhas", "nosso", "nossa", "este", "esta", "estes", "estas",
    "isto", "esse", "essa", "esses", "essas", "isso", "aquele", "aquela", "aquilo", "qual", "quais", "também", "já",
    "mais", "muito", "muita", "só", "ainda", "cada",
];

/// Every stop word [`tokens`] drops (lower case).
static STOP_WORDS: LazyLock<HashSet<&'static str>> =
    LazyLock::new(|| STOP_WORDS_EN.iter().chain(STOP_WORDS_PT).copied().collect());

/// Whether `token` (lower case) is an English or Portuguese stop word.
pub fn is_stop_word(token: &str) -> bool {
    STOP_WORDS.contains(token)
}

/// Character similarity in [0, 1]: `1 - levenshtein / max(len)` over chars; two empty texts are 1.
/// Exact at any length (bit-parallel Levenshtein: `O(len / 64 x len)`, milliseconds for 20 KB).
pub fn char_similarity(a: &str, b: &str) -> f64 {
    let longest = a.chars().count().max(b.chars().count());
    if longest == 0 {
        return 1.0;
    }
    let edits = rapidfuzz::distance::levenshtein::distance(a.chars(), b.chars());
    (1.0 - edits as f64 / longest as f64).clamp(0.0, 1.0)
}

/// Normalised token set: lower case, split on anything that is not a letter or digit, English and
/// Portuguese stop words and one-character tokens dropped.
pub fn tokens(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| t.chars().count() > 1)
        .map(str::to_lowercase)
        .filter(|t| !is_stop_word(t))
        .collect()
}

/// Jaccard similarity with its confidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JaccardScore {
    pub similarity: f64,
    /// Grows with the token counts: `min(sqrt(|A| * |B|) / 50, 0.95)`; 0.5 when both sets are
    /// empty (similarity 1), 0.7 when one is (similarity 0).
    pub confidence: f64,
}

/// Token-set Jaccard `|A ∩ B| / |A ∪ B|` of two texts (see [`tokens`]).
pub fn jaccard(a: &str, b: &str) -> JaccardScore {
    let (ta, tb) = (tokens(a), tokens(b));
    match (ta.is_empty(), tb.is_empty()) {
        (true, true) => return JaccardScore { similarity: 1.0, confidence: 0.5 },
        (true, false) | (false, true) => return JaccardScore { similarity: 0.0, confidence: 0.7 },
        (false, false) => {}
    }
    let common = ta.intersection(&tb).count();
    let union = ta.len() + tb.len() - common;
    let confidence = ((ta.len() as f64 * tb.len() as f64).sqrt() / 50.0).min(0.95);
    JaccardScore { similarity: common as f64 / union as f64, confidence }
}

/// Cosine similarity; `None` when the dimensions differ or a vector is zero or empty.
pub fn cosine(a: &[f32], b: &[f32]) -> Option<f64> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    (na > 0.0 && nb > 0.0).then(|| (dot / (na.sqrt() * nb.sqrt())).clamp(-1.0, 1.0))
}

/// How the cascade treats missing embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ConvergenceMode {
    /// Decide by Jaccard alone and record `degraded_from`.
    #[default]
    Permissive,
    /// Never converge past the Jaccard step.
    Strict,
}

/// The step that decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DecidedBy {
    #[default]
    Char,
    Jaccard,
    Embedding,
}

impl DecidedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Char => "char",
            DecidedBy::Jaccard => "jaccard",
            DecidedBy::Embedding => "embedding",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "char" => Some(DecidedBy::Char),
            "jaccard" => Some(DecidedBy::Jaccard),
            "embedding" => Some(DecidedBy::Embedding),
            _ => None,
        }
    }
}

/// What the cascade found.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CompareOutcome {
    pub converged: bool,
    /// Character similarity under [`CHAR_DIVERGED`].
    pub diverged: bool,
    pub decided_by: DecidedBy,
    pub char_similarity: f64,
    pub jaccard: Option<JaccardScore>,
    pub embedding_cosine: Option<f64>,
    /// `"embedding"` when embeddings were unavailable and the cascade stopped short of that step.
    pub degraded_from: Option<String>,
    /// Why embeddings were unavailable.
    pub degraded_reason: String,
    /// Both vectors came from the cache.
    pub embedding_cached: bool,
}

/// What the text steps (1 and 2) found.
#[derive(Debug, Clone, PartialEq)]
pub enum TextSteps {
    /// Character similarity or Jaccard decided: the outcome is final.
    Decided(CompareOutcome),
    /// Undecided: the embedding step must decide (see [`embedding_step`]); `jaccard` is set.
    NeedEmbedding(CompareOutcome),
}

/// Steps 1 and 2 of the cascade: character similarity, then Jaccard with its confidence.
pub fn text_steps(previous: &str, current: &str) -> TextSteps {
    let char_similarity = char_similarity(previous, current);
    let mut out = CompareOutcome { char_similarity, ..CompareOutcome::default() };
    if char_similarity >= CHAR_CONVERGED - EPS {
        out.converged = true;
        return TextSteps::Decided(out);
    }
    if char_similarity < CHAR_DIVERGED - EPS {
        out.diverged = true;
        return TextSteps::Decided(out);
    }
    let j = jaccard(previous, current);
    out.jaccard = Some(j);
    out.decided_by = DecidedBy::Jaccard;
    if j.similarity >= JACCARD_CONVERGED - EPS && j.confidence >= JACCARD_MIN_CONFIDENCE - EPS {
        out.converged = true;
        return TextSteps::Decided(out);
    }
    TextSteps::NeedEmbedding(out)
}

/// Why the embedding step could not run: its text is the comparison's `degraded_reason`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbeddingUnavailable {
    /// No embedding backend is usable for the phase.
    #[error("no embedding backend: {0}")]
    NoBackend(StageError),
    /// The embedding backend's circuit breaker is open.
    #[error("embedding circuit breaker is open")]
    BreakerOpen,
    /// The embedding call failed (the backend's error).
    #[error("embedding call failed: {0}")]
    CallFailed(String),
    /// The backend returned another number of vectors than texts.
    #[error("embedding backend returned {returned} vectors for {asked} texts")]
    WrongCount { returned: usize, asked: usize },
    /// The two vectors differ in length (or one is empty).
    #[error("embedding vectors are not comparable ({0} and {1} dims)")]
    Incomparable(usize, usize),
}

/// Step 3 of the cascade on an undecided outcome of [`text_steps`]: `cosine` is the embedding
/// cosine with whether both vectors came from a cache, or why embeddings were unavailable (then
/// `mode` decides: permissive falls back to Jaccard alone, strict refuses to converge).
pub fn embedding_step(
    mut out: CompareOutcome,
    mode: ConvergenceMode,
    cosine: Result<(f64, bool), EmbeddingUnavailable>,
) -> CompareOutcome {
    match cosine {
        Ok((c, cached)) => {
            out.decided_by = DecidedBy::Embedding;
            out.embedding_cosine = Some(c);
            out.embedding_cached = cached;
            out.converged = c >= EMBEDDING_CONVERGED - EPS;
        }
        Err(reason) => {
            let jaccard = out.jaccard.map_or(0.0, |j| j.similarity);
            out.degraded_from = Some("embedding".into());
            out.degraded_reason = reason.to_string();
            out.converged = match mode {
                ConvergenceMode::Permissive => jaccard >= JACCARD_CONVERGED - EPS,
                ConvergenceMode::Strict => false,
            };
        }
    }
    out
}

/// Step 3 turned off (self-refine's `embedding_step = false`) on an undecided outcome of
/// [`text_steps`]: decided as when embeddings are unavailable (permissive: Jaccard `>= 0.95` alone;
/// strict: not converged), but by choice, so nothing is recorded as degraded and `decided_by` stays
/// [`DecidedBy::Jaccard`].
pub fn skip_embedding_step(mut out: CompareOutcome, mode: ConvergenceMode) -> CompareOutcome {
    let jaccard = out.jaccard.map_or(0.0, |j| j.similarity);
    out.decided_by = DecidedBy::Jaccard;
    out.converged = match mode {
        ConvergenceMode::Permissive => jaccard >= JACCARD_CONVERGED - EPS,
        ConvergenceMode::Strict => false,
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn char_similarity_exact_values() {
        assert_eq!(char_similarity("", ""), 1.0);
        assert_eq!(char_similarity("abc", "abc"), 1.0);
        assert_eq!(char_similarity("abc", ""), 0.0);
        assert!(close(char_similarity("kitten", "sitting"), 1.0 - 3.0 / 7.0));
        assert!(close(char_similarity("abcd", "abce"), 0.75));
        // One inserted character costs one edit, not a shift of everything after it.
        assert!(close(char_similarity("xhello world", "hello world"), 1.0 - 1.0 / 12.0));
        // Characters, not bytes.
        assert!(close(char_similarity("Grüße", "Grüsse"), 1.0 - 2.0 / 6.0));
    }

    #[test]
    fn long_texts_get_the_exact_distance() {
        let a = "ab".repeat(3000);
        let b = "ba".repeat(3000);
        // The positional count called these entirely different; one deletion and one insertion align them.
        assert!(close(char_similarity(&a, &b), 1.0 - 2.0 / 6000.0));
        let c = format!("{a}x");
        assert!(close(char_similarity(&a, &c), 1.0 - 1.0 / 6001.0));
    }

    /// About 20 KB of prose: distinct sentences, so no shift of the text lines up with itself.
    fn long_draft() -> String {
        let mut text = String::new();
        let mut i = 0;
        while text.len() < 20_000 {
            text.push_str(&format!(
                "Step {i}: the lesson explains how compound interest grows a deposit of {} euros over {} years. ",
                100 + 7 * i,
                1 + i % 30
            ));
            i += 1;
        }
        text
    }

    #[test]
    fn a_20kb_draft_with_an_early_insertion_is_scored_by_edit_distance() {
        let draft = long_draft();
        let inserted = "A short reminder of what interest is comes first. ";
        let revised = format!("{}{inserted}{}", &draft[..120], &draft[120..]);
        let longest = revised.chars().count() as f64;
        let expected = 1.0 - inserted.chars().count() as f64 / longest;
        let got = char_similarity(&draft, &revised);
        // One edit per inserted character, as in a short text (positional: nearly every char differs).
        assert!(close(got, expected), "{got} != {expected}");
        match text_steps(&draft, &revised) {
            TextSteps::Decided(o) => assert!(o.converged && !o.diverged && o.decided_by == DecidedBy::Char, "{o:?}"),
            TextSteps::NeedEmbedding(o) => panic!("a 50-character insertion in 20 KB is converged by char: {o:?}"),
        }
        // Edits spread all over the text are counted one by one too.
        let edited = draft.replace("lesson", "lessons");
        let changes = draft.matches("lesson").count() as f64;
        assert!(close(char_similarity(&draft, &edited), 1.0 - changes / edited.chars().count() as f64));
    }
    #[test]
    fn tokens_are_normalised() {
        let t = tokens("The Cat, the cat!  It's a DOG-friendly world; I x 42.");
        let got: Vec<&str> = t.iter().map(String::as_str).collect();
        assert_eq!(got, vec!["42", "cat", "dog", "friendly", "world"]);
    }

    #[test]
    fn portuguese_stop_words_are_ignored() {
        let t = tokens("O gato está na casa da avó, e não é muito grande.");
        let got: Vec<&str> = t.iter().map(String::as_str).collect();
        assert_eq!(got, vec!["avó", "casa", "gato", "grande"]);
        // The same content words around different function words: identical sets.
        let j = jaccard("O gato dorme na casa com a avó", "Um gato dorme numa casa pela avó");
        assert!(close(j.similarity, 1.0), "{j:?}");
        // English ones still go, and content words of either language stay.
        let j = jaccard("the cat sleeps in the house", "o cat sleeps em uma house");
        assert!(close(j.similarity, 1.0), "{j:?}");
        assert!(is_stop_word("não") && is_stop_word("the") && !is_stop_word("era") && !is_stop_word("gato"));
    }

    #[test]
    fn jaccard_exact_values_and_confidence() {
        let j = jaccard("red green blue", "green blue yellow");
        assert!(close(j.similarity, 0.5));
        assert!(close(j.confidence, 3.0 / 50.0));
        assert_eq!(jaccard("the a", "of"), JaccardScore { similarity: 1.0, confidence: 0.5 });
        assert_eq!(jaccard("the", "word"), JaccardScore { similarity: 0.0, confidence: 0.7 });
        let big: String = (0..100).map(|i| format!("w{i} ")).collect();
        assert!(close(jaccard(&big, &big).confidence, 0.95));
        let thirty: String = (0..30).map(|i| format!("w{i} ")).collect();
        assert!(close(jaccard(&thirty, &thirty).confidence, 0.6));
    }

    #[test]
    fn cosine_values() {
        assert!(close(cosine(&[1.0, 0.0], &[1.0, 0.0]).unwrap(), 1.0));
        assert!(close(cosine(&[1.0, 0.0], &[0.0, 2.0]).unwrap(), 0.0));
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), None);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), None);
    }

    #[test]
    fn embedding_step_decides_on_the_cosine_or_by_mode() {
        let TextSteps::NeedEmbedding(out) = text_steps("red green blue", "green blue yellow") else {
            panic!("Jaccard 0.5 leaves the decision to embeddings");
        };
        let o = embedding_step(out.clone(), ConvergenceMode::Strict, Ok((EMBEDDING_CONVERGED, true)));
        assert!(o.converged && o.embedding_cached && o.decided_by == DecidedBy::Embedding, "{o:?}");
        let o = embedding_step(out.clone(), ConvergenceMode::Permissive, Ok((0.5, false)));
        assert!(!o.converged && o.degraded_from.is_none(), "{o:?}");
        let o = embedding_step(out, ConvergenceMode::Permissive, Err(EmbeddingUnavailable::BreakerOpen));
        assert!(
            !o.converged
                && o.degraded_from.as_deref() == Some("embedding")
                && o.degraded_reason == "embedding circuit breaker is open"
        );
    }

    #[test]
    fn a_skipped_embedding_step_decides_by_jaccard_without_degrading() {
        // Same tokens, different case: Jaccard 1 but too few tokens for its confidence.
        let TextSteps::NeedEmbedding(out) = text_steps("Red green blue", "red Green Blue") else {
            panic!("low confidence leaves the decision to embeddings");
        };
        let o = skip_embedding_step(out.clone(), ConvergenceMode::Permissive);
        assert!(o.converged && o.decided_by == DecidedBy::Jaccard && o.degraded_from.is_none(), "{o:?}");
        assert!(o.embedding_cosine.is_none() && o.degraded_reason.is_empty());
        let o = skip_embedding_step(out, ConvergenceMode::Strict);
        assert!(!o.converged && o.degraded_from.is_none(), "{o:?}");
    }
}
