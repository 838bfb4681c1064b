//! An open checklist_eval run: its records are rows of the run store, read a page at a time as
//! they are appended; each record's checklist (one per distinct input with a preset, else the
//! run's one) is found in a bounded cache, else among the stored ones, else produced once; results
//! are stored one per record; the aggregates come from one streamed pass over the stored results
//! at the end. The gateway holds the records in flight, not the run's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use assay_domain::{AggregateBuilder, Checklist, StageError};
use assay_proto::common::v1 as pb;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use prost::Message;

use super::super::checklist::{CHECKLIST, EvalRecord};
use super::super::responders::per_record;
use super::ChecklistEval;
use super::decide::{self, Decider, Said};
use super::lane::{CATEGORIZED, Checklists, Lane, Pending, Step, stored_results};
use super::respond::answering_usage;
use assay_runs::{RunCtx, RunOutcome, Writes};

/// Records read from the store at once.
pub(super) const PAGE: usize = 1024;
/// A record's result as its event says it: without the item scores, which its stored result
/// holds (ListRunResults), so an open run stores them once.
pub(super) fn slim(mut r: gw::RecordResult) -> gw::RecordResult {
    if let Some(s) = r.score.as_mut() {
        s.item_scores.clear();
    }
    r
}

/// An open run's record settled: its result stored, counted and said (without its item scores).
fn store_result(ctx: &RunCtx, index: usize, result: gw::RecordResult, writes: &mut Writes) {
    writes.push(ctx.results.queued(index as u64, &result));
    ctx.progress.add_done();
    writes.push(ctx.log.emit_queued(Event::RecordScored(slim(result))));
}

/// A record's wire form decoded back (it was checked when appended).
pub(super) fn decode_record(bytes: &[u8]) -> Result<EvalRecord, StageError> {
    let wire =
        gw::EvalRecord::decode(bytes).map_err(|e| StageError::Internal(format!("run store: corrupt record: {e}")))?;
    let mut v = assay_domain::Violations::new();
    let r = EvalRecord::parse(wire, "record", &mut v);
    v.into_result().map(|()| r)
}

impl ChecklistEval {
    /// Run an open run to the end: until it is sealed and every record it holds has a result.
    /// Its stored rows are the source of the run's [`Lane`], read a page at a time.
    pub(super) async fn run_open(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        // On a shared store, a run without a budget is spread over the gateways (a budget is
        // settled by the one gateway that executes the run; responders answer on it too).
        if ctx.inputs.can_spread() && !ctx.spending.has_budget() && self.responders.is_empty() {
            return self.run_spread(ctx).await;
        }
        // With responders each record is `per` targets, each with its own result (index
        // `record * per + k`, see `target_of`); without, one.
        let per = per_record(&self.responders).max(1);
        let done = stored_results(ctx).await?;
        ctx.progress.set_done(done.count());
        // The run's only checklist (an explicit one, or from a corpus) fails the run when it
        // cannot be produced; one of many fails its records only.
        let single = self.plan.preset().is_none();
        let mut lane = Lane::new(self, ctx, single, Checklists::default());
        // A run that stops when decided: its sequences, given what a previous process stored
        // (each record fed once its block's order is known, as the blocks are read).
        let mut decider = match self.stop {
            Some(s) => {
                let seed = s.seed_for(ctx.run_id());
                let mut d = Decider::new(s, seed, &self.responders, Vec::new());
                for (t, r) in ctx.results.all::<gw::RecordResult>().await? {
                    d.settle(usize::try_from(t).unwrap_or(usize::MAX), &r, &self.responders);
                }
                Some(d)
            }
            None => None,
        };
        let mut stopped = false;
        let mut said = Said::default();
        // Records read and not admitted yet, in the order they are asked.
        let mut queue: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
        // With a decider: records taken from the queue (the position in the run's order), and
        // by index whether each record read was asked (admitted, or with a result stored).
        let mut taken = 0usize;
        let mut asked: Vec<bool> = Vec::new();
        let mut next = 0u64;
        let mut sealed_and_read = false;
        // The last read found nothing to take: read again once records arrive.
        let mut starved = false;
        let mut writes = Writes::default();
        loop {
            for (p, r) in lane.not_run() {
                if let Some(d) = decider.as_mut() {
                    d.settle(p.index, &r, &self.responders);
                }
                store_result(ctx, p.index, r, &mut writes);
            }
            // Read more records while the lane has room and none read are waiting.
            if queue.is_empty() && !sealed_and_read && !starved && !stopped && lane.room() > 0 {
                let limit = if decider.is_some() { decide::BLOCK } else { PAGE };
                let page = ctx.inputs.page(next, limit).await?;
                let total = page.total.saturating_mul(per as u64);
                ctx.progress.set_total(u32::try_from(total).unwrap_or(u32::MAX), !page.sealed);
                let last_block = page.sealed && next + page.records.len() as u64 >= page.total;
                if page.records.is_empty() {
                    sealed_and_read = page.sealed && next >= page.total;
                    starved = !sealed_and_read;
                } else if let Some(d) = decider.as_mut() {
                    // A run that stops when decided takes a block once whole (or the run sealed):
                    // its order is then fixed, the same whenever the run is resumed.
                    if page.records.len() == decide::BLOCK || last_block {
                        let block = next / decide::BLOCK as u64;
                        let order = decide::block_order(block, page.records.len(), d.seed());
                        next += page.records.len() as u64;
                        asked.resize(usize::try_from(next).unwrap_or(usize::MAX), false);
                        let mut by_index: HashMap<u64, Vec<u8>> = page.records.into_iter().collect();
                        for i in &order {
                            let bytes = by_index.remove(&(*i as u64)).ok_or_else(|| {
                                StageError::Internal(format!("run record {i} is missing from its block"))
                            })?;
                            // A record with a result stored was asked (before a restart),
                            // whether or not it is asked again.
                            asked[*i] = (i * per..(i + 1) * per).any(|t| done.contains(t));
                            queue.push_back((*i as u64, bytes));
                        }
                        d.extend(&order, &self.responders);
                        stopped = d.decided();
                    } else {
                        starved = true;
                    }
                } else {
                    next = page.records.last().map_or(next, |(i, _)| i + 1);
                    queue.extend(page.records);
                }
            }
            // Admit what was read: all of it, or (a run that stops when decided) only so far
            // ahead of the records fed to its sequences.
            let mut fresh = Vec::new();
            let lead = decider.as_ref().map_or(usize::MAX, |d| d.lead(self.concurrency));
            while !stopped && taken < lead {
                let Some((index, bytes)) = queue.pop_front() else { break };
                taken += 1;
                let index = usize::try_from(index)
                    .map_err(|_| StageError::Internal(format!("record index {index} out of range")))?;
                if let Some(a) = asked.get_mut(index) {
                    *a = true;
                }
                let targets: Vec<usize> = (index * per..(index + 1) * per).filter(|t| !done.contains(*t)).collect();
                if targets.is_empty() {
                    continue;
                }
                let mut record = decode_record(&bytes)?;
                if !self.responders.is_empty() {
                    // Each target its record's (the id its index's when none is given).
                    record.id = record.id_or(index);
                }
                let key = self.plan.key(&record);
                for t in targets {
                    fresh.push((key.clone(), Pending { index: t, record: record.clone(), chunk: 0 }));
                }
            }
            // Every record read had a result (a resumed run) and nothing else may wake the loop:
            // read on at once.
            let read_on =
                fresh.is_empty() && queue.is_empty() && !lane.in_flight() && !(starved || sealed_and_read || stopped);
            if !fresh.is_empty() {
                lane.admit(fresh).await?;
            }
            lane.start();
            if (sealed_and_read || stopped) && lane.is_empty() {
                break;
            }
            if read_on {
                continue;
            }
            tokio::select! {
                step = lane.next() => match step? {
                    Step::Checklist { key, checklist, first_with_categories, indices } => {
                        let wire = convert::checklist_to(&checklist);
                        writes.push(ctx.checkpoints.queued(&format!("{CHECKLIST}{key}"), &wire));
                        if first_with_categories {
                            writes.push(ctx.checkpoints.queued(CATEGORIZED, &wire));
                        }
                        writes.push(ctx.log.emit_queued(Event::ChecklistReady(gw::ChecklistReady {
                            checklist: Some(wire),
                            record_indices: indices,
                        })));
                    }
                    Step::Settled(results) => {
                        for (p, r) in results {
                            if let Some(d) = decider.as_mut() {
                                d.settle(p.index, &r, &self.responders);
                                said.update(ctx, d, &self.responders, &mut writes);
                                if !stopped && d.decided() {
                                    stopped = true;
                                    tracing::info!(run_id = %ctx.run_id(), records = d.records_used(), "the comparison is decided: no new record is asked");
                                }
                            }
                            store_result(ctx, p.index, r, &mut writes);
                        }
                    }
                    Step::Cancelled => break,
                },
                () = ctx.inputs.arrival(), if starved => starved = false,
                e = writes.next_error() => return Err(e),
                () = ctx.gate.cancelled() => break,
            }
        }
        drop(lane);
        let cancelled = ctx.gate.is_cancelled();
        let sequential = match decider.as_ref() {
            Some(d) => {
                said.last(ctx, d, &self.responders, &mut writes);
                Some(self.decided_open(ctx, d, &asked, next, stopped && !cancelled).await?)
            }
            None => None,
        };
        writes.flush().await?;
        self.finish_open(ctx, &mut Checklists::default(), cancelled, sequential).await
    }

    /// What stopping when decided did in an open run: the records read and not asked, and those
    /// never read (appended past the blocks it took), by id.
    async fn decided_open(
        &self,
        ctx: &RunCtx,
        d: &Decider,
        asked: &[bool],
        read: u64,
        stopped: bool,
    ) -> Result<gw::SequentialResult, StageError> {
        let per = per_record(&self.responders).max(1);
        let mut not_asked = Vec::new();
        let mut first = 0u64;
        loop {
            let page = ctx.inputs.page(first, PAGE).await?;
            let Some((last, _)) = page.records.last() else { break };
            first = last + 1;
            for (index, bytes) in &page.records {
                let i = usize::try_from(*index).unwrap_or(usize::MAX);
                if *index >= read || !asked.get(i).copied().unwrap_or(false) {
                    not_asked.push(decode_record(bytes)?.id_or(i));
                }
            }
        }
        let asked_n = asked.iter().filter(|a| **a).count();
        let result = d.result(ctx, &self.responders, asked_n, not_asked, stopped);
        if result.stopped_early {
            // The run's work is what it asked: a decided comparison left the rest (the result
            // lists them), so its progress ends whole.
            ctx.progress.set_total(u32::try_from(asked_n * per).unwrap_or(u32::MAX), false);
        }
        Ok(result)
    }

    /// The end of an open run: the aggregates in one pass over the stored results (each with its
    /// record's checklist), then the outcome by how many records failed (of those it asked, when
    /// it stopped once decided). The results stay in the
    /// store (ListRunResults).
    pub(super) async fn finish_open(
        &self,
        ctx: &RunCtx,
        checklists: &mut Checklists,
        cancelled: bool,
        sequential: Option<gw::SequentialResult>,
    ) -> Result<RunOutcome, StageError> {
        ctx.spending.record_budget_stop();
        let mut aggregate = AggregateBuilder::default();
        let (mut results, mut failed) = (0u64, 0u64);
        let categorized = !ctx.checkpoints.get_many::<pb::Checklist>(vec![CATEGORIZED.to_string()]).await?.is_empty();
        // Without categories a checklist decides nothing in the aggregates.
        let uncategorized = Arc::new(Checklist::default());
        // With responders: every result, and its checklist, for their verdict.
        let mut matrix: Vec<gw::RecordResult> = Vec::new();
        let mut matrix_checklists: HashMap<String, Arc<Checklist>> = HashMap::new();
        let mut after = 0;
        loop {
            let page = ctx.results.page::<gw::RecordResult>(after, PAGE).await?;
            let (Some((last, _)), Some((_, first))) = (page.last(), page.first()) else { break };
            after = last + 1;
            // The page's records, for the keys of their checklists (only when one has categories).
            let mut keys: HashMap<u64, String> = HashMap::new();
            // A result's record: its index over the targets each record makes.
            let per = per_record(&self.responders).max(1) as u64;
            if categorized {
                let first = u64::from(first.index) / per;
                let span = page.last().map_or(0, |(_, r)| u64::from(r.index) / per - first + 1);
                let records = ctx.inputs.page(first, usize::try_from(span).unwrap_or(usize::MAX)).await?;
                keys = records
                    .records
                    .iter()
                    .map(|(i, bytes)| decode_record(bytes).map(|r| (*i, self.plan.key(&r))))
                    .collect::<Result<_, _>>()?;
                checklists.trim();
                checklists.load(ctx, keys.values().cloned().collect::<HashSet<_>>()).await?;
            }
            for (_, r) in page {
                results += 1;
                let Some(score) = &r.score else {
                    failed += 1;
                    if !self.responders.is_empty() {
                        matrix.push(r);
                    }
                    continue;
                };
                let checklist = if categorized {
                    keys.get(&(u64::from(r.index) / per)).and_then(|k| checklists.get(k)).ok_or_else(|| {
                        StageError::Internal(format!("the checklist of record {} is not stored", r.index))
                    })?
                } else {
                    uncategorized.clone()
                };
                aggregate.add(&convert::score_from(score.clone()), &checklist);
                if !self.responders.is_empty() {
                    matrix_checklists.entry(r.checklist_id.clone()).or_insert(checklist);
                    matrix.push(r);
                }
            }
        }
        let total = u64::from(ctx.snapshot().records_total);
        let unrun = total.saturating_sub(results);
        let state = if cancelled {
            gw::RunState::Cancelled
        } else if failed + unrun == 0 {
            gw::RunState::Succeeded
        } else if failed + unrun == total {
            gw::RunState::Failed
        } else {
            gw::RunState::Partial
        };
        let aggregate = Some(convert::aggregate_to(&aggregate.finish()));
        let (responders, comparisons) = if self.responders.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let usage = answering_usage(ctx, self.responders.len()).await?;
            let mut seen = HashSet::new();
            let ids: Vec<String> =
                matrix.iter().filter(|r| seen.insert(r.record_id.clone())).map(|r| r.record_id.clone()).collect();
            let checklist_of = |r: &gw::RecordResult| {
                Some(matrix_checklists.get(&r.checklist_id).cloned().unwrap_or_else(|| uncategorized.clone()))
            };
            self.verdict(&matrix, checklist_of, &usage, &ids)
        };
        if !cancelled {
            ctx.log.emit(Event::Aggregate(gw::AggregateReady { aggregate: aggregate.clone() })).await?;
        }
        let response = gw::EvaluateResponse {
            run_id: ctx.run_id().to_string(),
            results: Vec::new(),
            aggregate,
            checklists: Vec::new(),
            usage: Some(ctx.spending.usage()),
            models: ctx.progress.models().iter().map(convert::model_record_to).collect(),
            budget_exhausted: ctx.snapshot().budget_exhausted,
            results_paged: true,
            responders,
            comparisons,
            sequential,
        };
        Ok(RunOutcome { state, result: Some(gw::run_result::Result::ChecklistEval(response)) })
    }
}
