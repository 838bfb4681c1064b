//! Reading the mesh's document prompts in a scripted backend: the sections a judge prompt quotes
//! and the section an edit prompt (patch or expand) rewrites, as the refinement tests' backends
//! answer them.

use crate::RecordedRequest;

/// Every message of a chat call, joined by newlines.
pub fn prompt_of(r: &RecordedRequest) -> String {
    r.messages().into_iter().map(|(_, c)| c).collect::<Vec<_>>().join("\n")
}

/// The (id, text) of every `<section id="...">` block of a judge prompt (context blocks use another
/// tag and are not judged).
pub fn judged_sections(prompt: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = prompt;
    while let Some(at) = rest.find("<section id=\"") {
        let after = &rest[at + "<section id=\"".len()..];
        let Some(q) = after.find('"') else { break };
        let id = after[..q].to_string();
        let Some(open) = after.find(">\n") else { break };
        let body = &after[open + 2..];
        let Some(close) = body.find("\n</section>") else { break };
        out.push((id, body[..close].to_string()));
        rest = &body[close..];
    }
    out
}

/// The section text of an edit prompt (patch or expand).
pub fn edited_text(prompt: &str) -> Option<String> {
    let head = ["The current section (rewrite it):\n<section", "The section to fix:\n<section"]
        .iter()
        .find_map(|h| prompt.find(h).map(|at| at + h.len()))?;
    let rest = &prompt[head..];
    let body = &rest[rest.find(">\n")? + 2..];
    Some(body[..body.find("\n</section>")?].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_edits_are_read_from_their_tags() {
        let judge = "Judge these.\n<section id=\"a\" title=\"A\">\nfirst\n</section>\n<context id=\"b\">\nno\n</context>\n\
                     <section id=\"c\" title=\"C\">\nthird\nline\n</section>\n";
        assert_eq!(
            judged_sections(judge),
            vec![("a".to_string(), "first".to_string()), ("c".to_string(), "third\nline".to_string())]
        );
        let edit = "The section to fix:\n<section id=\"a\">\nold text\n</section>\nFix it.";
        assert_eq!(edited_text(edit).as_deref(), Some("old text"));
        assert_eq!(edited_text("no section here"), None);
    }
}
