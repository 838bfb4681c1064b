//! The spend ledger in SQLite: spend per (UTC day, backend) and holds of calls in flight.

use assay_domain::StageError;

use rusqlite::params;

use super::{SqliteStore, db_err};
use crate::store::contract::{HoldOutcome, SpendHold, SpendLedger, hold_outcome};

#[async_trait::async_trait]
impl SpendLedger for SqliteStore {
    async fn add_spend(&self, day: &str, backend: &str, nano_usd: i64) -> Result<i64, StageError> {
        let (day, backend) = (day.to_string(), backend.to_string());
        self.with(move |c| {
            c.prepare_cached(
                "INSERT INTO spend (day, backend, nano_usd) VALUES (?1, ?2, ?3)
                 ON CONFLICT (day, backend) DO UPDATE SET nano_usd = nano_usd + excluded.nano_usd
                 RETURNING nano_usd",
            )
            .map_err(db_err)?
            .query_row(params![day, backend, nano_usd], |r| r.get(0))
            .map_err(db_err)
        })
        .await
    }

    async fn hold_spend(&self, hold: &SpendHold, min: i64, cap: i64) -> Result<HoldOutcome, StageError> {
        let hold = hold.clone();
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(db_err)?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
            let expired: i64 = tx
                .query_row(
                    "SELECT COALESCE(SUM(nano_usd), 0) FROM spend_holds WHERE day = ?1 AND backend = ?2 AND expires_at < ?3",
                    params![hold.day, hold.backend, now],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            if expired > 0 {
                tx.execute(
                    "INSERT INTO spend (day, backend, nano_usd) VALUES (?1, ?2, ?3)
                     ON CONFLICT (day, backend) DO UPDATE SET nano_usd = nano_usd + excluded.nano_usd",
                    params![hold.day, hold.backend, expired],
                )
                .map_err(db_err)?;
                tx.execute(
                    "DELETE FROM spend_holds WHERE day = ?1 AND backend = ?2 AND expires_at < ?3",
                    params![hold.day, hold.backend, now],
                )
                .map_err(db_err)?;
            }
            let spent: i64 = tx
                .query_row(
                    "SELECT COALESCE((SELECT nano_usd FROM spend WHERE day = ?1 AND backend = ?2), 0)",
                    params![hold.day, hold.backend],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            let held: i64 = tx
                .query_row(
                    "SELECT COALESCE(SUM(nano_usd), 0) FROM spend_holds WHERE day = ?1 AND backend = ?2",
                    params![hold.day, hold.backend],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            let outcome = hold_outcome(spent, held, cap, min, hold.nano_usd);
            if let HoldOutcome::Granted(n) = outcome {
                tx.execute(
                    "INSERT INTO spend_holds (id, run_id, day, backend, nano_usd, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![hold.id, hold.run_id, hold.day, hold.backend, n, hold.expires_at],
                )
                .map_err(db_err)?;
            }
            tx.commit().map_err(db_err)?;
            Ok(outcome)
        })
        .await
    }

    async fn settle_spend(
        &self,
        day: &str,
        backend: &str,
        id: &str,
        reserved: i64,
        actual: i64,
    ) -> Result<i64, StageError> {
        let (day, backend, id) = (day.to_string(), backend.to_string(), id.to_string());
        self.with(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(db_err)?;
            let removed = tx.execute("DELETE FROM spend_holds WHERE id = ?1", params![id]).map_err(db_err)?;
            // A hold that expired into spend counted `reserved` already.
            let add = if removed == 1 { actual } else { actual - reserved };
            let total: i64 = tx
                .query_row(
                    "INSERT INTO spend (day, backend, nano_usd) VALUES (?1, ?2, MAX(?3, 0))
                     ON CONFLICT (day, backend) DO UPDATE SET nano_usd = MAX(nano_usd + ?3, 0)
                     RETURNING nano_usd",
                    params![day, backend, add],
                    |r| r.get(0),
                )
                .map_err(db_err)?;
            tx.commit().map_err(db_err)?;
            Ok(total)
        })
        .await
    }

    async fn spend(&self, day: &str) -> Result<Vec<(String, i64)>, StageError> {
        let day = day.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT backend, nano_usd FROM spend WHERE day = ?1 ORDER BY backend")
                .map_err(db_err)?;
            let rows = stmt.query_map(params![day], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db_err)?;
            rows.map(|r| r.map_err(db_err)).collect()
        })
        .await
    }

    async fn note_need(&self, day: &str, backend: &str, nano_usd: i64) -> Result<(), StageError> {
        let (day, backend) = (day.to_string(), backend.to_string());
        self.with(move |c| {
            c.prepare_cached(
                "INSERT INTO spend_needs (day, backend, nano_usd) VALUES (?1, ?2, ?3)
                 ON CONFLICT (day, backend) DO UPDATE SET nano_usd = MIN(nano_usd, excluded.nano_usd)",
            )
            .map_err(db_err)?
            .execute(params![day, backend, nano_usd])
            .map_err(db_err)?;
            Ok(())
        })
        .await
    }

    async fn needs(&self, day: &str) -> Result<Vec<(String, i64)>, StageError> {
        let day = day.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT backend, nano_usd FROM spend_needs WHERE day = ?1 ORDER BY backend")
                .map_err(db_err)?;
            let rows = stmt.query_map(params![day], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db_err)?;
            rows.map(|r| r.map_err(db_err)).collect()
        })
        .await
    }
}
