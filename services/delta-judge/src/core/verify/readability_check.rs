//! The readability check (no move away from the targets, a revised sentence judged against the one
//! it revises), the readability report, and the check of a text to measure.

use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::verify::ReadabilityReport;
use assay_domain::{StageError, Violations};

use super::heuristics::{Checked, checked};
use super::structure::Restructuring;
use crate::core::readability::{MAX_SENTENCE_WORDS, Readability, TARGET_AVERAGE_WORDS};

/// Readability of `after` does not move away from the targets: no new sentence over 25 words (one
/// that is neither in `before` nor a revision of one of its sentences, see [`revised_too_far`]),
/// the average sentence length does not leave the 15-20 band upwards (<= 20 before, > 20 after),
/// the text does not turn dense. An average that falls under 15 (from 15 or more) is a note, not a
/// rejection.
///
/// When an issue of the task asked for a structural change (`asked`: merge, condense, remove,
/// split, restructure...), the change it asked for may move these figures (two sentences merged
/// into a long one, paragraphs joined): the moves are reported as a note naming the issue, not
/// held against the fix, which the issue's own YES/NO check verifies.
///
/// `grown`: the text after is more than twice as long as the text before (an expanded stub: only
/// a task whose own bounds let the section grow gets that far). It is new text, with no sentence
/// of the old one to move away from: its long sentences are flagged in a note, and it is
/// held to the average and density targets.
pub fn readability_check(
    before: &Readability,
    after: &Readability,
    asked: Option<&Restructuring>,
    grown: bool,
) -> Checked {
    let figures = format!(
        "average {:.1} words a sentence (was {:.1}), longest {}, paragraph break ratio {:.2}",
        after.average_sentence_words,
        before.average_sentence_words,
        after.max_sentence_words,
        after.paragraph_break_ratio
    );
    let (low, high) = TARGET_AVERAGE_WORDS;
    let mut away = Vec::new();
    let mut flagged = Vec::new();
    let long: Vec<(&str, usize)> =
        after.all_sentences.iter().filter(|(_, w)| *w > MAX_SENTENCE_WORDS).map(|(s, w)| (s.as_str(), *w)).collect();
    if grown {
        flagged.extend(long.iter().map(|(s, w)| format!("{w} words: {:?}", preview(s, 60))));
    } else {
        // The same sentence, else a revision of an old one judged against it; first the sentences
        // kept as they were, so that an unchanged one is never taken for the revision of another.
        let mut old: Vec<(&str, usize)> = before.all_sentences.iter().map(|(s, w)| (s.as_str(), *w)).collect();
        let mut changed = Vec::new();
        for (s, w) in long {
            match old.iter().position(|(o, _)| *o == s) {
                Some(i) => {
                    old.swap_remove(i);
                }
                None => changed.push((s, w)),
            }
        }
        for (s, w) in changed {
            match revision_of(s, &old) {
                Some(i) => {
                    let (_, was) = old.swap_remove(i);
                    if let Some(why) = revised_too_far(was, w, s) {
                        away.push(why);
                    }
                }
                None => away
                    .push(format!("a new sentence over {MAX_SENTENCE_WORDS} words ({w} words: {:?})", preview(s, 60))),
            }
        }
    }
    if before.average_sentence_words <= high && after.average_sentence_words > high {
        away.push(format!(
            "the average sentence length left the {low}-{high} word band upwards ({:.1} -> {:.1})",
            before.average_sentence_words, after.average_sentence_words
        ));
    }
    if !before.dense_text && after.dense_text {
        away.push(format!(
            "the text turned dense (paragraph break ratio {:.2} -> {:.2})",
            before.paragraph_break_ratio, after.paragraph_break_ratio
        ));
    }
    if !away.is_empty() {
        if let Some(a) = asked {
            let what = format!(
                "readability moved as issue {} asked ({:?}): {} ({figures})",
                a.issue_id,
                a.word,
                away.join("; ")
            );
            return Checked { note: Some(what.clone()), ..checked("readability", true, what, None) };
        }
        let why = format!("readability regressed: {} ({figures})", away.join("; "));
        return checked("readability", false, why.clone(), Some(why));
    }
    let mut c = if after.within_targets {
        checked("readability", true, format!("within targets ({figures})"), None)
    } else {
        checked("readability", true, format!("no move away from the targets ({figures})"), None)
    };
    if !flagged.is_empty() {
        c.note = Some(format!(
            "new text (grown past twice its length) with {} sentence(s) over {MAX_SENTENCE_WORDS} words, flagged, not \
             held against it: {}",
            flagged.len(),
            flagged.join("; ")
        ));
    } else if after.sentences > 0 && before.average_sentence_words >= low && after.average_sentence_words < low {
        c.note = Some(format!(
            "shorter sentences: the average fell from {:.1} to {:.1} words, under the {low}-{high} word target \
             (a note, not a regression)",
            before.average_sentence_words, after.average_sentence_words
        ));
    }
    c
}

/// How alike (exact character similarity) a changed sentence must be to an old one to count as
/// its revision rather than a new sentence.
const REVISION_SIMILARITY: f64 = 0.6;
/// Words a revised sentence may have beyond the sentence it revises: what a fix adds (a unit, a
/// qualifier, a corrected figure written out) ...
pub const REVISION_EXTRA_WORDS: usize = 5;
/// ... or this share of the old sentence's words, whichever is more.
pub const REVISION_EXTRA_SHARE: f64 = 0.2;

/// The index of the old sentence `new` revises: the most alike of `old` at [`REVISION_SIMILARITY`]
/// or more, whatever its length.
fn revision_of(new: &str, old: &[(&str, usize)]) -> Option<usize> {
    old.iter()
        .enumerate()
        .map(|(i, (o, _))| (i, assay_domain::similarity::char_similarity(o, new)))
        .filter(|(_, sim)| *sim >= REVISION_SIMILARITY)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

/// Why a sentence revised to `now` words (over 25) from one of `was` words is a move away from the
/// targets, if it is: it grew by more than a fix needs (more than [`REVISION_EXTRA_WORDS`] or
/// [`REVISION_EXTRA_SHARE`] of the old sentence, whichever is more). A revision no longer than
/// that (a shortened sentence, a corrected figure, a word added) is not.
fn revised_too_far(was: usize, now: usize, sentence: &str) -> Option<String> {
    let allowed = was + REVISION_EXTRA_WORDS.max((was as f64 * REVISION_EXTRA_SHARE).ceil() as usize);
    (now > allowed).then(|| {
        format!(
            "a sentence revised past {MAX_SENTENCE_WORDS} words grew by more than a fix needs ({was} -> {now} words, at \
             most {allowed}: {:?})",
            preview(sentence, 60)
        )
    })
}

/// The first `chars` characters of `text`, with an ellipsis when cut.
fn preview(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().count() > chars {
        out.push('…');
    }
    out
}

pub fn report(r: &Readability) -> ReadabilityReport {
    ReadabilityReport {
        average_sentence_words: r.average_sentence_words,
        max_sentence_words: r.max_sentence_words as u32,
        paragraph_break_ratio: r.paragraph_break_ratio,
        sentences: r.sentences as u32,
        paragraphs: r.paragraphs as u32,
        long_sentences: r.long_sentences.clone(),
        dense_text: r.dense_text,
        within_targets: r.within_targets,
    }
}

/// A text readability can measure: not blank, within [`MAX_TEXT_BYTES`].
pub fn readability_input(text: &str) -> Result<(), StageError> {
    let mut v = Violations::new();
    if text.trim().is_empty() {
        v.push("text", "must not be blank: there is nothing to measure");
    }
    if text.len() > MAX_TEXT_BYTES {
        v.push("text", format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()));
    }
    v.into_result()
}
