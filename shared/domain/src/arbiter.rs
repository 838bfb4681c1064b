//! The arbiter stage: consolidate judges' verdicts, route fixes, plan execution batches
//! (the arbiter's part of a targeted refinement).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::document::{Brief, Criterion, JudgeIssue, JudgeVerdict, Section, Severity};
use crate::error::StageError;
use crate::model::{ModelRecord, ModelSpec};

/// Agreement at or above which every issue is kept.
pub const HIGH_AGREEMENT: f64 = 0.80;
/// Agreement at or above which issues raised by two judges or more are kept.
pub const MODERATE_AGREEMENT: f64 = 0.67;
/// Default cosine similarity at which two judges' issues are one issue.
pub const DEFAULT_MATCH_THRESHOLD: f64 = 0.75;
/// Most patchers of one batch.
pub const MAX_PARALLEL_PATCHERS: u32 = 3;
/// pedagogical_structure below this regenerates the whole document.
pub const STRUCTURE_FLOOR: f64 = 0.6;
/// More than this share of sections with a CRITICAL issue regenerates the whole document.
pub const CRITICAL_SECTION_SHARE: f64 = 0.4;

/// Level of measurement of the agreement coefficient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum MeasurementLevel {
    Nominal,
    Ordinal,
    #[default]
    Interval,
    Ratio,
}

/// Agreement band of a consolidation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AgreementLevel {
    /// alpha >= 0.80 (or judges in exact agreement): every issue kept.
    High,
    /// 0.67 <= alpha < 0.80: issues raised by two judges or more (two thirds of the judges when
    /// more than three were asked for).
    Moderate,
    /// alpha < 0.67, or agreement not measurable: CRITICAL issues only, flagged for review.
    Low,
}

impl AgreementLevel {
    /// The band of a defined alpha.
    pub fn of(alpha: f64) -> Self {
        if alpha >= HIGH_AGREEMENT {
            AgreementLevel::High
        } else if alpha >= MODERATE_AGREEMENT {
            AgreementLevel::Moderate
        } else {
            AgreementLevel::Low
        }
    }
}

/// Consolidate verdicts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConsolidateRequest {
    pub verdicts: Vec<JudgeVerdict>,
    pub sections: Vec<Section>,
    pub level: MeasurementLevel,
    /// Never empty once parsed (the defaults fill it).
    pub criteria: Vec<Criterion>,
    pub brief: Brief,
    pub model: ModelSpec,
    pub embedding_model: ModelSpec,
    pub match_threshold: f64,
    pub skip_synthesis: bool,
}

/// A resolved conflict between criteria on one section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConflictResolution {
    pub section_id: String,
    pub winning_criterion: String,
    pub losing_criterion: String,
    pub constraint: String,
}

/// The one instruction for a section.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SectionInstruction {
    pub section_id: String,
    pub instruction: String,
    pub constraints: Vec<String>,
    pub issue_ids: Vec<String>,
    pub primary_criterion: String,
    pub synthesized: bool,
    pub error: String,
}

/// What consolidation produced.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Consolidation {
    pub alpha: Option<f64>,
    pub alpha_undefined_reason: String,
    /// `None` with a single verdict: nothing to agree with, every issue kept.
    pub agreement: Option<AgreementLevel>,
    pub issues: Vec<JudgeIssue>,
    pub conflicts: Vec<ConflictResolution>,
    pub flagged_for_review: bool,
    pub criterion_scores: BTreeMap<String, f64>,
    pub issues_dropped: u32,
    pub instructions: Vec<SectionInstruction>,
    pub issues_merged: u32,
    pub unassigned_issues: u32,
    pub overall_score: f64,
    /// "criterion": alpha is measured over the judges' criterion scores at every judging (section
    /// scores are never units).
    pub agreement_units: String,
    /// Usage of every call: issue-matching embeddings, localization, synthesis.
    pub usage: Usage,
    pub model_record: Option<ModelRecord>,
    /// One entry per kept issue that named no known section, in issue order: where localization
    /// placed it (or why it could not).
    pub localizations: Vec<IssueLocalization>,
    /// Critical issues the agreement filter kept out of the plan, `raised_by` filled:
    /// acceptance and the unresolved issues still count them.
    #[serde(default)]
    pub held_critical: Vec<JudgeIssue>,
    /// Non-empty when the issues were matched by their words because the embedding backend
    /// failed or cannot embed: why (degraded, never a failed consolidation).
    #[serde(default)]
    pub similarity_degraded: String,
}

/// Most sections one localized issue is routed to.
pub const MAX_LOCALIZED_SECTIONS: usize = 3;

/// Where a kept issue without a known section was placed.
///
/// Ids stay traceable: an issue placed in one section keeps its id; an issue placed in two or
/// three sections becomes one copy per section with the id `<issue_id>@<section_id>` (each copy
/// routed, patched and verified like any issue). `issue_ids` lists the ids the issue has in the
/// consolidation after placement, so the original id maps to its copies.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct IssueLocalization {
    /// The consolidated issue's id before placement.
    pub issue_id: String,
    /// The sections it was placed in, in document order (empty: it stays unassigned).
    pub section_ids: Vec<String>,
    /// The ids of the placed issue(s), one per section (empty when unassigned).
    pub issue_ids: Vec<String>,
    /// How it was placed: "embedding" (the issue against the sections' passages) or "model" (a
    /// schema-constrained call naming section ids).
    pub method: String,
    /// Why it stays unassigned (empty when placed).
    pub reason: String,
}

/// The id of the copy of a localized issue in one section, when it was placed in several.
pub fn localized_issue_id(issue_id: &str, section_id: &str) -> String {
    format!("{issue_id}@{section_id}")
}

/// Fix action for a section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FixAction {
    SurgicalEdit,
    RegenerateSection,
    FullRegenerate,
}

/// Route consolidated issues.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteRequest {
    pub issues: Vec<JudgeIssue>,
    pub sections: Vec<Section>,
    pub criterion_scores: BTreeMap<String, f64>,
    pub instructions: Vec<SectionInstruction>,
    pub locked_section_ids: Vec<String>,
    pub criteria: Vec<Criterion>,
}

/// One unit of work on one section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixTask {
    pub id: String,
    pub section_id: String,
    pub action: FixAction,
    pub instruction: String,
    pub constraints: Vec<String>,
    pub issue_ids: Vec<String>,
    pub consistency_check: bool,
    pub priority: u32,
    pub criterion: String,
    pub severity: Option<Severity>,
    pub previous_section_id: String,
    pub next_section_id: String,
    pub estimated_tokens: u32,
}

/// Routing result.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Routing {
    pub full_regenerate: bool,
    pub full_regenerate_reason: String,
    pub tasks: Vec<FixTask>,
    pub skipped_locked_section_ids: Vec<String>,
    pub unassigned_issue_ids: Vec<String>,
    pub critical_section_ratio: f64,
}

/// Tasks that may run together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub index: u32,
    pub tasks: Vec<FixTask>,
    pub estimated_tokens: u32,
}

/// Consolidate + route + batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanRequest {
    pub consolidate: ConsolidateRequest,
    pub locked_section_ids: Vec<String>,
    pub max_parallel_patchers: u32,
}

/// An execution plan.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Plan {
    pub consolidation: Consolidation,
    pub routing: Routing,
    pub batches: Vec<Batch>,
    pub estimated_tokens: u64,
}

/// The arbiter stage.
#[async_trait::async_trait]
pub trait Arbiter: Send + Sync {
    async fn consolidate(&self, request: ConsolidateRequest) -> Result<Consolidation, StageError>;
    async fn route(&self, request: RouteRequest) -> Result<Routing, StageError>;
    async fn plan(&self, request: PlanRequest) -> Result<Plan, StageError>;
}
