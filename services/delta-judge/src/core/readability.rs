//! Language-agnostic readability: sentences by the Unicode
//! text segmentation rules (UAX #29), words by [`assay_domain::text::word_count`] (UAX #29 words,
//! Han and Hiragana counted by characters at their script's average word length), so German,
//! Russian, Chinese, Japanese or any other script is measured the same way; no English
//! tokenisation or syllable counting.
//!
//! - A paragraph is a block of text between blank lines.
//! - Paragraph break ratio = paragraphs / sentences: one break per 12.5 sentences is the floor
//!   (0.08); below it the text is flagged dense.
//! - Targets: average sentence length 15 to 20 words, no sentence over 25 words.

use assay_domain::text::word_count;
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
    /// Every sentence, trimmed, with its words, in order.
    pub all_sentences: Vec<(String, usize)>,
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
    let mut all_sentences = Vec::new();
    for p in &paragraphs {
        // Line breaks inside a paragraph (lists, headings) end a sentence too.
        for line in p.lines() {
            for sentence in line.unicode_sentences() {
                let words = word_count(sentence);
                if words == 0 {
                    continue;
                }
                if words > MAX_SENTENCE_WORDS {
                    long_sentences.push(sentence.trim().to_string());
                }
                words_per_sentence.push(words);
                all_sentences.push((sentence.trim().to_string(), words));
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
        all_sentences,
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

    /// Issue 59, point 7: Chinese and Japanese sentences are measured in words, not characters
    /// (UAX #29 alone made every ideograph a word: the 21-character sentence below was 21 "words").
    #[test]
    fn chinese_and_japanese_are_counted_in_words_beside_english_german_and_russian() {
        // The same three sentences in five languages: word counts of one order of magnitude.
        let en =
            "Compound interest pays interest on interest. The balance grows faster every year.\n\nStart saving early.";
        let de =
            "Zinseszins zahlt Zinsen auf Zinsen. Das Guthaben wächst jedes Jahr schneller.\n\nFang früh an zu sparen.";
        let ru = "Сложный процент начисляет проценты на проценты. Баланс растёт быстрее с каждым годом.\n\nНачните копить рано.";
        let zh = "复利就是对利息再计算利息。余额每年都增长得更快。\n\n尽早开始储蓄。";
        let ja = "複利とは利息にも利息がつくことです。残高は毎年より速く増えます。\n\n早く貯金を始めましょう。";
        let counts: Vec<(usize, usize)> = [en, de, ru, zh, ja]
            .iter()
            .map(|t| {
                let m = measure(t);
                assert_eq!((m.sentences, m.paragraphs), (3, 2), "{t}");
                (m.max_sentence_words, m.all_sentences.iter().map(|s| s.1).sum())
            })
            .collect();
        assert_eq!(counts[0], (6, 15), "en");
        assert_eq!(counts[1], (6, 16), "de");
        assert_eq!(counts[2], (6, 15), "ru");
        // 复利就是对利息再计算利息 is 12 characters, 8 words at 1.5 a word (复利 / 就是 / 对 / 利息 /
        // 再 / 计算 / 利息: 7); the three sentences have 16 or 17 words, counted 19.
        assert_eq!(counts[3], (8, 19), "zh");
        // 複利 / とは / 利息 / に / も / 利息 / が / つく / こと / です: 10 words, counted 10 (six Han,
        // eleven Hiragana); the three sentences have 22 words, counted 24.
        assert_eq!(counts[4], (10, 24), "ja");
        // A Chinese sentence of 21 characters is short (14 words), not 21 words long; one of 45
        // characters (30 words) is long.
        let short = "我们每个月把一部分工资存进银行的储蓄账户里。";
        assert_eq!(short.unicode_words().count(), 21);
        let m = measure(short);
        assert_eq!((m.max_sentence_words, m.long_sentences.len()), (14, 0));
        let long = format!("{}。", "储蓄账户".repeat(11).chars().take(45).collect::<String>());
        assert_eq!(measure(&long).long_sentences, vec![long.clone()]);
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
