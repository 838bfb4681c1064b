//! The engine's handle on its store, opened from the configured location.

use std::sync::Arc;

use assay_domain::StageError;

use super::contract::RunStorage;
use super::postgres::PostgresStore;
use super::sqlite::SqliteStore;

/// The engine's handle on its store. Cheap to clone.
#[derive(Clone)]
pub struct RunStore(Arc<dyn RunStorage>);

impl std::ops::Deref for RunStore {
    type Target = dyn RunStorage;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref()
    }
}

impl RunStore {
    /// Open the store `location` names: a `postgres://` / `postgresql://` URL, else a SQLite file
    /// path (`":memory:"` keeps it in memory). `owner` is this gateway's name in a shared store
    /// (empty: a random one); `lease` how long its claim on a run lasts unrenewed.
    pub async fn connect(location: &str, owner: &str, lease: std::time::Duration) -> Result<RunStore, StageError> {
        if location.starts_with("postgres://") || location.starts_with("postgresql://") {
            let owner = if owner.is_empty() { uuid::Uuid::now_v7().to_string() } else { owner.to_string() };
            Ok(RunStore(Arc::new(PostgresStore::connect(location, owner, lease).await?)))
        } else {
            Self::open(location)
        }
    }

    /// Open (or create) a SQLite store as its one gateway; `":memory:"` keeps it in memory.
    /// Refused while another process holds the file as its gateway.
    pub fn open(path: &str) -> Result<RunStore, StageError> {
        Ok(RunStore(Arc::new(SqliteStore::open(path)?)))
    }

    /// Open a SQLite store without taking the gateway's lock: to read or prepare a file beside
    /// the gateway that holds it (tests, tools), never to execute its runs.
    pub fn open_unlocked(path: &str) -> Result<RunStore, StageError> {
        Ok(RunStore(Arc::new(SqliteStore::open_unlocked(path)?)))
    }

    pub fn from_storage(storage: Arc<dyn RunStorage>) -> RunStore {
        RunStore(storage)
    }

    /// A handle that does not keep the store open.
    pub(crate) fn downgrade(&self) -> std::sync::Weak<dyn RunStorage> {
        Arc::downgrade(&self.0)
    }
}
