//! Open runs spread over the gateways sharing the store: records claimed in chunks
//! (`FOR UPDATE SKIP LOCKED`), each chunk's results written by the claim holding it, a result never
//! replaced once stored.

use std::collections::HashSet;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

use super::store::*;
use crate::store::contract::{Chunk, ChunkCommit, ChunkRow, ChunkStorage, Claim};

const RUNNING: i32 = gw::RunState::Running as i32;

fn index(i: i64) -> u64 {
    u64::try_from(i).unwrap_or(0)
}

fn signed(i: u64) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl ChunkStorage for PostgresStore {
    async fn spread(&self, run_id: &str) -> Result<(), StageError> {
        let n = self
            .client()
            .await?
            .execute("UPDATE run_inputs SET spread = true WHERE run_id = $1", &[&run_id])
            .await
            .map_err(db_err)?;
        if n == 0 {
            return Err(StageError::NotFound(format!("run {run_id} has no records as rows")));
        }
        Ok(())
    }

    async fn claim_chunk(&self, run_id: &str, token: &str, max: u32) -> Result<Claim, StageError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let state: Option<i32> = tx
            .query_opt("SELECT state FROM runs WHERE run_id = $1", &[&run_id])
            .await
            .map_err(db_err)?
            .map(|r| r.get(0));
        let Some(state) = state else { return Err(StageError::NotFound(format!("run {run_id}"))) };
        if state != RUNNING {
            return Ok(Claim::Wait);
        }
        // A chunk whose claim expired first (its gateway stopped or died), lowest first; SKIP
        // LOCKED: gateways claiming together take different chunks instead of queueing.
        let expired = tx
            .query_opt(
                "UPDATE run_chunks SET owner = $2, token = $3, claims = claims + 1,
                        lease_until = now() + make_interval(secs => $4)
                 WHERE (run_id, first) = (
                     SELECT run_id, first FROM run_chunks
                     WHERE run_id = $1 AND NOT done AND lease_until <= now()
                     ORDER BY first LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING first, count",
                &[&run_id, &self.owner, &token, &self.lease_seconds],
            )
            .await
            .map_err(db_err)?;
        if let Some(r) = expired {
            tx.commit().await.map_err(db_err)?;
            let count: i32 = r.get(1);
            return Ok(Claim::Chunk(Chunk {
                first: index(r.get(0)),
                count: u32::try_from(count).unwrap_or(0),
                takeover: true,
            }));
        }
        // Else the next records not in a chunk (the inputs row locked: claims of new records of
        // one run are serialised, and appends wait for them).
        let row = tx
            .query_opt("SELECT total, sealed, chunked FROM run_inputs WHERE run_id = $1 FOR UPDATE", &[&run_id])
            .await
            .map_err(db_err)?
            .ok_or_else(|| StageError::NotFound(format!("run {run_id} has no records as rows")))?;
        let (total, sealed, chunked): (i64, bool, i64) = (row.get(0), row.get(1), row.get(2));
        if chunked < total {
            let count = (total - chunked).min(i64::from(max.max(1)));
            tx.execute("UPDATE run_inputs SET chunked = $2 WHERE run_id = $1", &[&run_id, &(chunked + count)])
                .await
                .map_err(db_err)?;
            let count32 = i32::try_from(count).unwrap_or(i32::MAX);
            tx.execute(
                "INSERT INTO run_chunks (run_id, first, count, owner, token, lease_until)
                 VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
                &[&run_id, &chunked, &count32, &self.owner, &token, &self.lease_seconds],
            )
            .await
            .map_err(db_err)?;
            tx.commit().await.map_err(db_err)?;
            return Ok(Claim::Chunk(Chunk {
                first: index(chunked),
                count: u32::try_from(count).unwrap_or(0),
                takeover: false,
            }));
        }
        let unfinished: i64 = tx
            .query_one("SELECT count(*) FROM run_chunks WHERE run_id = $1 AND NOT done", &[&run_id])
            .await
            .map_err(db_err)?
            .get(0);
        tx.commit().await.map_err(db_err)?;
        Ok(if sealed && unfinished == 0 { Claim::Finished } else { Claim::Wait })
    }

    async fn commit_chunks(&self, run_id: &str, token: &str, commit: ChunkCommit) -> Result<Vec<u64>, StageError> {
        let mut named: Vec<i64> = commit.held.iter().chain(&commit.done).copied().map(signed).collect();
        named.extend(commit.checkpoints.iter().filter_map(|(c, _, _)| c.map(signed)));
        named.sort_unstable();
        named.dedup();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        // Nothing is stored for a run that has ended (cancelled: its executor wrote its result;
        // a finished run ends only once every chunk is done).
        let state: Option<i32> = tx
            .query_opt("SELECT state FROM runs WHERE run_id = $1", &[&run_id])
            .await
            .map_err(db_err)?
            .map(|r| r.get(0));
        if state.is_none_or(|s| ENDED.contains(&s)) {
            return Ok(named.into_iter().map(index).collect());
        }
        // The token's chunks renewed and locked: a claim taking one over waits for this
        // transaction, then finds the lease renewed.
        let held: HashSet<u64> = tx
            .query(
                "UPDATE run_chunks SET lease_until = now() + make_interval(secs => $4)
                 WHERE run_id = $1 AND token = $2 AND NOT done AND first = ANY($3)
                 RETURNING first",
                &[&run_id, &token, &named, &self.lease_seconds],
            )
            .await
            .map_err(db_err)?
            .iter()
            .map(|r| index(r.get(0)))
            .collect();
        let (mut keys, mut values): (Vec<String>, Vec<Vec<u8>>) = (Vec::new(), Vec::new());
        for (chunk, key, value) in commit.checkpoints {
            if chunk.is_none_or(|c| held.contains(&c)) {
                keys.push(key);
                values.push(value);
            }
        }
        if !keys.is_empty() {
            // A result is written once: the first claim to store it wins, a later one is dropped.
            tx.execute(
                "INSERT INTO checkpoints (run_id, key, value)
                 SELECT $1, k, v FROM unnest($2::text[], $3::bytea[]) AS t(k, v)
                 ON CONFLICT (run_id, key) DO NOTHING",
                &[&run_id, &keys, &values],
            )
            .await
            .map_err(db_err)?;
        }
        let done: Vec<i64> = commit.done.iter().filter(|c| held.contains(c)).copied().map(signed).collect();
        if !done.is_empty() {
            tx.execute(
                "UPDATE run_chunks SET done = true WHERE run_id = $1 AND token = $2 AND first = ANY($3)",
                &[&run_id, &token, &done],
            )
            .await
            .map_err(db_err)?;
        }
        if let Some((key, usage)) = &commit.usage {
            // The claim's spend so far, replacing what its last commit stored.
            tx.execute(
                "INSERT INTO checkpoints (run_id, key, value) VALUES ($1, $2, $3)
                 ON CONFLICT (run_id, key) DO UPDATE SET value = EXCLUDED.value",
                &[&run_id, key, usage],
            )
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        Ok(named.into_iter().map(index).filter(|c| !held.contains(c)).collect())
    }

    async fn release_chunks(&self, run_id: &str, token: &str) -> Result<(), StageError> {
        self.client()
            .await?
            .execute(
                "UPDATE run_chunks SET lease_until = to_timestamp(0) WHERE run_id = $1 AND token = $2 AND NOT done",
                &[&run_id, &token],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn chunks(&self, run_id: &str, first: u64) -> Result<Vec<ChunkRow>, StageError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT first, count, owner, token, done, claims FROM run_chunks
                 WHERE run_id = $1 AND first >= $2 ORDER BY first",
                &[&run_id, &signed(first)],
            )
            .await
            .map_err(db_err)?;
        Ok(rows
            .iter()
            .map(|r| ChunkRow {
                first: index(r.get(0)),
                count: u32::try_from(r.get::<_, i32>(1)).unwrap_or(0),
                owner: r.get(2),
                token: r.get(3),
                done: r.get(4),
                claims: u32::try_from(r.get::<_, i32>(5)).unwrap_or(0),
            })
            .collect())
    }

    async fn runs_to_help(&self, limit: usize) -> Result<Vec<String>, StageError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT i.run_id FROM run_inputs i JOIN runs r ON r.run_id = i.run_id
                 WHERE i.spread AND r.state = $2 AND r.owner IS DISTINCT FROM $1
                   AND (i.chunked < i.total OR EXISTS (
                       SELECT 1 FROM run_chunks c
                       WHERE c.run_id = i.run_id AND NOT c.done AND c.lease_until <= now()))
                 ORDER BY r.created_at LIMIT $3",
                &[&self.owner, &RUNNING, &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(db_err)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
