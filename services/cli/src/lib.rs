//! The whole mesh in one process: every service on its own loopback listener, the gateway calling
//! the stages over real gRPC (the same code paths as separate Deployments). Built by `assay-mesh`,
//! the composition root `assay serve <stage>` shares.

pub use assay_mesh::{Mesh, MeshAddrs, start_mesh};
