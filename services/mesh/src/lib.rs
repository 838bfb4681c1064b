//! The composition root of Assay: one table of stages ([`STAGES`]) and the one way each stage is
//! built from configuration, used by every entry point so they cannot drift apart:
//!
//! - a stage on its own (`assay serve gateway`, `assay serve scorer`, ...; one per Kubernetes
//!   Deployment), reaching the stages it calls at their configured addresses ([`standalone`]);
//! - `assay up` and the whole-mesh test sandbox, which run every service in one process, each on
//!   its own loopback listener, calling each other over real gRPC ([`start_mesh`]).
//!
//! A row of the table names a stage's service, gRPC service, `[ports]` / `[upstreams]` key, the
//! stages it calls, the settings its core takes from configuration and how that core is built
//! from them ([`cores`]); the gateway's stages and run engine are built by [`gateway`].

pub mod cores;
pub mod error;
pub mod gateway;
pub mod mesh;
pub mod remotes;
pub mod standalone;
pub mod table;

pub use assay_gateway::{Engine, admin};
pub use cores::{Built, Core, CoreSettings};
pub use error::MeshError;
pub use mesh::{Mesh, MeshAddrs, start_mesh};
pub use remotes::Remotes;
pub use table::{STAGES, Stage, StageDef};
