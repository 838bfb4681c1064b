//! An open checklist_eval run: its records are rows of the run store, read a page at a time as
//! they are appended; each record's checklist (one per distinct input with a preset, else the
//! run's one) is found in a bounded cache, else among the stored ones, else produced once; results
//! are stored one per record; the aggregates come from one streamed pass over the stored results
//! at the end. The gateway holds the records in flight, not the run's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use assay_domain::{AggregateBuilder, Checklist, StageError, Usage};
use assay_proto::common::v1 as pb;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prost::Message;

use super::super::checklist::{CHECKLIST, EvalRecord, decode_checklist};
use super::super::responders::{Answered, RESPONSE, label, per_record, target_of};
use super::respond::InFlight;
use super::{
    ChecklistEval, RECORD, Reserve, generation_fails_run, generation_failure, record_key, record_result, settle,
};
use assay_runs::{RunCtx, RunOutcome, Writes};

/// The checkpoint saying a checklist of the run has categories (the first such checklist): the
/// end of the run reads each record's checklist back only then (category pass rates); else every
/// answered item is ungrouped whatever its checklist.
pub(super) const CATEGORIZED: &str = "open:categorized";

pub(super) fn has_categories(c: &Checklist) -> bool {
    c.items.iter().any(|i| i.category.as_deref().is_some_and(|c| !c.is_empty()))
}

/// Records read from the store at once.
pub(super) const PAGE: usize = 1024;
/// Checklists kept in memory by key; past it the cache starts again (a checklist not in memory
/// is read back from the store).
const CACHE: usize = 4096;

/// A record read and waiting for its checklist or its scoring.
pub(super) struct Pending {
    pub(super) index: usize,
    pub(super) record: EvalRecord,
    /// The chunk it belongs to (a spread run), else 0.
    pub(super) chunk: u64,
}

/// Which records already have a result (a resumed run), one bit per record.
#[derive(Default)]
pub(super) struct Done(Vec<u64>);

impl Done {
    pub(super) fn insert(&mut self, i: usize) {
        let (w, b) = (i / 64, i % 64);
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << b;
    }

    pub(super) fn contains(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    pub(super) fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
}

/// The checklists a run has produced, the most recent ones in memory.
#[derive(Default)]
pub(super) struct Checklists {
    cache: HashMap<String, Arc<Checklist>>,
}

impl Checklists {
    pub(super) fn get(&self, key: &str) -> Option<Arc<Checklist>> {
        self.cache.get(key).cloned()
    }

    pub(super) fn insert(&mut self, key: String, c: Arc<Checklist>) {
        self.cache.insert(key, c);
    }

    /// Start the cache again when it is full: called before a page of records is looked up, so
    /// what one page loads stays until the page is done with.
    pub(super) fn trim(&mut self) {
        if self.cache.len() >= CACHE {
            self.cache.clear();
        }
    }

    /// Put the stored checklists of `keys` not in memory into it.
    pub(super) async fn load(
        &mut self,
        ctx: &RunCtx,
        keys: impl IntoIterator<Item = String>,
    ) -> Result<(), StageError> {
        let missing: Vec<String> =
            keys.into_iter().filter(|k| !self.cache.contains_key(k)).map(|k| format!("{CHECKLIST}{k}")).collect();
        if missing.is_empty() {
            return Ok(());
        }
        // From the store, whatever the context keeps its own writes in (a helper keeps none).
        for (key, bytes) in ctx.inputs.stored(missing).await? {
            let c = pb::Checklist::decode(bytes.as_slice())
                .map_err(|e| StageError::Internal(format!("run store: corrupt checkpoint: {e}")))?;
            let key = key.strip_prefix(CHECKLIST).unwrap_or(&key).to_string();
            self.insert(key, Arc::new(decode_checklist(c)?));
        }
        Ok(())
    }
}

/// The records of a run that already have a result.
pub(super) async fn stored_results(ctx: &RunCtx) -> Result<Done, StageError> {
    let mut done = Done::default();
    let mut after = String::new();
    loop {
        let page = ctx.checkpoints.page::<gw::RecordResult>(RECORD, &after, PAGE * 8).await?;
        let Some((last, _)) = page.last() else { break };
        after.clone_from(last);
        for (_, r) in &page {
            done.insert(r.index as usize);
        }
    }
    Ok(done)
}

/// A record's result as its event says it: without the item scores, which its stored result
/// holds (ListRunResults), so an open run stores them once.
pub(super) fn slim(mut r: gw::RecordResult) -> gw::RecordResult {
    if let Some(s) = r.score.as_mut() {
        s.item_scores.clear();
    }
    r
}

/// Each responder's answering cost, over the answers the run stored (a page at a time).
async fn answering_usage(ctx: &RunCtx, responders: usize) -> Result<Vec<Usage>, StageError> {
    let mut usage = vec![Usage::default(); responders];
    let mut after = String::new();
    loop {
        let page = ctx.checkpoints.page_json::<Answered>(RESPONSE, &after, PAGE).await?;
        let Some((last, _)) = page.last() else { break };
        after.clone_from(last);
        for (k, a) in page {
            if let Some(j) = k.rsplit(':').next().and_then(|j| j.parse::<usize>().ok()).filter(|j| *j < responders) {
                usage[j].add(&a.usage);
            }
        }
    }
    Ok(usage)
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
    pub(super) async fn run_open(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        // On a shared store, a run without a budget is spread over the gateways (a budget is
        // settled by the one gateway that executes the run; responders answer on it too).
        if ctx.inputs.can_spread() && !ctx.spending.has_budget() && self.responders.is_empty() {
            return self.run_spread(ctx).await;
        }
        // With responders each record is `per` targets, each with its own result (index
        // `record * per + k`, see `target_of`); without, one.
        let per = per_record(&self.responders).max(1);
        let answers = InFlight::default();
        let done = stored_results(ctx).await?;
        ctx.progress.set_done(done.count());
        // The run's only checklist (an explicit one, or from a corpus) fails the run when it
        // cannot be produced; one of many fails its records only.
        let single = self.plan.preset().is_none();
        let mut checklists = Checklists::default();
        let mut next = 0u64;
        let mut sealed_and_read = false;
        // Records read but not started: waiting for their checklist (by key), or ready to score.
        let mut waiting: HashMap<String, Vec<Pending>> = HashMap::new();
        let mut waiting_n = 0usize;
        let mut queue: VecDeque<(Pending, Arc<Checklist>)> = VecDeque::new();
        let mut producing = FuturesUnordered::new();
        let mut scoring = FuturesUnordered::new();
        let mut writes = Writes::default();
        let mut reserve = Reserve::default();
        let config = &self.scorer;
        let mut categorized = false;
        loop {
            // A spent budget starts no new record: those read are not run, and say why.
            if let Some(why) = ctx.spending.budget_exhausted() {
                for (p, c) in std::mem::take(&mut queue) {
                    let mut r = record_result(p.index, &p.record, &c.id, None, format!("not run: {}", why.message));
                    label(&mut r, &self.responders, None);
                    writes.push(ctx.checkpoints.queued(&record_key(p.index), &r));
                    ctx.progress.add_done();
                    writes.push(ctx.log.emit_queued(Event::RecordScored(slim(r))));
                }
            }
            // Read more records while fewer than two rounds of scoring wait.
            let mut starved = false;
            // A page read whose records all have a result (a resumed run): read the next one at
            // once, for nothing else may wake the loop.
            let mut read_done_page = false;
            if !sealed_and_read && queue.len() + waiting_n < 2 * self.concurrency {
                let page = ctx.inputs.page(next, PAGE).await?;
                let total = page.total.saturating_mul(per as u64);
                ctx.progress.set_total(u32::try_from(total).unwrap_or(u32::MAX), !page.sealed);
                if page.records.is_empty() {
                    sealed_and_read = page.sealed && next >= page.total;
                    starved = !sealed_and_read;
                }
                read_done_page = !page.records.is_empty();
                let mut fresh = Vec::with_capacity(page.records.len());
                for (index, bytes) in page.records {
                    next = index + 1;
                    let index = usize::try_from(index)
                        .map_err(|_| StageError::Internal(format!("record index {index} out of range")))?;
                    let targets: Vec<usize> = (index * per..(index + 1) * per).filter(|t| !done.contains(*t)).collect();
                    if targets.is_empty() {
                        continue;
                    }
                    let mut record = decode_record(&bytes)?;
                    if self.responders.is_empty() {
                        fresh.push((self.plan.key(&record), Pending { index, record, chunk: 0 }));
                        continue;
                    }
                    // Each target its record's (the id its index's when none is given).
                    record.id = record.id_or(index);
                    let key = self.plan.key(&record);
                    for t in targets {
                        fresh.push((key.clone(), Pending { index: t, record: record.clone(), chunk: 0 }));
                    }
                }
                read_done_page &= fresh.is_empty();
                checklists.trim();
                let unknown: HashSet<String> = fresh
                    .iter()
                    .filter(|(k, _)| checklists.get(k).is_none() && !waiting.contains_key(k))
                    .map(|(k, _)| k.clone())
                    .collect();
                checklists.load(ctx, unknown).await?;
                for (key, p) in fresh {
                    if let Some(c) = checklists.get(&key) {
                        queue.push_back((p, c));
                        continue;
                    }
                    waiting_n += 1;
                    if let Some(w) = waiting.get_mut(&key) {
                        w.push(p);
                        continue;
                    }
                    let record = p.record.clone();
                    let index = p.index;
                    waiting.insert(key.clone(), vec![p]);
                    producing.push(async move {
                        let out = match ctx.gate.wait().await {
                            Ok(()) => self.plan.produce(ctx, &self.stages, &record, index).await,
                            Err(e) => Err(e),
                        };
                        (key, out)
                    });
                }
            }
            let affordable = ctx.spending.budget_left().map_or(usize::MAX, |left| reserve.in_flight(&left));
            while scoring.len() < self.concurrency.min(affordable) {
                let Some((p, checklist)) = queue.pop_front() else { break };
                let answers = &answers;
                scoring.push(async move {
                    ctx.gate.wait().await?;
                    let (answering, out) = match target_of(p.index, &self.responders) {
                        None => (Usage::default(), self.score_record(&checklist, config, p.index, &p.record).await),
                        Some((i, j, _)) => {
                            let cell = answers.cell(i, j);
                            self.answer_and_score(ctx, &cell, true, &p.record, &checklist, config, p.index).await?
                        }
                    };
                    Ok::<_, StageError>((p, checklist, answering, out))
                });
            }
            if sealed_and_read && scoring.is_empty() && producing.is_empty() && queue.is_empty() {
                break;
            }
            if read_done_page {
                continue;
            }
            // Records left to read while nothing else moves: wait for an append.
            let idle = starved && scoring.is_empty() && producing.is_empty();
            tokio::select! {
                Some((key, out)) = producing.next(), if !producing.is_empty() => {
                    let records = waiting.remove(&key).unwrap_or_default();
                    waiting_n -= records.len();
                    match out {
                        Ok(c) => {
                            let wire = convert::checklist_to(&c);
                            writes.push(ctx.checkpoints.queued(&format!("{CHECKLIST}{key}"), &wire));
                            if !categorized && has_categories(&c) {
                                categorized = true;
                                writes.push(ctx.checkpoints.queued(CATEGORIZED, &wire));
                            }
                            let record_indices = records.iter().map(|p| p.index as u32).collect();
                            writes.push(ctx.log.emit_queued(Event::ChecklistReady(gw::ChecklistReady {
                                checklist: Some(wire),
                                record_indices,
                            })));
                            let c = Arc::new(c);
                            checklists.insert(key, c.clone());
                            queue.extend(records.into_iter().map(|p| (p, c.clone())));
                        }
                        Err(e) if generation_fails_run(&e, single) => return Err(e),
                        Err(e) => {
                            tracing::warn!(run_id = %ctx.run_id(), error = %e, "checklist generation failed for one input");
                            let why = generation_failure(&e);
                            for p in records {
                                let mut r = record_result(p.index, &p.record, "", None, why.clone());
                                label(&mut r, &self.responders, None);
                                writes.push(ctx.checkpoints.queued(&record_key(p.index), &r));
                                ctx.progress.add_done();
                                writes.push(ctx.log.emit_queued(Event::RecordScored(slim(r))));
                            }
                        }
                    }
                }
                Some(scored) = scoring.next(), if !scoring.is_empty() => {
                    let (p, checklist, answering, scored) = match scored {
                        Ok(x) => x,
                        Err(StageError::Cancelled(_)) if ctx.gate.is_cancelled() => break,
                        Err(e) => return Err(e),
                    };
                    reserve.charge(&answering);
                    let mut result = settle(ctx, &mut reserve, p.index, &p.record, &checklist.id, scored)?;
                    if let Some((i, j, sample)) = target_of(p.index, &self.responders) {
                        let response = answers.settled(i, j, sample, self.responders[j].samples);
                        label(&mut result, &self.responders, response.as_deref());
                    }
                    writes.push(ctx.checkpoints.queued(&record_key(p.index), &result));
                    ctx.progress.add_done();
                    writes.push(ctx.log.emit_queued(Event::RecordScored(slim(result))));
                }
                () = ctx.inputs.arrival(), if idle => {}
                e = writes.next_error() => return Err(e),
                () = ctx.gate.cancelled() => break,
            }
        }
        drop(scoring);
        drop(producing);
        writes.flush().await?;
        self.finish_open(ctx, &mut checklists, ctx.gate.is_cancelled()).await
    }

    /// The end of an open run: the aggregates in one pass over the stored results (each with its
    /// record's checklist), then the outcome by how many records failed. The results stay in the
    /// store (ListRunResults).
    pub(super) async fn finish_open(
        &self,
        ctx: &RunCtx,
        checklists: &mut Checklists,
        cancelled: bool,
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
        let mut after = String::new();
        loop {
            let page = ctx.checkpoints.page::<gw::RecordResult>(RECORD, &after, PAGE).await?;
            let (Some((last, _)), Some((_, first))) = (page.last(), page.first()) else { break };
            after.clone_from(last);
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
        };
        Ok(RunOutcome { state, result: Some(gw::run_result::Result::ChecklistEval(response)) })
    }
}
