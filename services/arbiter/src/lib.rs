//! The arbiter service: verdict consolidation, agreement, routing and plans.

pub mod core;
pub mod grpc;

pub use core::ArbiterCore;
pub use grpc::routes;
