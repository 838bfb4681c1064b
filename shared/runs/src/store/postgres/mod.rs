//! The PostgreSQL run store, shared by several gateways. A run is executed by the gateway whose
//! name is in its `owner` column while its `lease_until` is in the future (time is the database
//! server's, the same for every gateway); writes of a run's events, summary and checkpoints are
//! fenced by that lease.

mod chunks;
mod records;
mod runs;
mod spend;
mod store;
mod tls;

pub use store::{PostgresStore, redact_url};
