//! The loop's state: everything it knows, checkpointed (as JSON under [`super::STATE`]) after
//! every step, so a restarted gateway goes on where it was.

use std::collections::{BTreeMap, BTreeSet};

use assay_domain::arbiter::{FixTask, Plan};
use assay_domain::iteration::{self, MeanScore, SectionLock};
use assay_domain::{JudgeIssue, Section};
use serde::{Deserialize, Serialize};

/// One judging of the document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Judging {
    /// Rounds of edits before it (0 = the document as given).
    pub(super) iteration: u32,
    pub(super) score: f64,
    pub(super) sections: Vec<Section>,
    /// Consolidated issues (after agreement filtering).
    pub(super) issues: Vec<JudgeIssue>,
    pub(super) critical: bool,
    /// Mean per (section, criterion) over the judges that scored sections, else per criterion
    /// under an empty section id.
    pub(super) scores: Vec<MeanScore>,
    pub(super) plan: Plan,
    /// The content judged holds edits a human made since the previous judging.
    #[serde(default)]
    pub(super) human_edited: bool,
}

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
        }
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
