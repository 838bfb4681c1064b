//! The generator service: checklist generation.
//!
//! - [`core`]: the [`Generator`] core and the [`ChecklistGenerator`] stage trait with its domain
//!   request/outcome types (no transport types); [`core::corpus`]: corpus-level generation
//!   (feedback, checkeval, interacteval) with built-in refinement through `assay-refiners`.
//! - [`grpc`]: the gRPC adapter ([`routes`]) and the wire conversions.
//! - [`remote`]: [`RemoteGenerator`], the stage trait over gRPC.

pub mod core;
pub mod grpc;
pub mod remote;

pub use core::{
    AugmentationMode, Candidate, ChecklistGenerator, CorpusOutcome, CorpusPreset, CorpusProgress, CorpusRefinement,
    CorpusRequest, Dimension, GenerateOutcome, GenerateRequest, Generator, Preset, PresetId, PresetInfo, SubDimension,
    preset_table,
};
pub use grpc::{GeneratorGrpc, routes};
pub use remote::RemoteGenerator;
