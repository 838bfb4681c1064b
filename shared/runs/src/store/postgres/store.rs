//! The PostgreSQL store: its pool, migrations and the helpers its parts share.

use std::time::Duration;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use prost::Message;
use tokio_postgres::NoTls;

use crate::store::contract::StoredRun;

/// The schema, one migration per entry, applied in order and recorded in `assay_schema`.
pub(super) const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../../migrations/postgres/0001_runs.sql")),
    (2, include_str!("../../../migrations/postgres/0002_control_refusals.sql")),
    (3, include_str!("../../../migrations/postgres/0003_spend.sql")),
    (4, include_str!("../../../migrations/postgres/0004_spend_holds.sql")),
    (5, include_str!("../../../migrations/postgres/0005_retention.sql")),
    (6, include_str!("../../../migrations/postgres/0006_run_records.sql")),
    (7, include_str!("../../../migrations/postgres/0007_run_chunks.sql")),
    (8, include_str!("../../../migrations/postgres/0008_spend_needs.sql")),
];
/// A run's summary, fenced by this gateway's lease: $1 run, $2 state, $3 summary, $4 owner.
pub(super) const UPDATE_SUMMARY: &str =
    "UPDATE runs SET state = $2, run = $3 WHERE run_id = $1 AND owner = $4 AND lease_until > now()";
/// One event: $1 run, $2 sequence, $3 event, $4 owner, $5 ended states. A finished run's single
/// event (Evaluate) is written unfenced: the run is nobody's.
pub(super) const APPEND_EVENT: &str = "INSERT INTO events (run_id, sequence, event)
     SELECT $1, $2, $3 WHERE EXISTS (
         SELECT 1 FROM runs WHERE run_id = $1
           AND ((owner = $4 AND lease_until > now()) OR (owner IS NULL AND state = ANY($5))))";
/// A run's state, its row locked until the transaction ends, fenced: $1 run, $2 owner.
pub(super) const LOCK_STATE: &str =
    "SELECT state FROM runs WHERE run_id = $1 AND owner = $2 AND lease_until > now() FOR UPDATE";
/// One checkpoint, fenced: $1 run, $2 key, $3 value, $4 owner.
pub(super) const PUT_CHECKPOINT: &str = "INSERT INTO checkpoints (run_id, key, value)
     SELECT $1, $2, $3 WHERE EXISTS (
         SELECT 1 FROM runs WHERE run_id = $1 AND owner = $4 AND lease_until > now())
     ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value";

/// The advisory lock gateways starting together take to apply the migrations once.
pub(super) const MIGRATION_LOCK: i64 = 0x6173_7361_795f_6d67;

/// Terminal run states (SUCCEEDED, PARTIAL, FAILED, CANCELLED), as stored.
pub(super) const ENDED: [i32; 4] = [
    gw::RunState::Succeeded as i32,
    gw::RunState::Partial as i32,
    gw::RunState::Failed as i32,
    gw::RunState::Cancelled as i32,
];

/// Run storage in a PostgreSQL database.
pub struct PostgresStore {
    pub(super) pool: Pool,
    pub(super) url: String,
    pub(super) owner: String,
    pub(super) lease_seconds: f64,
}

/// An error with its causes ("error connecting to server: Connection refused ...").
pub(super) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

pub(super) fn db_err(e: tokio_postgres::Error) -> StageError {
    if e.as_db_error().is_some() {
        StageError::Internal(format!("run store: {}", chain(&e)))
    } else {
        StageError::Unavailable(format!("run store: {}", chain(&e)))
    }
}

pub(super) fn pool_err(e: deadpool_postgres::PoolError) -> StageError {
    StageError::Unavailable(format!("run store: {}", chain(&e)))
}

pub(super) fn decode_err(e: prost::DecodeError) -> StageError {
    StageError::Internal(format!("run store: corrupt record: {e}"))
}

/// A write refused because this gateway no longer holds the run's lease.
pub(super) fn lease_lost(run_id: &str) -> StageError {
    StageError::FailedPrecondition(format!("run {run_id}: this gateway no longer holds its lease"))
}

pub(super) fn stored(run: &[u8], request: &[u8]) -> Result<StoredRun, StageError> {
    Ok(StoredRun {
        run: gw::Run::decode(run).map_err(decode_err)?,
        request: gw::RunPipelineRequest::decode(request).map_err(decode_err)?,
    })
}

impl PostgresStore {
    /// Connect, and bring the schema up to date (under an advisory lock, so gateways starting
    /// together apply each migration once).
    pub async fn connect(url: &str, owner: String, lease: Duration) -> Result<PostgresStore, StageError> {
        let shown = redact_url(url);
        let invalid = |e: &dyn std::fmt::Display| StageError::invalid("gateway.store", format!("{shown}: {e}"));
        let (pg_url, tls) = super::tls::split(url).map_err(|e| invalid(&e))?;
        let config: tokio_postgres::Config = pg_url.parse().map_err(|e: tokio_postgres::Error| invalid(&e))?;
        let manager_config = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match super::tls::connector(&tls).map_err(|e| invalid(&e))? {
            Some(connector) => Manager::from_config(config, connector, manager_config),
            None => Manager::from_config(config, NoTls, manager_config),
        };
        let pool = Pool::builder(manager)
            .max_size(16)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(10)))
            .build()
            .map_err(|e| StageError::Internal(format!("run store {shown}: {e}")))?;
        let store = PostgresStore { pool, url: shown, owner, lease_seconds: lease.as_secs_f64() };
        if let Err(e) = store.migrate().await {
            // Every error of `migrate` is one of these two.
            #[allow(clippy::wildcard_enum_match_arm)]
            let why = match e {
                StageError::Unavailable(m) | StageError::Internal(m) => m,
                other => other.to_string(),
            };
            return Err(StageError::Unavailable(format!("{why} ({})", store.url)));
        }
        let encrypted = store.encrypted().await?;
        tracing::info!(store = %store.url, tls = encrypted, "run store connected");
        Ok(store)
    }

    /// Whether this gateway's connections to the database are encrypted (TLS).
    pub async fn encrypted(&self) -> Result<bool, StageError> {
        let row = self
            .client()
            .await?
            .query_opt("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
            .await
            .map_err(db_err)?;
        Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
    }

    pub(super) async fn migrate(&self) -> Result<(), StageError> {
        let mut client = self.pool.get().await.map_err(pool_err)?;
        let tx = client.transaction().await.map_err(db_err)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await.map_err(db_err)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS assay_schema (
                 version INTEGER PRIMARY KEY,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await
        .map_err(db_err)?;
        let current: i32 =
            tx.query_one("SELECT coalesce(max(version), 0) FROM assay_schema", &[]).await.map_err(db_err)?.get(0);
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql).await.map_err(db_err)?;
            tx.execute("INSERT INTO assay_schema (version) VALUES ($1)", &[version]).await.map_err(db_err)?;
            tracing::info!(version, "run store schema migrated");
        }
        tx.commit().await.map_err(db_err)
    }

    pub(super) async fn client(&self) -> Result<deadpool_postgres::Object, StageError> {
        self.pool.get().await.map_err(pool_err)
    }

    /// This gateway's name in the store.
    pub fn owner(&self) -> &str {
        &self.owner
    }
}

/// `url` with its password replaced, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("redacted"));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => "<unparseable url>".into(),
    }
}
