//! The whole mesh in one process: every service on its own loopback listener, the gateway calling
//! the stages over real gRPC (the same code paths as separate Deployments).

pub mod mesh;

pub use mesh::{Mesh, MeshAddrs, start_mesh};
