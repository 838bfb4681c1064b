//! The PostgreSQL run store, shared by several gateways. A run is executed by the gateway whose
//! name is in its `owner` column while its `lease_until` is in the future (time is the database
//! server's, the same for every gateway); writes of a run's events, summary and checkpoints are
//! fenced by that lease.

use std::time::Duration;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use prost::Message;
use tokio_postgres::NoTls;
use tokio_postgres::types::ToSql;

use super::{
    ControlOutcome, ControlRefusal, PostedControl, RunStorage, RunWrite, StoredRun, redact_url, state_refused,
};

/// The schema, one migration per entry, applied in order and recorded in `assay_schema`.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_runs.sql")),
    (2, include_str!("../../migrations/postgres/0002_control_refusals.sql")),
    (3, include_str!("../../migrations/postgres/0003_spend.sql")),
    (4, include_str!("../../migrations/postgres/0004_spend_holds.sql")),
];
/// A run's summary, fenced by this gateway's lease: $1 run, $2 state, $3 summary, $4 owner.
const UPDATE_SUMMARY: &str =
    "UPDATE runs SET state = $2, run = $3 WHERE run_id = $1 AND owner = $4 AND lease_until > now()";
/// One event: $1 run, $2 sequence, $3 event, $4 owner, $5 ended states. A finished run's single
/// event (Evaluate) is written unfenced: the run is nobody's.
const APPEND_EVENT: &str = "INSERT INTO events (run_id, sequence, event)
     SELECT $1, $2, $3 WHERE EXISTS (
         SELECT 1 FROM runs WHERE run_id = $1
           AND ((owner = $4 AND lease_until > now()) OR (owner IS NULL AND state = ANY($5))))";
/// A run's state, its row locked until the transaction ends, fenced: $1 run, $2 owner.
const LOCK_STATE: &str = "SELECT state FROM runs WHERE run_id = $1 AND owner = $2 AND lease_until > now() FOR UPDATE";
/// One checkpoint, fenced: $1 run, $2 key, $3 value, $4 owner.
const PUT_CHECKPOINT: &str = "INSERT INTO checkpoints (run_id, key, value)
     SELECT $1, $2, $3 WHERE EXISTS (
         SELECT 1 FROM runs WHERE run_id = $1 AND owner = $4 AND lease_until > now())
     ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value";

/// The advisory lock gateways starting together take to apply the migrations once.
const MIGRATION_LOCK: i64 = 0x6173_7361_795f_6d67;

/// Terminal run states (SUCCEEDED, PARTIAL, FAILED, CANCELLED), as stored.
const ENDED: [i32; 4] = [
    gw::RunState::Succeeded as i32,
    gw::RunState::Partial as i32,
    gw::RunState::Failed as i32,
    gw::RunState::Cancelled as i32,
];

/// Run storage in a PostgreSQL database.
pub struct PostgresStore {
    pool: Pool,
    url: String,
    owner: String,
    lease_seconds: f64,
}

/// An error with its causes ("error connecting to server: Connection refused ...").
fn chain(e: &dyn std::error::Error) -> String {
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

fn db_err(e: tokio_postgres::Error) -> StageError {
    if e.as_db_error().is_some() {
        StageError::Internal(format!("run store: {}", chain(&e)))
    } else {
        StageError::Unavailable(format!("run store: {}", chain(&e)))
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StageError {
    StageError::Unavailable(format!("run store: {}", chain(&e)))
}

fn decode_err(e: prost::DecodeError) -> StageError {
    StageError::Internal(format!("run store: corrupt record: {e}"))
}

/// A write refused because this gateway no longer holds the run's lease.
fn lease_lost(run_id: &str) -> StageError {
    StageError::FailedPrecondition(format!("run {run_id}: this gateway no longer holds its lease"))
}

fn stored(run: &[u8], request: &[u8]) -> Result<StoredRun, StageError> {
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
        let invalid = |e: String| StageError::invalid("gateway.store", format!("{shown}: {e}"));
        let (pg_url, tls) = super::pg_tls::split(url).map_err(invalid)?;
        let config: tokio_postgres::Config =
            pg_url.parse().map_err(|e: tokio_postgres::Error| invalid(e.to_string()))?;
        let manager_config = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match super::pg_tls::connector(&tls).map_err(invalid)? {
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

    async fn migrate(&self) -> Result<(), StageError> {
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

    async fn client(&self) -> Result<deadpool_postgres::Object, StageError> {
        self.pool.get().await.map_err(pool_err)
    }

    /// This gateway's name in the store.
    pub fn owner(&self) -> &str {
        &self.owner
    }
}

#[async_trait::async_trait]
impl RunStorage for PostgresStore {
    fn describe(&self) -> String {
        format!("PostgreSQL {} (gateway {}, leases of {} s)", self.url, self.owner, self.lease_seconds)
    }

    fn shared(&self) -> bool {
        true
    }

    async fn create(&self, run: gw::Run, request: gw::RunPipelineRequest) -> Result<(), StageError> {
        // A finished run (Evaluate) is stored unowned.
        let owner = (!ENDED.contains(&run.state)).then_some(self.owner.as_str());
        self.client()
            .await?
            .execute(
                "INSERT INTO runs (run_id, created_at, state, kind, run, request, owner, lease_until)
                 VALUES ($1, $2, $3, $4, $5, $6, $7::text,
                         CASE WHEN $7::text IS NULL THEN NULL ELSE now() + make_interval(secs => $8) END)",
                &[
                    &run.run_id,
                    &run.created_at.map_or(0, |t| t.seconds),
                    &run.state,
                    &run.kind,
                    &run.encode_to_vec(),
                    &request.encode_to_vec(),
                    &owner,
                    &self.lease_seconds,
                ],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn write(&self, run_id: &str, writes: Vec<RunWrite>) -> Result<(), StageError> {
        if writes.is_empty() {
            return Ok(());
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        // Expectations first, the run's row locked: nothing is written unless they hold, and no
        // other transaction changes its state before this one ends.
        let (expected, writes): (Vec<RunWrite>, Vec<RunWrite>) =
            writes.into_iter().partition(|w| matches!(w, RunWrite::Expect(_)));
        for w in expected {
            let RunWrite::Expect(states) = w else { continue };
            let row = tx.query_opt(LOCK_STATE, &[&run_id, &self.owner]).await.map_err(db_err)?;
            match row.map(|r| r.get::<_, i32>(0)) {
                Some(state) if states.contains(&state) => {}
                Some(state) => return Err(state_refused(run_id, state)),
                None => return Err(lease_lost(run_id)),
            }
        }
        if writes.is_empty() {
            return tx.commit().await.map_err(db_err);
        }
        let (append, checkpoint, summary) = futures::try_join!(
            tx.prepare_cached(APPEND_EVENT),
            tx.prepare_cached(PUT_CHECKPOINT),
            tx.prepare_cached(UPDATE_SUMMARY)
        )
        .map_err(db_err)?;
        // Owned parameters first, then every statement sent at once (one connection pipelines
        // them) and applied in order; each is fenced by this gateway's lease, like the single writes.
        type Param = Box<dyn ToSql + Sync + Send>;
        fn param(v: impl ToSql + Sync + Send + 'static) -> Param {
            Box::new(v)
        }
        let owner = || param(self.owner.clone());
        let rows: Vec<(&tokio_postgres::Statement, Vec<Param>)> = writes
            .into_iter()
            .filter_map(|w| match w {
                RunWrite::Event(e) => Some((
                    &append,
                    vec![
                        param(e.run_id.clone()),
                        param(i64::try_from(e.sequence).unwrap_or(i64::MAX)),
                        param(e.encode_to_vec()),
                        owner(),
                        param(ENDED.to_vec()),
                    ],
                )),
                RunWrite::Checkpoint { key, value } => {
                    Some((&checkpoint, vec![param(run_id.to_string()), param(key), param(value), owner()]))
                }
                RunWrite::Summary(run) => Some((
                    &summary,
                    vec![param(run.run_id.clone()), param(run.state), param(run.encode_to_vec()), owner()],
                )),
                // Checked above.
                RunWrite::Expect(_) => None,
            })
            .collect();
        let counts = futures::future::try_join_all(rows.iter().map(|(statement, params)| {
            let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
            let tx = &tx;
            async move { tx.execute(*statement, &params).await }
        }))
        .await
        .map_err(db_err)?;
        if counts.contains(&0) {
            return Err(lease_lost(run_id));
        }
        tx.commit().await.map_err(db_err)
    }

    async fn events_after(&self, run_id: &str, after: u64) -> Result<Vec<gw::RunEvent>, StageError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let rows = self
            .client()
            .await?
            .query("SELECT event FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence", &[&run_id, &after])
            .await
            .map_err(db_err)?;
        rows.iter().map(|r| gw::RunEvent::decode(r.get::<_, &[u8]>(0)).map_err(decode_err)).collect()
    }

    async fn checkpoints(&self, run_id: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT key, value FROM checkpoints WHERE run_id = $1 AND starts_with(key, $2) ORDER BY key",
                &[&run_id, &prefix],
            )
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn get(&self, run_id: &str) -> Result<Option<StoredRun>, StageError> {
        let row = self
            .client()
            .await?
            .query_opt("SELECT run, request FROM runs WHERE run_id = $1", &[&run_id])
            .await
            .map_err(db_err)?;
        row.map(|r| stored(r.get(0), r.get(1))).transpose()
    }

    async fn list(
        &self,
        kind: i32,
        state: i32,
        cursor: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<gw::Run>, StageError> {
        let (cur_t, cur_id) = cursor.unwrap_or((i64::MAX, String::new()));
        let rows = self
            .client()
            .await?
            .query(
                "SELECT run FROM runs
                 WHERE ($1::int4 = 0 OR kind = $1) AND ($2::int4 = 0 OR state = $2)
                   AND (created_at < $3 OR (created_at = $3 AND ($4::text = '' OR run_id < $4)))
                 ORDER BY created_at DESC, run_id DESC LIMIT $5",
                &[&kind, &state, &cur_t, &cur_id, &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(db_err)?;
        rows.iter().map(|r| gw::Run::decode(r.get::<_, &[u8]>(0)).map_err(decode_err)).collect()
    }

    async fn claim_orphans(&self, startup: bool) -> Result<Vec<StoredRun>, StageError> {
        // SKIP LOCKED: gateways scanning together split the orphans instead of queueing.
        let rows = self
            .client()
            .await?
            .query(
                "UPDATE runs SET owner = $1, lease_until = now() + make_interval(secs => $2)
                 WHERE run_id IN (
                     SELECT run_id FROM runs
                     WHERE state <> ALL($3)
                       AND (owner IS NULL OR lease_until IS NULL OR lease_until <= now() OR ($4 AND owner = $1))
                     FOR UPDATE SKIP LOCKED)
                 RETURNING run, request, created_at, run_id",
                &[&self.owner, &self.lease_seconds, &&ENDED[..], &startup],
            )
            .await
            .map_err(db_err)?;
        let mut rows: Vec<_> = rows.iter().map(|r| ((r.get::<_, i64>(2), r.get::<_, String>(3)), r)).collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.into_iter().map(|(_, r)| stored(r.get(0), r.get(1))).collect()
    }

    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StageError> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let kept = self
            .client()
            .await?
            .query(
                "UPDATE runs SET lease_until = now() + make_interval(secs => $2)
                 WHERE run_id = ANY($3) AND owner = $1 AND lease_until > now()
                 RETURNING run_id",
                &[&self.owner, &self.lease_seconds, &run_ids],
            )
            .await
            .map_err(db_err)?;
        let kept: std::collections::HashSet<String> = kept.iter().map(|r| r.get(0)).collect();
        Ok(run_ids.iter().filter(|r| !kept.contains(*r)).cloned().collect())
    }

    async fn release(&self, run_id: &str) -> Result<(), StageError> {
        self.client()
            .await?
            .execute("UPDATE runs SET lease_until = now() WHERE run_id = $1 AND owner = $2", &[&run_id, &self.owner])
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn post_control(&self, request: gw::ControlRunRequest) -> Result<i64, StageError> {
        let row = self
            .client()
            .await?
            .query_one(
                "INSERT INTO controls (run_id, request) VALUES ($1, $2) RETURNING id",
                &[&request.run_id, &request.encode_to_vec()],
            )
            .await
            .map_err(db_err)?;
        Ok(row.get(0))
    }

    async fn posted_controls(&self, run_ids: &[String]) -> Result<Vec<PostedControl>, StageError> {
        if run_ids.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self
            .client()
            .await?
            .query(
                "SELECT id, request FROM controls WHERE run_id = ANY($1) AND refused_code IS NULL ORDER BY id",
                &[&run_ids],
            )
            .await
            .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                Ok(PostedControl {
                    id: r.get(0),
                    request: gw::ControlRunRequest::decode(r.get::<_, &[u8]>(1)).map_err(decode_err)?,
                })
            })
            .collect()
    }

    async fn remove_control(&self, id: i64) -> Result<(), StageError> {
        self.client().await?.execute("DELETE FROM controls WHERE id = $1", &[&id]).await.map_err(db_err)?;
        Ok(())
    }

    async fn refuse_control(&self, id: i64, refusal: ControlRefusal) -> Result<(), StageError> {
        self.client()
            .await?
            .execute(
                "UPDATE controls SET refused_code = $2, refused_message = $3, refused_details = $4 WHERE id = $1",
                &[&id, &refusal.code, &refusal.message, &refusal.details],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn control_outcome(&self, id: i64) -> Result<ControlOutcome, StageError> {
        let row = self
            .client()
            .await?
            .query_opt("SELECT refused_code, refused_message, refused_details FROM controls WHERE id = $1", &[&id])
            .await
            .map_err(db_err)?;
        Ok(match row {
            None => ControlOutcome::Taken,
            Some(r) => match r.get::<_, Option<i32>>(0) {
                None => ControlOutcome::Pending,
                Some(code) => ControlOutcome::Refused(ControlRefusal {
                    code,
                    message: r.get::<_, Option<String>>(1).unwrap_or_default(),
                    details: r.get::<_, Option<Vec<u8>>>(2).unwrap_or_default(),
                }),
            },
        })
    }

    async fn count_by_state(&self) -> Result<Vec<(i32, i64)>, StageError> {
        let rows = self
            .client()
            .await?
            .query("SELECT state, COUNT(*) FROM runs GROUP BY state ORDER BY state", &[])
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| (r.get::<_, i32>(0), r.get::<_, i64>(1))).collect())
    }

    async fn add_spend(&self, day: &str, backend: &str, nano_usd: i64) -> Result<i64, StageError> {
        let row = self
            .client()
            .await?
            .query_one(
                "INSERT INTO spend (day, backend, nano_usd) VALUES ($1::text::date, $2, $3)
                 ON CONFLICT (day, backend) DO UPDATE SET nano_usd = spend.nano_usd + EXCLUDED.nano_usd
                 RETURNING nano_usd",
                &[&day, &backend, &nano_usd],
            )
            .await
            .map_err(db_err)?;
        Ok(row.get(0))
    }

    async fn hold_spend(&self, hold: &super::SpendHold, min: i64, cap: i64) -> Result<super::HoldOutcome, StageError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        // The day's row, locked until the transaction ends: every gateway's holds on this
        // (day, backend) take turns.
        tx.execute(
            "INSERT INTO spend (day, backend, nano_usd) VALUES ($1::text::date, $2, 0) ON CONFLICT (day, backend) DO NOTHING",
            &[&hold.day, &hold.backend],
        )
        .await
        .map_err(db_err)?;
        let spent: i64 = tx
            .query_one(
                "SELECT nano_usd FROM spend WHERE day = $1::text::date AND backend = $2 FOR UPDATE",
                &[&hold.day, &hold.backend],
            )
            .await
            .map_err(db_err)?
            .get(0);
        let expired: i64 = tx
            .query_one(
                "WITH gone AS (DELETE FROM spend_holds WHERE day = $1::text::date AND backend = $2
                   AND expires_at < now() RETURNING nano_usd)
                 SELECT COALESCE(SUM(nano_usd), 0)::BIGINT FROM gone",
                &[&hold.day, &hold.backend],
            )
            .await
            .map_err(db_err)?
            .get(0);
        let spent = if expired > 0 {
            tx.query_one(
                "UPDATE spend SET nano_usd = nano_usd + $3::BIGINT WHERE day = $1::text::date AND backend = $2 RETURNING nano_usd",
                &[&hold.day, &hold.backend, &expired],
            )
            .await
            .map_err(db_err)?
            .get(0)
        } else {
            spent
        };
        let held: i64 = tx
            .query_one(
                "SELECT COALESCE(SUM(nano_usd), 0)::BIGINT FROM spend_holds WHERE day = $1::text::date AND backend = $2",
                &[&hold.day, &hold.backend],
            )
            .await
            .map_err(db_err)?
            .get(0);
        let outcome = super::hold_outcome(spent, held, cap, min, hold.nano_usd);
        if let super::HoldOutcome::Granted(n) = outcome {
            tx.execute(
                "INSERT INTO spend_holds (id, run_id, day, backend, nano_usd, expires_at)
                 VALUES ($1, $2, $3::text::date, $4, $5::BIGINT, to_timestamp($6::BIGINT::DOUBLE PRECISION))",
                &[&hold.id, &hold.run_id, &hold.day, &hold.backend, &n, &hold.expires_at],
            )
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        Ok(outcome)
    }

    async fn settle_spend(
        &self,
        day: &str,
        backend: &str,
        id: &str,
        reserved: i64,
        actual: i64,
    ) -> Result<i64, StageError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let removed = tx.execute("DELETE FROM spend_holds WHERE id = $1", &[&id]).await.map_err(db_err)?;
        // A hold that expired into spend counted `reserved` already.
        let add = if removed == 1 { actual } else { actual - reserved };
        let total: i64 = tx
            .query_one(
                "INSERT INTO spend (day, backend, nano_usd) VALUES ($1::text::date, $2, GREATEST($3::BIGINT, 0))
                 ON CONFLICT (day, backend) DO UPDATE SET nano_usd = GREATEST(spend.nano_usd + $3::BIGINT, 0)
                 RETURNING nano_usd",
                &[&day, &backend, &add],
            )
            .await
            .map_err(db_err)?
            .get(0);
        tx.commit().await.map_err(db_err)?;
        Ok(total)
    }

    async fn spend(&self, day: &str) -> Result<Vec<(String, i64)>, StageError> {
        let rows = self
            .client()
            .await?
            .query("SELECT backend, nano_usd FROM spend WHERE day = $1::text::date ORDER BY backend", &[&day])
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))).collect())
    }
}
