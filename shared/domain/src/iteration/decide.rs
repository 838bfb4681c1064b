//! After each judging of a targeted refinement: is the content accepted, does the loop stop, or
//! does it run another iteration? And how good is a judged document?
//!
//! - Full-auto accepts at [`FULL_AUTO_ACCEPT`], or with a warning at [`WARN_SCORE`] when no issue
//!   is critical; below that it stops with its best effort.
//! - At either mode's top threshold a document with a critical issue open is accepted
//!   with a warning naming the open critical issues ([`open_critical_warning`]), and its quality
//!   is never [`Quality::Good`].
//! - Semi-auto accepts at [`SEMI_AUTO_ACCEPT`], or at [`SEMI_AUTO_NO_CRITICAL`] when no issue is
//!   critical; below that it escalates to a human.
//! - Otherwise the loop stops on convergence or a hard limit ([`convergence_within`]), or when
//!   there is nothing left to fix; else it goes on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::limits::{Limits, convergence_within};
use crate::arbiter::Routing;
use crate::document::Section;

/// Full-auto accepts at this score.
pub const FULL_AUTO_ACCEPT: f64 = 0.85;
/// Full-auto accepts with a warning at this score when no issue is critical.
pub const WARN_SCORE: f64 = 0.75;
/// Semi-auto accepts at this score.
pub const SEMI_AUTO_ACCEPT: f64 = 0.90;
/// Semi-auto accepts at this score when no issue is critical.
pub const SEMI_AUTO_NO_CRITICAL: f64 = 0.85;
/// Stop reason when no judging of the document succeeded.
pub const JUDGES_FAILED: &str = "judges_failed";
/// Stop reason when the plan has no task to run (or only locked sections to regenerate).
pub const NOTHING_TO_FIX: &str = "nothing_to_fix";

/// Who finishes a refinement that does not reach its thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// The best iteration is returned as a best effort.
    FullAuto,
    /// A human is asked (escalation).
    SemiAuto,
}

/// Quality band of a judged document (the same in both modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quality {
    /// At least [`FULL_AUTO_ACCEPT`] with no critical issue.
    Good,
    /// At least [`WARN_SCORE`] with no critical issue.
    Acceptable,
    /// Below [`WARN_SCORE`], or a critical issue is open (whatever the score).
    BelowStandard,
}

/// The quality band of a document scored `score`, `critical` when an issue is critical (an
/// issue any judge raised as critical, whether or not the agreement filter planned it).
pub fn quality(score: f64, critical: bool) -> Quality {
    if critical {
        Quality::BelowStandard
    } else if score >= FULL_AUTO_ACCEPT {
        Quality::Good
    } else if score >= WARN_SCORE {
        Quality::Acceptable
    } else {
        Quality::BelowStandard
    }
}

/// How the mode accepts a judged document.
#[derive(Debug, Clone, PartialEq)]
pub enum Acceptance {
    Accepted,
    /// Accepted below the full-auto threshold; the warning says why.
    AcceptedWithWarning(String),
}

/// The mode's top threshold is met: 0.85 full-auto, 0.90 semi-auto. Both modes try to reach it
/// before they settle.
pub fn meets_top(mode: Mode, score: f64) -> bool {
    match mode {
        Mode::FullAuto => score >= FULL_AUTO_ACCEPT,
        Mode::SemiAuto => score >= SEMI_AUTO_ACCEPT,
    }
}

/// How the top threshold accepts a document scored `score`: plainly, or with a warning when a
/// critical issue is open (the top threshold accepts even then; the result says what it accepted).
pub fn top_acceptance(mode: Mode, score: f64, critical: bool) -> Acceptance {
    if critical {
        let top = match mode {
            Mode::FullAuto => FULL_AUTO_ACCEPT,
            Mode::SemiAuto => SEMI_AUTO_ACCEPT,
        };
        Acceptance::AcceptedWithWarning(format!("score {score:.2} meets {top:.2} with a critical issue open"))
    } else {
        Acceptance::Accepted
    }
}

/// The warning for a document accepted with critical issues open: how many, and each one
/// (section, criterion, description and how many judges raised it). `None` when none is critical.
pub fn open_critical_warning(issues: &[crate::document::JudgeIssue]) -> Option<String> {
    let critical: Vec<String> = issues
        .iter()
        .filter(|i| i.severity == crate::document::Severity::Critical)
        .map(|i| {
            let section = if i.section_id.is_empty() { "document" } else { i.section_id.as_str() };
            let support = match i.raised_by.len() {
                0 => String::new(),
                1 => " (raised by 1 judge)".to_string(),
                n => format!(" (raised by {n} judges)"),
            };
            format!("[{section}] {}: {}{support}", i.criterion, i.description.trim())
        })
        .collect();
    match critical.len() {
        0 => None,
        1 => Some(format!("1 critical issue open: {}", critical[0])),
        n => Some(format!("{n} critical issues open: {}", critical.join("; "))),
    }
}

/// Acceptance once the loop stops (convergence, a limit, nothing left to fix): the top threshold
/// (with a warning when a critical issue is open, [`top_acceptance`]), else the lower tier
/// (full-auto: at least 0.75 with no critical issue, with a warning; semi-auto: at least 0.85 with
/// no critical issue).
pub fn accepts(mode: Mode, score: f64, critical: bool) -> Option<Acceptance> {
    match mode {
        _ if meets_top(mode, score) => Some(top_acceptance(mode, score, critical)),
        Mode::FullAuto if score >= WARN_SCORE && !critical => Some(Acceptance::AcceptedWithWarning(format!(
            "score {score:.2} is below {FULL_AUTO_ACCEPT:.2} but at least {WARN_SCORE:.2} with no critical issue"
        ))),
        Mode::SemiAuto if score >= SEMI_AUTO_NO_CRITICAL && !critical => Some(Acceptance::Accepted),
        Mode::FullAuto | Mode::SemiAuto => None,
    }
}

/// A judging as the decisions read it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub score: f64,
    /// An issue of the judging is critical.
    pub critical: bool,
    /// The content judged holds a human's edits.
    pub human_edited: bool,
}

impl Scored {
    pub fn new(score: f64, critical: bool) -> Self {
        Self { score, critical, human_edited: false }
    }
}

/// The judging a stopped loop settles on, and how its mode accepts it: the highest-scoring
/// judging that a tier accepts (the highest-scoring iteration, not the last; on a tie the
/// rule of [`super::best_judging`]). `None` when no judging is accepted by any tier.
pub fn settle_on(mode: Mode, judged: &[Scored]) -> Option<(Acceptance, usize)> {
    let accepted: Vec<(usize, Acceptance)> =
        judged.iter().enumerate().filter_map(|(i, j)| Some((i, accepts(mode, j.score, j.critical)?))).collect();
    let pairs: Vec<(f64, bool)> = accepted.iter().map(|(i, _)| (judged[*i].score, judged[*i].human_edited)).collect();
    if accepted.is_empty() {
        return None;
    }
    let (index, acceptance) = accepted.into_iter().nth(super::best_judging(&pairs))?;
    Some((acceptance, index))
}

#[derive(Debug, Clone, Copy)]
pub struct LastJudging<'a> {
    pub score: f64,
    /// An issue of the judging is critical.
    pub critical: bool,
    /// The arbiter's routing of its issues.
    pub routing: &'a Routing,
}

/// Where a refinement stands after a judging: what [`decide`] reads.
#[derive(Debug, Clone, Copy)]
pub struct Standing<'a> {
    pub mode: Mode,
    /// The last judging; `None` when none succeeded.
    pub last: Option<LastJudging<'a>>,
    /// Every judging, the document as given first (the last judging included).
    pub judged: &'a [Scored],
    /// Index of the judging convergence and the iteration limit count from: 0, or the first
    /// judging after a human resumed an escalated loop (a resume grants the run's iteration
    /// allowance again, and gains are measured from the document the human sent back).
    pub since: usize,
    /// Accepted edits per section id.
    pub edits: &'a BTreeMap<String, u32>,
    pub tokens_used: u64,
    /// Active time of the run (time paused or waiting for a human excluded).
    pub elapsed_ms: u64,
    pub limits: Limits,
    /// The document as it stands.
    pub sections: &'a [Section],
    /// Ids of the sections locked against further edits.
    pub locked: &'a [String],
}

/// The decision after a judging.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// The mode's top threshold is met.
    Accept(Acceptance),
    /// The loop stopped (the reason) and a tier accepts the best judging it reached (its index in
    /// the judgings, see [`settle_on`]): that judging's content is the result.
    Settle(Acceptance, String, usize),
    /// Stop iterating below every tier, for this reason (a [`super::Stop`] name, [`JUDGES_FAILED`] or
    /// [`NOTHING_TO_FIX`]).
    Stop(String),
    /// Run another iteration from the last judging's plan.
    Continue,
}

/// Accept, stop or go on: the mode's top threshold first; then convergence and the hard limits,
/// then whether the plan has anything to do (a full regeneration needs an unlocked section, a
/// targeted plan a task); a stop settles on the best judging a tier accepts (see [`settle_on`]).
pub fn decide(s: &Standing<'_>) -> Decision {
    let Some(last) = s.last else { return Decision::Stop(JUDGES_FAILED.into()) };
    if meets_top(s.mode, last.score) {
        return Decision::Accept(top_acceptance(s.mode, last.score, last.critical));
    }
    let stop = stop_reason(s, last);
    match stop {
        None => Decision::Continue,
        Some(reason) => match settle_on(s.mode, s.judged) {
            Some((a, judging)) => Decision::Settle(a, reason, judging),
            None => Decision::Stop(reason),
        },
    }
}

/// Why the loop stops after this judging, if it does: convergence or a limit, else nothing left
/// to fix.
fn stop_reason(s: &Standing<'_>, last: LastJudging<'_>) -> Option<String> {
    let counted = s.judged.get(s.since..).unwrap_or_default();
    let history: Vec<f64> = counted.iter().map(|j| j.score).collect();
    let c = convergence_within(&history, s.edits, s.tokens_used, s.elapsed_ms, s.limits);
    if let Some(stop) = c.stop {
        return Some(stop.name().into());
    }
    let routing = last.routing;
    let unlocked = s.sections.iter().any(|x| !s.locked.contains(&x.id));
    if (routing.full_regenerate && !unlocked) || (!routing.full_regenerate && routing.tasks.is_empty()) {
        return Some(NOTHING_TO_FIX.into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::{FixAction, FixTask};

    #[test]
    fn quality_bands_are_the_full_auto_thresholds() {
        assert_eq!(quality(0.85, false), Quality::Good);
        assert_eq!(quality(0.85, true), Quality::BelowStandard, "never good with a critical issue open");
        assert_eq!(quality(0.99, true), Quality::BelowStandard);
        assert_eq!(quality(0.849, false), Quality::Acceptable);
        assert_eq!(quality(0.75, false), Quality::Acceptable);
        assert_eq!(quality(0.75, true), Quality::BelowStandard);
        assert_eq!(quality(0.749, false), Quality::BelowStandard);
    }

    #[test]
    fn full_auto_accepts_at_its_threshold_or_warns_without_a_critical_issue() {
        assert_eq!(accepts(Mode::FullAuto, 0.85, false), Some(Acceptance::Accepted));
        assert_eq!(
            accepts(Mode::FullAuto, 0.85, true),
            Some(Acceptance::AcceptedWithWarning("score 0.85 meets 0.85 with a critical issue open".into()))
        );
        assert_eq!(
            accepts(Mode::FullAuto, 0.8, false),
            Some(Acceptance::AcceptedWithWarning(
                "score 0.80 is below 0.85 but at least 0.75 with no critical issue".into()
            ))
        );
        assert_eq!(accepts(Mode::FullAuto, 0.8, true), None);
        assert_eq!(accepts(Mode::FullAuto, 0.749, false), None);
    }

    #[test]
    fn semi_auto_accepts_higher_and_warns_only_of_an_open_critical_issue() {
        assert_eq!(accepts(Mode::SemiAuto, 0.90, false), Some(Acceptance::Accepted));
        assert_eq!(
            accepts(Mode::SemiAuto, 0.90, true),
            Some(Acceptance::AcceptedWithWarning("score 0.90 meets 0.90 with a critical issue open".into()))
        );
        assert_eq!(accepts(Mode::SemiAuto, 0.85, false), Some(Acceptance::Accepted));
        assert_eq!(accepts(Mode::SemiAuto, 0.89, true), None);
        assert_eq!(accepts(Mode::SemiAuto, 0.84, false), None);
    }

    #[test]
    fn the_open_critical_warning_names_each_critical_issue_and_its_support() {
        use crate::document::{JudgeIssue, Severity};
        let issue = |id: &str, section: &str, severity, judges: &[&str]| JudgeIssue {
            id: id.into(),
            criterion: "factual_accuracy".into(),
            severity,
            section_id: section.into(),
            description: format!("wrong {id} "),
            fix_instruction: String::new(),
            location: String::new(),
            raised_by: judges.iter().map(|j| (*j).to_string()).collect(),
            context_window: String::new(),
        };
        assert_eq!(open_critical_warning(&[issue("a", "s1", Severity::Major, &["j1"])]), None);
        let issues = [
            issue("a", "s1", Severity::Critical, &["j1"]),
            issue("b", "s2", Severity::Minor, &["j1", "j2"]),
            issue("c", "", Severity::Critical, &["j1", "j2"]),
        ];
        assert_eq!(
            open_critical_warning(&issues).unwrap(),
            "2 critical issues open: [s1] factual_accuracy: wrong a (raised by 1 judge); \
             [document] factual_accuracy: wrong c (raised by 2 judges)"
        );
    }

    fn task(section: &str) -> FixTask {
        FixTask {
            id: format!("t-{section}"),
            section_id: section.into(),
            action: FixAction::SurgicalEdit,
            instruction: "fix".into(),
            constraints: Vec::new(),
            issue_ids: Vec::new(),
            consistency_check: false,
            priority: 1,
            criterion: "clarity".into(),
            severity: None,
            previous_section_id: String::new(),
            next_section_id: String::new(),
            estimated_tokens: 10,
        }
    }

    fn sections(ids: &[&str]) -> Vec<Section> {
        ids.iter().map(|id| Section { id: (*id).into(), ..Section::default() }).collect()
    }

    /// A full-auto standing after two judgings (0.5 then 0.6) with nothing locked.
    fn scored(history: &[f64]) -> Vec<Scored> {
        history.iter().map(|x| Scored::new(*x, false)).collect()
    }

    fn standing<'a>(
        routing: &'a Routing,
        judged: &'a [Scored],
        sections: &'a [Section],
        locked: &'a [String],
        edits: &'a BTreeMap<String, u32>,
    ) -> Standing<'a> {
        Standing {
            mode: Mode::FullAuto,
            last: Some(LastJudging { score: judged.last().map_or(0.0, |j| j.score), critical: false, routing }),
            judged,
            since: 0,
            edits,
            tokens_used: 0,
            elapsed_ms: 0,
            limits: Limits::default(),
            sections,
            locked,
        }
    }

    #[test]
    fn accepts_first_then_stops_on_a_limit_then_on_nothing_to_fix() {
        let edits = BTreeMap::new();
        let secs = sections(&["s1", "s2"]);
        let with_task = Routing { tasks: vec![task("s1")], ..Routing::default() };
        let history = scored(&[0.5, 0.6]);
        let s = standing(&with_task, &history, &secs, &[], &edits);
        assert_eq!(decide(&s), Decision::Continue);
        // No judging succeeded.
        assert_eq!(decide(&Standing { last: None, ..s }), Decision::Stop(JUDGES_FAILED.into()));
        // The thresholds win over a spent budget.
        let accepted = scored(&[0.5, 0.9]);
        let s2 = Standing { tokens_used: u64::MAX, ..standing(&with_task, &accepted, &secs, &[], &edits) };
        assert_eq!(decide(&s2), Decision::Accept(Acceptance::Accepted));
        // At the top threshold with a critical issue open: accepted, with a warning.
        let critical = Standing { last: Some(LastJudging { critical: true, ..s2.last.unwrap() }), ..s2 };
        assert!(
            matches!(decide(&critical), Decision::Accept(Acceptance::AcceptedWithWarning(w)) if w.contains("critical"))
        );
        // A spent budget stops before the plan is looked at.
        assert_eq!(decide(&Standing { tokens_used: 15_000, ..s }), Decision::Stop("token_budget".into()));
        let stalled = scored(&[0.5, 0.51, 0.52]);
        assert_eq!(
            decide(&standing(&with_task, &stalled, &secs, &[], &edits)),
            Decision::Stop("gain_below_threshold".into())
        );
        // A targeted plan without tasks.
        let empty = Routing::default();
        assert_eq!(decide(&standing(&empty, &history, &secs, &[], &edits)), Decision::Stop(NOTHING_TO_FIX.into()));
    }

    #[test]
    fn a_full_regeneration_goes_on_while_a_section_is_unlocked() {
        let edits = BTreeMap::new();
        let secs = sections(&["s1", "s2"]);
        let full = Routing { full_regenerate: true, ..Routing::default() };
        let history = scored(&[0.4]);
        let one_locked = ["s1".to_string()];
        assert_eq!(decide(&standing(&full, &history, &secs, &one_locked, &edits)), Decision::Continue);
        let all_locked = ["s1".to_string(), "s2".to_string()];
        assert_eq!(
            decide(&standing(&full, &history, &secs, &all_locked, &edits)),
            Decision::Stop(NOTHING_TO_FIX.into())
        );
    }

    #[test]
    fn semi_auto_does_not_accept_what_full_auto_accepts_with_a_warning() {
        let edits = BTreeMap::new();
        let secs = sections(&["s1"]);
        let with_task = Routing { tasks: vec![task("s1")], ..Routing::default() };
        let history = scored(&[0.8]);
        let s = standing(&with_task, &history, &secs, &[], &edits);
        // Both modes try for their top threshold first.
        assert_eq!(decide(&s), Decision::Continue);
        assert_eq!(decide(&Standing { mode: Mode::SemiAuto, ..s }), Decision::Continue);
        // Once the loop stops, full-auto settles with a warning; semi-auto does not.
        let empty = Routing::default();
        let s = standing(&empty, &history, &secs, &[], &edits);
        assert!(
            matches!(decide(&s), Decision::Settle(Acceptance::AcceptedWithWarning(_), ref r, 0) if r == NOTHING_TO_FIX)
        );
        assert_eq!(decide(&Standing { mode: Mode::SemiAuto, ..s }), Decision::Stop(NOTHING_TO_FIX.into()));
        let high = scored(&[0.87]);
        let s = standing(&empty, &high, &secs, &[], &edits);
        assert_eq!(
            decide(&Standing { mode: Mode::SemiAuto, ..s }),
            Decision::Settle(Acceptance::Accepted, NOTHING_TO_FIX.into(), 0)
        );
    }

    #[test]
    fn a_resumed_loop_counts_its_iterations_and_gains_from_the_resume() {
        let edits = BTreeMap::new();
        let secs = sections(&["s1"]);
        let with_task = Routing { tasks: vec![task("s1")], ..Routing::default() };
        let limits = Limits { max_iterations: 1, ..Limits::default() };
        // At its iteration limit (one iteration), semi-auto below its thresholds stops.
        let judged = scored(&[0.70, 0.80]);
        let at_limit = Standing { mode: Mode::SemiAuto, limits, ..standing(&with_task, &judged, &secs, &[], &edits) };
        assert_eq!(decide(&at_limit), Decision::Stop("max_iterations".into()));
        // A human resumed with no edit: the judging after the resume is where counting starts.
        let judged = scored(&[0.70, 0.80, 0.80]);
        let resumed = Standing { since: 2, ..Standing { judged: &judged, ..at_limit } };
        assert_eq!(decide(&resumed), Decision::Continue, "a resume runs at least one iteration");
        // One iteration after the resume: the limit again.
        let judged = scored(&[0.70, 0.80, 0.80, 0.84]);
        assert_eq!(decide(&Standing { judged: &judged, ..resumed }), Decision::Stop("max_iterations".into()));
        // Stalled gains before the resume do not stop the resumed loop.
        let limits = Limits::default();
        let judged = scored(&[0.70, 0.70, 0.70, 0.70]);
        let stalled = Standing { limits, ..Standing { judged: &judged, ..at_limit } };
        assert_eq!(decide(&stalled), Decision::Stop("gain_below_threshold".into()));
        assert_eq!(decide(&Standing { since: 3, ..stalled }), Decision::Continue);
    }

    #[test]
    fn a_settled_loop_returns_its_best_judging_not_its_last() {
        let edits = BTreeMap::new();
        let secs = sections(&["s1"]);
        let with_task = Routing { tasks: vec![task("s1")], ..Routing::default() };
        // 0.70 -> 0.82 -> 0.80 -> 0.79: stalled at the last two, no critical issue.
        let judged = scored(&[0.70, 0.82, 0.80, 0.79]);
        let decision = decide(&standing(&with_task, &judged, &secs, &[], &edits));
        let Decision::Settle(Acceptance::AcceptedWithWarning(w), reason, judging) = decision else {
            panic!("expected a settle on the best judging, got {decision:?}")
        };
        assert_eq!(judging, 1, "the 0.82 iteration");
        assert_eq!(reason, "gain_below_threshold");
        assert!(w.contains("0.82"), "the warning is about the judging returned: {w}");
        // The best judging holds a critical issue no tier accepts: the best one a tier accepts.
        let mut judged = scored(&[0.70, 0.82, 0.80, 0.79]);
        judged[1].critical = true;
        assert_eq!(settle_on(Mode::FullAuto, &judged).map(|(_, i)| i), Some(2));
        // Semi-auto: only 0.85 without a critical issue or 0.90 settles.
        assert_eq!(settle_on(Mode::SemiAuto, &judged), None);
        let judged = scored(&[0.70, 0.91, 0.86, 0.86]);
        assert_eq!(settle_on(Mode::SemiAuto, &judged), Some((Acceptance::Accepted, 1)));
        // A tie goes to the human-edited content, else to the first.
        let mut tie = scored(&[0.80, 0.80, 0.78]);
        assert_eq!(settle_on(Mode::FullAuto, &tie).map(|(_, i)| i), Some(0));
        tie[1].human_edited = true;
        assert_eq!(settle_on(Mode::FullAuto, &tie).map(|(_, i)| i), Some(1));
    }
}
