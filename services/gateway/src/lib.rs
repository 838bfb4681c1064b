//! The gateway: pipelines composed over the stage services.

pub mod core;
pub mod grpc;

pub use core::{EvalRecord, Evaluation, EvaluationOutcome, GatewayCore, RecordOutcome};
pub use grpc::{GatewayGrpc, routes};
