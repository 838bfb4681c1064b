//! The generator service: checklist generation.

pub mod grpc;

pub use grpc::routes;
