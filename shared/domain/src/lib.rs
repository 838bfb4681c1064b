//! Assay's domain: checklists, scores, model specs, stage traits and the closed error type.
//! Nothing here knows about gRPC.

pub mod checklist;
pub mod error;
pub mod generator;
pub mod limits;
pub mod model;
pub mod models;
pub mod refiners;
pub mod score;
pub mod stage;
pub mod template;

pub use checklist::*;
pub use error::*;
pub use generator::ChecklistGenerator;
pub use model::*;
pub use models::*;
pub use refiners::ChecklistRefiner;
pub use score::*;
pub use stage::*;

pub use assay_llm::Usage;
