//! The delta-judge service: fix verification.

pub mod grpc;

pub use grpc::routes;
