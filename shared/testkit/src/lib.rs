//! Test harness: scripted OpenAI-compatible server, port-0 servers, whole-mesh sandbox.

pub mod postgres;
pub mod process;
pub mod prompts;
pub mod schema_fake;
pub mod scripted;
pub mod server;

pub use postgres::{PostgresError, TempPostgres};
pub use process::{ChildOutput, http_request};
pub use schema_fake::{FaultCounts, FaultMix, schema_handler, schema_reply, with_faults};
pub use scripted::{
    Exchange, Gate, Handler, RecordedRequest, Reply, ScriptedLlm, embedding_handler, eventually, hash_embedding,
    max_in_flight,
};
pub use server::TestServer;
