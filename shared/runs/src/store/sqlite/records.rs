//! Open runs' records as rows in SQLite, and results read a page at a time.

use assay_domain::StageError;
use rusqlite::{OptionalExtension, params};

use super::{ENDED, SqliteStore, db_err};
use crate::store::contract::{Appended, NewRecord, RecordStorage, RecordsPage, append, state_refused};

/// One gateway per file: runs are not spread (the defaults refuse).
impl crate::store::contract::ChunkStorage for SqliteStore {}

#[async_trait::async_trait]
impl RecordStorage for SqliteStore {
    async fn append_records(
        &self,
        run_id: &str,
        records: Vec<NewRecord>,
        seal: bool,
        max_total: u64,
    ) -> Result<Appended, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(db_err)?;
            let state: i32 = tx
                .query_row("SELECT state FROM runs WHERE run_id = ?1", params![run_id], |r| r.get(0))
                .optional()
                .map_err(db_err)?
                .ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
            let (total, sealed): (i64, bool) = tx
                .query_row("SELECT total, sealed FROM run_inputs WHERE run_id = ?1", params![run_id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(db_err)?
                .ok_or_else(|| append::not_open(&run_id))?;
            if sealed {
                return Err(append::sealed(&run_id));
            }
            if ENDED.contains(&state) {
                return Err(state_refused(&run_id, state));
            }
            let held = total as u64;
            if held + records.len() as u64 > max_total {
                return Err(append::too_many(held, records.len(), max_total));
            }
            {
                let mut insert = tx
                    .prepare_cached("INSERT INTO run_records (run_id, idx, record_id, record) VALUES (?1, ?2, ?3, ?4)")
                    .map_err(db_err)?;
                for (i, r) in records.iter().enumerate() {
                    match insert.execute(params![run_id, total + i as i64, r.id, r.record]) {
                        Ok(_) => {}
                        Err(rusqlite::Error::SqliteFailure(e, _))
                            if e.code == rusqlite::ErrorCode::ConstraintViolation =>
                        {
                            return Err(append::duplicate(i, &r.id));
                        }
                        Err(e) => return Err(db_err(e)),
                    }
                }
            }
            let new_total = total + records.len() as i64;
            tx.execute(
                "UPDATE run_inputs SET total = ?2, sealed = ?3 WHERE run_id = ?1",
                params![run_id, new_total, seal],
            )
            .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(Appended { first: held, total: new_total as u64, sealed: seal })
        })
        .await
    }

    async fn records(&self, run_id: &str, first: u64, limit: usize) -> Result<RecordsPage, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            let (total, sealed): (i64, bool) = tx
                .query_row("SELECT total, sealed FROM run_inputs WHERE run_id = ?1", params![run_id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(db_err)?
                .ok_or_else(|| StageError::NotFound(format!("run {run_id} has no records as rows")))?;
            let records = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT idx, record FROM run_records WHERE run_id = ?1 AND idx >= ?2 ORDER BY idx LIMIT ?3",
                    )
                    .map_err(db_err)?;
                let first = i64::try_from(first).unwrap_or(i64::MAX);
                let rows = stmt
                    .query_map(params![run_id, first, i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
                        Ok((r.get::<_, i64>(0)? as u64, r.get::<_, Vec<u8>>(1)?))
                    })
                    .map_err(db_err)?;
                rows.collect::<Result<Vec<_>, _>>().map_err(db_err)?
            };
            Ok(RecordsPage { records, total: total as u64, sealed })
        })
        .await
    }

    async fn checkpoints_get(&self, run_id: &str, keys: Vec<String>) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let mut stmt =
                c.prepare_cached("SELECT value FROM checkpoints WHERE run_id = ?1 AND key = ?2").map_err(db_err)?;
            let mut out = Vec::new();
            for key in keys {
                let value: Option<Vec<u8>> =
                    stmt.query_row(params![run_id, key], |r| r.get(0)).optional().map_err(db_err)?;
                if let Some(v) = value {
                    out.push((key, v));
                }
            }
            Ok(out)
        })
        .await
    }

    async fn checkpoints_page(
        &self,
        run_id: &str,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        let (run_id, prefix, after) = (run_id.to_string(), prefix.to_string(), after.to_string());
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT key, value FROM checkpoints
                     WHERE run_id = ?1 AND key > ?2 AND substr(key, 1, ?3) = ?4 ORDER BY key LIMIT ?5",
                )
                .map_err(db_err)?;
            let after = if after.as_str() > prefix.as_str() { after } else { prefix.clone() };
            let rows = stmt
                .query_map(
                    params![run_id, after, prefix.len() as i64, prefix, i64::try_from(limit).unwrap_or(i64::MAX)],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?)),
                )
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
        .await
    }
}
