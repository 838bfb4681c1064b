//! The judges' prompts: the whole-document prompt, and the focused one (judged sections in full,
//! context sections as fenced excerpts).

use assay_domain::Brief;
use assay_domain::document::{Criterion, Section};
use assay_domain::template::render;

/// The judge prompt: placeholders {brief}, {criteria}, {criterion_names}, {sections}.
pub const TEMPLATE: &str = include_str!("../../../prompts/judge_sections.txt");

/// The focused judge prompt (a request with context): placeholders {brief}, {criteria},
/// {criterion_names}, {document} (judged sections and context excerpts in document order),
/// {judged_ids}, {judged_count}, {criterion_count}, {section_score_count}.
pub const FOCUSED_TEMPLATE: &str = include_str!("../../../prompts/judge_sections_focused.txt");

/// Characters of a context section shown at each cut end (its end when it comes before a judged
/// section, its start when it comes after one): about two paragraphs, enough to judge a
/// transition, about 150 tokens. A context section at most this long (twice this between two judged
/// sections) is shown whole.
pub const CONTEXT_EXCERPT_CHARS: usize = 250;

/// The prompt for a document: brief, criteria with descriptions, sections with ids and titles.
/// The brief and the sections are caller text: they are fenced (see
/// [`assay_domain::template::fence_untrusted`]) so they cannot close the tags they are quoted
/// between, forge a section or pose as instructions after the rule that they are material.
pub fn render_prompt(brief: &Brief, criteria: &[Criterion], sections: &[Section]) -> String {
    use assay_domain::template::fence_untrusted as fence;
    let brief_text = brief_text(brief);
    let brief_text = fence(&brief_text);
    let names: Vec<String> = criteria.iter().map(|c| c.name.clone()).collect();
    let sections_text: Vec<String> = sections.iter().map(|s| section_text(s, |t| fence(t).into_owned())).collect();
    render(
        TEMPLATE,
        &[
            ("brief", &brief_text),
            ("criteria", &criteria_text(criteria)),
            ("criterion_names", &names.join(", ")),
            ("sections", &sections_text.join("\n\n")),
        ],
    )
}

/// The brief as the judges read it (before fencing).
fn brief_text(brief: &Brief) -> String {
    let or_none = |s: &str| if s.trim().is_empty() { "(not given)".to_string() } else { s.trim().to_string() };
    let objectives = if brief.objectives.is_empty() {
        " (not given)".to_string()
    } else {
        brief.objectives.iter().map(|o| format!("\n- {}", o.trim())).collect()
    };
    format!(
        "Objectives:{objectives}\nAudience: {}\nLanguage: {}\nDescription: {}",
        or_none(&brief.audience),
        if brief.language.trim().is_empty() { "the document's own".to_string() } else { brief.language.clone() },
        or_none(&brief.description),
    )
}

/// One line per criterion: name, priority and description.
fn criteria_text(criteria: &[Criterion]) -> String {
    let lines: Vec<String> = criteria
        .iter()
        .map(|c| {
            let description =
                if c.description.trim().is_empty() { String::new() } else { format!(": {}", c.description.trim()) };
            format!("- {} (priority {}){description}", c.name, c.priority)
        })
        .collect();
    lines.join("\n")
}

/// A judged section between its tags, in full (`fence` applied to every caller text).
fn section_text(s: &Section, fence: impl Fn(&str) -> String) -> String {
    let title = if s.title.trim().is_empty() { String::new() } else { format!(" title={:?}", fence(s.title.trim())) };
    format!("<section id={:?}{title}>\n{}\n</section>", fence(&s.id), fence(s.content.trim_end()))
}

/// Caller text of a focused prompt: fenced like every quote ([`assay_domain::template::fence_untrusted`]),
/// and a `<context` / `</context` tag of any case has its `<` replaced by `‹` too, so a section
/// cannot close a context quote or forge one.
fn fence_focused(text: &str) -> String {
    const TAG: &[u8] = b"context";
    let text = assay_domain::template::fence_untrusted(text);
    let bytes = text.as_bytes();
    let forged = |at: usize| {
        let mut j = at + 1;
        while j < bytes.len() && (bytes[j] == b'/' || bytes[j].is_ascii_whitespace()) {
            j += 1;
        }
        bytes.len() >= j + TAG.len()
            && bytes[j..j + TAG.len()].eq_ignore_ascii_case(TAG)
            && bytes.get(j + TAG.len()).is_none_or(|b| !b.is_ascii_alphanumeric() && *b != b'_')
    };
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (i, _) in text.match_indices('<').filter(|&(i, _)| forged(i)) {
        out.push_str(&text[last..i]);
        out.push('‹');
        last = i + 1;
    }
    out.push_str(&text[last..]);
    out
}

/// The first `n` characters of `text`, cut back to a word boundary when one is in the second half.
fn head(text: &str, n: usize) -> &str {
    let Some((end, _)) = text.char_indices().nth(n) else { return text };
    let cut = &text[..end];
    match cut.rfind(char::is_whitespace) {
        Some(p) if p >= end / 2 => cut[..p].trim_end(),
        _ => cut,
    }
}

/// The last `n` characters of `text`, cut forward to a word boundary when one is in the first half.
fn tail(text: &str, n: usize) -> &str {
    let count = text.chars().count();
    if count <= n {
        return text;
    }
    let start = text.char_indices().nth(count - n).map_or(0, |(i, _)| i);
    let cut = &text[start..];
    match cut.find(char::is_whitespace) {
        Some(p) if p <= cut.len() / 2 => cut[p..].trim_start(),
        _ => cut,
    }
}

/// What part of a context section the judges see, given where it sits relative to the judged
/// sections (see [`CONTEXT_EXCERPT_CHARS`]); `(shows, text)`.
fn context_excerpt(content: &str, before_judged: bool, after_judged: bool) -> (&'static str, String) {
    let content = content.trim();
    let n = CONTEXT_EXCERPT_CHARS;
    let chars = content.chars().count();
    match (before_judged, after_judged) {
        // Between two judged sections: both ends.
        (true, true) if chars > 2 * n => {
            ("start and end", format!("{}\n[...]\n{}", head(content, n), tail(content, n)))
        }
        // Before a judged section: its end leads into it.
        (true, false) if chars > n => ("end", format!("[...] {}", tail(content, n))),
        // After a judged section: its start follows on from it.
        (false, true) if chars > n => ("start", format!("{} [...]", head(content, n))),
        _ => ("all", content.to_string()),
    }
}

/// The prompt of a focused judging: the judged sections in full and the context as excerpts,
/// merged in document order (by `index`; the request check makes indexes distinct), with the
/// judged ids and the number of section scores required. Every caller text is fenced
/// ([`fence_focused`]).
pub fn render_focused_prompt(
    brief: &Brief,
    criteria: &[Criterion],
    sections: &[Section],
    context: &[Section],
) -> String {
    let mut parts: Vec<(u32, String)> = sections.iter().map(|s| (s.index, section_text(s, fence_focused))).collect();
    for c in context {
        let before = sections.iter().any(|s| s.index > c.index);
        let after = sections.iter().any(|s| s.index < c.index);
        let (shows, excerpt) = context_excerpt(&c.content, before, after);
        let title = if c.title.trim().is_empty() {
            String::new()
        } else {
            format!(" title={:?}", fence_focused(c.title.trim()))
        };
        parts.push((
            c.index,
            format!(
                "<context id={:?}{title} shows={shows:?}>\n{}\n</context>",
                fence_focused(&c.id),
                fence_focused(&excerpt)
            ),
        ));
    }
    parts.sort_by_key(|(index, _)| *index);
    let document: Vec<String> = parts.into_iter().map(|(_, text)| text).collect();
    let names: Vec<String> = criteria.iter().map(|c| c.name.clone()).collect();
    let judged: Vec<String> = sections.iter().map(|s| format!("{:?}", fence_focused(&s.id))).collect();
    render(
        FOCUSED_TEMPLATE,
        &[
            ("brief", &fence_focused(&brief_text(brief))),
            ("criteria", &criteria_text(criteria)),
            ("criterion_names", &names.join(", ")),
            ("document", &document.join("\n\n")),
            ("judged_ids", &judged.join(", ")),
            ("judged_count", &sections.len().to_string()),
            ("criterion_count", &criteria.len().to_string()),
            ("section_score_count", &(sections.len() * criteria.len()).to_string()),
        ],
    )
}
