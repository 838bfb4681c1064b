//! The refiners service: checklist and content refiners.

pub mod grpc;

pub use grpc::routes;
