//! The heuristic checks' common result ([`Checked`]), and the length and language checks.

use assay_domain::headings::{Fenced, fenced_lines};
use assay_domain::verify::HeuristicCheck;

/// A check with the rejection reason it implies, if any, and a note to report even when it passed.
pub struct Checked {
    pub check: HeuristicCheck,
    pub reason: Option<String>,
    pub note: Option<String>,
}

pub(super) fn checked(name: &str, passed: bool, detail: String, reason: Option<String>) -> Checked {
    Checked {
        check: HeuristicCheck { name: name.into(), passed, detail },
        reason: if passed { None } else { reason },
        note: None,
    }
}

/// len(after) / len(before) in characters within `[lo, hi]`.
pub fn length_check(before: &str, after: &str, lo: f64, hi: f64) -> Checked {
    let (b, a) = (before.chars().count(), after.chars().count());
    let ratio = if b == 0 { f64::INFINITY } else { a as f64 / b as f64 };
    if ratio < lo {
        let why = format!("length ratio {ratio:.2} below {lo}");
        checked("length", false, format!("{why} ({a} / {b} characters)"), Some(why))
    } else if ratio > hi {
        let why = format!("length ratio {ratio:.2} above {hi}");
        checked("length", false, format!("{why} ({a} / {b} characters)"), Some(why))
    } else {
        checked("length", true, format!("length ratio {ratio:.2} within [{lo}, {hi}]"), None)
    }
}

/// Prose only: fenced code blocks removed (code would confuse language detection).
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (_, line) in fenced_lines(text).filter(|(f, _)| *f == Fenced::Outside) {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The language is unchanged; judged only when detection is reliable on both sides.
pub fn language_check(before: &str, after: &str) -> Checked {
    let detect = |t: &str| whatlang::detect(&prose(t)).filter(|i| i.is_reliable()).map(|i| i.lang());
    match (detect(before), detect(after)) {
        (Some(b), Some(a)) if a == b => {
            checked("language", true, format!("language unchanged ({})", a.eng_name()), None)
        }
        (Some(b), Some(a)) => {
            let why = format!("language changed from {} to {}", b.eng_name(), a.eng_name());
            checked("language", false, why.clone(), Some(why))
        }
        (b, a) => {
            let side = match (b, a) {
                (None, None) => "either side",
                (None, Some(_)) => "the text before",
                (Some(_), None) | (Some(_), Some(_)) => "the text after",
            };
            checked("language", true, format!("language undetermined: detection is not reliable on {side}"), None)
        }
    }
}
