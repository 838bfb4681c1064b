//! The generator service: checklist generation.
//!
//! - [`core`]: the [`Generator`] core (instance presets, and [`core::corpus`] for corpus-level
//!   generation: feedback, checkeval, interacteval, refined through the refiners stage). The
//!   requests, presets, their validation and the `ChecklistGenerator` stage trait are the domain's
//!   (`assay_domain::generator`); the wire conversions are `assay_proto::convert::generator`; the
//!   remote client is `assay_rpc::remote::RemoteGenerator`.
//! - [`grpc`]: the gRPC adapter ([`routes`]).

pub mod core;
pub mod grpc;

pub use core::Generator;
pub use grpc::{GeneratorGrpc, routes};
