//! Language-agnostic readability (REFERENCE section 7, FR-035..FR-037): sentences and words by the
//! Unicode text segmentation rules (UAX #29), so German, Russian or any other script is measured the
//! same way; no English tokenisation or syllable counting.
//!
//! - A paragraph is a block of text between blank lines.
//! - Paragraph break ratio = paragraphs / sentences: one break per 12.5 sentences is the floor
//!   (0.08); below it the text is flagged dense.
//! - Targets: average sentence length 15 to 20 words, no sentence over 25 words.

use unicode_segmentation::UnicodeSegmentation;

/// Longest sentence within the targets, in words.
pub const MAX_SENTENCE_WORDS: usize = 25;
/// Average sentence length targets, in words.
pub const TARGET_AVERAGE_WORDS: (f64, f64) = (15.0, 20.0);
/// Least paragraph break ratio before a text counts as dense.
pub const MIN_PARAGRAPH_BREAK_RATIO: f64 = 0.08;

/// Readability figures of a text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Readability {
    pub sentences: usize,
    pub paragraphs: usize,
    pub average_sentence_words: f64,
    pub max_sentence_words: usize,
    pub paragraph_break_ratio: f64,
    /// Sentences over [`MAX_SENTENCE_WORDS`], trimmed.
    pub long_sentences: Vec<String>,
    pub dense_text: bool,
    pub within_targets: bool,
}

/// The paragraphs of a text: blocks separated by lines that are blank.
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !current.trim().is_empty() {
                out.push(std::mem::take(&mut current));
            }
            current.clear();
        } else {
            if !current.is_empty() {
                current.push('\n');
            }
            current.push_str(line);
        }
    }
    if !current.trim().is_empty() {
        out.push(current);
    }
    out
}

/// Measure a text.
pub fn measure(text: &str) -> Readability {
    let paragraphs = paragraphs(text);
    let mut words_per_sentence = Vec::new();
    let mut long_sentences = Vec::new();
    for p in &paragraphs {
        // Line breaks inside a paragraph (lists, headings) end a sentence too.
        for line in p.lines() {
            for sentence in line.unicode_sentences() {
                let words = sentence.unicode_words().count();
                if words == 0 {
                    continue;
                }
                if words > MAX_SENTENCE_WORDS {
                    long_sentences.push(sentence.trim().to_string());
                }
                words_per_sentence.push(words);
            }
        }
    }
    let sentences = words_per_sentence.len();
    let total: usize = words_per_sentence.iter().sum();
    let average_sentence_words = if sentences == 0 { 0.0 } else { total as f64 / sentences as f64 };
    let max_sentence_words = words_per_sentence.iter().copied().max().unwrap_or(0);
    let paragraph_break_ratio = if sentences == 0 { 0.0 } else { paragraphs.len() as f64 / sentences as f64 };
    let dense_text = sentences > 0 && paragraph_break_ratio < MIN_PARAGRAPH_BREAK_RATIO;
    let within_targets = sentences > 0
        && (TARGET_AVERAGE_WORDS.0..=TARGET_AVERAGE_WORDS.1).contains(&average_sentence_words)
        && max_sentence_words <= MAX_SENTENCE_WORDS
        && !dense_text;
    Readability {
        sentences,
        paragraphs: paragraphs.len(),
        average_sentence_words,
        max_sentence_words,
        paragraph_break_ratio,
        long_sentences,
        dense_text,
        within_targets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn english_german_and_russian_are_counted_alike() {
        let en = "The cat sat on the mat. It was warm!\n\nThen it slept for a long time.";
        let de = "Die Katze saß auf der Matte. Es war warm!\n\nDann schlief sie für eine lange Zeit.";
        let ru = "Кошка сидела на коврике. Было тепло!\n\nПотом она долго спала.";
        let m = measure(en);
        assert_eq!((m.sentences, m.paragraphs, m.max_sentence_words), (3, 2, 7));
        assert!((m.average_sentence_words - 16.0 / 3.0).abs() < 1e-12);
        let m = measure(de);
        assert_eq!((m.sentences, m.paragraphs, m.max_sentence_words), (3, 2, 7));
        assert!((m.average_sentence_words - 16.0 / 3.0).abs() < 1e-12);
        let m = measure(ru);
        assert_eq!((m.sentences, m.paragraphs, m.max_sentence_words), (3, 2, 4));
        assert!((m.average_sentence_words - 10.0 / 3.0).abs() < 1e-12);
        assert!((m.paragraph_break_ratio - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn long_sentences_and_dense_text_are_flagged() {
        let long = format!("Word {}.", vec!["word"; 29].join(" "));
        let m = measure(&format!("Short one. {long}"));
        assert_eq!(m.max_sentence_words, 30);
        assert_eq!(m.long_sentences.len(), 1);
        assert!(!m.within_targets);
        // Thirteen sentences in one paragraph: 1/13 < 0.08.
        let dense = "Seventeen words make this sentence sit right inside the target band for the average length here. "
            .repeat(13);
        let m = measure(&dense);
        assert_eq!(m.sentences, 13);
        assert!(m.dense_text && !m.within_targets);
        // Twelve: 1/12 >= 0.08, average 16 words, within targets.
        let m = measure(
            &"Seventeen words make this sentence sit right inside the target band for the average length here. "
                .repeat(12),
        );
        assert!(!m.dense_text, "{m:?}");
        assert!(m.within_targets, "{m:?}");
    }

    #[test]
    fn empty_text_has_no_sentences() {
        let m = measure("  \n\n ");
        assert_eq!(m, Readability::default());
    }
}
