//! The runtime every Assay service shares: serving with health, reflection (v1 and v1alpha),
//! message limits, TLS and mutual TLS, bearer auth, per-request tracing with W3C context, graceful
//! shutdown; mapping of [`StageError`](assay_domain::StageError) to gRPC status and back; call
//! context (deadline and trace context) forwarded on every outgoing hop; server-streaming calls, both
//! ends.

pub mod auth;
pub mod context;
pub mod decode_error;
pub mod metrics;
pub mod remote;
pub mod serve;
pub mod spent;
pub mod status;
pub mod stream;
pub mod tls;

pub use context::{CallContext, outgoing, run_with};
pub use serve::{Readiness, ServeOptions, serve, shutdown_signal};
pub use status::{from_status, to_status};
pub use stream::{EventStream, Streamed, consume_stream, serve_stream};
pub use tls::{ClientTls, ServerTls};
