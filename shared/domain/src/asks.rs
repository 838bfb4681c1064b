//! Whether an issue asks for a structural change: removing, merging, condensing or restructuring
//! content. The patcher refuses a reply that drops one of the section's headings, and the delta
//! judge holds a drop of headings, list items or code blocks against a fix, only when no issue of
//! the task asks for one.
//!
//! Detection reads the issue's description and fix instruction (the judge's and the arbiter's
//! words; the issue carries no structured action) and looks for a word that names such a change,
//! in English or Portuguese (the two languages the prompts handle): a word that starts with one of
//! [`RESTRUCTURE_STEMS`] ("remove", "removing", "merge", "redundant", "condense", "restructure", "split",
//! "turn the list into prose", "remover", "mesclar", "reestruturar", "redundante"...). A word
//! negated by one of the three words before it ("do not remove", "without merging", "não
//! remover") does not count. Stems are chosen to avoid everyday words (no "exclu", which would
//! take "exclusive"; no "omit", which in a description usually means content is missing).
//!
//! Two more asks read the same way (issue 59): whether an issue asks for content the section lacks
//! ([`asks_for_content`]: a completeness issue, "add", "expand", "missing"...), which lets an edit
//! grow the section, and whether it asks about a heading ([`asks_about_heading`]), which lets an
//! edit reword it.

use unicode_segmentation::UnicodeSegmentation;

use crate::document::JudgeIssue;

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
    first_asking(text, |w| RESTRUCTURE_STEMS.iter().any(|s| w.starts_with(s)))
}

/// The first word of `text` (lower case) for which `asks` holds and that is not negated by one of
/// the [`NEGATION_REACH`] words before it.
fn first_asking(text: &str, asks: impl Fn(&str) -> bool) -> Option<String> {
    let words: Vec<String> = text.unicode_words().map(|w| w.to_lowercase().replace('’', "'")).collect();
    words.iter().enumerate().find_map(|(i, w)| {
        let negated = words[i.saturating_sub(NEGATION_REACH)..i].iter().any(|p| NEGATIONS.contains(&p.as_str()));
        (asks(w) && !negated).then(|| w.clone())
    })
}

/// The word in an issue's description or fix instruction that asks for a structural change, if
/// any.
pub fn asks_to_restructure(description: &str, fix_instruction: &str) -> Option<String> {
    restructuring_word(fix_instruction).or_else(|| restructuring_word(description))
}

/// The criterion whose issues ask for content the section lacks (the default criteria's name).
pub const COMPLETENESS: &str = "completeness";

/// Word beginnings that ask for more content (lower case): "add", "expand", "missing",
/// "elaborate", "incomplete", "flesh out", "lacks", "extend", "deepen", "adicionar",
/// "acrescentar", "falta", "desenvolver", "aprofundar"...
pub const EXPANSION_STEMS: &[&str] = &[
    // English
    "expand",
    "elaborat",
    "missing",
    "incomplet",
    "flesh",
    "lack",
    "extend",
    "enlarg",
    "deepen",
    "broaden",
    "underdevelop",
    // Portuguese
    "adicion",
    "acrescent",
    "expandir",
    "expanda",
    "falt",
    "desenvolv",
    "aprofund",
    "ampli",
];

/// Whole words that ask for more content ("add" alone: the stem would take "address").
pub const EXPANSION_WORDS: &[&str] = &["add", "adds", "adding", "added", "stub", "stubs"];

/// The first word of `text` that asks for more content, not negated.
pub fn expansion_word(text: &str) -> Option<String> {
    first_asking(text, |w| EXPANSION_WORDS.contains(&w) || EXPANSION_STEMS.iter().any(|s| w.starts_with(s)))
}

/// Why an issue asks for content the section does not have, if it does: its criterion is
/// [`COMPLETENESS`], or its fix instruction or description asks to add, expand or elaborate, or
/// says something is missing (see [`expansion_word`]). Such an issue may grow the section: the
/// expander is given a length to grow to, and the delta judge lets it grow that far.
pub fn asks_for_content(issue: &JudgeIssue) -> Option<String> {
    if issue.criterion.trim().eq_ignore_ascii_case(COMPLETENESS) {
        return Some(COMPLETENESS.to_string());
    }
    expansion_word(&issue.fix_instruction).or_else(|| expansion_word(&issue.description))
}

/// Word beginnings that name a heading (lower case): "heading", "headline", "title", "subtitle",
/// "header", "título", "cabeçalho".
pub const HEADING_STEMS: &[&str] =
    &["heading", "headline", "header", "subheading", "title", "subtitle", "títul", "titul", "subtítul", "cabeçalh"];

/// Whether an issue asks for a change to `heading` (its text without the `#` markers): the issue's
/// location quotes the heading, or the issue speaks of a heading or title, not
/// negated ("do not change the title" does not ask). A heading the issue asks about may be
/// reworded.
pub fn asks_about_heading(issue: &JudgeIssue, heading: &str) -> bool {
    let heading = heading.trim().to_lowercase();
    let quotes = !heading.is_empty() && issue.location.to_lowercase().contains(&heading);
    let names = |t: &str| first_asking(t, |w| HEADING_STEMS.iter().any(|s| w.starts_with(s))).is_some();
    quotes || names(&issue.fix_instruction) || names(&issue.description)
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

    fn issue(criterion: &str, description: &str, fix: &str, location: &str) -> JudgeIssue {
        JudgeIssue {
            id: "i".into(),
            criterion: criterion.into(),
            severity: crate::Severity::Critical,
            section_id: "s".into(),
            description: description.into(),
            fix_instruction: fix.into(),
            location: location.into(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    #[test]
    fn requests_for_more_content_are_found() {
        for (criterion, description, fix, why) in [
            ("completeness", "The section is a stub.", "Cover the four stages.", "completeness"),
            ("Completeness", "", "", "completeness"),
            ("clarity_readability", "The formula step is missing.", "Show it.", "missing"),
            ("engagement_examples", "No example.", "Add a worked example with numbers.", "add"),
            ("learning_objective_alignment", "Too thin.", "Expand the section to cover every objective.", "expand"),
            ("learning_objective_alignment", "Seção incompleta.", "Acrescente um exemplo.", "acrescente"),
        ] {
            let i = issue(criterion, description, fix, "");
            assert_eq!(asks_for_content(&i).as_deref(), Some(why), "{description} / {fix}");
        }
        for (description, fix) in [
            ("The date is wrong.", "Address the error: the year is 1998."),
            ("A stubborn typo.", "Correct the spelling."),
            ("Too long.", "Do not add anything; shorten the second sentence."),
        ] {
            assert_eq!(asks_for_content(&issue("factual_accuracy", description, fix, "")), None, "{fix}");
        }
    }

    #[test]
    fn requests_about_a_heading_are_found() {
        let asks = |d: &str, f: &str, l: &str| asks_about_heading(&issue("clarity_readability", d, f, l), "Ordr");
        assert!(asks("A typo.", "Fix the typo in the heading.", ""));
        assert!(asks("The section title is misspelled.", "Correct it.", ""));
        assert!(asks("A typo.", "Correct it.", "## Ordr"));
        assert!(asks("O título tem um erro.", "Corrija.", ""));
        assert!(!asks("A typo in the second sentence.", "Correct the spelling.", "Awarenes comes first."));
        assert!(!asks("A typo.", "Fix the sentence but do not change the heading.", ""));
    }
}
