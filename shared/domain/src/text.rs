//! Words of a text in any script (readability is language agnostic), for readability and edit lengths.
//!
//! Words are the word segments of the Unicode text segmentation rules (UAX #29, the
//! `unicode-segmentation` crate), with one exception: UAX #29 does not segment scripts written
//! without spaces, and gives every Han ideograph and every Hiragana character a segment of its own,
//! so a Chinese or Japanese sentence would count one "word" a character (two to three times as many
//! as it has). Those characters are counted by their script (ICU's Script property,
//! `icu_properties`) and converted to words at the average word length of the script:
//! [`HAN_CHARS_PER_WORD`] for Han (Chinese words average 1.5 to 1.7 characters, Japanese kanji
//! compounds are mostly two), [`HIRAGANA_CHARS_PER_WORD`] for Hiragana (particles of one
//! character, verb endings of two or three). Katakana runs, which UAX #29 already keeps together,
//! and Hangul words, which are separated by spaces, count one word each, as in any other script.
//!
//! The word targets of readability (15-20 words a sentence, at most 25) then mean about 22-30 and
//! 37 characters of Chinese, close to the sentence lengths plain-language guides for Chinese and
//! Japanese recommend.

use icu_properties::CodePointMapData;
use icu_properties::props::Script;
use unicode_segmentation::UnicodeSegmentation;

/// Han characters that make one word, on average.
pub const HAN_CHARS_PER_WORD: f64 = 1.5;
/// Hiragana characters that make one word, on average.
pub const HIRAGANA_CHARS_PER_WORD: f64 = 2.0;

/// Words of `text`: UAX #29 word segments, with Han and Hiragana counted by characters (see the
/// module documentation). Punctuation and spaces are not words.
pub fn word_count(text: &str) -> usize {
    let scripts = CodePointMapData::<Script>::new();
    let (mut words, mut han, mut hiragana) = (0usize, 0usize, 0usize);
    for segment in text.unicode_words() {
        // A segment takes the script of its first letter: UAX #29 never joins Han or Hiragana to
        // another character, so a Han or Hiragana segment is that one character (with any
        // combining mark or iteration sign after it).
        match segment.chars().find(|c| c.is_alphanumeric()).map(|c| scripts.get(c)) {
            Some(Script::Han) => han += 1,
            Some(Script::Hiragana) => hiragana += 1,
            Some(_) => words += 1,
            None => {}
        }
    }
    let cjk = han as f64 / HAN_CHARS_PER_WORD + hiragana as f64 / HIRAGANA_CHARS_PER_WORD;
    // At least one word for any CJK text at all.
    let cjk = if han + hiragana > 0 { (cjk.round() as usize).max(1) } else { 0 };
    words + cjk
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaced_scripts_count_their_words() {
        assert_eq!(word_count("The cat sat on the mat."), 6);
        assert_eq!(word_count("Die Katze saß auf der Matte."), 6);
        assert_eq!(word_count("Кошка сидела на коврике."), 4);
        assert_eq!(word_count("It costs 1,250.50 dollars, doesn't it?"), 6);
        assert_eq!(word_count("한국어 문장은 띄어쓰기로 단어를 나눕니다."), 5);
        assert_eq!(word_count(" ... — !"), 0);
        assert_eq!(word_count(""), 0);
    }

    /// UAX #29 alone makes every ideograph and every Hiragana character a word.
    #[test]
    fn chinese_and_japanese_count_words_not_characters() {
        // 我们 / 今天 / 去 / 公园 / 散步: five words, nine characters.
        let zh = "我们今天去公园散步。";
        assert_eq!(zh.unicode_words().count(), 9);
        assert_eq!(word_count(zh), 6);
        // 私 / は / 学校 / に / 行き / ます: six words, ten characters (four Han, five Hiragana).
        let ja = "私は学校に行きます。";
        assert_eq!(ja.unicode_words().count(), 9);
        assert_eq!(word_count(ja), 5);
        // A Katakana loanword is one word, as UAX #29 keeps it.
        assert_eq!(word_count("コンピューター"), 1);
        // Mixed scripts: Latin words count one each, the Han run by its characters.
        assert_eq!(word_count("我们用 Python 编程。"), 1 + 3);
        assert_eq!(word_count("水"), 1);
    }
}
