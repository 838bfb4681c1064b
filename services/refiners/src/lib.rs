//! The refiners service: the four checklist refiners (Deduplicator, Tagger, UnitTester, Selector),
//! alone or chained.
//!
//! - [`core`]: [`ChecklistRefiners`], the refiners' logic (no transport). Their options, reports,
//!   validation and the `ChecklistRefiner` stage trait are the domain's
//!   (`assay_domain::refiners`); wire conversions are `assay_proto::convert::refiners`; the remote
//!   client is `assay_rpc::remote::RemoteRefiners`. The UnitTester scores rewrites through a
//!   `Scorer` stage (the scorer service over gRPC in production).
//! - [`grpc`]: the gRPC adapter ([`routes`]).
//!
//! The content refiners (SelfRefine, Patch, ExpandSection) are not built yet: they answer
//! UNIMPLEMENTED.

pub mod core;
pub mod grpc;

pub use core::ChecklistRefiners;
pub use grpc::{RefinersGrpc, routes};
