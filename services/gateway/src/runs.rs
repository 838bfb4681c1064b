//! Durable pipeline runs: creation, execution with per-record checkpoints, gap-free event sequences
//! persisted and broadcast, watch/reattach, pause/resume/cancel, and resume after a restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use assay_domain::{AggregateScores, Checklist, ScoreRequest, ScoreTarget, Scorer, StageError, Violations};
use assay_proto::common::v1 as pb;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use futures::StreamExt;
use tokio::sync::{broadcast, watch};

use crate::core::Evaluation;
use crate::stages::{ChecklistRefiner, CorpusGenerator, StageEvent};
use crate::store::{RunStore, StoredRun};

fn now() -> prost_types::Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// A run being executed by this gateway.
struct LiveRun {
    events: broadcast::Sender<gw::RunEvent>,
    /// Serialises sequence assignment + persistence so sequences are gap-free and ordered.
    seq: tokio::sync::Mutex<u64>,
    run: Mutex<gw::Run>,
    paused: watch::Sender<bool>,
    cancelled: watch::Sender<bool>,
    /// Models used so far (reproducibility records).
    models: Mutex<Vec<assay_domain::ModelRecord>>,
}

/// Run manager.
#[derive(Clone)]
pub struct Runs {
    store: RunStore,
    scorer: Arc<dyn Scorer>,
    generator: Option<Arc<dyn assay_generator::ChecklistGenerator>>,
    corpus: Option<Arc<dyn CorpusGenerator>>,
    refiner: Option<Arc<dyn ChecklistRefiner>>,
    live: Arc<Mutex<HashMap<String, Arc<LiveRun>>>>,
    concurrency: usize,
    /// Set when this gateway stops: executors quit without touching stored state, so the next
    /// gateway resumes the runs where they were.
    halt: Arc<watch::Sender<bool>>,
}

/// Parse and validate a checklist evaluation pipeline.
pub fn evaluation(p: gw::ChecklistEvalPipeline) -> Result<Evaluation, StageError> {
    crate::grpc::evaluation_from(p)
}

fn is_terminal(state: i32) -> bool {
    [gw::RunState::Succeeded, gw::RunState::Partial, gw::RunState::Failed, gw::RunState::Cancelled]
        .iter()
        .any(|s| *s as i32 == state)
}

impl Runs {
    pub fn new(store: RunStore, scorer: Arc<dyn Scorer>, concurrency: usize) -> Self {
        Self {
            store,
            scorer,
            generator: None,
            corpus: None,
            refiner: None,
            live: Arc::default(),
            concurrency: concurrency.max(1),
            halt: Arc::new(watch::channel(false).0),
        }
    }

    /// Generate checklists from presets with this generator.
    pub fn with_generator(mut self, generator: Arc<dyn assay_generator::ChecklistGenerator>) -> Self {
        self.generator = Some(generator);
        self
    }

    /// Generate corpus-level checklists with this generator.
    pub fn with_corpus(mut self, corpus: Arc<dyn CorpusGenerator>) -> Self {
        self.corpus = Some(corpus);
        self
    }

    /// Refine checklists with this refiner chain.
    pub fn with_refiner(mut self, refiner: Arc<dyn ChecklistRefiner>) -> Self {
        self.refiner = Some(refiner);
        self
    }

    /// Stop executing runs (gateway shutdown). Unfinished runs stay RUNNING in the store.
    pub fn halt(&self) {
        self.halt.send_replace(true);
    }

    pub fn store(&self) -> &RunStore {
        &self.store
    }

    fn live(&self, run_id: &str) -> Option<Arc<LiveRun>> {
        self.live.lock().ok().and_then(|m| m.get(run_id).cloned())
    }

    async fn emit(&self, live: &LiveRun, run_id: &str, event: Event) -> Result<(), StageError> {
        let mut seq = live.seq.lock().await;
        let ev = gw::RunEvent { run_id: run_id.to_string(), sequence: *seq + 1, time: Some(now()), event: Some(event) };
        self.store.append_event(ev.clone()).await?;
        *seq += 1;
        let run = {
            let mut r = live.run.lock().map_err(|_| StageError::Internal("run lock poisoned".into()))?;
            r.last_sequence = *seq;
            r.updated_at = ev.time;
            r.clone()
        };
        self.store.update(run).await?;
        let _ = live.events.send(ev);
        Ok(())
    }

    fn snapshot(live: &LiveRun) -> gw::Run {
        live.run.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn set_state(live: &LiveRun, state: gw::RunState) {
        if let Ok(mut r) = live.run.lock() {
            r.state = state as i32;
        }
    }

    /// Validate, store and start a pipeline. Returns the run id and a receiver subscribed before the
    /// first event.
    pub async fn start(
        &self,
        request: gw::RunPipelineRequest,
    ) -> Result<(String, broadcast::Receiver<gw::RunEvent>), StageError> {
        let (kind, records) = match &request.pipeline {
            Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)) => {
                validate_generation(&evaluation(p.clone())?)?;
                (gw::PipelineKind::ChecklistEval, p.records.len() as u32)
            }
            Some(gw::run_pipeline_request::Pipeline::GenerateChecklist(p)) => {
                validate_generation(&crate::grpc::generation_from(p.clone())?).map_err(|e| {
                    e.map_fields(|f| match f.strip_prefix("pipeline.records[0]") {
                        Some(rest) => format!("pipeline.record{rest}"),
                        None => f.to_string(),
                    })
                })?;
                (gw::PipelineKind::GenerateChecklist, 0)
            }
            Some(
                gw::run_pipeline_request::Pipeline::TargetedRefinement(_)
                | gw::run_pipeline_request::Pipeline::SelfRefine(_)
                | gw::run_pipeline_request::Pipeline::Debate(_),
            ) => {
                return Err(StageError::Unimplemented(
                    "this pipeline is not available yet; checklist_eval and generate_checklist are".into(),
                ));
            }
            None => return Err(StageError::invalid("pipeline", "is required (checklist_eval or generate_checklist)")),
        };
        let run_id = uuid::Uuid::now_v7().to_string();
        let t = now();
        let run = gw::Run {
            run_id: run_id.clone(),
            kind: kind as i32,
            state: gw::RunState::Running as i32,
            label: request.label.clone(),
            created_at: Some(t),
            updated_at: Some(t),
            last_sequence: 0,
            records_total: records,
            records_done: 0,
            result: None,
            usage: Some(pb::Usage::default()),
        };
        self.store.create(run.clone(), request.clone()).await?;
        let (live, rx) = self.register(run, 0);
        self.emit(&live, &run_id, Event::Started(gw::RunStarted { kind: kind as i32, records })).await?;
        self.spawn(run_id.clone(), request, live);
        Ok((run_id, rx))
    }

    fn register(&self, run: gw::Run, seq: u64) -> (Arc<LiveRun>, broadcast::Receiver<gw::RunEvent>) {
        let (tx, rx) = broadcast::channel(4096);
        let live = Arc::new(LiveRun {
            events: tx,
            seq: tokio::sync::Mutex::new(seq),
            run: Mutex::new(run.clone()),
            paused: watch::channel(false).0,
            cancelled: watch::channel(false).0,
            models: Mutex::new(Vec::new()),
        });
        if let Ok(mut m) = self.live.lock() {
            m.insert(run.run_id.clone(), live.clone());
        }
        (live, rx)
    }

    fn spawn(&self, run_id: String, request: gw::RunPipelineRequest, live: Arc<LiveRun>) {
        let this = self.clone();
        let mut halt = self.halt.subscribe();
        tokio::spawn(async move {
            let outcome = tokio::select! {
                o = this.execute(&run_id, request, &live) => o,
                () = async { let _ = halt.wait_for(|h| *h).await; } => {
                    tracing::info!(run_id = %run_id, "gateway stopping; run left to resume");
                    Ok(())
                }
            };
            if let Err(e) = outcome {
                tracing::warn!(run_id = %run_id, error = %e, "run failed");
                Self::set_state(&live, gw::RunState::Failed);
                let result = gw::RunResult { result: None, error: e.to_string() };
                if let Ok(mut r) = live.run.lock() {
                    r.result = Some(result.clone());
                }
                let _ = this
                    .emit(
                        &live,
                        &run_id,
                        Event::Completed(gw::RunCompleted { state: gw::RunState::Failed as i32, result: Some(result) }),
                    )
                    .await;
            }
            if let Ok(mut m) = this.live.lock() {
                m.remove(&run_id);
            }
        });
    }

    async fn execute(&self, run_id: &str, request: gw::RunPipelineRequest, live: &LiveRun) -> Result<(), StageError> {
        let p = match request.pipeline {
            Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)) => p,
            Some(gw::run_pipeline_request::Pipeline::GenerateChecklist(p)) => {
                return self.execute_generation(run_id, crate::grpc::generation_from(p)?, live).await;
            }
            Some(
                gw::run_pipeline_request::Pipeline::TargetedRefinement(_)
                | gw::run_pipeline_request::Pipeline::SelfRefine(_)
                | gw::run_pipeline_request::Pipeline::Debate(_),
            )
            | None => return Err(StageError::Internal("stored run has no pipeline this gateway runs".into())),
        };
        let eval = evaluation(p)?;
        // Checklists: stored once so a resumed run scores against exactly the same ones.
        let (checklists, record_checklist, failures) = self.checklists(run_id, &eval, live).await?;
        let mut eval = eval;
        if !eval.scorer_set
            && let Some(p) = eval.preset
        {
            eval.scorer = p.default_scorer();
        }
        let eval = eval;
        let done: std::collections::HashSet<u32> = self.store.records(run_id).await?.iter().map(|r| r.index).collect();
        if let Ok(mut r) = live.run.lock() {
            r.records_done = done.len() as u32;
        }
        let mut todo: Vec<usize> = (0..eval.records.len()).filter(|i| !done.contains(&(*i as u32))).collect();
        // Records whose checklist could not be generated fail on their own; the others go on.
        for i in todo.iter().copied().filter(|i| failures[record_checklist[*i]].is_some()) {
            let why = failures[record_checklist[i]].clone().unwrap_or_default();
            let result = gw::RecordResult {
                index: i as u32,
                record_id: record_id(&eval, i),
                checklist_id: String::new(),
                score: None,
                error: format!("checklist generation failed: {why}"),
            };
            self.store.put_record(run_id, result.clone()).await?;
            if let Ok(mut r) = live.run.lock() {
                r.records_done += 1;
            }
            self.emit(live, run_id, Event::RecordScored(result)).await?;
        }
        todo.retain(|i| failures[record_checklist[*i]].is_none());
        let checklists_ok: Vec<Checklist> =
            checklists.iter().zip(&failures).filter(|(_, f)| f.is_none()).map(|(c, _)| c.clone()).collect();
        let mut cancelled = live.cancelled.subscribe();
        let paused = live.paused.subscribe();
        let checklists_ref = &checklists;
        let record_checklist_ref = &record_checklist;
        let eval_ref = &eval;
        let mut work = futures::stream::iter(todo)
            .map(|i| {
                let mut paused = paused.clone();
                async move {
                    // Paused runs start no new record; in-flight ones finish.
                    {
                        let _ = paused.wait_for(|p| !*p).await;
                    }
                    let checklist = &checklists_ref[record_checklist_ref[i]];
                    (i, self.score_one(checklist, eval_ref, i).await)
                }
            })
            .buffer_unordered(self.concurrency);
        loop {
            tokio::select! {
                next = work.next() => {
                    let Some((i, result)) = next else { break };
                    let result = match result {
                        Ok((r, usage, model)) => {
                            if let Ok(mut run) = live.run.lock() {
                                let mut total = convert::usage_from(run.usage);
                                total.add(&usage);
                                run.usage = Some(convert::usage_to(&total));
                            }
                            if let Ok(mut m) = live.models.lock()
                                && !m.contains(&model)
                            {
                                m.push(model);
                            }
                            r
                        }
                        Err(e @ (StageError::InvalidArgument(_) | StageError::FailedPrecondition(_) | StageError::Unimplemented(_))) => return Err(e),
                        Err(e) => gw::RecordResult {
                            index: i as u32,
                            record_id: record_id(&eval, i),
                            checklist_id: checklists[record_checklist[i]].id.clone(),
                            score: None,
                            error: e.to_string(),
                        },
                    };
                    self.store.put_record(run_id, result.clone()).await?;
                    if let Ok(mut r) = live.run.lock() {
                        r.records_done += 1;
                    }
                    self.emit(live, run_id, Event::RecordScored(result)).await?;
                }
                () = async { let _ = cancelled.wait_for(|c| *c).await; } => {
                    drop(work);
                    Self::set_state(live, gw::RunState::Cancelled);
                    let result = self.result(live, run_id, &checklists_ok).await?;
                    self.emit(live, run_id, Event::Completed(gw::RunCompleted { state: gw::RunState::Cancelled as i32, result: Some(result) })).await?;
                    return Ok(());
                }
            }
        }
        drop(work);
        let result = self.result(live, run_id, &checklists_ok).await?;
        let failed = result
            .result
            .as_ref()
            .and_then(|r| match r {
                gw::run_result::Result::ChecklistEval(e) => {
                    Some(e.results.iter().filter(|r| r.score.is_none()).count())
                }
                gw::run_result::Result::Checklist(_)
                | gw::run_result::Result::SelfRefine(_)
                | gw::run_result::Result::Debate(_)
                | gw::run_result::Result::TargetedRefinement(_) => None,
            })
            .unwrap_or(0);
        if let Some(gw::run_result::Result::ChecklistEval(e)) = &result.result {
            self.emit(live, run_id, Event::Aggregate(gw::AggregateReady { aggregate: e.aggregate.clone() })).await?;
        }
        let state = if failed == 0 {
            gw::RunState::Succeeded
        } else if failed == eval.records.len() {
            gw::RunState::Failed
        } else {
            gw::RunState::Partial
        };
        Self::set_state(live, state);
        if let Ok(mut r) = live.run.lock() {
            r.result = Some(result.clone());
            if let Some(gw::run_result::Result::ChecklistEval(e)) = &result.result {
                r.usage = e.usage;
            }
        }
        self.emit(live, run_id, Event::Completed(gw::RunCompleted { state: state as i32, result: Some(result) })).await
    }

    /// A generate-only run: the checklist (generated, from a corpus or given), refined, as the result.
    async fn execute_generation(&self, run_id: &str, eval: Evaluation, live: &LiveRun) -> Result<(), StageError> {
        let (checklists, _, failures) = self.checklists(run_id, &eval, live).await?;
        if let Some(why) = failures.into_iter().flatten().next() {
            return Err(StageError::Unavailable(format!("checklist generation failed: {why}")));
        }
        let checklist = checklists.into_iter().next().unwrap_or_default();
        let result = gw::RunResult {
            result: Some(gw::run_result::Result::Checklist(convert::checklist_to(&checklist))),
            error: String::new(),
        };
        Self::set_state(live, gw::RunState::Succeeded);
        if let Ok(mut r) = live.run.lock() {
            r.result = Some(result.clone());
        }
        self.emit(
            live,
            run_id,
            Event::Completed(gw::RunCompleted { state: gw::RunState::Succeeded as i32, result: Some(result) }),
        )
        .await
    }

    fn add_usage(live: &LiveRun, usage: &assay_domain::Usage) {
        if let Ok(mut run) = live.run.lock() {
            let mut total = convert::usage_from(run.usage);
            total.add(usage);
            run.usage = Some(convert::usage_to(&total));
        }
    }

    fn add_model(live: &LiveRun, model: &assay_domain::ModelRecord) {
        if let Ok(mut m) = live.models.lock()
            && !m.contains(model)
        {
            m.push(model.clone());
        }
    }

    async fn progress(&self, live: &LiveRun, run_id: &str, service: &str, p: pb::Progress) -> Result<(), StageError> {
        self.emit(live, run_id, Event::Progress(gw::StageProgress { service: service.into(), progress: Some(p) })).await
    }

    /// Produce one checklist: generate (instance preset or corpus) or take the given one, then run the
    /// refiner chain on it, relaying stage progress as run events.
    async fn produce(
        &self,
        run_id: &str,
        live: &LiveRun,
        eval: &Evaluation,
        record: usize,
    ) -> Result<Checklist, StageError> {
        let mut checklist = if let Some(preset) = eval.preset {
            let generator = self
                .generator
                .clone()
                .ok_or_else(|| StageError::Unimplemented("this gateway has no generator configured".into()))?;
            let req = generate_request(preset, eval, &eval.records[record]);
            let out = generator
                .generate(req)
                .await
                .map_err(|e| e.map_fields(|f| format!("pipeline.records[{record}].{f}")))?;
            Self::add_usage(live, &out.usage);
            Self::add_model(live, &out.model);
            out.checklist
        } else if let Some(corpus) = &eval.corpus {
            let generator = self
                .corpus
                .clone()
                .ok_or_else(|| StageError::Unimplemented("this gateway has no corpus generator configured".into()))?;
            let rename = |e: StageError| e.map_fields(|f| format!("pipeline.source.corpus.{f}"));
            let mut events = generator.generate_corpus(corpus.clone()).await.map_err(rename)?;
            let mut result = None;
            while let Some(ev) = events.next().await {
                match ev.map_err(rename)? {
                    StageEvent::Progress(p) => self.progress(live, run_id, "generator", p).await?,
                    StageEvent::Done(r) => result = Some(r),
                }
            }
            let r = result.ok_or_else(|| StageError::Unavailable("corpus generation ended without a result".into()))?;
            Self::add_usage(live, &convert::usage_from(r.usage));
            Self::add_model(live, &convert::model_record_from(r.model.clone()));
            decode_checklist(r.checklist.unwrap_or_default())?
        } else {
            let mut c = eval.checklist.clone();
            if c.id.is_empty() {
                c.id = format!("checklist-{}", uuid::Uuid::now_v7());
            }
            if c.source_method.is_empty() {
                c.source_method = "explicit".into();
            }
            c
        };
        if !eval.refiners.is_empty() {
            let refiner = self
                .refiner
                .clone()
                .ok_or_else(|| StageError::Unimplemented("this gateway has no refiners service configured".into()))?;
            let request = assay_proto::refiners::v1::RefineChecklistRequest {
                items: checklist.items.iter().map(convert::checklist_item_to).collect(),
                steps: eval.refiners.clone(),
            };
            let rename = |e: StageError| {
                e.map_fields(|f| match f.strip_prefix("steps") {
                    Some(rest) => format!("pipeline.refiners{rest}"),
                    None => format!("pipeline.refiners.{f}"),
                })
            };
            let mut events = refiner.refine(request).await.map_err(rename)?;
            let mut result = None;
            while let Some(ev) = events.next().await {
                match ev.map_err(rename)? {
                    StageEvent::Progress(p) => self.progress(live, run_id, "refiners", p).await?,
                    StageEvent::Done(r) => result = Some(r),
                }
            }
            let r = result.ok_or_else(|| StageError::Unavailable("refinement ended without a result".into()))?;
            Self::add_usage(live, &convert::usage_from(r.usage));
            if r.items.is_empty() {
                let removed: Vec<String> = r
                    .actions
                    .iter()
                    .filter(|a| a.kind != assay_proto::refiners::v1::ActionKind::Kept as i32)
                    .take(3)
                    .map(|a| format!("{} {}: {}", a.refiner, a.item_id, a.reason))
                    .collect();
                return Err(StageError::Unavailable(format!(
                    "the refiner chain removed every one of the {} items of checklist {} (first: {})",
                    checklist.items.len(),
                    checklist.id,
                    removed.join("; ")
                )));
            }
            let mut refined = convert::checklist_to(&checklist);
            refined.items = r.items;
            checklist.items = decode_checklist(refined)?.items;
            checklist.metadata.insert(
                "refiners".into(),
                eval.refiners.iter().filter_map(|s| s.step.as_ref().map(refiner_name)).collect::<Vec<_>>().join(","),
            );
        }
        Ok(checklist)
    }

    /// The run's checklists, per record the index of the one it is scored against, and per
    /// checklist why it could not be produced (a transient stage failure for one of several
    /// inputs fails only that input's records; bad input or a rejected request fails the run).
    /// Each is stored once produced, so a resumed run scores against exactly the same ones.
    async fn checklists(
        &self,
        run_id: &str,
        eval: &Evaluation,
        live: &LiveRun,
    ) -> Result<(Vec<Checklist>, Vec<usize>, Vec<Option<String>>), StageError> {
        let stored = self.store.checklists(run_id).await?;
        // One checklist per distinct (input, reference, history, candidates) with a preset; else one.
        let mut keys: Vec<String> = Vec::new();
        let mut record_key = Vec::with_capacity(eval.records.len());
        for r in &eval.records {
            let key = if eval.preset.is_some() {
                serde_key(r)
            } else if eval.corpus.is_some() {
                "corpus".to_string()
            } else {
                "explicit".to_string()
            };
            let k = match keys.iter().position(|x| *x == key) {
                Some(k) => k,
                None => {
                    keys.push(key);
                    keys.len() - 1
                }
            };
            record_key.push(k);
        }
        let mut found: Vec<Option<Checklist>> = vec![None; keys.len()];
        for (k, c) in stored {
            if let Some(pos) = keys.iter().position(|x| *x == k) {
                found[pos] = Some(decode_checklist(c)?);
            }
        }
        let missing: Vec<usize> = (0..keys.len()).filter(|k| found[*k].is_none()).collect();
        let mut producing = futures::stream::iter(missing)
            .map(|k| {
                let first = record_key.iter().position(|x| *x == k).unwrap_or(0);
                async move { (k, self.produce(run_id, live, eval, first).await) }
            })
            .buffer_unordered(self.concurrency);
        let mut failures: Vec<Option<String>> = vec![None; keys.len()];
        while let Some((k, out)) = producing.next().await {
            let checklist = match out {
                Ok(c) => c,
                Err(
                    e @ (StageError::InvalidArgument(_)
                    | StageError::FailedPrecondition(_)
                    | StageError::Unimplemented(_)),
                ) => return Err(e),
                Err(e) if keys.len() == 1 => return Err(e),
                Err(e) => {
                    tracing::warn!(run_id = %run_id, error = %e, "checklist generation failed for one input");
                    failures[k] = Some(e.to_string());
                    continue;
                }
            };
            self.store.put_checklist(run_id, &keys[k], convert::checklist_to(&checklist)).await?;
            let indices = record_key.iter().enumerate().filter(|(_, x)| **x == k).map(|(i, _)| i as u32).collect();
            let ready =
                gw::ChecklistReady { checklist: Some(convert::checklist_to(&checklist)), record_indices: indices };
            self.emit(live, run_id, Event::ChecklistReady(ready)).await?;
            found[k] = Some(checklist);
        }
        drop(producing);
        let checklists = found.into_iter().map(Option::unwrap_or_default).collect();
        Ok((checklists, record_key, failures))
    }

    async fn score_one(
        &self,
        checklist: &Checklist,
        eval: &Evaluation,
        i: usize,
    ) -> Result<(gw::RecordResult, assay_domain::Usage, assay_domain::ModelRecord), StageError> {
        let r = &eval.records[i];
        let target = ScoreTarget {
            id: record_id(eval, i),
            input: if r.input.is_empty() { checklist.input.clone() } else { r.input.clone() },
            target: r.target.clone(),
            reference: r.reference.clone(),
            history: r.history.clone(),
        };
        let req = ScoreRequest {
            checklist: checklist.clone(),
            targets: vec![target],
            config: eval.scorer.clone(),
            model: eval.scorer_model.clone(),
        };
        let out = self.scorer.score(req, &assay_domain::no_events).await?;
        let usage = out.usage;
        let model = out.model;
        let score =
            out.scores.into_iter().next().ok_or_else(|| StageError::Internal("scorer returned no score".into()))?;
        let mut pscore = convert::score_to(&score);
        pscore.target_id = record_id(eval, i);
        let result = gw::RecordResult {
            index: i as u32,
            record_id: record_id(eval, i),
            checklist_id: checklist.id.clone(),
            score: Some(pscore),
            error: String::new(),
        };
        Ok((result, usage, model))
    }

    /// The evaluation result from every stored record, in record order.
    async fn result(
        &self,
        live: &LiveRun,
        run_id: &str,
        checklists: &[Checklist],
    ) -> Result<gw::RunResult, StageError> {
        let records = self.store.records(run_id).await?;
        let scored: Vec<(assay_domain::Score, &Checklist)> = records
            .iter()
            .filter_map(|r| {
                let cl = checklists.iter().find(|c| c.id == r.checklist_id)?;
                Some((convert::score_from(r.score.clone()?), cl))
            })
            .collect();
        let aggregate = AggregateScores::compute(scored.iter().map(|(s, c)| (s, *c)));
        let usage = Self::snapshot(live).usage.unwrap_or_default();
        let models = live.models.lock().map(|m| m.iter().map(convert::model_record_to).collect()).unwrap_or_default();
        Ok(gw::RunResult {
            result: Some(gw::run_result::Result::ChecklistEval(gw::EvaluateResponse {
                run_id: run_id.to_string(),
                results: records,
                aggregate: Some(convert::aggregate_to(&aggregate)),
                checklists: checklists.iter().map(convert::checklist_to).collect(),
                usage: Some(usage),
                models,
            })),
            error: String::new(),
        })
    }

    /// Store an evaluation that already finished (the unary Evaluate path).
    pub async fn record_finished(
        &self,
        pipeline: gw::ChecklistEvalPipeline,
        response: gw::EvaluateResponse,
    ) -> Result<(), StageError> {
        let t = now();
        let failed = response.results.iter().filter(|r| r.score.is_none()).count();
        let state = if failed == 0 { gw::RunState::Succeeded } else { gw::RunState::Partial };
        let result = gw::RunResult {
            result: Some(gw::run_result::Result::ChecklistEval(response.clone())),
            error: String::new(),
        };
        let run = gw::Run {
            run_id: response.run_id.clone(),
            kind: gw::PipelineKind::ChecklistEval as i32,
            state: state as i32,
            label: "evaluate".into(),
            created_at: Some(t),
            updated_at: Some(t),
            last_sequence: 1,
            records_total: response.results.len() as u32,
            records_done: response.results.len() as u32,
            result: Some(result.clone()),
            usage: response.usage,
        };
        let request = gw::RunPipelineRequest {
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
            label: "evaluate".into(),
        };
        self.store.create(run, request).await?;
        for r in response.results {
            self.store.put_record(&response.run_id, r).await?;
        }
        self.store
            .append_event(gw::RunEvent {
                run_id: response.run_id.clone(),
                sequence: 1,
                time: Some(t),
                event: Some(Event::Completed(gw::RunCompleted { state: state as i32, result: Some(result) })),
            })
            .await
    }

    /// A run's summary (with result).
    pub async fn get(&self, run_id: &str) -> Result<gw::Run, StageError> {
        if let Some(live) = self.live(run_id) {
            return Ok(Self::snapshot(&live));
        }
        self.store.get(run_id).await?.map(|s| s.run).ok_or_else(|| StageError::NotFound(format!("run {run_id}")))
    }

    /// Replay events after `after`, then follow live ones until the run completes.
    pub async fn watch(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<impl futures::Stream<Item = Result<gw::RunEvent, StageError>> + Send + 'static, StageError> {
        let live_rx = self.live(run_id).map(|l| l.events.subscribe());
        if live_rx.is_none() && self.store.get(run_id).await?.is_none() {
            return Err(StageError::NotFound(format!("run {run_id}")));
        }
        let past = self.store.events_after(run_id, after).await?;
        let mut last = past.last().map_or(after, |e| e.sequence);
        let finished = past.iter().any(|e| matches!(e.event, Some(Event::Completed(_))));
        let stream = async_stream(past, live_rx.filter(|_| !finished), move |ev| {
            if ev.sequence <= last {
                return None;
            }
            last = ev.sequence;
            Some(ev)
        });
        Ok(stream)
    }

    /// Pause, resume or cancel.
    pub async fn control(&self, req: gw::ControlRunRequest) -> Result<gw::Run, StageError> {
        let gw::ControlRunRequest { run_id, action, actor, reason } = req;
        let Some(action) = action else {
            return Err(StageError::invalid("action", "is required (pause, resume, accept, cancel or edit_section)"));
        };
        let Some(live) = self.live(&run_id) else {
            let stored = self.store.get(&run_id).await?.ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
            return Err(StageError::FailedPrecondition(format!(
                "run {run_id} is not in progress (state {})",
                gw::RunState::try_from(stored.run.state).map(|s| s.as_str_name()).unwrap_or("unknown")
            )));
        };
        tracing::info!(run_id = %run_id, actor = %actor, reason = %reason, "run control");
        match action {
            gw::control_run_request::Action::Pause(_) => {
                live.paused.send_replace(true);
                Self::set_state(&live, gw::RunState::Paused);
                self.emit(
                    &live,
                    &run_id,
                    Event::StateChanged(gw::RunStateChanged { state: gw::RunState::Paused as i32, reason }),
                )
                .await?;
            }
            gw::control_run_request::Action::Resume(_) => {
                live.paused.send_replace(false);
                Self::set_state(&live, gw::RunState::Running);
                self.emit(
                    &live,
                    &run_id,
                    Event::StateChanged(gw::RunStateChanged { state: gw::RunState::Running as i32, reason }),
                )
                .await?;
            }
            gw::control_run_request::Action::Cancel(_) => {
                live.paused.send_replace(false);
                live.cancelled.send_replace(true);
            }
            gw::control_run_request::Action::Accept(_) | gw::control_run_request::Action::EditSection(_) => {
                return Err(StageError::FailedPrecondition(
                    "accept and edit_section apply to targeted refinement runs only".into(),
                ));
            }
        }
        Ok(Self::snapshot(&live))
    }

    /// Resume every run left unfinished by a previous gateway process.
    pub async fn resume_unfinished(&self) -> Result<usize, StageError> {
        let runs = self.store.unfinished().await?;
        let n = runs.len();
        for StoredRun { run, request } in runs {
            if is_terminal(run.state) {
                continue;
            }
            let last = self.store.events_after(&run.run_id, 0).await?.last().map_or(0, |e| e.sequence);
            let run_id = run.run_id.clone();
            let (live, _rx) = self.register(run, last);
            self.emit(
                &live,
                &run_id,
                Event::StateChanged(gw::RunStateChanged {
                    state: gw::RunState::Running as i32,
                    reason: "resumed after a gateway restart".into(),
                }),
            )
            .await?;
            tracing::info!(run_id = %run_id, "resuming run");
            self.spawn(run_id, request, live);
        }
        Ok(n)
    }
}

/// The generation request for a record under a preset.
fn generate_request(
    preset: assay_generator::Preset,
    eval: &Evaluation,
    r: &crate::core::EvalRecord,
) -> assay_generator::GenerateRequest {
    let mut req = assay_generator::GenerateRequest::new(preset, r.input.clone());
    req.reference = r.reference.clone();
    req.history = r.history.clone();
    req.max_items = eval.max_items;
    req.model = eval.generator_model.clone();
    match preset {
        assay_generator::Preset::OpenRubricsPairwise => {
            req.chosen = r.candidates.first().cloned().unwrap_or_default();
            req.rejected = r.candidates.get(1).cloned().unwrap_or_default();
        }
        assay_generator::Preset::Tick
        | assay_generator::Preset::RocketEval
        | assay_generator::Preset::RlcfDirect
        | assay_generator::Preset::RlcfCandidate
        | assay_generator::Preset::RlcfCandidatesOnly
        | assay_generator::Preset::OpenRubricsListwise => {
            req.candidates = r
                .candidates
                .iter()
                .enumerate()
                .map(|(i, t)| assay_generator::Candidate { id: i.to_string(), text: t.clone(), model: String::new() })
                .collect();
        }
    }
    req
}

/// A wire checklist as a domain one (validated).
fn decode_checklist(c: pb::Checklist) -> Result<Checklist, StageError> {
    let mut v = Violations::new();
    let c = convert::checklist(Some(c), "checklist", &mut v);
    v.into_result().map(|()| c)
}

fn refiner_name(step: &assay_proto::refiners::v1::refiner_step::Step) -> String {
    use assay_proto::refiners::v1::refiner_step::Step;
    match step {
        Step::Deduplicate(_) => "deduplicator",
        Step::Tag(_) => "tagger",
        Step::UnitTest(_) => "unit_tester",
        Step::Select(_) => "selector",
    }
    .to_string()
}

/// Validate every record's generation request up front (fields named `pipeline.records[i].*`).
fn validate_generation(eval: &Evaluation) -> Result<(), StageError> {
    let Some(preset) = eval.preset else { return Ok(()) };
    let mut v = Violations::new();
    for (i, r) in eval.records.iter().enumerate() {
        if let Err(StageError::InvalidArgument(vs)) =
            assay_generator::Generator::validate(&generate_request(preset, eval, r))
        {
            for f in vs {
                let field = match f.field.as_str() {
                    "preset" => "pipeline.source.preset".to_string(),
                    "max_items" => "pipeline.max_items".to_string(),
                    "model" => "pipeline.generator_model".to_string(),
                    "chosen" | "rejected" => format!("pipeline.records[{i}].candidates"),
                    other => format!("pipeline.records[{i}].{other}"),
                };
                v.push(field, f.description);
            }
        }
    }
    v.into_result()
}

/// Key of what a checklist is generated from.
fn serde_key(r: &crate::core::EvalRecord) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for part in [&r.input, &r.reference, &r.history] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    for c in &r.candidates {
        h.update((c.len() as u64).to_le_bytes());
        h.update(c.as_bytes());
    }
    format!("gen:{}", hex::encode(h.finalize()))
}

fn record_id(eval: &Evaluation, i: usize) -> String {
    let id = &eval.records[i].id;
    if id.is_empty() { i.to_string() } else { id.clone() }
}

/// Past events, then live ones passed through `keep` (dedup by sequence), ending after RunCompleted.
fn async_stream(
    past: Vec<gw::RunEvent>,
    live: Option<broadcast::Receiver<gw::RunEvent>>,
    mut keep: impl FnMut(gw::RunEvent) -> Option<gw::RunEvent> + Send + 'static,
) -> impl futures::Stream<Item = Result<gw::RunEvent, StageError>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<gw::RunEvent, StageError>>(256);
    tokio::spawn(async move {
        for ev in past {
            let done = matches!(ev.event, Some(Event::Completed(_)));
            if tx.send(Ok(keep(ev.clone()).unwrap_or(ev))).await.is_err() || done {
                return;
            }
        }
        let Some(mut live) = live else { return };
        loop {
            match live.recv().await {
                Ok(ev) => {
                    if let Some(ev) = keep(ev) {
                        let done = matches!(ev.event, Some(Event::Completed(_)));
                        if tx.send(Ok(ev)).await.is_err() || done {
                            return;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let _ = tx
                        .send(Err(StageError::ResourceExhausted(format!(
                            "watcher fell {n} events behind; reattach with WatchRun from the last sequence seen"
                        ))))
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
