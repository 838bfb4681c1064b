//! Open runs' records as rows in PostgreSQL, and results read a page at a time.

use assay_domain::StageError;

use super::store::*;
use crate::store::contract::{Appended, NewRecord, RecordStorage, RecordsPage, append, state_refused};

#[async_trait::async_trait]
impl RecordStorage for PostgresStore {
    async fn append_records(
        &self,
        run_id: &str,
        records: Vec<NewRecord>,
        seal: bool,
        max_total: u64,
    ) -> Result<Appended, StageError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        // The run's inputs row locked: appends to one run are serialised, whichever gateway takes them.
        let state: i32 = tx
            .query_opt("SELECT state FROM runs WHERE run_id = $1", &[&run_id])
            .await
            .map_err(db_err)?
            .ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?
            .get(0);
        let row = tx
            .query_opt("SELECT total, sealed FROM run_inputs WHERE run_id = $1 FOR UPDATE", &[&run_id])
            .await
            .map_err(db_err)?
            .ok_or_else(|| append::not_open(run_id))?;
        let (total, sealed): (i64, bool) = (row.get(0), row.get(1));
        if sealed {
            return Err(append::sealed(run_id));
        }
        if ENDED.contains(&state) {
            return Err(state_refused(run_id, state));
        }
        let held = total as u64;
        if held + records.len() as u64 > max_total {
            return Err(append::too_many(held, records.len(), max_total));
        }
        let ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
        let bodies: Vec<&[u8]> = records.iter().map(|r| r.record.as_slice()).collect();
        let inserted = tx
            .execute(
                "INSERT INTO run_records (run_id, idx, record_id, record)
                 SELECT $1, $2 + t.i - 1, t.id, t.rec FROM unnest($3::text[], $4::bytea[]) WITH ORDINALITY AS t(id, rec, i)
                 ON CONFLICT DO NOTHING",
                &[&run_id, &total, &ids, &bodies],
            )
            .await
            .map_err(db_err)?;
        if inserted as usize != records.len() {
            // An id the run already holds: which one, then nothing of the append is kept.
            let taken: Vec<String> = tx
                .query(
                    "SELECT record_id FROM run_records WHERE run_id = $1 AND idx < $2 AND record_id = ANY($3)",
                    &[&run_id, &total, &ids],
                )
                .await
                .map_err(db_err)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let i = ids.iter().position(|id| taken.iter().any(|t| t == id)).unwrap_or(0);
            return Err(append::duplicate(i, ids.get(i).copied().unwrap_or_default()));
        }
        let new_total = total + records.len() as i64;
        tx.execute("UPDATE run_inputs SET total = $2, sealed = $3 WHERE run_id = $1", &[&run_id, &new_total, &seal])
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(Appended { first: held, total: new_total as u64, sealed: seal })
    }

    async fn records(&self, run_id: &str, first: u64, limit: usize) -> Result<RecordsPage, StageError> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(db_err)?;
        let row = tx
            .query_opt("SELECT total, sealed FROM run_inputs WHERE run_id = $1", &[&run_id])
            .await
            .map_err(db_err)?
            .ok_or_else(|| StageError::NotFound(format!("run {run_id} has no records as rows")))?;
        let (total, sealed): (i64, bool) = (row.get(0), row.get(1));
        let first = i64::try_from(first).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = tx
            .query(
                "SELECT idx, record FROM run_records WHERE run_id = $1 AND idx >= $2 ORDER BY idx LIMIT $3",
                &[&run_id, &first, &limit],
            )
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        let records = rows.iter().map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, Vec<u8>>(1))).collect();
        Ok(RecordsPage { records, total: total as u64, sealed })
    }

    async fn checkpoints_get(&self, run_id: &str, keys: Vec<String>) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        let rows = self
            .client()
            .await?
            .query("SELECT key, value FROM checkpoints WHERE run_id = $1 AND key = ANY($2)", &[&run_id, &keys])
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn checkpoints_page(
        &self,
        run_id: &str,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        let after = if after > prefix { after } else { prefix };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .client()
            .await?
            .query(
                "SELECT key, value FROM checkpoints
                 WHERE run_id = $1 AND key > $2 AND starts_with(key, $3) ORDER BY key LIMIT $4",
                &[&run_id, &after, &prefix, &limit],
            )
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}
