//! The structure check: headings, list items and code blocks kept, unless an issue asked for a
//! structural change.

use assay_domain::JudgeIssue;
use assay_domain::asks;
use assay_domain::headings::{self, Fenced, Heading, fenced_lines, heading_of};

use super::heuristics::{Checked, checked};

/// Markdown structure of a text.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Structure {
    /// Headings in order.
    pub headings: Vec<Heading>,
    pub list_items: usize,
    pub code_blocks: usize,
}

fn is_list_item(t: &str) -> bool {
    if let Some(rest) = t.strip_prefix(['-', '*', '+']) {
        return rest.starts_with(' ') || rest.starts_with('\t');
    }
    let digits = t.chars().take_while(char::is_ascii_digit).count();
    digits > 0
        && digits <= 9
        && t[digits..].strip_prefix(['.', ')']).is_some_and(|r| r.starts_with(' ') || r.starts_with('\t'))
}

/// Headings (ATX `#`..`######`), list items and fenced code blocks; nothing inside a fence counts.
pub fn structure_of(text: &str) -> Structure {
    let mut s = Structure::default();
    for (fenced, line) in fenced_lines(text) {
        if fenced == Fenced::Opens {
            s.code_blocks += 1;
        }
        if fenced != Fenced::Outside {
            continue;
        }
        let t = line.trim_start();
        if let Some(h) = heading_of(t) {
            s.headings.push(h);
        } else if is_list_item(t) {
            s.list_items += 1;
        }
    }
    s
}

/// An issue of the request that asks for a structural change, and the word that asks.
#[derive(Debug, Clone, PartialEq)]
pub struct Restructuring {
    pub issue_id: String,
    pub word: String,
}

/// The first issue that asks to remove, merge or restructure (see [`asks::asks_to_restructure`]).
pub fn restructuring(issues: &[JudgeIssue]) -> Option<Restructuring> {
    issues.iter().find_map(|i| {
        asks::asks_to_restructure(&i.description, &i.fix_instruction)
            .map(|word| Restructuring { issue_id: i.id.clone(), word })
    })
}

/// Headings, list items and code blocks of `before` are still in `after`, unless `asked` (an issue
/// asked for a structural change): then a drop passes and is reported as a note. A heading
/// reworded in place ([`headings::compare`] with the request's `issues`) is kept, and the
/// rewording is a note.
pub fn structure_check(before: &str, after: &str, asked: Option<&Restructuring>, issues: &[JudgeIssue]) -> Checked {
    let (b, a) = (structure_of(before), structure_of(after));
    let changes = headings::compare(&b.headings, &a.headings, issues);
    let mut lost: Vec<String> = changes.lost.iter().map(|h| format!("heading {:?}", h.text)).collect();
    let reworded = (!changes.reworded.is_empty()).then(|| {
        let each: Vec<String> =
            changes.reworded.iter().map(|(old, new)| format!("{:?} -> {:?}", old.text, new.text)).collect();
        format!("heading reworded: {}", each.join(", "))
    });
    if a.list_items < b.list_items {
        lost.push(format!("list items {} -> {}", b.list_items, a.list_items));
    }
    if a.code_blocks < b.code_blocks {
        lost.push(format!("code blocks {} -> {}", b.code_blocks, a.code_blocks));
    }
    if lost.is_empty() {
        let detail = format!(
            "structure preserved: headings {}, list items {}, code blocks {}",
            b.headings.len(),
            b.list_items,
            b.code_blocks
        );
        let detail = match &reworded {
            Some(r) => format!("{detail} ({r})"),
            None => detail,
        };
        Checked { note: reworded, ..checked("structure", true, detail, None) }
    } else if let Some(a) = asked {
        let what = format!("structure changed as issue {} asked ({:?}): {}", a.issue_id, a.word, lost.join(", "));
        let note = match &reworded {
            Some(r) => format!("{what}; {r}"),
            None => what.clone(),
        };
        Checked { note: Some(note), ..checked("structure", true, what, None) }
    } else {
        let why = format!("structure lost: {}", lost.join(", "));
        checked("structure", false, why.clone(), Some(why))
    }
}
