//! The refiners service: the four checklist refiners (Deduplicator, Tagger, UnitTester, Selector),
//! alone or chained; the content refiners of sectioned documents (Patch, ExpandSection); and
//! self-refine (critique -> revise passes stopped by the convergence cascade, with a regression
//! guard).
//!
//! - [`core`]: [`ChecklistRefiners`], the refiners' logic (no transport). Their options, reports,
//!   validation and the `ChecklistRefiner` stage trait are the domain's
//!   (`assay_domain::refiners`); wire conversions are `assay_proto::convert::refiners`; the remote
//!   client is `assay_rpc::remote::RemoteRefiners`. The UnitTester scores rewrites through a
//!   `Scorer` stage (the scorer service over gRPC in production).
//! - [`grpc`]: the gRPC adapter ([`routes`]).
//!
//! - [`core::content`]: Patch and ExpandSection (`assay_domain::content::ContentRefiner`).
//! - [`core::self_refine`]: self-refine (`assay_domain::self_refine::SelfRefiner`; wire
//!   conversions `assay_proto::convert::self_refine`). The convergence cascade, its embedding
//!   cache and breaker are `assay_domain::similarity`'s, one per service.

pub mod core;
pub mod grpc;

pub use core::ChecklistRefiners;
pub use grpc::{RefinersGrpc, routes};
