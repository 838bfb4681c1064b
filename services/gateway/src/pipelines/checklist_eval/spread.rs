//! An open run spread over the gateways sharing a PostgreSQL store. Its records are claimed in
//! chunks of [`PAGE`] by the executing gateway and by every other gateway that helps
//! ([`assay_runs::Pipeline::help`]); each claim scores its chunk's records and stores their results
//! (and the checklists it produced) through its claim, a few hundred at a time, then marks the
//! chunk done. Dispatch is at least once (a chunk whose claim expired is claimed again, and its
//! records without a stored result are scored again); results are written once (a result stored
//! under a record's key is never replaced, and a claim that lost its chunk stores nothing of it).
//!
//! The executor alone writes the run's events: its own records as they are scored, the records of
//! other gateways' chunks once those are done (read back from the store), and a `records_claimed`
//! event per claim; it keeps each gateway's share in the run's summary and, once every chunk is
//! done, adds what helpers spent (each helping claim keeps its spend so far with every commit) to
//! the run's usage and computes the aggregates. Every fact is said once: a resumed executor reads
//! the run's events back first, so it announces no claim twice and says the results a dead
//! executor stored but never told.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use assay_domain::{StageError, Usage};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use assay_runs::store::{ChunkCommit, ChunkRow, Claim};
use assay_runs::{RunCtx, RunOutcome, Writes};
use futures::future::BoxFuture;
use prost::Message;

use super::super::checklist::CHECKLIST;
use super::ChecklistEval;
use super::lane::{CATEGORIZED, Checklists, Done, Lane, Pending, Step, has_categories};
use super::open::{PAGE, decode_record, slim};

/// How often a claim looks again when nothing was left to claim, renews its chunks when it stored
/// nothing meanwhile, and the executor reads the run's chunks.
const TICK: Duration = Duration::from_millis(500);

/// Who works on the chunks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The gateway executing the run: it writes the run's events and ends the run.
    Executor,
    /// Another gateway sharing the store.
    Helper,
}

/// Where a helping claim keeps what it has spent so far (one key per claim, replaced with each
/// commit): the executor adds every helper's at the end, a dead helper's included.
const HELPER_USAGE: &str = "spread:usage:";

/// What the executor knows of the run's chunks and has said of them.
#[derive(Default)]
struct Watch {
    /// Every chunk seen, as last read.
    chunks: BTreeMap<u64, ChunkRow>,
    /// Per chunk, the claims a `records_claimed` event has announced (read back from the run's
    /// events by a resumed executor, so no claim is announced twice).
    announced: HashMap<u64, u32>,
    /// Chunks whose records other claims scored that have been read back and said.
    absorbed: HashSet<u64>,
    /// Chunks below this are all done and said: read from here on.
    low: u64,
}

impl Watch {
    /// Each gateway's share, by name.
    fn shares(&self) -> Vec<gw::GatewayShare> {
        let mut by: BTreeMap<&str, gw::GatewayShare> = BTreeMap::new();
        for c in self.chunks.values() {
            let s = by
                .entry(c.owner.as_str())
                .or_insert_with(|| gw::GatewayShare { gateway: c.owner.clone(), ..Default::default() });
            s.records_claimed += u64::from(c.count);
            if c.done {
                s.records_done += u64::from(c.count);
            }
        }
        by.into_values().collect()
    }
}

/// What a run's stored events told: the records whose result was said, and per chunk how many
/// claims were announced. Read a page at a time.
async fn told_before(ctx: &RunCtx) -> Result<(Done, HashMap<u64, u32>), StageError> {
    let (mut said, mut announced) = (Done::default(), HashMap::new());
    let mut after = 0;
    loop {
        let page = ctx.log.stored_events(after, 4096).await?;
        let Some(last) = page.last() else { break };
        after = last.sequence;
        for e in page {
            match e.event {
                Some(Event::RecordScored(r)) => said.insert(r.index as usize),
                Some(Event::RecordsClaimed(c)) => *announced.entry(c.first).or_insert(0u32) += 1,
                _ => {}
            }
        }
    }
    Ok((said, announced))
}

/// The results stored for records of `[first, first + count)`.
async fn results_in(ctx: &RunCtx, first: u64, count: u32) -> Result<Vec<gw::RecordResult>, StageError> {
    Ok(ctx.results.stored_range(first, count).await?.into_iter().map(|(_, r)| r).collect())
}

impl ChecklistEval {
    /// Execute a spread run: work on its chunks like any helper, say what every claim does, and
    /// end the run once it is sealed and every chunk is done.
    pub(super) async fn run_spread(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        // The run's only checklist (explicit, or from a corpus) is produced once, here, before
        // any record is spread; helpers read it from the store.
        if self.plan.preset().is_none() {
            let key = self.plan.key(&Default::default());
            let mut known = Checklists::default();
            known.load(ctx, [key.clone()]).await?;
            if known.get(&key).is_none() {
                let c = self.plan.produce(ctx, &self.stages, &Default::default(), 0).await?;
                let wire = convert::checklist_to(&c);
                let mut commit = ChunkCommit {
                    checkpoints: vec![(None, format!("{CHECKLIST}{key}"), wire.encode_to_vec())],
                    ..Default::default()
                };
                if has_categories(&c) {
                    commit.checkpoints.push((None, CATEGORIZED.to_string(), wire.encode_to_vec()));
                }
                ctx.inputs.commit(commit).await?;
                ctx.log
                    .emit(Event::ChecklistReady(gw::ChecklistReady {
                        checklist: Some(wire),
                        record_indices: Vec::new(),
                    }))
                    .await?;
            }
        }
        ctx.inputs.spread().await?;
        // What the run's events told before (a resumed executor): a result stored by a claim
        // whose events were lost with its gateway is said now, and said once.
        let (said, announced) = told_before(ctx).await?;
        ctx.progress.set_done(said.count());
        let cancelled = self.work(ctx, Role::Executor, said, announced).await?;
        // What helpers spent, once, at the end (a resumed executor would count it twice if it
        // added it as chunks finished: the run's stored usage is its executors' own). Each
        // helping claim stores its spend with every commit, so a helper that died is counted up
        // to its last commit.
        let mut after = String::new();
        loop {
            let page = ctx.inputs.stored_page(HELPER_USAGE, &after, 256).await?;
            let Some((last, _)) = page.last() else { break };
            after.clone_from(last);
            for (_, bytes) in page {
                let usage = assay_proto::common::v1::Usage::decode(bytes.as_slice())
                    .map_err(|e| StageError::Internal(format!("run store: corrupt usage: {e}")))?;
                ctx.spending.add_usage(&convert::usage_from(Some(usage)));
            }
        }
        let mut checklists = Checklists::default();
        self.finish_open(ctx, &mut checklists, cancelled, None).await
    }

    /// Help with a spread run another gateway executes.
    pub(super) async fn help_spread(&self, ctx: &RunCtx) -> Result<(), StageError> {
        self.work(ctx, Role::Helper, Done::default(), HashMap::new()).await.map(|_| ())
    }

    /// Claim chunks and score their records until nothing is left to claim (a helper) or the run
    /// is sealed and every chunk is done (the executor). `said`: records whose result the run's
    /// events have told, `announced`: the claims they announced per chunk (the executor's).
    /// Returns whether the run was cancelled.
    async fn work(
        &self,
        ctx: &RunCtx,
        role: Role,
        mut said: Done,
        announced: HashMap<u64, u32>,
    ) -> Result<bool, StageError> {
        let executor = role == Role::Executor;
        let single = self.plan.preset().is_none();
        let mut lane = Lane::new(self, ctx, single, Checklists::default());
        // Chunks this claim works on, with their records still without a result.
        let mut held: HashMap<u64, usize> = HashMap::new();
        let mut pending = ChunkCommit::default();
        let mut committing: Option<BoxFuture<'_, Result<Vec<u64>, StageError>>> = None;
        let mut last_commit = tokio::time::Instant::now();
        let mut finished = false;
        let mut idle = false;
        let mut events = Writes::default();
        let mut watch = Watch { announced, ..Watch::default() };
        // A helping claim's spend so far, stored with each of its commits.
        let mut spent = Usage::default();
        let usage_key = format!("{HELPER_USAGE}{}", ctx.inputs.token());
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cancelled = false;
        loop {
            if !finished && !idle && lane.room() > 0 {
                match ctx.inputs.claim(PAGE as u32).await? {
                    Claim::Chunk(chunk) => {
                        let page = ctx.inputs.page(chunk.first, chunk.count as usize).await?;
                        if executor {
                            ctx.progress.set_total(u32::try_from(page.total).unwrap_or(u32::MAX), !page.sealed);
                        }
                        let end = chunk.first + u64::from(chunk.count);
                        let mut stored = Done::default();
                        if chunk.takeover {
                            // Records an expired claim stored a result for are not scored again.
                            for r in results_in(ctx, chunk.first, chunk.count).await? {
                                stored.insert((u64::from(r.index) - chunk.first) as usize);
                                if executor && !said.contains(r.index as usize) {
                                    said.insert(r.index as usize);
                                    ctx.progress.add_done();
                                    events.push(ctx.log.emit_queued(Event::RecordScored(slim(r))));
                                }
                            }
                        }
                        let mut fresh = Vec::new();
                        for (index, bytes) in page.records.into_iter().filter(|(i, _)| *i < end) {
                            if stored.contains((index - chunk.first) as usize) {
                                continue;
                            }
                            let record = decode_record(&bytes)?;
                            let index = usize::try_from(index)
                                .map_err(|_| StageError::Internal(format!("record index {index} out of range")))?;
                            fresh.push((self.plan.key(&record), Pending { index, record, chunk: chunk.first }));
                        }
                        if fresh.is_empty() {
                            pending.done.push(chunk.first);
                        } else {
                            held.insert(chunk.first, fresh.len());
                        }
                        lane.admit(fresh).await?;
                    }
                    Claim::Wait => idle = true,
                    Claim::Finished => finished = true,
                }
            }
            lane.start();
            let busy = !(lane.is_empty() && held.is_empty());
            let unstored = !(pending.checkpoints.is_empty() && pending.done.is_empty());
            if committing.is_none() && (unstored || (!held.is_empty() && last_commit.elapsed() >= TICK)) {
                let mut commit = std::mem::take(&mut pending);
                commit.held = held.keys().copied().collect();
                if role == Role::Helper {
                    spent.add(&convert::usage_from(Some(ctx.spending.take_usage())));
                    commit.usage = Some((usage_key.clone(), convert::usage_to(&spent).encode_to_vec()));
                }
                last_commit = tokio::time::Instant::now();
                committing = Some(Box::pin(ctx.inputs.commit(commit)));
            }
            let quiet = !busy && committing.is_none() && !unstored;
            match role {
                Role::Executor if finished && quiet => break,
                Role::Helper if (finished || idle) && quiet => break,
                Role::Executor | Role::Helper => {}
            }
            tokio::select! {
                step = lane.next() => match step? {
                    Step::Checklist { key, checklist, first_with_categories, indices } => {
                        let wire = convert::checklist_to(&checklist);
                        pending.checkpoints.push((None, format!("{CHECKLIST}{key}"), wire.encode_to_vec()));
                        if first_with_categories {
                            pending.checkpoints.push((None, CATEGORIZED.to_string(), wire.encode_to_vec()));
                        }
                        if executor {
                            events.push(ctx.log.emit_queued(Event::ChecklistReady(gw::ChecklistReady {
                                checklist: Some(wire),
                                record_indices: indices,
                            })));
                        }
                    }
                    Step::Settled(results) => {
                        for (p, r) in results {
                            self.scored(ctx, role, p, r, &mut held, &mut pending, &mut said, &mut events);
                        }
                    }
                    Step::Cancelled => {
                        cancelled = true;
                        break;
                    }
                },
                lost = async {
                    match committing.as_mut() {
                        Some(c) => c.await,
                        None => std::future::pending().await,
                    }
                }, if committing.is_some() => {
                    committing = None;
                    for first in lost? {
                        // Another claim holds it now: what is left of it is that claim's.
                        if held.remove(&first).is_some() {
                            tracing::info!(run_id = %ctx.run_id(), first, "a chunk's claim was lost");
                        }
                    }
                }
                _ = tick.tick() => {
                    idle = false;
                    if executor {
                        self.look(ctx, &mut watch, &mut said, &mut events).await?;
                    }
                }
                () = ctx.inputs.arrival(), if executor && idle => idle = false,
                e = events.next_error() => return Err(e),
                () = ctx.gate.cancelled() => { cancelled = true; break }
            }
        }
        drop(lane);
        if let Some(c) = committing.take() {
            c.await?;
        }
        if role == Role::Helper {
            spent.add(&convert::usage_from(Some(ctx.spending.take_usage())));
            pending.usage = Some((usage_key.clone(), convert::usage_to(&spent).encode_to_vec()));
        }
        if !pending.checkpoints.is_empty() || !pending.done.is_empty() || pending.usage.is_some() {
            pending.held = held.keys().copied().collect();
            ctx.inputs.commit(pending).await?;
        }
        if executor {
            // The last chunks other gateways finished, said before the end.
            self.look(ctx, &mut watch, &mut said, &mut events).await?;
        }
        events.flush().await?;
        Ok(cancelled)
    }

    /// A record of chunk `p.chunk` has its result: stored with the claim's next commit, the chunk
    /// done once its last record is, and (the executor) said.
    #[allow(clippy::too_many_arguments)]
    fn scored(
        &self,
        ctx: &RunCtx,
        role: Role,
        p: Pending,
        result: gw::RecordResult,
        held: &mut HashMap<u64, usize>,
        pending: &mut ChunkCommit,
        said: &mut Done,
        events: &mut Writes,
    ) {
        pending.result(p.chunk, p.index as u64, &result);
        if let Some(left) = held.get_mut(&p.chunk) {
            *left -= 1;
            if *left == 0 {
                held.remove(&p.chunk);
                pending.done.push(p.chunk);
            }
        }
        if role == Role::Executor && !said.contains(p.index) {
            said.insert(p.index);
            ctx.progress.add_done();
            events.push(ctx.log.emit_queued(Event::RecordScored(slim(result))));
        }
    }

    /// The executor reads the run's chunks: a `records_claimed` event for each new claim, the
    /// records of chunks other claims finished read back and said, what helpers spent added to
    /// the run's usage, and each gateway's share in the summary.
    async fn look(
        &self,
        ctx: &RunCtx,
        watch: &mut Watch,
        said: &mut Done,
        events: &mut Writes,
    ) -> Result<(), StageError> {
        let rows = ctx.inputs.chunks(watch.low).await?;
        for row in rows {
            let first = row.first;
            // Each claim announced once: a chunk's claims count up, and what was announced
            // before a restart is read back from the events.
            let announced = watch.announced.get(&first).copied().unwrap_or(0);
            if row.claims > announced {
                watch.announced.insert(first, row.claims);
                events.push(ctx.log.emit_queued(Event::RecordsClaimed(gw::RecordsClaimed {
                    gateway: row.owner.clone(),
                    first,
                    count: row.count,
                    takeover: row.claims > 1,
                })));
            }
            if row.done && row.token != ctx.inputs.token() && !watch.absorbed.contains(&first) {
                for r in results_in(ctx, first, row.count).await? {
                    if !said.contains(r.index as usize) {
                        said.insert(r.index as usize);
                        ctx.progress.add_done();
                        events.push(ctx.log.emit_queued(Event::RecordScored(slim(r))));
                    }
                }
                watch.absorbed.insert(first);
            }
            watch.chunks.insert(first, row);
        }
        // Past every chunk done and said, the next look starts.
        while let Some(c) = watch.chunks.get(&watch.low) {
            if !c.done || (c.token != ctx.inputs.token() && !watch.absorbed.contains(&watch.low)) {
                break;
            }
            watch.low += u64::from(c.count);
        }
        ctx.progress.set_gateways(watch.shares());
        let page = ctx.inputs.page(u64::MAX >> 2, 0).await?;
        ctx.progress.set_total(u32::try_from(page.total).unwrap_or(u32::MAX), !page.sealed);
        Ok(())
    }
}
