//! The refiners service: the four checklist refiners (Deduplicator, Tagger, UnitTester, Selector),
//! alone or chained.
//!
//! - [`core`]: [`ChecklistRefiners`], the refiners' logic and their domain types (no transport).
//! - [`convert`]: wire <-> domain conversions of the refiners' messages.
//! - [`grpc`]: the gRPC adapter ([`routes`]).
//!
//! The content refiners (SelfRefine, Patch, ExpandSection) are not built yet: they answer
//! UNIMPLEMENTED.

pub mod convert;
pub mod core;
pub mod grpc;

pub use core::ChecklistRefiners;
pub use grpc::{RefinersGrpc, routes};
