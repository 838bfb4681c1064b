//! The record lane: how a record of a checklist evaluation is scored, whatever brings it. Three
//! sources feed it: the request's records (`checklist_eval.rs`), an open run's stored rows
//! (`open.rs`) and a spread run's claimed chunks (`spread.rs`). A source admits records while the
//! lane has room; the lane finds each record's checklist (in memory, else stored, else produced
//! once per key while the records needing it wait), scores the record under the run's concurrency
//! and budget (answered first by its responder, with responders), and hands back each checklist
//! made and each record's result (scored, failed or not run), which the source stores and says as
//! its run does.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use assay_domain::{Checklist, ModelRecord, StageError, Usage};
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use prost::Message;

use super::super::checklist::{CHECKLIST, EvalRecord, decode_checklist};
use super::super::reserve::Reserve;
use super::super::responders::{label, target_of};
use super::respond::InFlight;
use super::{ChecklistEval, record_result};
use assay_runs::RunCtx;

/// The checkpoint saying a checklist of the run has categories (the first such checklist): the
/// end of an open run reads each record's checklist back only then (category pass rates); else
/// every answered item is ungrouped whatever its checklist.
pub(super) const CATEGORIZED: &str = "open:categorized";

pub(super) fn has_categories(c: &Checklist) -> bool {
    c.items.iter().any(|i| i.category.as_deref().is_some_and(|c| !c.is_empty()))
}

/// Checklists kept in memory by key (a bounded cache); past it the cache starts again (a checklist
/// not in memory is read back from the store).
const CACHE: usize = 4096;

/// A record admitted to the lane: its result's position (with responders, one per response to
/// score) and the record.
pub(super) struct Pending {
    pub(super) index: usize,
    pub(super) record: EvalRecord,
    /// The chunk it belongs to (a spread run), else 0.
    pub(super) chunk: u64,
}

/// The checklists a run has produced, the most recent ones in memory.
#[derive(Default)]
pub(super) struct Checklists {
    cache: HashMap<String, Arc<Checklist>>,
    /// Every checklist of the run is here (the request's records: bounded): never trimmed, never
    /// read back.
    complete: bool,
}

impl Checklists {
    /// The run's every checklist, as the caller found them stored: kept whole.
    pub(super) fn complete(cache: HashMap<String, Arc<Checklist>>) -> Self {
        Self { cache, complete: true }
    }

    pub(super) fn get(&self, key: &str) -> Option<Arc<Checklist>> {
        self.cache.get(key).cloned()
    }

    pub(super) fn insert(&mut self, key: String, c: Arc<Checklist>) {
        self.cache.insert(key, c);
    }

    /// Start the cache again when it is full: called before a page of records is looked up, so
    /// what one page loads stays until the page is done with.
    pub(super) fn trim(&mut self) {
        if !self.complete && self.cache.len() >= CACHE {
            self.cache.clear();
        }
    }

    /// Put the stored checklists of `keys` not in memory into it.
    pub(super) async fn load(
        &mut self,
        ctx: &RunCtx,
        keys: impl IntoIterator<Item = String>,
    ) -> Result<(), StageError> {
        if self.complete {
            return Ok(());
        }
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

    /// The checklists in memory, by key.
    pub(super) fn into_map(self) -> HashMap<String, Arc<Checklist>> {
        self.cache
    }
}

/// Results read at once when a resumed run looks for the records already done.
const DONE_PAGE: usize = 8192;

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

/// The records of a run that already have a result.
pub(super) async fn stored_results(ctx: &RunCtx) -> Result<Done, StageError> {
    let mut done = Done::default();
    let mut first = 0;
    loop {
        let page = ctx.results.page::<gw::RecordResult>(first, DONE_PAGE).await?;
        let Some((last, _)) = page.last() else { break };
        first = last + 1;
        for (i, _) in &page {
            done.insert(*i as usize);
        }
    }
    Ok(done)
}

/// What the lane did: a checklist made, results settled, or the run cancelled.
pub(super) enum Step {
    /// A checklist was made under `key` for the records waiting on it (`indices`, now queued):
    /// the source stores it and says it. `first_with_categories`: the run's first checklist that
    /// has categories.
    Checklist { key: String, checklist: Arc<Checklist>, first_with_categories: bool, indices: Vec<u32> },
    /// Records' results: scored, failed (their own failure, or their checklist's) or not run.
    Settled(Vec<(Pending, gw::RecordResult)>),
    /// The run was cancelled while a record was scored.
    Cancelled,
}

/// A record's scoring: the record, its checklist, what answering it cost now, and the scorer's
/// outcome.
type Scored = (Pending, Arc<Checklist>, Usage, Result<(gw::RecordResult, Usage, ModelRecord), StageError>);

/// The lane of one run's records on this gateway.
pub(super) struct Lane<'a> {
    eval: &'a ChecklistEval,
    ctx: &'a RunCtx,
    /// The run has one checklist: failing to produce it fails the run (one of many fails only its
    /// records).
    single: bool,
    checklists: Checklists,
    /// Records waiting for their checklist, by its key (each key produced once).
    waiting: HashMap<String, Vec<Pending>>,
    waiting_n: usize,
    /// Checklists to produce (key, the record and position it is generated from), in the order
    /// their first record came: at most the gateway's concurrency are produced at once.
    unmade: VecDeque<(String, EvalRecord, usize)>,
    /// Records whose checklist exists, to score.
    queue: VecDeque<(Pending, Arc<Checklist>)>,
    producing: FuturesUnordered<BoxFuture<'a, (String, Result<Checklist, StageError>)>>,
    scoring: FuturesUnordered<BoxFuture<'a, Result<Scored, StageError>>>,
    /// Under a budget, no more records in flight than what is left pays for.
    reserve: Reserve,
    /// Responders' answers of the records in flight.
    answers: Arc<InFlight>,
    categorized: bool,
}

impl<'a> Lane<'a> {
    pub(super) fn new(eval: &'a ChecklistEval, ctx: &'a RunCtx, single: bool, checklists: Checklists) -> Self {
        Self {
            eval,
            ctx,
            single,
            checklists,
            waiting: HashMap::new(),
            waiting_n: 0,
            unmade: VecDeque::new(),
            queue: VecDeque::new(),
            producing: FuturesUnordered::new(),
            scoring: FuturesUnordered::new(),
            reserve: Reserve::default(),
            answers: Arc::default(),
            categorized: false,
        }
    }

    /// How many more records a source may admit now. Without a budget, two rounds of scoring may
    /// wait (their checklists produced meanwhile); under one, records are admitted only a round
    /// ahead of those finished, so what the budget pays for is records evaluated, not checklists
    /// of records it never reaches.
    pub(super) fn room(&self) -> usize {
        let round = self.eval.concurrency;
        let backlog = self.queue.len() + self.waiting_n;
        if self.ctx.spending.has_budget() {
            round.saturating_sub(backlog + self.scoring.len())
        } else {
            (2 * round).saturating_sub(backlog)
        }
    }

    /// Nothing admitted is left: no record waiting, queued or scored, no checklist produced.
    pub(super) fn is_empty(&self) -> bool {
        self.scoring.is_empty() && self.producing.is_empty() && self.queue.is_empty() && self.unmade.is_empty()
    }

    /// Whether a record or a checklist is in flight (something will wake [`Lane::next`]).
    pub(super) fn in_flight(&self) -> bool {
        !(self.scoring.is_empty() && self.producing.is_empty())
    }

    /// Admit records, each with the key of its checklist: queued when the checklist is known (in
    /// memory or stored), else waiting for it (produced once per key).
    pub(super) async fn admit(&mut self, fresh: Vec<(String, Pending)>) -> Result<(), StageError> {
        self.checklists.trim();
        let unknown: HashSet<String> = fresh
            .iter()
            .filter(|(k, _)| self.checklists.get(k).is_none() && !self.waiting.contains_key(k))
            .map(|(k, _)| k.clone())
            .collect();
        self.checklists.load(self.ctx, unknown).await?;
        for (key, p) in fresh {
            if let Some(c) = self.checklists.get(&key) {
                self.queue.push_back((p, c));
                continue;
            }
            self.waiting_n += 1;
            if let Some(w) = self.waiting.get_mut(&key) {
                w.push(p);
                continue;
            }
            // The record it is generated from: with responders, a response's record.
            let index = target_of(p.index, &self.eval.responders).map_or(p.index, |(i, _, _)| i);
            self.unmade.push_back((key.clone(), p.record.clone(), index));
            self.waiting.insert(key, vec![p]);
        }
        Ok(())
    }

    /// Start producing checklists, as many at once as the gateway's concurrency allows, and
    /// scoring queued records, as many as the run's concurrency and budget allow.
    pub(super) fn start(&mut self) {
        while self.producing.len() < self.eval.stages.concurrency {
            let Some((key, record, index)) = self.unmade.pop_front() else { break };
            let (eval, ctx) = (self.eval, self.ctx);
            self.producing.push(Box::pin(async move {
                let out = match ctx.gate.wait().await {
                    Ok(()) => eval.plan.produce(ctx, &eval.stages, &record, index).await,
                    Err(e) => Err(e),
                };
                (key, out)
            }));
        }
        let affordable = self.ctx.spending.budget_left().map_or(usize::MAX, |left| self.reserve.in_flight(&left));
        while self.scoring.len() < self.eval.concurrency.min(affordable) {
            let Some((p, checklist)) = self.queue.pop_front() else { break };
            let (eval, ctx, answers) = (self.eval, self.ctx, self.answers.clone());
            self.scoring.push(Box::pin(async move {
                // Paused runs start no new record; in-flight ones finish.
                ctx.gate.wait().await?;
                let config = &eval.scorer;
                let (answering, out) = match target_of(p.index, &eval.responders) {
                    None => (Usage::default(), eval.score_record(&checklist, config, p.index, &p.record).await),
                    Some((i, j, _)) => {
                        let cell = answers.cell(i, j);
                        eval.answer_and_score(ctx, &cell, &p.record, &checklist, config, p.index).await?
                    }
                };
                Ok::<_, StageError>((p, checklist, answering, out))
            }));
        }
    }

    /// A spent budget starts no new record: the queued ones are not run, and say why. (Asked only
    /// while records wait: a budget spent by the last records in flight stopped nothing, and the
    /// run does not say it did.)
    pub(super) fn not_run(&mut self) -> Vec<(Pending, gw::RecordResult)> {
        if self.queue.is_empty() {
            return Vec::new();
        }
        let Some(why) = self.ctx.spending.budget_exhausted() else { return Vec::new() };
        let why = format!("not run: {}", why.message);
        std::mem::take(&mut self.queue)
            .into_iter()
            .map(|(p, c)| {
                let r = self.result(&p, &c.id, why.clone());
                (p, r)
            })
            .collect()
    }

    /// The next checklist made or record settled (cancel-safe: nothing is lost when the future is
    /// dropped before it resolves). Pends while nothing is in flight.
    pub(super) async fn next(&mut self) -> Result<Step, StageError> {
        tokio::select! {
            Some((key, out)) = self.producing.next(), if !self.producing.is_empty() => self.made(key, out),
            Some(scored) = self.scoring.next(), if !self.scoring.is_empty() => self.scored(scored),
            else => std::future::pending().await,
        }
    }

    /// The checklists the lane holds in memory, by key.
    pub(super) fn into_checklists(self) -> HashMap<String, Arc<Checklist>> {
        self.checklists.into_map()
    }

    fn made(&mut self, key: String, out: Result<Checklist, StageError>) -> Result<Step, StageError> {
        let records = self.waiting.remove(&key).unwrap_or_default();
        self.waiting_n -= records.len();
        match out {
            Ok(c) => {
                let first_with_categories = !self.categorized && has_categories(&c);
                self.categorized |= first_with_categories;
                let indices = records.iter().map(|p| p.index as u32).collect();
                let c = Arc::new(c);
                self.checklists.insert(key.clone(), c.clone());
                self.queue.extend(records.into_iter().map(|p| (p, c.clone())));
                Ok(Step::Checklist { key, checklist: c, first_with_categories, indices })
            }
            Err(e) if generation_fails_run(&e, self.single) => Err(e),
            Err(e) => {
                tracing::warn!(run_id = %self.ctx.run_id(), error = %e, "checklist generation failed for one input");
                let why = generation_failure(&e);
                Ok(Step::Settled(
                    records
                        .into_iter()
                        .map(|p| {
                            let r = self.result(&p, "", why.clone());
                            (p, r)
                        })
                        .collect(),
                ))
            }
        }
    }

    fn scored(&mut self, scored: Result<Scored, StageError>) -> Result<Step, StageError> {
        let (p, checklist, answering, scored) = match scored {
            Ok(x) => x,
            Err(StageError::Cancelled(_)) if self.ctx.gate.is_cancelled() => return Ok(Step::Cancelled),
            Err(e) => return Err(e),
        };
        self.reserve.charge(&answering);
        let mut result = settle(self.ctx, &mut self.reserve, p.index, &p.record, &checklist.id, scored)?;
        if let Some((i, j, sample)) = target_of(p.index, &self.eval.responders) {
            let response = self.answers.settled(i, j, sample, self.eval.responders[j].samples);
            label(&mut result, &self.eval.responders, response.as_deref());
        }
        Ok(Step::Settled(vec![(p, result)]))
    }

    /// A record's result without a score, named by its responder (with responders).
    fn result(&self, p: &Pending, checklist_id: &str, why: String) -> gw::RecordResult {
        let mut r = record_result(p.index, &p.record, checklist_id, None, why);
        label(&mut r, &self.eval.responders, None);
        r
    }
}

/// A record's scoring as its result: the usage and model counted when it was scored; a call the
/// budget refused says "not run"; a transient failure fails the record; bad input or a refused
/// request fails the run.
fn settle(
    ctx: &RunCtx,
    reserve: &mut Reserve,
    i: usize,
    r: &EvalRecord,
    checklist_id: &str,
    scored: Result<(gw::RecordResult, Usage, ModelRecord), StageError>,
) -> Result<gw::RecordResult, StageError> {
    Ok(match scored {
        Ok((result, usage, model)) => {
            reserve.add(&usage);
            ctx.spending.add_usage(&usage);
            ctx.progress.add_model(&model);
            result
        }
        Err(
            e @ (StageError::InvalidArgument(_) | StageError::FailedPrecondition(_) | StageError::Unimplemented(_)),
        ) => {
            return Err(e);
        }
        Err(StageError::BudgetExhausted(m)) => record_result(i, r, checklist_id, None, format!("not run: {m}")),
        Err(e) => record_result(i, r, checklist_id, None, e.to_string()),
    })
}

/// Why the records of a checklist that could not be produced fail (each on its own): not run when
/// a budget or cap refused the generation.
fn generation_failure(e: &StageError) -> String {
    if let StageError::BudgetExhausted(why) = e {
        format!("not run: {}", why.message)
    } else {
        format!("checklist generation failed: {e}")
    }
}

/// Whether a failed generation fails the whole run: a request the generator refused (the others
/// fail only their records, unless the run has a single checklist).
fn generation_fails_run(e: &StageError, single: bool) -> bool {
    single
        || matches!(
            e,
            StageError::InvalidArgument(_)
                | StageError::FailedPrecondition(_)
                | StageError::Unimplemented(_)
                | StageError::Cancelled(_)
        )
}
