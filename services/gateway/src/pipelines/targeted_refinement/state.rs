//! The loop's state: everything it knows, checkpointed (as JSON under [`super::STATE`]) after
//! every step, so a restarted gateway goes on where it was.

use std::collections::{BTreeMap, BTreeSet};

use assay_domain::arbiter::{FixTask, Plan};
use assay_domain::iteration::board::Board;
use assay_domain::iteration::{self, MeanScore, SectionLock};
use assay_domain::{JudgeIssue, Section, Usage};
use serde::{Deserialize, Serialize};

/// One judging of the document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Judging {
    /// Rounds of edits before it (0 = the document as given).
    pub(super) iteration: u32,
    pub(super) score: f64,
    pub(super) sections: Vec<Section>,
    /// Consolidated issues (after agreement filtering): what the plan fixes.
    pub(super) issues: Vec<JudgeIssue>,
    /// Critical issues the agreement filter kept out of the plan: reported as unresolved and
    /// counted against acceptance (`critical`), not fixed.
    #[serde(default)]
    pub(super) held: Vec<JudgeIssue>,
    /// An issue of the judging is critical (kept or held back).
    pub(super) critical: bool,
    /// Mean per (section, criterion) over the judges that scored sections, else per criterion
    /// under an empty section id.
    pub(super) scores: Vec<MeanScore>,
    pub(super) plan: Plan,
    /// The content judged holds edits a human made since the previous judging.
    #[serde(default)]
    pub(super) human_edited: bool,
    /// Each judge's standing view, section by section (carried by focused judgings).
    #[serde(default)]
    pub(super) board: Board,
    /// Only the changed sections were judged (their neighbours as context), the rest carried.
    #[serde(default)]
    pub(super) focused: bool,
}

impl Judging {
    /// Every issue left open by this judging: the planned ones, then the critical ones held back.
    pub(super) fn open_issues(&self) -> Vec<JudgeIssue> {
        self.issues.iter().chain(&self.held).cloned().collect()
    }

    /// The open issues on the wire, the held-back ones flagged.
    pub(super) fn open_issues_to(&self) -> Vec<assay_proto::common::v1::JudgeIssue> {
        let held = self.held.iter().map(|i| assay_proto::common::v1::JudgeIssue {
            held_back: true,
            ..assay_proto::convert::document::issue_to(i)
        });
        self.issues.iter().map(assay_proto::convert::document::issue_to).chain(held).collect()
    }

    /// Critical issues open, held-back ones included.
    pub(super) fn critical_count(&self) -> u32 {
        (self.issues.iter().filter(|i| i.severity == assay_domain::Severity::Critical).count() + self.held.len()) as u32
    }
}

/// Tokens of one phase: estimated before spending, used by the calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct PhaseTally {
    pub(super) estimated: u64,
    pub(super) usage: Usage,
}

/// Phases of the token accounting (see `PhaseUsage` in the gateway contract).
pub(super) const ASSESSMENT: &str = "assessment";
pub(super) const JUDGING: &str = "judging";
pub(super) const ARBITER: &str = "arbiter";
pub(super) const EDITING: &str = "editing";
pub(super) const VERIFICATION: &str = "verification";
pub(super) const SELF_REFINE: &str = "self_refine";
pub(super) const PHASES: [&str; 6] = [ASSESSMENT, JUDGING, ARBITER, EDITING, VERIFICATION, SELF_REFINE];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Status {
    Pending,
    Running,
    Applied,
    Rejected,
    Failed,
    Skipped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TaskState {
    pub(super) task: FixTask,
    pub(super) batch: u32,
    pub(super) status: Status,
    pub(super) detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) enum Phase {
    /// Judge the document (first, or after an iteration) and decide.
    Judge,
    /// Run the current iteration's tasks.
    Execute,
    /// Semi-auto escalation: waiting for a human.
    Escalated,
}

/// Everything the loop knows, checkpointed after every step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct State {
    pub(super) phase: Phase,
    pub(super) sections: Vec<Section>,
    /// Rounds of edits started.
    pub(super) iteration: u32,
    pub(super) judged: Vec<Judging>,
    pub(super) tasks: Vec<TaskState>,
    /// Batches of the current iteration whose batch_started was emitted (a restarted gateway
    /// does not emit it again).
    #[serde(default)]
    pub(super) batches_started: BTreeSet<u32>,
    pub(super) full_regenerate: bool,
    pub(super) full_regenerate_reason: String,
    /// Accepted edits per section.
    pub(super) edits: BTreeMap<String, u32>,
    pub(super) locked: Vec<String>,
    pub(super) quality_locks: Vec<SectionLock>,
    /// Content at the start of the current iteration (restored when a quality lock breaks).
    pub(super) before_iteration: Vec<Section>,
    /// Sections a human edited, not verified yet.
    pub(super) unverified_edits: Vec<String>,
    /// Sections a human edited during the current iteration (their tasks are skipped).
    pub(super) human_edited: BTreeSet<String>,
    /// Every section a human ever edited (the self-refine hook's producer "human").
    #[serde(default)]
    pub(super) human_sections: BTreeSet<String>,
    /// The loop has decided and the run is finishing (the self-refine hook may be under way): a
    /// restarted gateway finishes it the same way.
    #[serde(default)]
    pub(super) finishing: Option<Finishing>,
    /// Posted actions consumed.
    pub(super) consumed: u32,
    /// Active milliseconds before this process took the run over.
    pub(super) active_ms: u64,
    pub(super) stop_reason: String,
    pub(super) tasks_completed: u32,
    pub(super) tasks_failed: u32,
    /// Tokens of the first assessment (judging and plan of the document as given), counted
    /// apart from the token budget; `None` until it is done.
    #[serde(default)]
    pub(super) assessment_tokens: Option<u64>,
    /// Tokens by phase.
    #[serde(default)]
    pub(super) phases: BTreeMap<String, PhaseTally>,
    /// The loop stops after the final judging of the current edits (the reason).
    #[serde(default)]
    pub(super) pending_stop: Option<String>,
    /// What the first judging cost against its estimate: later judging estimates (the reserve
    /// among them) are scaled by it.
    #[serde(default)]
    pub(super) judging_scale: Option<f64>,
    /// The next judging is a full one confirming a focused judging's decision (it replaces it).
    #[serde(default)]
    pub(super) confirming: bool,
    /// Sections holding verified fixes that no judging scored (the final judging could not run).
    #[serde(default)]
    pub(super) stale: Vec<String>,
    /// Sections sent back to the best judged iteration's content when the loop ended, with the
    /// content they held.
    #[serde(default)]
    pub(super) discarded: Vec<Discarded>,
    /// Index of the judging that convergence and the iteration limit count from: the first
    /// judging after a human's last resume (0 before any).
    #[serde(default)]
    pub(super) since: usize,
    /// Sections locked by the current batch's edits (id, edits), announced after its
    /// batch_complete.
    #[serde(default)]
    pub(super) locks_to_announce: Vec<(String, u32)>,
    /// Budget tokens (after the first assessment) spent before the current token allowance: a
    /// human's resume of a loop escalated on its token budget grants a fresh one from here.
    #[serde(default)]
    pub(super) allowance_tokens: u64,
    /// Active milliseconds before the current time allowance (likewise for the time budget).
    #[serde(default)]
    pub(super) allowance_ms: u64,
}

/// A section the loop's result sent back to an earlier judging's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Discarded {
    pub(super) section_id: String,
    /// The first iteration whose judging held the discarded content.
    pub(super) iteration: u32,
    pub(super) content: String,
    pub(super) reason: String,
}

impl State {
    pub(super) fn new(sections: Vec<Section>) -> Self {
        Self {
            phase: Phase::Judge,
            before_iteration: sections.clone(),
            sections,
            iteration: 0,
            judged: Vec::new(),
            tasks: Vec::new(),
            batches_started: BTreeSet::new(),
            full_regenerate: false,
            full_regenerate_reason: String::new(),
            edits: BTreeMap::new(),
            locked: Vec::new(),
            quality_locks: Vec::new(),
            unverified_edits: Vec::new(),
            human_edited: BTreeSet::new(),
            human_sections: BTreeSet::new(),
            finishing: None,
            consumed: 0,
            active_ms: 0,
            stop_reason: String::new(),
            tasks_completed: 0,
            tasks_failed: 0,
            assessment_tokens: None,
            phases: BTreeMap::new(),
            pending_stop: None,
            confirming: false,
            judging_scale: None,
            stale: Vec::new(),
            discarded: Vec::new(),
            since: 0,
            locks_to_announce: Vec::new(),
            allowance_tokens: 0,
            allowance_ms: 0,
        }
    }

    /// Record a phase's usage.
    pub(super) fn tally(&mut self, phase: &str, usage: &Usage) {
        self.phases.entry(phase.to_string()).or_default().usage.add(usage);
    }

    /// Record a phase's estimate.
    pub(super) fn expect(&mut self, phase: &str, tokens: u64) {
        self.phases.entry(phase.to_string()).or_default().estimated += tokens;
    }

    /// The judging phase now: the first assessment until it is done.
    pub(super) fn judging_phase(&self) -> &'static str {
        if self.assessment_tokens.is_none() { ASSESSMENT } else { JUDGING }
    }

    pub(super) fn arbiter_phase(&self) -> &'static str {
        if self.assessment_tokens.is_none() { ASSESSMENT } else { ARBITER }
    }

    pub(super) fn history(&self) -> Vec<f64> {
        self.judged.iter().map(|j| j.score).collect()
    }

    /// Index of the first highest-scoring judging; on a tie, a judging of human-edited content
    /// wins over earlier ones (a human's edit is not thrown away for an equal score).
    pub(super) fn best(&self) -> usize {
        let judgings: Vec<(f64, bool)> = self.judged.iter().map(|j| (j.score, j.human_edited)).collect();
        iteration::best_judging(&judgings)
    }

    /// Every judging as the decisions read it.
    pub(super) fn scored(&self) -> Vec<iteration::Scored> {
        self.judged
            .iter()
            .map(|j| iteration::Scored { score: j.score, critical: j.critical, human_edited: j.human_edited })
            .collect()
    }

    /// Send the document back to judging `to`'s content (a no-op for the last judging, or when
    /// fixes no judging scored are held: they stay). Each section sent back is recorded as
    /// discarded: the content it held, the first judged iteration that held it, and why.
    pub(super) fn roll_back(&mut self, to: usize) {
        let last = self.judged.len().saturating_sub(1);
        if to >= last || !self.stale.is_empty() {
            return;
        }
        let kept = &self.judged[to];
        let mut discarded = Vec::new();
        for (now, then) in self.sections.iter().zip(&kept.sections) {
            if now.content == then.content {
                continue;
            }
            // The first later judging that held other content for the section (the last one
            // judged the content as it stands: no fixes are stale).
            let held = self.judged[to + 1..]
                .iter()
                .find(|j| j.sections.iter().any(|s| s.id == now.id && s.content != then.content))
                .unwrap_or(&self.judged[last]);
            let (iteration, score) = (held.iteration, held.score);
            discarded.push(Discarded {
                section_id: now.id.clone(),
                iteration,
                content: now.content.clone(),
                reason: format!(
                    "iteration {} scored {:.2}, the highest of the run; the content edited since (first judged at \
                     iteration {iteration}, {score:.2}) scored lower",
                    kept.iteration, kept.score
                ),
            });
        }
        self.sections = kept.sections.clone();
        self.discarded = discarded;
    }

    pub(super) fn section(&self, id: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.id == id)
    }

    pub(super) fn set_section(&mut self, section: &Section) {
        if let Some(s) = self.sections.iter_mut().find(|s| s.id == section.id) {
            s.content.clone_from(&section.content);
            if !section.title.trim().is_empty() {
                s.title.clone_from(&section.title);
            }
        }
    }
}

/// A decided run's ending, kept in the state until the result is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Finishing {
    /// A `gw::RefinementOutcome`.
    pub(super) outcome: i32,
    /// The judging the result reports.
    pub(super) judging: usize,
    pub(super) warning: String,
    /// A best-effort result (its summary is recomputed from the judging).
    pub(super) best_effort: bool,
}

/// How a step of the loop ends when it does not simply go on.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Halt {
    /// A limit was reached (the reason).
    Limit(String),
    /// A human accepted the content as it stands.
    Accept,
}

/// A human decision after an escalation.
pub(super) enum Human {
    Accept,
    Review,
    Resume,
}

/// A judging's end.
pub(super) enum Judged {
    Done(Box<Judging>),
    /// Every judge failed.
    Failed,
    /// A budget was spent before the judging could finish (the reason): nothing was judged.
    Limit(String),
}
