//! The debate service: multi-LLM debate.

pub mod grpc;

pub use grpc::routes;
