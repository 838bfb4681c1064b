//! Whether an issue asks for a structural change: removing, merging, condensing or restructuring
//! content. The patcher refuses a reply that drops one of the section's headings, and the delta
//! judge holds a drop of headings, list items or code blocks against a fix, only when no issue of
//! the task asks for one.
//!
//! Detection reads the description and fix instruction (the judge's and the arbiter's
//! words; the issue carries no structured action) and looks for a word that names such a change,
//! in English or Portuguese (the seed's two languages): a word that starts with one of
//! [`RESTRUCTURE_STEMS`] ("remove", "removing", "merge", "redundant", "condense", "restructure", "split",
//! "turn the list into prose", "remover", "mesclar", "reestruturar", "redundante"...). A word
//! negated by one of the three words before it ("do not remove", "without merging", "não
//! remover") does not count. Stems are chosen to avoid everyday words (no "exclu", which would
//! take "exclusive"; no "omit", which in a description usually means content is missing).

use unicode_segmentation::UnicodeSegmentation;

/// Word beginnings that name a removal, merge or restructuring (lower case).
pub const RESTRUCTURE_STEMS: &[&str] = &[
    // English
    "remov",
    "delet",
    "drop",
    "cut",
    "elimin",
    "trim",
    "merg",
    "combin",
    "consolid",
    "restructur",
    "reorgani",
    "condens",
    "collaps",
    "redundan",
    "duplic",
    "dedup",
    "repetiti",
    "shorten",
    "overlap",
    "prose",
    "split",
    // Portuguese
    "apag",
    "retir",
    "cort",
    "excluir",
    "exclua",
    "exclui",
    "mescl",
    "fundir",
    "unific",
    "juntar",
    "junte",
    "reestrutur",
    "enxug",
    "repetid",
    "repetiç",
    "sobrepos",
    "prosa",
];

/// Words that negate a following request ("do not remove", "sem remover").
const NEGATIONS: &[&str] = &[
    "not",
    "no",
    "never",
    "don't",
    "dont",
    "doesn't",
    "shouldn't",
    "without",
    "keep",
    "não",
    "nao",
    "nunca",
    "sem",
    "nem",
    "mantenha",
    "manter",
];

/// How many words before a stem a negation reaches.
const NEGATION_REACH: usize = 3;

/// The first word of `text` that asks for a removal, merge or restructuring, not negated.
pub fn restructuring_word(text: &str) -> Option<String> {
    let words: Vec<String> = text.unicode_words().map(|w| w.to_lowercase().replace('’', "'")).collect();
    words.iter().enumerate().find_map(|(i, w)| {
        let asks = RESTRUCTURE_STEMS.iter().any(|s| w.starts_with(s));
        let negated = words[i.saturating_sub(NEGATION_REACH)..i].iter().any(|p| NEGATIONS.contains(&p.as_str()));
        (asks && !negated).then(|| w.clone())
    })
}

/// The word in an issue's description or fix instruction that asks for a structural change, if
/// any.
pub fn asks_to_restructure(description: &str, fix_instruction: &str) -> Option<String> {
    restructuring_word(fix_instruction).or_else(|| restructuring_word(description))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removal_merge_and_restructure_requests_are_found() {
        for (text, word) in [
            ("Remove the redundant list of tools.", "remove"),
            ("The two lists overlap; merge them into one.", "overlap"),
            ("Turn the bullet points into prose.", "prose"),
            ("Condense the steps.", "condense"),
            ("Restructure the section around the example.", "restructure"),
            ("Remova a lista redundante.", "remova"),
            ("Mesclar as duas listas.", "mesclar"),
            ("Reestruture a seção.", "reestruture"),
        ] {
            assert_eq!(restructuring_word(text).as_deref(), Some(word), "{text}");
        }
    }

    #[test]
    fn other_instructions_and_negated_requests_are_not() {
        for text in [
            "Give the stages in order: awareness, interest, desire, action.",
            "Add a worked example with numbers.",
            "Do not remove the list; reword its second item.",
            "Fix the date without dropping any step.",
            "The explanation is exclusively about files.",
            "Não remova a lista.",
            "",
        ] {
            assert_eq!(restructuring_word(text), None, "{text}");
        }
        assert_eq!(asks_to_restructure("The list repeats the intro.", "Delete it.").as_deref(), Some("delete"));
        assert_eq!(asks_to_restructure("A redundant list.", "Say it once.").as_deref(), Some("redundant"));
        assert_eq!(asks_to_restructure("Vague.", "Say what it returns."), None);
    }
}
