//! The delta-judge service: fix verification.

pub mod core;
pub mod grpc;

pub use core::verify::DeltaJudgeCore;
pub use grpc::routes;
