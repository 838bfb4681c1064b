//! The generator service: checklist generation.
//!
//! - [`core`]: the [`Generator`] core and the [`ChecklistGenerator`] stage trait with its domain
//!   request/outcome types (no transport types).
//! - [`grpc`]: the gRPC adapter ([`routes`]) and the wire conversions.
//! - [`remote`]: [`RemoteGenerator`], the stage trait over gRPC.

pub mod core;
pub mod grpc;
pub mod remote;

pub use core::{
    Candidate, ChecklistGenerator, GenerateOutcome, GenerateRequest, Generator, Preset, PresetInfo, preset_table,
};
pub use grpc::{GeneratorGrpc, routes};
pub use remote::RemoteGenerator;
