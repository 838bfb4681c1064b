//! What a run store is: the storage traits the engine uses and the values that cross them.

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

/// A stored run with the request that started it.
#[derive(Debug, Clone)]
pub struct StoredRun {
    pub run: gw::Run,
    pub request: gw::RunPipelineRequest,
}

/// A control request waiting for the gateway that executes its run.
#[derive(Debug, Clone)]
pub struct PostedControl {
    pub id: i64,
    pub request: gw::ControlRunRequest,
}

/// Why the executing gateway refused a posted control: the gRPC status it would have answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlRefusal {
    pub code: i32,
    pub message: String,
    pub details: Vec<u8>,
}

/// Where a posted control stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlOutcome {
    /// Not taken yet.
    Pending,
    /// Taken and applied (its row is gone).
    Taken,
    /// Refused by the executing gateway.
    Refused(ControlRefusal),
}

/// One write of a run's state, applied with others by [`RunStorage::write`].
#[derive(Debug, Clone, PartialEq)]
pub enum RunWrite {
    /// Append an event (sequences assigned by the run's writer, gap-free).
    Event(Box<gw::RunEvent>),
    /// Store a checkpoint under `key`, replacing the one stored there.
    Checkpoint { key: String, value: Vec<u8> },
    /// Replace the run's summary.
    Summary(Box<gw::Run>),
    /// The run's stored state must be one of these (`RunState` numbers), checked in the
    /// transaction before any other write of the batch: else none is applied and the write fails
    /// with FAILED_PRECONDITION naming the state found ([`state_refused`]). How a control's state
    /// check and its audit entry are made atomic.
    Expect(Vec<i32>),
}

/// The error of a write whose expected states ([`RunWrite::Expect`]) did not hold.
pub fn state_refused(run_id: &str, found: i32) -> StageError {
    let name = gw::RunState::try_from(found).map(|s| s.as_str_name()).unwrap_or("RUN_STATE_UNKNOWN");
    StageError::FailedPrecondition(format!("run {run_id} is {name}"))
}

/// Run storage behind the engine.
#[async_trait::async_trait]
pub trait RunStorage: SpendLedger + RecordStorage + ChunkStorage + Send + Sync {
    /// What the store is, for logs (no secrets).
    fn describe(&self) -> String;
    /// Whether several gateways share it (leases, takeover and cross-gateway watching apply).
    fn shared(&self) -> bool;
    /// Insert a new run, owned by this gateway; a request with `open` set makes the run take
    /// records as rows ([`RecordStorage::append_records`]).
    async fn create(&self, run: gw::Run, request: gw::RunPipelineRequest) -> Result<(), StageError>;
    /// Apply `writes` of run `run_id` in order, in one transaction: all of them or none. The run's
    /// writer hands over everything queued since its last write at once (group commit), so a run
    /// pays one transaction per batch instead of one per event and checkpoint.
    async fn write(&self, run_id: &str, writes: Vec<RunWrite>) -> Result<(), StageError>;
    /// Events with sequence > `after`, in order.
    async fn events_after(&self, run_id: &str, after: u64) -> Result<Vec<gw::RunEvent>, StageError>;
    /// At most `limit` events with sequence > `after`, in order (a run's log read a page at a
    /// time).
    async fn events_page(&self, run_id: &str, after: u64, limit: usize) -> Result<Vec<gw::RunEvent>, StageError>;
    /// A run's checkpoints whose key starts with `prefix`, by key.
    async fn checkpoints(&self, run_id: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StageError>;
    /// One run.
    async fn get(&self, run_id: &str) -> Result<Option<StoredRun>, StageError>;
    /// Runs newest first, filtered, `limit` at most, starting after the (created_at, run_id) cursor.
    async fn list(
        &self,
        kind: i32,
        state: i32,
        cursor: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<gw::Run>, StageError>;
    /// Take the unfinished runs no gateway executes (their lease expired, or was released) and
    /// return them, now leased to this gateway. At `startup`, also the runs leased to this
    /// gateway's own name (a restarted process takes its runs back at once). A store with one
    /// gateway returns every unfinished run at startup and nothing afterwards.
    async fn claim_orphans(&self, startup: bool) -> Result<Vec<StoredRun>, StageError>;
    /// Extend this gateway's leases on `run_ids`; returns the ones it no longer holds.
    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StageError>;
    /// Give up this gateway's lease on a run it stops executing without ending it (shutdown),
    /// so another gateway takes it over at once.
    async fn release(&self, run_id: &str) -> Result<(), StageError>;
    /// Leave a control for the gateway executing `request.run_id`.
    async fn post_control(&self, request: gw::ControlRunRequest) -> Result<i64, StageError>;
    /// Controls posted for any of `run_ids`, oldest first.
    async fn posted_controls(&self, run_ids: &[String]) -> Result<Vec<PostedControl>, StageError>;
    /// Remove a posted control (taken, or refused).
    async fn remove_control(&self, id: i64) -> Result<(), StageError>;
    /// Record that the executing gateway refused a posted control (the row stays, out of
    /// [`RunStorage::posted_controls`], until its poster reads the refusal and removes it).
    async fn refuse_control(&self, id: i64, refusal: ControlRefusal) -> Result<(), StageError>;
    /// Where a posted control stands.
    async fn control_outcome(&self, id: i64) -> Result<ControlOutcome, StageError>;
    /// How many runs the store holds in each state (`RunState` numbers; states with none left out).
    async fn count_by_state(&self) -> Result<Vec<(i32, i64)>, StageError>;
    /// Delete finished run `run_id` with its events, checkpoints (audit entries among them) and
    /// posted controls, in one transaction, and return its summary as it was; the space is given
    /// back to the file system where the store can (SQLite's incremental vacuum). NOT_FOUND when
    /// there is no such run, FAILED_PRECONDITION naming its state ([`state_refused`]) when it has
    /// not finished.
    async fn delete(&self, run_id: &str) -> Result<gw::Run, StageError>;
    /// Ids of finished runs created before `before` (seconds since the Unix epoch), oldest
    /// first, `limit` at most.
    async fn finished_before(&self, before: i64, limit: usize) -> Result<Vec<String>, StageError>;
    /// Take, or extend, the store-wide lease `name` for `seconds`: true while this gateway holds
    /// it (one gateway at a time does store-wide chores, such as the retention sweep). A store of
    /// one gateway always holds it.
    async fn hold_store_lease(&self, name: &str, seconds: f64) -> Result<bool, StageError>;
}

/// The spend ledger behind the daily caps: spend per (UTC day, backend) and the holds of calls in
/// flight, atomic with every gateway sharing the store.
#[async_trait::async_trait]
pub trait SpendLedger: Send + Sync {
    /// Add `nano_usd` (1e-9 USD) to `backend`'s spend on UTC `day` (`YYYY-MM-DD`), atomically
    /// with every other gateway sharing the store; returns the day's total after the addition.
    async fn add_spend(&self, day: &str, backend: &str, nano_usd: i64) -> Result<i64, StageError>;
    /// Every backend's spend on UTC `day`, nano-dollars.
    async fn spend(&self, day: &str) -> Result<Vec<(String, i64)>, StageError>;
    /// A call on `backend` needed `nano_usd` on UTC `day` and its cap could not hold it: kept
    /// (the least such need of the day) for every gateway and process sharing the store.
    async fn note_need(&self, day: &str, backend: &str, nano_usd: i64) -> Result<(), StageError>;
    /// Every backend's least refused need on UTC `day` ([`SpendLedger::note_need`]).
    async fn needs(&self, day: &str) -> Result<Vec<(String, i64)>, StageError>;
    /// Hold part of `hold.backend`'s daily cap `cap` on `hold.day` for a call about to spend,
    /// atomically with every other gateway sharing the store: at least `min` and up to
    /// `hold.nano_usd` nano-dollars of what neither the day's spend nor live holds take. Holds
    /// past their `expires_at` (their gateway died with the calls in flight) first become spend at
    /// their reserved amount: a crash cannot hide calls a provider served.
    async fn hold_spend(&self, hold: &SpendHold, min: i64, cap: i64) -> Result<HoldOutcome, StageError>;
    /// Settle hold `id` of `reserved` nano-dollars on (`day`, `backend`): the hold removed and
    /// `actual` added to the day's spend, in one transaction (a hold that had expired into spend
    /// is corrected to `actual`); returns the day's total.
    async fn settle_spend(
        &self,
        day: &str,
        backend: &str,
        id: &str,
        reserved: i64,
        actual: i64,
    ) -> Result<i64, StageError>;
}

/// A hold on a backend's daily cap ([`SpendLedger::hold_spend`]).
#[derive(Debug, Clone)]
pub struct SpendHold {
    pub id: String,
    pub run_id: String,
    pub day: String,
    pub backend: String,
    /// What is wanted, nano-dollars.
    pub nano_usd: i64,
    /// Seconds since the Unix epoch after which the hold counts as spent.
    pub expires_at: i64,
}

/// What [`SpendLedger::hold_spend`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOutcome {
    /// Held this many nano-dollars.
    Granted(i64),
    /// `min` fits only once live holds are settled: ask again.
    Wait,
    /// `min` does not fit in what the day's spend leaves of the cap: the spend so far.
    Refused(i64),
}

/// The outcome of a hold given the day's `spent`, what live holds take (`held`), the `cap`, and
/// `min` / `want`.
pub(crate) fn hold_outcome(spent: i64, held: i64, cap: i64, min: i64, want: i64) -> HoldOutcome {
    if spent.saturating_add(min) > cap {
        return HoldOutcome::Refused(spent);
    }
    let free = cap - spent - held;
    if min > free {
        return HoldOutcome::Wait;
    }
    HoldOutcome::Granted(want.min(free).max(min))
}

/// A record for an open run's rows: its id (empty: its index stands in) and the encoded
/// `EvalRecord`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRecord {
    pub id: String,
    pub record: Vec<u8>,
}

/// What an append left: the first index it took, the run's records and whether it is sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub first: u64,
    pub total: u64,
    pub sealed: bool,
}

/// A page of an open run's records, with the run's count and whether more can come.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RecordsPage {
    /// (index, encoded `EvalRecord`), by index.
    pub records: Vec<(u64, Vec<u8>)>,
    pub total: u64,
    pub sealed: bool,
}

/// The records of open runs, as rows, and their results read a page at a time.
#[async_trait::async_trait]
pub trait RecordStorage: Send + Sync {
    /// Add `records` to open run `run_id` after those it holds (indices continue), and seal it
    /// when `seal`: all of them or none, atomically with other appends. NOT_FOUND without such a
    /// run; FAILED_PRECONDITION when it was not created open, is sealed or has ended;
    /// INVALID_ARGUMENT naming `records[i].id` when an id is already in the run, or `records`
    /// when the run would hold more than `max_total`.
    async fn append_records(
        &self,
        run_id: &str,
        records: Vec<NewRecord>,
        seal: bool,
        max_total: u64,
    ) -> Result<Appended, StageError>;
    /// Up to `limit` of an open run's records from index `first` on, by index (NOT_FOUND when
    /// the run has no records as rows).
    async fn records(&self, run_id: &str, first: u64, limit: usize) -> Result<RecordsPage, StageError>;
    /// The checkpoints of a run stored under any of `keys` (those that exist).
    async fn checkpoints_get(&self, run_id: &str, keys: Vec<String>) -> Result<Vec<(String, Vec<u8>)>, StageError>;
    /// Up to `limit` of a run's checkpoints whose key starts with `prefix` and sorts after
    /// `after`, by key.
    async fn checkpoints_page(
        &self,
        run_id: &str,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StageError>;
}

/// A chunk of an open run's records, `[first, first + count)`, claimed by this gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub first: u64,
    pub count: u32,
    /// It was claimed before, by a claim that expired.
    pub takeover: bool,
}

/// What [`ChunkStorage::claim_chunk`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A chunk, now held by the claim's token.
    Chunk(Chunk),
    /// Nothing to claim now: the other chunks are held, or records may still be appended.
    Wait,
    /// The run is sealed and every record is in a finished chunk.
    Finished,
}

/// A chunk as the store has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRow {
    pub first: u64,
    pub count: u32,
    /// The gateway that holds (or finished) it.
    pub owner: String,
    /// The claim that holds it (a new one after a takeover).
    pub token: String,
    /// How many claims it has had (more than one: taken over after a claim expired).
    pub claims: u32,
    pub done: bool,
}

/// One commit of a claim's work ([`ChunkStorage::commit_chunks`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkCommit {
    /// The chunks the claim works on: their claims are renewed.
    pub held: Vec<u64>,
    /// Results and other checkpoints, each stored only if none is stored under its key yet, with
    /// the chunk it belongs to (`None`: not fenced by a chunk, such as a checklist).
    pub checkpoints: Vec<(Option<u64>, String, Vec<u8>)>,
    /// Chunks every record of which has a result now.
    pub done: Vec<u64>,
    /// What a helping claim has spent so far (encoded `Usage`) and the checkpoint key it is kept
    /// under: replaced with each commit, so a helper that dies is counted up to its last one.
    pub usage: Option<(String, Vec<u8>)>,
}

impl ChunkCommit {
    /// Store the result at position `index`, of chunk `chunk` (see [`crate::Results`]).
    pub fn result(&mut self, chunk: u64, index: u64, result: &impl prost::Message) {
        self.checkpoints.push((Some(chunk), super::result_keys::key(index), result.encode_to_vec()));
    }
}

/// An open run's records spread over the gateways sharing a store: claimed in chunks, each chunk's
/// results written by the claim that holds it (at-least-once dispatch: a chunk whose claim expired
/// is claimed again; results written once: a result stored under a record's key is never
/// replaced). Stores of one gateway do not spread runs.
#[async_trait::async_trait]
pub trait ChunkStorage: Send + Sync {
    /// Let other gateways claim chunks of open run `run_id` (its executor does).
    async fn spread(&self, run_id: &str) -> Result<(), StageError> {
        let _ = run_id;
        Err(StageError::Unimplemented("this run store has one gateway: runs are not spread".into()))
    }
    /// Claim a chunk of running open run `run_id` for `token` (for the store's lease): an unfinished
    /// chunk whose claim expired first, else the next records not in a chunk, `max` at most.
    async fn claim_chunk(&self, run_id: &str, token: &str, max: u32) -> Result<Claim, StageError> {
        let _ = (run_id, token, max);
        Err(StageError::Unimplemented("this run store has one gateway: runs are not spread".into()))
    }
    /// Store `commit` for the claim `token` in one transaction: what belongs to a chunk the token
    /// no longer holds is dropped, and those chunks are returned (another claim has them now).
    async fn commit_chunks(&self, run_id: &str, token: &str, commit: ChunkCommit) -> Result<Vec<u64>, StageError> {
        let _ = (run_id, token, commit);
        Err(StageError::Unimplemented("this run store has one gateway: runs are not spread".into()))
    }
    /// Give up the unfinished chunks `token` holds (it stops): another claim takes them at once.
    async fn release_chunks(&self, run_id: &str, token: &str) -> Result<(), StageError> {
        let _ = (run_id, token);
        Ok(())
    }
    /// The chunks of run `run_id` from `first` on, by first index.
    async fn chunks(&self, run_id: &str, first: u64) -> Result<Vec<ChunkRow>, StageError> {
        let _ = (run_id, first);
        Ok(Vec::new())
    }
    /// Running spread runs this gateway does not execute with a chunk to claim, `limit` at most.
    async fn runs_to_help(&self, limit: usize) -> Result<Vec<String>, StageError> {
        let _ = limit;
        Ok(Vec::new())
    }
}

/// The errors of an append, shared by the stores.
pub(crate) mod append {
    use super::StageError;

    pub fn not_open(run_id: &str) -> StageError {
        StageError::FailedPrecondition(format!(
            "run {run_id} was not created open (RunPipelineRequest.open): its records came with its request"
        ))
    }

    pub fn sealed(run_id: &str) -> StageError {
        StageError::FailedPrecondition(format!("run {run_id} is sealed: it takes no more records"))
    }

    pub fn too_many(held: u64, adding: usize, max: u64) -> StageError {
        StageError::invalid(
            "records",
            format!(
                "would make the run {} records (it holds {held}); the limit is {max} per run",
                held + adding as u64
            ),
        )
    }

    pub fn duplicate(i: usize, id: &str) -> StageError {
        StageError::invalid(
            format!("records[{i}].id"),
            format!("duplicate id {id:?}: the run already holds a record with it"),
        )
    }
}
