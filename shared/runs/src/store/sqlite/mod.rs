//! The SQLite run store: one gateway per file (the embedded default).

mod records;
mod spend;

use std::path::Path;
use std::sync::{Arc, Mutex};

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use prost::Message;
use rusqlite::{OptionalExtension, params};

use super::contract::{ControlOutcome, ControlRefusal, PostedControl, RunStorage, RunWrite, StoredRun, state_refused};

/// Run storage in one SQLite file (or in memory); every call runs on a blocking thread.
pub struct SqliteStore {
    location: String,
    conn: Arc<Mutex<rusqlite::Connection>>,
    /// The file's gateway lock, held while the store is open ([`lock_for_one_gateway`]).
    _lock: Option<Arc<std::fs::File>>,
}

/// Take the lock that makes a SQLite file one gateway's: an exclusive `flock` on `<file>.lock`
/// beside it, held while the store is open and released by the kernel when the process ends
/// (a SIGKILL included). A second gateway on a live file would resume the first one's running
/// runs and execute them twice; it is refused, naming the process that holds the file. (A lock
/// file of its own, not the database: SQLite's POSIX locks on the database would be dropped by
/// closing any other descriptor of it.) Within one process the lock is shared: a gateway
/// restarted in the same process (tests do) opens the file again while tasks of the old one still
/// let go of it.
fn lock_for_one_gateway(path: &str) -> Result<Arc<std::fs::File>, StageError> {
    use std::io::{Read, Seek, Write};
    static HELD: Mutex<Vec<(std::path::PathBuf, std::sync::Weak<std::fs::File>)>> = Mutex::new(Vec::new());
    let lock_path = format!("{path}.lock");
    let key =
        std::fs::canonicalize(Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))
            .map(|dir| dir.join(Path::new(&lock_path).file_name().unwrap_or_default()))
            .unwrap_or_else(|_| std::path::PathBuf::from(&lock_path));
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    held.retain(|(_, w)| w.strong_count() > 0);
    if let Some(file) = held.iter().find(|(k, _)| *k == key).and_then(|(_, w)| w.upgrade()) {
        return Ok(file);
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| StageError::Internal(format!("run store lock {lock_path}: {e}")))?;
    match file.try_lock() {
        Ok(()) => {
            // Who holds it, for the message a second gateway gets.
            let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
            let file = Arc::new(file);
            held.push((key, Arc::downgrade(&file)));
            Ok(file)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let by = if holder.is_empty() { String::new() } else { format!(" (process {holder})") };
            Err(StageError::FailedPrecondition(format!(
                "run store {path} is in use by another gateway{by}: a SQLite run store serves one gateway at a \
                 time. Stop the other one, give this one its own file (gateway.store), or share a PostgreSQL \
                 store between several gateways (gateway.store = \"postgres://...\")"
            )))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(StageError::Internal(format!("run store lock {lock_path}: {e}"))),
    }
}

fn db_err(e: rusqlite::Error) -> StageError {
    StageError::Internal(format!("run store: {e}"))
}

fn decode_err(e: prost::DecodeError) -> StageError {
    StageError::Internal(format!("run store: corrupt record: {e}"))
}

fn put_summary(c: &rusqlite::Connection, run: &gw::Run) -> Result<(), StageError> {
    c.prepare_cached("UPDATE runs SET state = ?2, run = ?3 WHERE run_id = ?1")
        .and_then(|mut s| s.execute(params![run.run_id, run.state, run.encode_to_vec()]))
        .map_err(db_err)?;
    Ok(())
}

/// Fails unless the run's stored state is one of `states`.
fn expect_state(c: &rusqlite::Connection, run_id: &str, states: &[i32]) -> Result<(), StageError> {
    let found: Option<i32> = c
        .prepare_cached("SELECT state FROM runs WHERE run_id = ?1")
        .and_then(|mut s| s.query_row(params![run_id], |r| r.get(0)).optional())
        .map_err(db_err)?;
    match found {
        Some(state) if states.contains(&state) => Ok(()),
        Some(state) => Err(state_refused(run_id, state)),
        None => Err(StageError::NotFound(format!("run {run_id}"))),
    }
}

fn put_event(c: &rusqlite::Connection, event: &gw::RunEvent) -> Result<(), StageError> {
    c.prepare_cached("INSERT INTO events (run_id, sequence, event) VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![event.run_id, event.sequence as i64, event.encode_to_vec()]))
        .map_err(db_err)?;
    Ok(())
}

fn put_checkpoint(c: &rusqlite::Connection, run_id: &str, key: &str, value: &[u8]) -> Result<(), StageError> {
    c.prepare_cached("INSERT OR REPLACE INTO checkpoints (run_id, key, value) VALUES (?1, ?2, ?3)")
        .and_then(|mut s| s.execute(params![run_id, key, value]))
        .map_err(db_err)?;
    Ok(())
}

/// Terminal run states, as stored.
const ENDED: [i32; 4] = [
    gw::RunState::Succeeded as i32,
    gw::RunState::Partial as i32,
    gw::RunState::Failed as i32,
    gw::RunState::Cancelled as i32,
];

/// Make the file give back the pages of deleted runs (`auto_vacuum = INCREMENTAL`, pages freed
/// by `PRAGMA incremental_vacuum` after each delete). A new file takes the setting before its
/// first table; a file made before it is rewritten once (`VACUUM`).
fn free_pages_on_delete(c: &rusqlite::Connection) -> Result<(), StageError> {
    const INCREMENTAL: i64 = 2;
    let mode: i64 = c.query_row("PRAGMA auto_vacuum", [], |r| r.get(0)).map_err(db_err)?;
    if mode == INCREMENTAL {
        return Ok(());
    }
    c.execute_batch("PRAGMA auto_vacuum = INCREMENTAL").map_err(db_err)?;
    let tables: i64 =
        c.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| r.get(0)).map_err(db_err)?;
    if tables > 0 {
        tracing::info!("run store: rewriting the file once so deleted runs give their space back");
        c.execute_batch("VACUUM").map_err(db_err)?;
    }
    Ok(())
}

impl SqliteStore {
    /// Open (or create) the store as its gateway; `":memory:"` keeps it in memory. Refused while
    /// another process holds the file ([`lock_for_one_gateway`]).
    pub fn open(path: &str) -> Result<SqliteStore, StageError> {
        Self::open_with(path, true)
    }

    /// Open the store without taking the gateway's lock: to read or prepare a file beside the
    /// gateway that holds it (tests, tools), never to execute its runs.
    pub fn open_unlocked(path: &str) -> Result<SqliteStore, StageError> {
        Self::open_with(path, false)
    }

    fn open_with(path: &str, as_gateway: bool) -> Result<SqliteStore, StageError> {
        let mut lock = None;
        let conn = if path == ":memory:" {
            rusqlite::Connection::open_in_memory()
        } else {
            if let Some(parent) = Path::new(path).parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| StageError::Internal(format!("run store directory {}: {e}", parent.display())))?;
            }
            if as_gateway {
                lock = Some(lock_for_one_gateway(path)?);
            }
            rusqlite::Connection::open(path)
        }
        .map_err(db_err)?;
        free_pages_on_delete(&conn)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA journal_size_limit = 67108864;
             CREATE TABLE IF NOT EXISTS runs (
                 run_id TEXT PRIMARY KEY,
                 created_at INTEGER NOT NULL,
                 state INTEGER NOT NULL,
                 kind INTEGER NOT NULL,
                 run BLOB NOT NULL,
                 request BLOB NOT NULL
             );
             CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at DESC, run_id DESC);
             CREATE TABLE IF NOT EXISTS events (
                 run_id TEXT NOT NULL,
                 sequence INTEGER NOT NULL,
                 event BLOB NOT NULL,
                 PRIMARY KEY (run_id, sequence)
             );
             CREATE TABLE IF NOT EXISTS checkpoints (
                 run_id TEXT NOT NULL,
                 key TEXT NOT NULL,
                 value BLOB NOT NULL,
                 PRIMARY KEY (run_id, key)
             );
             CREATE TABLE IF NOT EXISTS spend (
                 day TEXT NOT NULL,
                 backend TEXT NOT NULL,
                 nano_usd INTEGER NOT NULL,
                 PRIMARY KEY (day, backend)
             );
             CREATE TABLE IF NOT EXISTS spend_holds (
                 id TEXT PRIMARY KEY,
                 run_id TEXT NOT NULL,
                 day TEXT NOT NULL,
                 backend TEXT NOT NULL,
                 nano_usd INTEGER NOT NULL,
                 expires_at INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS spend_holds_day ON spend_holds (day, backend);
             -- Per backend and day, the least a call refused on its daily cap needed.
             CREATE TABLE IF NOT EXISTS spend_needs (
                 day TEXT NOT NULL,
                 backend TEXT NOT NULL,
                 nano_usd INTEGER NOT NULL,
                 PRIMARY KEY (day, backend)
             );
             -- Open runs' records as rows, and per open run how many it holds and whether sealed.
             CREATE TABLE IF NOT EXISTS run_records (
                 run_id TEXT NOT NULL,
                 idx INTEGER NOT NULL,
                 record_id TEXT NOT NULL,
                 record BLOB NOT NULL,
                 PRIMARY KEY (run_id, idx)
             );
             CREATE UNIQUE INDEX IF NOT EXISTS run_records_id ON run_records (run_id, record_id) WHERE record_id <> '';
             CREATE TABLE IF NOT EXISTS run_inputs (
                 run_id TEXT PRIMARY KEY,
                 total INTEGER NOT NULL,
                 sealed INTEGER NOT NULL
             );",
        )
        .map_err(db_err)?;
        Ok(SqliteStore { location: path.to_string(), conn: Arc::new(Mutex::new(conn)), _lock: lock })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StageError> + Send + 'static,
    ) -> Result<T, StageError> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().map_err(|_| StageError::Internal("run store lock poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| StageError::Internal(format!("run store task: {e}")))?
    }
}

#[async_trait::async_trait]
impl RunStorage for SqliteStore {
    fn describe(&self) -> String {
        if self.location == ":memory:" {
            "SQLite in memory (not persisted)".into()
        } else {
            format!("SQLite {}", self.location)
        }
    }

    fn shared(&self) -> bool {
        false
    }

    /// Insert a new run.
    async fn create(&self, run: gw::Run, request: gw::RunPipelineRequest) -> Result<(), StageError> {
        self.with(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            tx.execute(
                "INSERT INTO runs (run_id, created_at, state, kind, run, request) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    run.run_id,
                    run.created_at.map_or(0, |t| t.seconds),
                    run.state,
                    run.kind,
                    run.encode_to_vec(),
                    request.encode_to_vec()
                ],
            )
            .map_err(db_err)?;
            if request.open {
                // An open run: no record yet, not sealed.
                tx.execute("INSERT INTO run_inputs (run_id, total, sealed) VALUES (?1, 0, 0)", params![run.run_id])
                    .map_err(db_err)?;
            }
            tx.commit().map_err(db_err)
        })
        .await
    }

    async fn write(&self, run_id: &str, writes: Vec<RunWrite>) -> Result<(), StageError> {
        if writes.is_empty() {
            return Ok(());
        }
        let run_id = run_id.to_string();
        self.with(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            // Expectations first: nothing is written unless they hold.
            for w in &writes {
                if let RunWrite::Expect(states) = w {
                    expect_state(&tx, &run_id, states)?;
                }
            }
            for w in &writes {
                match w {
                    RunWrite::Event(e) => put_event(&tx, e)?,
                    RunWrite::Checkpoint { key, value } => put_checkpoint(&tx, &run_id, key, value)?,
                    RunWrite::Summary(run) => put_summary(&tx, run)?,
                    RunWrite::Expect(_) => {}
                }
            }
            tx.commit().map_err(db_err)
        })
        .await
    }

    /// Events with sequence > `after`, in order.
    async fn events_after(&self, run_id: &str, after: u64) -> Result<Vec<gw::RunEvent>, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare("SELECT event FROM events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence")
                .map_err(db_err)?;
            // Sequences fit in i64; anything above is past every event.
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            let rows = stmt.query_map(params![run_id, after], |r| r.get::<_, Vec<u8>>(0)).map_err(db_err)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(gw::RunEvent::decode(row.map_err(db_err)?.as_slice()).map_err(decode_err)?);
            }
            Ok(out)
        })
        .await
    }

    async fn events_page(&self, run_id: &str, after: u64, limit: usize) -> Result<Vec<gw::RunEvent>, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT event FROM events WHERE run_id = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3",
                )
                .map_err(db_err)?;
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt.query_map(params![run_id, after, limit], |r| r.get::<_, Vec<u8>>(0)).map_err(db_err)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(gw::RunEvent::decode(row.map_err(db_err)?.as_slice()).map_err(decode_err)?);
            }
            Ok(out)
        })
        .await
    }

    /// A run's checkpoints whose key starts with `prefix`, by key.
    async fn checkpoints(&self, run_id: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        let (run_id, prefix) = (run_id.to_string(), prefix.to_string());
        self.with(move |c| {
            let mut stmt = c
                .prepare(
                    "SELECT key, value FROM checkpoints WHERE run_id = ?1 AND substr(key, 1, ?2) = ?3 ORDER BY key",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![run_id, prefix.len() as i64, prefix], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
                })
                .map_err(db_err)?;
            rows.collect::<Result<Vec<_>, _>>().map_err(db_err)
        })
        .await
    }

    /// One run.
    async fn get(&self, run_id: &str) -> Result<Option<StoredRun>, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let row: Option<(Vec<u8>, Vec<u8>)> = c
                .query_row("SELECT run, request FROM runs WHERE run_id = ?1", params![run_id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(db_err)?;
            row.map(|(run, req)| {
                Ok(StoredRun {
                    run: gw::Run::decode(run.as_slice()).map_err(decode_err)?,
                    request: gw::RunPipelineRequest::decode(req.as_slice()).map_err(decode_err)?,
                })
            })
            .transpose()
        })
        .await
    }

    /// Runs newest first, filtered, `limit` at most, starting after the (created_at, run_id) cursor.
    async fn list(
        &self,
        kind: i32,
        state: i32,
        cursor: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<gw::Run>, StageError> {
        self.with(move |c| {
            let (cur_t, cur_id) = cursor.unwrap_or((i64::MAX, String::new()));
            let mut stmt = c
                .prepare(
                    "SELECT run FROM runs
                     WHERE (?1 = 0 OR kind = ?1) AND (?2 = 0 OR state = ?2)
                       AND (created_at < ?3 OR (created_at = ?3 AND (?4 = '' OR run_id < ?4)))
                     ORDER BY created_at DESC, run_id DESC LIMIT ?5",
                )
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![kind, state, cur_t, cur_id, limit as i64], |r| r.get::<_, Vec<u8>>(0))
                .map_err(db_err)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(gw::Run::decode(row.map_err(db_err)?.as_slice()).map_err(decode_err)?);
            }
            Ok(out)
        })
        .await
    }

    async fn claim_orphans(&self, startup: bool) -> Result<Vec<StoredRun>, StageError> {
        if startup { self.unfinished().await } else { Ok(Vec::new()) }
    }

    async fn renew(&self, _run_ids: &[String]) -> Result<Vec<String>, StageError> {
        Ok(Vec::new())
    }

    async fn release(&self, _run_id: &str) -> Result<(), StageError> {
        Ok(())
    }

    async fn post_control(&self, request: gw::ControlRunRequest) -> Result<i64, StageError> {
        Err(StageError::FailedPrecondition(format!("run {} is not in progress on this gateway", request.run_id)))
    }

    async fn posted_controls(&self, _run_ids: &[String]) -> Result<Vec<PostedControl>, StageError> {
        Ok(Vec::new())
    }

    async fn remove_control(&self, _id: i64) -> Result<(), StageError> {
        Ok(())
    }

    async fn refuse_control(&self, _id: i64, _refusal: ControlRefusal) -> Result<(), StageError> {
        Ok(())
    }

    async fn control_outcome(&self, _id: i64) -> Result<ControlOutcome, StageError> {
        Ok(ControlOutcome::Taken)
    }

    async fn count_by_state(&self) -> Result<Vec<(i32, i64)>, StageError> {
        self.with(|c| {
            let mut stmt =
                c.prepare("SELECT state, COUNT(*) FROM runs GROUP BY state ORDER BY state").map_err(db_err)?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, i32>(0)?, r.get::<_, i64>(1)?))).map_err(db_err)?;
            rows.map(|r| r.map_err(db_err)).collect()
        })
        .await
    }

    async fn delete(&self, run_id: &str) -> Result<gw::Run, StageError> {
        let run_id = run_id.to_string();
        self.with(move |c| {
            let tx = c.transaction().map_err(db_err)?;
            let row: Option<(i32, Vec<u8>)> = tx
                .query_row("SELECT state, run FROM runs WHERE run_id = ?1", params![run_id], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
                .map_err(db_err)?;
            let (state, run) = row.ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
            if !ENDED.contains(&state) {
                return Err(state_refused(&run_id, state));
            }
            for table in ["events", "checkpoints", "run_records", "run_inputs", "runs"] {
                tx.execute(&format!("DELETE FROM {table} WHERE run_id = ?1"), params![run_id]).map_err(db_err)?;
            }
            tx.commit().map_err(db_err)?;
            // The freed pages go back to the file system (auto_vacuum = INCREMENTAL): the
            // pragma frees one page per step, so it is stepped to its end.
            let mut vacuum = c.prepare_cached("PRAGMA incremental_vacuum").map_err(db_err)?;
            let mut steps = vacuum.raw_query();
            while steps.next().map_err(db_err)?.is_some() {}
            gw::Run::decode(run.as_slice()).map_err(decode_err)
        })
        .await
    }

    async fn finished_before(&self, before: i64, limit: usize) -> Result<Vec<String>, StageError> {
        self.with(move |c| {
            let mut stmt = c
                .prepare(
                    "SELECT run_id FROM runs WHERE state IN (?1, ?2, ?3, ?4) AND created_at < ?5
                     ORDER BY created_at, run_id LIMIT ?6",
                )
                .map_err(db_err)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt
                .query_map(params![ENDED[0], ENDED[1], ENDED[2], ENDED[3], before, limit], |r| r.get::<_, String>(0))
                .map_err(db_err)?;
            rows.map(|r| r.map_err(db_err)).collect()
        })
        .await
    }

    async fn hold_store_lease(&self, _name: &str, _seconds: f64) -> Result<bool, StageError> {
        Ok(true)
    }
}

impl SqliteStore {
    /// Runs that were in progress (to resume after a restart).
    async fn unfinished(&self) -> Result<Vec<StoredRun>, StageError> {
        let ended = ENDED;
        self.with(move |c| {
            let mut stmt = c
                .prepare("SELECT run, request FROM runs WHERE state NOT IN (?1, ?2, ?3, ?4) ORDER BY created_at")
                .map_err(db_err)?;
            let rows = stmt
                .query_map(params![ended[0], ended[1], ended[2], ended[3]], |r| {
                    Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, Vec<u8>>(1)?))
                })
                .map_err(db_err)?;
            let mut out = Vec::new();
            for row in rows {
                let (run, req) = row.map_err(db_err)?;
                out.push(StoredRun {
                    run: gw::Run::decode(run.as_slice()).map_err(decode_err)?,
                    request: gw::RunPipelineRequest::decode(req.as_slice()).map_err(decode_err)?,
                });
            }
            Ok(out)
        })
        .await
    }
}
