//! Assay's domain: checklists, scores, model specs, stage traits and the closed error type.
//! Nothing here knows about gRPC or model backends: no transport, no client, no metrics.

pub mod arbiter;
pub mod asks;
pub mod checklist;
pub mod content;
pub mod debate;
pub mod document;
pub mod error;
pub mod generator;
pub mod headings;
pub mod iteration;
pub mod judge;
pub mod limits;
pub mod model;
pub mod refiners;
pub mod score;
pub mod self_refine;
pub mod similarity;
pub mod stage;
pub mod stats;
pub mod template;
pub mod text;
pub mod usage;
pub mod verify;

pub use checklist::*;
pub use document::{Brief, Criterion, JudgeIssue, JudgeVerdict, Section, SectionScore, Severity};
pub use error::*;
pub use generator::ChecklistGenerator;
pub use model::*;
pub use refiners::ChecklistRefiner;
pub use score::*;
pub use self_refine::SelfRefiner;
pub use stage::*;
pub use usage::Usage;
