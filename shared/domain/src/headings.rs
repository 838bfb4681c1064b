//! Markdown headings of a section and whether an edit kept them (the patcher preserves
//! what it was not asked to change). Shared by the patcher and section expander, which refuse a
//! reply that drops a heading, and by the delta judge, whose structure check rejects the drop.
//!
//! A heading of the text before is kept when the text after has a heading with the same text
//! (ignoring case and spacing, at any level), or, failing that, when it was reworded: the heading
//! at the same place in the list of headings has the same level and is a close edit of the old
//! one ([`REWORD_SIMILARITY`], "## Ordr" -> "## Order"), or an issue of the edit asks about the
//! heading ([`crate::asks::asks_about_heading`]: "rename the title", a location quoting it).

use crate::asks::asks_about_heading;
use crate::document::JudgeIssue;
use crate::similarity::char_similarity;

/// Least character similarity (lower case) of a reworded heading to the heading it replaces.
pub const REWORD_SIMILARITY: f64 = 0.6;

/// One ATX heading (`#` to `######`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heading {
    /// 1 to 6.
    pub level: usize,
    /// The text, markers (opening and closing `#`) and surrounding space removed.
    pub text: String,
}

impl std::fmt::Display for Heading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", "#".repeat(self.level), self.text)
    }
}

/// The opening marker of a fenced code block, if `line` (trimmed at the start) opens or closes one.
pub fn fence_marker(line: &str) -> Option<&'static str> {
    if line.starts_with("```") {
        Some("```")
    } else if line.starts_with("~~~") {
        Some("~~~")
    } else {
        None
    }
}

/// The heading a line is, if it is one: up to six `#`, then a space, a tab or the end of the line.
pub fn heading_of(line: &str) -> Option<Heading> {
    let t = line.trim_start();
    let level = t.chars().take_while(|c| *c == '#').count();
    if !(1..=6).contains(&level) || !(t.len() == level || t[level..].starts_with([' ', '\t'])) {
        return None;
    }
    Some(Heading { level, text: t[level..].trim().trim_end_matches('#').trim().to_string() })
}

/// Where a line of Markdown sits with respect to fenced code blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The line opens a fenced block (` ``` ` or `~~~`).
    Opens,
    /// The line closes the open block (the same marker).
    Closes,
    /// Code inside a block (another marker inside is code too).
    Inside,
    /// Text outside any block.
    Outside,
}

/// The lines of a Markdown text, each with where it sits ([`Fenced`]).
pub fn fenced_lines(text: &str) -> impl Iterator<Item = (Fenced, &str)> {
    let mut fence: Option<&'static str> = None;
    text.lines().map(move |line| {
        let t = line.trim_start();
        match (fence_marker(t), fence) {
            (Some(marker), None) => {
                fence = Some(marker);
                (Fenced::Opens, line)
            }
            (Some(_), Some(open)) if t.starts_with(open) => {
                fence = None;
                (Fenced::Closes, line)
            }
            (_, Some(_)) => (Fenced::Inside, line),
            (None, None) => (Fenced::Outside, line),
        }
    })
}

/// The headings of a Markdown text in order; a `#` line inside a fenced code block is code.
pub fn headings(text: &str) -> Vec<Heading> {
    fenced_lines(text).filter(|(f, _)| *f == Fenced::Outside).filter_map(|(_, line)| heading_of(line)).collect()
}

fn normalized(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

/// What became of the headings of a text after an edit.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HeadingChanges {
    /// Headings of the text before that the text after no longer has.
    pub lost: Vec<Heading>,
    /// Headings kept under new wording: (before, after).
    pub reworded: Vec<(Heading, Heading)>,
}

/// Compare the headings of the text before and after an edit (see the module documentation);
/// `issues` are the issues the edit fixes.
pub fn compare(before: &[Heading], after: &[Heading], issues: &[JudgeIssue]) -> HeadingChanges {
    let mut taken = vec![false; after.len()];
    let mut unmatched = Vec::new();
    for (i, h) in before.iter().enumerate() {
        let same = after.iter().enumerate().position(|(j, a)| !taken[j] && normalized(&a.text) == normalized(&h.text));
        match same {
            Some(j) => taken[j] = true,
            None => unmatched.push(i),
        }
    }
    let mut changes = HeadingChanges::default();
    for i in unmatched {
        let old = &before[i];
        let reworded = after.get(i).filter(|a| {
            !taken[i]
                && a.level == old.level
                && (char_similarity(&normalized(&old.text), &normalized(&a.text)) >= REWORD_SIMILARITY
                    || issues.iter().any(|issue| asks_about_heading(issue, &old.text)))
        });
        match reworded {
            Some(a) => {
                taken[i] = true;
                changes.reworded.push((old.clone(), a.clone()));
            }
            None => changes.lost.push(old.clone()),
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(level: usize, text: &str) -> Heading {
        Heading { level, text: text.into() }
    }

    fn issue(description: &str, fix: &str) -> JudgeIssue {
        JudgeIssue {
            id: "i".into(),
            criterion: "clarity_readability".into(),
            severity: crate::Severity::Minor,
            section_id: String::new(),
            description: description.into(),
            fix_instruction: fix.into(),
            location: String::new(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    #[test]
    fn headings_outside_fences_with_their_levels() {
        let text =
            "# Title #\n\nText\n   ## Usage\n#not a heading\n```sh\n# comment\n```\n~~~\n```\n# still code\n~~~\n###\n";
        assert_eq!(headings(text), vec![h(1, "Title"), h(2, "Usage"), h(3, "")]);
        assert_eq!(h(2, "Order").to_string(), "## Order");
    }

    /// Issue 59, point 5: a typo fixed in a heading is a kept heading, not a lost one.
    #[test]
    fn a_close_edit_at_the_same_place_and_level_is_a_reworded_heading() {
        let before = headings("## Ordr\nAwareness first.\n\n### Steps\n- a\n");
        let after = headings("## Order\nAwareness first.\n\n### Steps\n- a\n");
        let c = compare(&before, &after, &[]);
        assert!(c.lost.is_empty(), "{c:?}");
        assert_eq!(c.reworded, vec![(h(2, "Ordr"), h(2, "Order"))]);
        // Case and spacing alone are no change at all; a level change of the same text is kept.
        let c = compare(&[h(2, "The  Funnel")], &[h(3, "the funnel")], &[]);
        assert_eq!(c, HeadingChanges::default());
    }

    #[test]
    fn an_unrelated_heading_a_new_level_or_another_place_is_a_lost_heading() {
        let before = vec![h(2, "Order"), h(3, "Steps")];
        // Not a close edit, no issue asks: lost.
        let c = compare(&before, &[h(2, "Pricing"), h(3, "Steps")], &[]);
        assert_eq!(c.lost, vec![h(2, "Order")]);
        // A close edit at another level: lost.
        assert_eq!(compare(&before, &[h(3, "Orders"), h(3, "Steps")], &[]).lost, vec![h(2, "Order")]);
        // Dropped, the next heading moving up into its place: lost (the next one is matched by text).
        assert_eq!(compare(&before, &[h(3, "Steps")], &[]).lost, vec![h(2, "Order")]);
        // An issue asking for a new title allows any rewording in place; a negated one does not.
        let asked = [issue("The heading does not say what the section teaches.", "Rename it.")];
        let c = compare(&before, &[h(2, "The four stages"), h(3, "Steps")], &asked);
        assert!(c.lost.is_empty() && c.reworded.len() == 1, "{c:?}");
        let negated = [issue("A typo in the text.", "Fix it; do not touch the heading.")];
        assert_eq!(compare(&before, &[h(2, "The four stages"), h(3, "Steps")], &negated).lost, vec![h(2, "Order")]);
    }
}
