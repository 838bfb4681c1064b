//! The scorer service: yes/no checklist judgments with every aggregate.

pub mod core;
pub mod grpc;

pub use core::ScorerCore;
pub use grpc::{ScorerGrpc, routes};
