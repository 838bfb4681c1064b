//! The spend ledger in PostgreSQL: spend per (UTC day, backend) and holds of calls in flight.

use assay_domain::StageError;

use super::store::*;
use crate::store::contract::{HoldOutcome, SpendHold, SpendLedger, hold_outcome};

#[async_trait::async_trait]
impl SpendLedger for PostgresStore {
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

    async fn hold_spend(&self, hold: &SpendHold, min: i64, cap: i64) -> Result<HoldOutcome, StageError> {
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
        let outcome = hold_outcome(spent, held, cap, min, hold.nano_usd);
        if let HoldOutcome::Granted(n) = outcome {
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

    async fn note_need(&self, day: &str, backend: &str, nano_usd: i64) -> Result<(), StageError> {
        self.client()
            .await?
            .execute(
                "INSERT INTO spend_needs (day, backend, nano_usd) VALUES ($1::text::date, $2, $3)
                 ON CONFLICT (day, backend) DO UPDATE SET nano_usd = LEAST(spend_needs.nano_usd, EXCLUDED.nano_usd)",
                &[&day, &backend, &nano_usd],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn needs(&self, day: &str) -> Result<Vec<(String, i64)>, StageError> {
        let rows = self
            .client()
            .await?
            .query("SELECT backend, nano_usd FROM spend_needs WHERE day = $1::text::date ORDER BY backend", &[&day])
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1))).collect())
    }
}
