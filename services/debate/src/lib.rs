//! The debate service: multi-LLM debate. Three solvers solve a problem
//! independently, review each other, refine with the reviews about them, and a judge picks the
//! winner.

pub mod core;
pub mod grpc;

pub use core::DebateCore;
pub use grpc::routes;
