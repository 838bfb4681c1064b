//! A checklist_eval run whose records came with its request: they are the source of the run's
//! record lane, admitted as it has room; each result is stored by position and said in full, and
//! the run's end reads them back for the evaluation it returns. A run kept in memory (Evaluate)
//! with one checklist scores every record in one scorer call instead.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use assay_domain::{Checklist, StageError};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;

use super::super::checklist::{self, CHECKLIST};
use super::super::responders::per_record;
use super::ChecklistEval;
use super::decide::{self, Decider, Said};
use super::lane::{Checklists, Lane, Pending, Step, stored_results};
use assay_runs::{RunCtx, RunOutcome, Writes};

impl ChecklistEval {
    /// Each record is scored as soon as its checklist exists: generation (one per distinct
    /// input) and scoring overlap, so the run's critical path is one generation and one scoring.
    /// The request's records are the source of the run's [`Lane`], admitted as it has room.
    pub(super) async fn run_inline(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        // Each record's checklist key, and per key the results its checklist is for.
        let keys: Vec<String> = self.records.iter().map(|r| self.plan.key(r)).collect();
        let per = per_record(&self.responders).max(1);
        let mut for_key: HashMap<&str, Vec<u32>> = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            for_key.entry(k.as_str()).or_default().extend((i * per..(i + 1) * per).map(|t| t as u32));
        }
        // The run's only checklist (explicit, from a corpus, or every record's input the same)
        // fails the run when it cannot be produced; one of many fails its records only.
        let single = self.plan.preset().is_none() || for_key.len() == 1;
        if ctx.is_ephemeral() && for_key.len() == 1 && !ctx.spending.has_budget() && self.responders.is_empty() {
            // Evaluate with one checklist: nothing to overlap; every record in one scorer call.
            // (With a budget, records go one scorer call each, so those scored before it ran
            // out are kept.)
            let checklist = self.plan.produce(ctx, &self.stages, &self.records[0], 0).await?;
            return self.score_together(ctx, &checklist, &self.scorer).await;
        }
        // The checklists a previous process stored (a resumed run): every one in memory.
        let mut stored = HashMap::new();
        for (key, c) in ctx.checkpoints.all::<assay_proto::common::v1::Checklist>(CHECKLIST).await? {
            if let Some(key) = key.strip_prefix(CHECKLIST).filter(|k| for_key.contains_key(*k)) {
                stored.insert(key.to_string(), Arc::new(checklist::decode_checklist(c)?));
            }
        }
        let done = stored_results(ctx).await?;
        ctx.progress.set_done(done.count());
        let n = self.records.len();
        // Records the run asked: admitted, or with a result stored before a restart.
        let mut asked: Vec<bool> = (0..n).map(|i| (i * per..(i + 1) * per).any(|t| done.contains(t))).collect();
        // A run that stops when decided takes its records in a seeded random order, and a resumed
        // one feeds what it stored first (in that order: the same decision at the same record).
        let mut decider = self.stop.map(|s| {
            let seed = s.seed_for(ctx.run_id());
            Decider::new(s, seed, &self.responders, decide::order(n, seed))
        });
        let order: Vec<usize> = decider.as_ref().map_or_else(|| (0..n).collect(), |d| d.order().to_vec());
        if let Some(d) = decider.as_mut() {
            for (t, r) in ctx.results.all::<gw::RecordResult>().await? {
                d.settle(t as usize, &r, &self.responders);
            }
        }
        let mut stopped = decider.as_ref().is_some_and(Decider::decided);
        let mut said = Said::default();
        let mut lane = Lane::new(self, ctx, single, Checklists::complete(stored));
        let mut next = 0usize;
        // Checkpoints and events are queued, not waited for one by one: the run's writer stores
        // them in order, many per transaction, while the lane goes on starting scorer calls.
        let mut writes = Writes::default();
        let mut cancelled = false;
        loop {
            for (p, r) in lane.not_run() {
                if let Some(d) = decider.as_mut() {
                    d.settle(p.index, &r, &self.responders);
                }
                store_result(ctx, p.index, r, &mut writes);
            }
            let room = lane.room();
            let mut fresh = Vec::new();
            // A run that stops when decided asks only so far ahead of the records fed to its
            // sequences.
            let lead = decider.as_ref().map_or(usize::MAX, |d| d.lead(self.concurrency));
            while next < n && next < lead && fresh.len() < room && !stopped {
                // Each response of a record its own result (its id the record's position when none
                // is given), each result scored once.
                let i = order[next];
                let mut record = self.records[i].clone();
                if !self.responders.is_empty() {
                    record.id = record.id_or(i);
                }
                for t in (i * per..(i + 1) * per).filter(|t| !done.contains(*t)) {
                    fresh.push((keys[i].clone(), Pending { index: t, record: record.clone(), chunk: 0 }));
                }
                asked[i] = true;
                next += 1;
            }
            if !fresh.is_empty() {
                lane.admit(fresh).await?;
            }
            lane.start();
            if (next >= n || stopped) && lane.is_empty() {
                break;
            }
            tokio::select! {
                step = lane.next() => match step? {
                    Step::Checklist { key, checklist, first_with_categories: _, indices: _ } => {
                        // A run kept in memory is never resumed nor watched.
                        if !ctx.is_ephemeral() {
                            let wire = convert::checklist_to(&checklist);
                            writes.push(ctx.checkpoints.queued(&format!("{CHECKLIST}{key}"), &wire));
                            let record_indices = for_key.get(key.as_str()).cloned().unwrap_or_default();
                            writes.push(ctx.log.emit_queued(Event::ChecklistReady(gw::ChecklistReady {
                                checklist: Some(wire),
                                record_indices,
                            })));
                        }
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
                    Step::Cancelled => {
                        cancelled = true;
                        break;
                    }
                },
                e = writes.next_error() => return Err(e),
                () = ctx.gate.cancelled() => {
                    cancelled = true;
                    break;
                }
            }
        }
        let made = lane.into_checklists();
        let sequential = decider.as_ref().map(|d| {
            said.last(ctx, d, &self.responders, &mut writes);
            let not_asked: Vec<String> = (0..n).filter(|i| !asked[*i]).map(|i| self.records[i].id_or(i)).collect();
            d.result(ctx, &self.responders, n - not_asked.len(), not_asked, stopped)
        });
        writes.flush().await?;
        // The run's checklists, in the order of the records that need them.
        let mut seen = HashSet::new();
        let checklists: Vec<Checklist> = keys
            .iter()
            .filter(|k| seen.insert(k.as_str()))
            .filter_map(|k| made.get(k).map(|c| (**c).clone()))
            .collect();
        let asked: Vec<usize> = (0..n).filter(|i| asked[*i]).collect();
        if sequential.as_ref().is_some_and(|q| q.stopped_early) {
            // The run's work is what it asked: a decided comparison left the rest (the result
            // lists them), so its progress ends whole.
            ctx.progress.set_total(u32::try_from(asked.len() * per).unwrap_or(u32::MAX), false);
        }
        self.finish(ctx, &checklists, cancelled || ctx.gate.is_cancelled(), &asked, sequential).await
    }
}

/// A request's record settled: its result stored, counted and said.
fn store_result(ctx: &RunCtx, index: usize, result: gw::RecordResult, writes: &mut Writes) {
    writes.push(ctx.results.queued(index as u64, &result));
    ctx.progress.add_done();
    writes.push(ctx.log.emit_queued(Event::RecordScored(result)));
}
