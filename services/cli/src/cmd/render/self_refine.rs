//! The human lines of self-refine: one per pass, one per output through the self-refine hook (as
//! `assay refine` and `assay debate` print them), and how a run ended, as `assay refine-text`
//! prints them on standard error and `assay runs watch` per event.

use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as rpb;

use super::{plural, stop_reason_name};

/// The critique of a pass in a few words.
fn critique_words(critique: &[String]) -> String {
    match critique {
        [] => "no critique".into(),
        [only] if only.trim().eq_ignore_ascii_case("no material issues") => "no material issues".into(),
        list => plural(list.len(), "critique point"),
    }
}

/// The figure the cascade decided by, with its name; None when no comparison was made.
fn decided_similarity(p: &rpb::SelfRefinePass) -> Option<String> {
    let value = match p.decided_by.as_str() {
        "" => return None,
        "jaccard" => p.jaccard,
        "embedding" => p.cosine,
        _ => Some(p.char_similarity),
    };
    Some(match value {
        Some(v) => format!("similarity {v:.2} ({})", p.decided_by),
        None => format!("decided by {}", p.decided_by),
    })
}

/// The progress line of one pass, as `assay refine-text` prints it on standard error.
pub fn pass_line(p: &rpb::SelfRefinePass) -> String {
    let mut parts = vec![critique_words(&p.critique)];
    if let Some(s) = decided_similarity(p) {
        parts.push(s);
    }
    if let Some(s) = p.similarity_to_original {
        let measure =
            if p.similarity_measure.is_empty() { String::new() } else { format!(" ({})", p.similarity_measure) };
        let mut guard = format!("{s:.2} to the original{measure}");
        if p.rolled_back
            && let Some(t) = p.rollback_threshold
        {
            guard.push_str(&format!(" < {t:.2}"));
        }
        parts.push(guard);
    }
    if !p.degraded_from.is_empty() {
        let why = if p.degraded_reason.is_empty() { String::new() } else { format!(": {}", p.degraded_reason) };
        parts.push(format!("degraded from {}{why}", p.degraded_from));
    }
    if p.revised_block_missing {
        parts.push("no <revised> block".into());
    }
    let verdict = if !p.error.is_empty() {
        format!("error: {}; kept the previous draft", p.error)
    } else if p.rolled_back {
        "rolled back; kept the previous draft".to_string()
    } else if p.converged {
        "converged".to_string()
    } else if p.diverged {
        "revised (diverged)".to_string()
    } else {
        "revised".to_string()
    };
    parts.push(verdict);
    format!("pass {}: {}", p.pass, parts.join("; "))
}

/// The progress line of one output through the self-refine hook, as `assay refine` and `assay
/// debate` print it on standard error.
pub fn self_refined_line(e: &gw::SelfRefined) -> String {
    let what = format!("self-refine {} ({})", e.target, e.producer);
    if !e.skipped.is_empty() {
        return format!("{what}: skipped: {}", e.skipped);
    }
    if !e.error.is_empty() {
        return format!("{what}: error: {}; kept the text", e.error);
    }
    let r = e.refine.clone().unwrap_or_default();
    if r.skipped_too_short {
        return format!("{what}: skipped: too_short");
    }
    format!(
        "{what}: {} after {}, text {}",
        stop_reason_name(r.stop_reason),
        plural(r.passes.len(), "pass"),
        if e.before == e.after { "unchanged" } else { "changed" }
    )
}

/// How the run ended, one line on standard error.
pub fn summary_line(r: &rpb::SelfRefineResponse, min_bytes: u32) -> String {
    if r.skipped_too_short {
        return format!(
            "done: the draft is shorter than {min_bytes} bytes (--min-bytes): returned unchanged, no model call"
        );
    }
    let u = r.usage.clone().unwrap_or_default();
    let mut line = format!(
        "done: {} after {}, text {}, {} ({} tokens, {})",
        stop_reason_name(r.stop_reason),
        plural(r.passes.len(), "pass"),
        if r.changed { "changed" } else { "unchanged" },
        plural(u.calls as usize, "call"),
        u.prompt_tokens + u.completion_tokens,
        super::cost_text(&u)
    );
    if !r.degraded_from.is_empty() {
        line.push_str(&format!("; decided without {} (degraded)", r.degraded_from));
    }
    line
}

#[cfg(test)]
mod tests {
    use assay_proto::common::v1 as common;

    use super::*;

    #[test]
    fn pass_lines_speak_human() {
        let revised = rpb::SelfRefinePass {
            pass: 1,
            critique: vec!["Too vague".into(), "No example".into(), "Jargon".into()],
            revised: "New text".into(),
            char_similarity: 0.71,
            jaccard: Some(0.62),
            decided_by: "jaccard".into(),
            ..Default::default()
        };
        assert_eq!(pass_line(&revised), "pass 1: 3 critique points; similarity 0.62 (jaccard); revised");
        let converged = rpb::SelfRefinePass {
            pass: 2,
            critique: vec!["No material issues".into()],
            char_similarity: 0.994,
            decided_by: "char".into(),
            converged: true,
            similarity_to_original: Some(0.93),
            similarity_measure: "embedding".into(),
            rollback_threshold: Some(0.8),
            ..Default::default()
        };
        assert_eq!(
            pass_line(&converged),
            "pass 2: no material issues; similarity 0.99 (char); 0.93 to the original (embedding); converged"
        );
        let rolled = rpb::SelfRefinePass {
            pass: 2,
            critique: vec!["Rewrite all".into()],
            char_similarity: 0.2,
            decided_by: "char".into(),
            diverged: true,
            rolled_back: true,
            similarity_to_original: Some(0.41),
            similarity_measure: "jaccard".into(),
            rollback_threshold: Some(0.74),
            degraded_from: "embedding".into(),
            degraded_reason: "breaker open".into(),
            ..Default::default()
        };
        assert_eq!(
            pass_line(&rolled),
            "pass 2: 1 critique point; similarity 0.20 (char); 0.41 to the original (jaccard) < 0.74; degraded from \
             embedding: breaker open; rolled back; kept the previous draft"
        );
        let failed = rpb::SelfRefinePass {
            pass: 1,
            error: "reply cut at the token limit".into(),
            revised_block_missing: true,
            ..Default::default()
        };
        assert_eq!(
            pass_line(&failed),
            "pass 1: no critique; no <revised> block; error: reply cut at the token limit; kept the previous draft"
        );
        let diverged = rpb::SelfRefinePass {
            pass: 1,
            critique: vec!["a".into(), "b".into()],
            cosine: Some(0.5),
            decided_by: "embedding".into(),
            diverged: true,
            ..Default::default()
        };
        assert_eq!(pass_line(&diverged), "pass 1: 2 critique points; similarity 0.50 (embedding); revised (diverged)");
    }

    #[test]
    fn self_refined_lines_say_what_the_hook_did() {
        let entry = |skipped: &str, error: &str, refine: Option<rpb::SelfRefineResponse>| gw::SelfRefined {
            target: "stages".into(),
            producer: "model".into(),
            skipped: skipped.into(),
            before: "Old.".into(),
            after: if refine.is_some() { "New." } else { "Old." }.into(),
            refine,
            error: error.into(),
        };
        let refined = rpb::SelfRefineResponse {
            passes: vec![rpb::SelfRefinePass::default(), rpb::SelfRefinePass::default()],
            stop_reason: rpb::SelfRefineStopReason::Converged as i32,
            changed: true,
            ..Default::default()
        };
        assert_eq!(
            self_refined_line(&entry("", "", Some(refined))),
            "self-refine stages (model): converged after 2 passes, text changed"
        );
        assert_eq!(self_refined_line(&entry("excluded", "", None)), "self-refine stages (model): skipped: excluded");
        assert_eq!(
            self_refined_line(&entry("", "refiner unavailable", None)),
            "self-refine stages (model): error: refiner unavailable; kept the text"
        );
    }

    #[test]
    fn the_summary_tells_how_it_ended() {
        let r = rpb::SelfRefineResponse {
            final_text: "Better text.".into(),
            passes: vec![rpb::SelfRefinePass { pass: 1, revised: "Better text.".into(), ..Default::default() }],
            converged: true,
            usage: Some(common::Usage { calls: 1, prompt_tokens: 300, completion_tokens: 120, ..Default::default() }),
            stop_reason: rpb::SelfRefineStopReason::Converged as i32,
            changed: true,
            degraded_from: "embedding".into(),
            ..Default::default()
        };
        assert_eq!(
            summary_line(&r, 200),
            "done: converged after 1 pass, text changed, 1 call (420 tokens, cost unknown); decided without embedding (degraded)"
        );
        let skipped = rpb::SelfRefineResponse {
            skipped_too_short: true,
            stop_reason: rpb::SelfRefineStopReason::TooShort as i32,
            ..Default::default()
        };
        assert!(summary_line(&skipped, 200).contains("shorter than 200 bytes"));
    }
}
