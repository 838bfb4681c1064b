//! Model backends for Assay.

pub mod types;

pub use types::*;
