//! Runs, events, checkpoints, leases and posted controls in PostgreSQL.

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use prost::Message;
use tokio_postgres::types::ToSql;

use super::store::*;
use crate::store::contract::{
    ControlOutcome, ControlRefusal, PostedControl, RunStorage, RunWrite, StoredRun, state_refused,
};

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
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        tx.execute(
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
        if request.open {
            tx.execute("INSERT INTO run_inputs (run_id, total, sealed) VALUES ($1, 0, false)", &[&run.run_id])
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
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

    async fn events_page(&self, run_id: &str, after: u64, limit: usize) -> Result<Vec<gw::RunEvent>, StageError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .client()
            .await?
            .query(
                "SELECT event FROM events WHERE run_id = $1 AND sequence > $2 ORDER BY sequence LIMIT $3",
                &[&run_id, &after, &limit],
            )
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
        if startup {
            // Chunks this gateway's previous process held are free to claim again at once.
            self.client()
                .await?
                .execute(
                    "UPDATE run_chunks SET lease_until = to_timestamp(0) WHERE owner = $1 AND NOT done",
                    &[&self.owner],
                )
                .await
                .map_err(db_err)?;
        }
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

    async fn delete(&self, run_id: &str) -> Result<gw::Run, StageError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let row = tx
            .query_opt("SELECT state, run FROM runs WHERE run_id = $1 FOR UPDATE", &[&run_id])
            .await
            .map_err(db_err)?
            .ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
        let state: i32 = row.get(0);
        if !ENDED.contains(&state) {
            return Err(state_refused(run_id, state));
        }
        let run = gw::Run::decode(row.get::<_, &[u8]>(1)).map_err(decode_err)?;
        for table in ["events", "checkpoints", "controls", "run_records", "run_inputs", "run_chunks", "runs"] {
            tx.execute(&format!("DELETE FROM {table} WHERE run_id = $1"), &[&run_id]).await.map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        Ok(run)
    }

    async fn finished_before(&self, before: i64, limit: usize) -> Result<Vec<String>, StageError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT run_id FROM runs WHERE state = ANY($1) AND created_at < $2
                 ORDER BY created_at, run_id LIMIT $3",
                &[&&ENDED[..], &before, &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn hold_store_lease(&self, name: &str, seconds: f64) -> Result<bool, StageError> {
        let held = self
            .client()
            .await?
            .query_opt(
                "INSERT INTO store_leases (name, owner, lease_until) VALUES ($1, $2, now() + make_interval(secs => $3))
                 ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until
                 WHERE store_leases.owner = EXCLUDED.owner OR store_leases.lease_until <= now()
                 RETURNING owner",
                &[&name, &self.owner, &seconds],
            )
            .await
            .map_err(db_err)?;
        Ok(held.is_some())
    }
}
