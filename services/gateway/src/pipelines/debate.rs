//! The `debate` pipeline: a problem set, every problem debated by the debate service (solve, peer
//! review, refine, judge; RunDebateStream), its stage events relayed as `debate_stage` events with
//! the problem's id, one checkpoint per problem (a restarted gateway never redoes a finished
//! problem), then the aggregates: accuracy against the references, consensus and changed-answer
//! rates, tokens and calls. Accuracy comes twice: over the graded problems (those with a reference
//! that did not fail), and over every problem with a reference, a failed one counted as wrong, so
//! a run whose hard problems fail cannot report a better figure than one that answered them.
//!
//! With `baselines`, every problem is also answered without debate by the first solver's model:
//! single model (its first sample) and self-consistency (the majority answer, after normalisation,
//! over as many samples as the debate made model calls for the problem). Samples come from Solve
//! calls whose three solvers are all the first solver (the debate service's Solve takes exactly
//! three solvers), so a problem's baselines cost `3 * ceil(samples / 3)` model calls.
//!
//! With `self_refine`, every final answer then goes through the self-refine hook (the problem as
//! its instruction) before the problem's checkpoint; grading uses the debate's own answer.

use std::collections::HashSet;

use assay_domain::debate::{
    self as dd, Debate, DebateEvent, DebateOutcome, DebateRequest, RefinedSolution, SolveRequest, Solver,
};
use assay_domain::limits::{MAX_ID_BYTES, MAX_RECORDS};
use assay_domain::self_refine::SelfRefineHook;
use assay_domain::{ModelSpec, StageError, Usage, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;

use super::reserve::Reserve;
use super::self_refine_hook::{self, Output};
use super::stages::Stages;
use assay_runs::{Pipeline, RunCtx, RunOutcome};

/// Checkpoint key prefix of the finished problems.
/// Where runs stored before results had their own lane (`RunCtx::results`) kept each problem's
/// result: still read, so such a run resumes without asking its problems again.
const LEGACY_PROBLEM: &str = "debate:problem:";
/// Most problems debated at once.
pub const MAX_CONCURRENCY: u32 = 64;
/// Longest reference answer, bytes.
const MAX_REFERENCE_BYTES: usize = dd::MAX_ARTIFACT_TEXT_BYTES;

/// One problem of the set.
#[derive(Debug, Clone)]
struct Problem {
    id: String,
    problem: String,
    reference: Option<String>,
}

/// A parsed debate run.
pub struct DebatePipeline {
    problems: Vec<Problem>,
    /// Filled: three solvers (the defaults when none were given).
    solvers: Vec<Solver>,
    judge_model: ModelSpec,
    rounds: u32,
    early_stop: bool,
    baselines: bool,
    /// The self-refine hook on the final answers.
    hook: Option<SelfRefineHook>,
    /// Problems at once (the caller's, else the gateway's, at most [`MAX_CONCURRENCY`]).
    concurrency: usize,
    stages: Stages,
}

impl DebatePipeline {
    /// Parse and validate (fields named `pipeline.*`).
    pub fn parse(p: gw::DebatePipeline, stages: Stages) -> Result<Self, StageError> {
        let gw::DebatePipeline {
            problems,
            solvers,
            judge_model,
            rounds,
            early_stop_on_agreement,
            baselines,
            concurrency,
            self_refine,
        } = p;
        let mut v = Violations::new();
        if concurrency > MAX_CONCURRENCY {
            v.push("pipeline.concurrency", format!("is {concurrency}; the limit is {MAX_CONCURRENCY}"));
        }
        if problems.is_empty() {
            v.push("pipeline.problems", "must not be empty");
        }
        if problems.len() > MAX_RECORDS {
            v.push("pipeline.problems", format!("has {} problems; the limit is {MAX_RECORDS}", problems.len()));
        }
        let solvers: Vec<Solver> = solvers
            .into_iter()
            .enumerate()
            .map(|(i, s)| convert::debate::solver(s, &format!("pipeline.solvers[{i}]"), &mut v))
            .collect();
        dd::check_solvers(&solvers, "pipeline", &mut v);
        let judge_model = convert::model_spec(judge_model, "pipeline.judge_model", &mut v);
        let rounds = rounds.unwrap_or(dd::DEFAULT_ROUNDS);
        if rounds == 0 || rounds > dd::MAX_ROUNDS {
            v.push("pipeline.rounds", format!("must be between 1 and {} (got {rounds})", dd::MAX_ROUNDS));
        }
        let mut ids = HashSet::new();
        let problems: Vec<Problem> = problems
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let f = format!("pipeline.problems[{i}]");
                let gw::DebateProblem { id, problem, reference } = p;
                let id = if id.trim().is_empty() { format!("p{}", i + 1) } else { id };
                if id.len() > MAX_ID_BYTES {
                    v.push(format!("{f}.id"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", id.len()));
                } else if !ids.insert(id.clone()) {
                    v.push(format!("{f}.id"), format!("duplicate id {id:?}"));
                }
                dd::check_problem(&problem, &f, &mut v);
                if let Some(r) = &reference {
                    if dd::normalize_answer(r).is_empty() {
                        v.push(format!("{f}.reference"), "has no letter or digit to compare answers with");
                    } else if r.len() > MAX_REFERENCE_BYTES {
                        v.push(
                            format!("{f}.reference"),
                            format!("is {} bytes; the limit is {MAX_REFERENCE_BYTES}", r.len()),
                        );
                    }
                }
                Problem { id, problem, reference }
            })
            .collect();
        let hook = self_refine.map(|h| convert::self_refine::self_refine_hook(h, "pipeline.self_refine", &mut v));
        v.into_result()?;
        stages.debate()?;
        if hook.is_some() {
            stages.self_refiner()?;
        }
        let concurrency = if concurrency > 0 { concurrency as usize } else { stages.concurrency };
        Ok(Self {
            problems,
            solvers: dd::solvers_or_default(solvers, &[]),
            judge_model,
            rounds,
            early_stop: early_stop_on_agreement,
            baselines,
            hook,
            concurrency: concurrency.clamp(1, MAX_CONCURRENCY as usize),
            stages,
        })
    }

    /// Debate problem `i` (then its baselines), relaying the debate's stage events.
    async fn solve_one(&self, ctx: &RunCtx, i: usize) -> Result<gw::DebateProblemResult, StageError> {
        let p = &self.problems[i];
        let debate = self.stages.debate()?;
        let request = DebateRequest {
            problem: p.problem.clone(),
            solvers: self.solvers.clone(),
            judge_model: self.judge_model.clone(),
            rounds: self.rounds,
            early_stop_on_agreement: self.early_stop,
        };
        let (tx, mut rx) = mpsc::unbounded_channel::<DebateEvent>();
        let sink = move |e: DebateEvent| {
            let _ = tx.send(e);
        };
        let call = debate.run_debate(request, &sink);
        let outcome: DebateOutcome = assay_runs::relay_with(&mut rx, call, |e| self.relay(ctx, i, e)).await??;
        ctx.spending.add_usage(&outcome.usage);
        for m in outcome.solutions.iter().filter_map(|s| s.model.as_ref()) {
            ctx.progress.add_model(m);
        }
        if let Some(m) = outcome.judgment.as_ref().and_then(|j| j.model.as_ref()) {
            ctx.progress.add_model(m);
        }
        let baselines = if self.baselines {
            let samples = (outcome.usage.calls + outcome.usage.cache_hits).max(1) as usize;
            let b = self.baselines_of(debate.as_ref(), p, samples).await?;
            ctx.spending.add_usage(&convert::usage_from(b.usage.clone()));
            Some(b)
        } else {
            None
        };
        let self_refined = match &self.hook {
            Some(hook) => {
                let output = Output {
                    target: p.id.clone(),
                    producer: "debate",
                    text: outcome.final_answer.clone(),
                    instruction: assay_domain::self_refine::final_answer_instruction(&p.problem),
                };
                Some(self_refine_hook::refine(&self.stages, ctx, hook, output).await?)
            }
            None => None,
        };
        let reference = p.reference.clone().unwrap_or_default();
        let debate = convert::debate::run_debate_response_to(&outcome);
        Ok(gw::DebateProblemResult {
            index: i as u32,
            id: p.id.clone(),
            final_answer: self_refined.as_ref().map_or_else(|| outcome.final_answer.clone(), |e| e.after.clone()),
            correct: p.reference.as_deref().map(|r| is_correct(&outcome.final_answer, r)),
            consensus: outcome.consensus,
            answers_changed: outcome.answers_changed,
            decided_by: debate.decided_by,
            debate: Some(debate),
            baselines,
            error: String::new(),
            reference,
            self_refined,
        })
    }

    /// Single-model and self-consistency answers from `samples` samples of the first solver.
    async fn baselines_of(
        &self,
        debate: &dyn Debate,
        p: &Problem,
        samples: usize,
    ) -> Result<gw::DebateBaselines, StageError> {
        let first = &self.solvers[0];
        let calls = samples.div_ceil(dd::SOLVERS);
        let requests: Vec<SolveRequest> = (0..calls)
            .map(|c| SolveRequest {
                problem: p.problem.clone(),
                solvers: (0..dd::SOLVERS)
                    .map(|k| {
                        let n = c * dd::SOLVERS + k;
                        let mut model = first.model.clone();
                        // A seeded model would give every sample the same answer (and one cache entry).
                        model.seed = model.seed.map(|s| s.wrapping_add(n as u64));
                        Solver { id: format!("baseline_{}", n + 1), persona: first.persona.clone(), model }
                    })
                    .collect(),
            })
            .collect();
        let outcomes = futures::future::try_join_all(requests.into_iter().map(|r| debate.solve(r))).await?;
        let mut usage = Usage::default();
        let mut answers: Vec<RefinedSolution> = Vec::new();
        for o in outcomes {
            usage.add(&o.usage);
            answers.extend(o.solutions.into_iter().map(|s| RefinedSolution {
                solver_id: s.solver_id,
                final_answer: s.final_answer,
                confidence: s.confidence,
                ..RefinedSolution::default()
            }));
        }
        answers.truncate(samples);
        let single = answers.first().map(|a| a.final_answer.clone()).unwrap_or_default();
        let vote = dd::majority_vote(&answers);
        let (majority, votes) = vote.map(|v| (v.answer, v.votes as u32)).unwrap_or_default();
        let grade = |a: &str| p.reference.as_deref().map(|r| is_correct(a, r));
        Ok(gw::DebateBaselines {
            single_model_correct: grade(&single),
            single_model_answer: single,
            self_consistency_correct: grade(&majority),
            self_consistency_answer: majority,
            samples: answers.len() as u32,
            votes,
            sample_answers: answers.into_iter().map(|a| a.final_answer).collect(),
            usage: Some(convert::usage_to(&usage)),
        })
    }

    /// A finished stage of problem `i`'s debate, as a `debate_stage` event.
    async fn relay(&self, ctx: &RunCtx, i: usize, e: DebateEvent) -> Result<(), StageError> {
        ctx.log
            .emit(Event::DebateStage(gw::DebateStageEvent {
                index: i as u32,
                problem_id: self.problems[i].id.clone(),
                stage: Some(convert::debate::stage_completed_to(&e)),
            }))
            .await
    }

    fn failed(&self, i: usize, error: String) -> gw::DebateProblemResult {
        let p = &self.problems[i];
        gw::DebateProblemResult {
            index: i as u32,
            id: p.id.clone(),
            reference: p.reference.clone().unwrap_or_default(),
            error,
            ..Default::default()
        }
    }

    /// The run's end: the stored problems in order, aggregated.
    async fn finish(&self, ctx: &RunCtx, cancelled: bool) -> Result<RunOutcome, StageError> {
        let problems = stored_problems(ctx).await?;
        let failed = problems.iter().filter(|r| !r.error.is_empty()).count();
        let state = if cancelled {
            gw::RunState::Cancelled
        } else if failed == 0 {
            gw::RunState::Succeeded
        } else if failed == self.problems.len() {
            gw::RunState::Failed
        } else {
            gw::RunState::Partial
        };
        let mut result = aggregate(problems, self.problems.len());
        // Every call the run paid for outside the baselines, failed problems included: a problem
        // stopped part-way (by its budget, a fault) spent on calls its result does not carry.
        let debate = without(
            &convert::usage_from(Some(ctx.spending.usage())),
            &convert::usage_from(result.baseline_usage.clone()),
        );
        result.calls = debate.calls;
        result.tokens = debate.tokens();
        result.debate_usage = Some(convert::usage_to(&debate));
        Ok(RunOutcome { state, result: Some(gw::run_result::Result::Debate(result)) })
    }
}

/// `total` less `part` (a part of it).
fn without(total: &Usage, part: &Usage) -> Usage {
    let mut cost_by_backend = total.cost_by_backend.clone();
    for (backend, usd) in &part.cost_by_backend {
        if let Some(v) = cost_by_backend.get_mut(backend) {
            *v = (*v - usd).max(0.0);
        }
    }
    Usage {
        calls: total.calls.saturating_sub(part.calls),
        prompt_tokens: total.prompt_tokens.saturating_sub(part.prompt_tokens),
        completion_tokens: total.completion_tokens.saturating_sub(part.completion_tokens),
        cache_hits: total.cache_hits.saturating_sub(part.cache_hits),
        retries: total.retries.saturating_sub(part.retries),
        schema_fallbacks: total.schema_fallbacks.saturating_sub(part.schema_fallbacks),
        cached_prompt_tokens: total.cached_prompt_tokens.saturating_sub(part.cached_prompt_tokens),
        cost_usd: (total.cost_usd - part.cost_usd).max(0.0),
        unpriced_calls: total.unpriced_calls.saturating_sub(part.unpriced_calls),
        cost_by_backend,
        abandoned_calls: total.abandoned_calls.saturating_sub(part.abandoned_calls),
        abandoned_tokens: total.abandoned_tokens.saturating_sub(part.abandoned_tokens),
        abandoned_cost_usd: (total.abandoned_cost_usd - part.abandoned_cost_usd).max(0.0),
        schema_violations: total.schema_violations.saturating_sub(part.schema_violations),
        hedged_calls: total.hedged_calls.saturating_sub(part.hedged_calls),
    }
}

/// Whether `answer` equals `reference` after normalisation.
fn is_correct(answer: &str, reference: &str) -> bool {
    let r = dd::normalize_answer(reference);
    !r.is_empty() && dd::normalize_answer(answer) == r
}

fn rate(n: usize, of: usize) -> f64 {
    if of == 0 { 0.0 } else { n as f64 / of as f64 }
}

/// The run's result from its problems' results (any order; sorted by index).
pub fn aggregate(mut problems: Vec<gw::DebateProblemResult>, total: usize) -> gw::DebateRunResult {
    problems.sort_by_key(|p| p.index);
    let ok: Vec<&gw::DebateProblemResult> = problems.iter().filter(|p| p.error.is_empty()).collect();
    let graded: Vec<&&gw::DebateProblemResult> = ok.iter().filter(|p| p.correct.is_some()).collect();
    let correct = graded.iter().filter(|p| p.correct == Some(true)).count();
    let failed_with_reference = problems.iter().filter(|p| !p.error.is_empty() && !p.reference.is_empty()).count();
    let with_reference = graded.len() + failed_with_reference;
    let mut debate_usage = Usage::default();
    let mut baseline_usage = Usage::default();
    for p in &ok {
        debate_usage.add(&convert::usage_from(p.debate.as_ref().and_then(|d| d.usage.clone())));
        baseline_usage.add(&convert::usage_from(p.baselines.as_ref().and_then(|b| b.usage.clone())));
    }
    let with_baselines: Vec<&gw::DebateBaselines> = graded.iter().filter_map(|p| p.baselines.as_ref()).collect();
    let baseline_rate = |hit: fn(&gw::DebateBaselines) -> bool| {
        (!with_baselines.is_empty())
            .then(|| rate(with_baselines.iter().filter(|b| hit(b)).count(), with_baselines.len()))
    };
    gw::DebateRunResult {
        problems_total: total as u32,
        problems_failed: (problems.len() - ok.len()) as u32,
        graded: graded.len() as u32,
        correct: correct as u32,
        accuracy: (!graded.is_empty()).then(|| rate(correct, graded.len())),
        failed_with_reference: failed_with_reference as u32,
        accuracy_all: (with_reference > 0).then(|| rate(correct, with_reference)),
        consensus_rate: rate(ok.iter().filter(|p| p.consensus).count(), ok.len()),
        changed_rate: rate(ok.iter().filter(|p| p.answers_changed).count(), ok.len()),
        tokens: debate_usage.prompt_tokens + debate_usage.completion_tokens,
        calls: debate_usage.calls,
        single_model_accuracy: baseline_rate(|b| b.single_model_correct == Some(true)),
        self_consistency_accuracy: baseline_rate(|b| b.self_consistency_correct == Some(true)),
        debate_usage: Some(convert::usage_to(&debate_usage)),
        baseline_usage: Some(convert::usage_to(&baseline_usage)),
        problems,
    }
}

#[async_trait::async_trait]
impl Pipeline for DebatePipeline {
    fn kind(&self) -> gw::PipelineKind {
        gw::PipelineKind::Debate
    }

    fn total(&self) -> u32 {
        self.problems.len() as u32
    }

    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        let done: HashSet<u32> = stored_problems(ctx).await?.iter().map(|r| r.index).collect();
        ctx.progress.set_done(done.len() as u32);
        let mut todo = (0..self.problems.len()).filter(|i| !done.contains(&(*i as u32)));
        let mut work = FuturesUnordered::new();
        // Under a budget, problems start only while what is left can finish them: one at a time
        // until one finished, then what is left over a finished problem's cost (problems run at
        // once shared the budget until none could finish).
        let mut reserve = Reserve::starting(1);
        loop {
            let affordable = ctx.spending.budget_left().map_or(usize::MAX, |left| reserve.in_flight(&left));
            while work.len() < self.concurrency.min(affordable) {
                let Some(i) = todo.next() else { break };
                work.push(async move {
                    // Paused runs start no new problem; problems in flight finish.
                    ctx.gate.wait().await?;
                    // A spent budget starts no new problem: finished ones are kept.
                    if let Some(why) = ctx.spending.budget_exhausted() {
                        return Ok((i, Err(StageError::BudgetExhausted(why))));
                    }
                    Ok::<_, StageError>((i, self.solve_one(ctx, i).await))
                });
            }
            if work.is_empty() {
                break;
            }
            tokio::select! {
                next = work.next() => {
                    let Some(next) = next else { break };
                    let (i, solved) = match next {
                        Ok(x) => x,
                        Err(StageError::Cancelled(_)) if ctx.gate.is_cancelled() => break,
                        Err(e) => return Err(e),
                    };
                    let result = match solved {
                        Ok(r) => {
                            reserve.add(&problem_usage(&r));
                            r
                        }
                        Err(StageError::Cancelled(_)) if ctx.gate.is_cancelled() => break,
                        Err(e @ (StageError::InvalidArgument(_) | StageError::FailedPrecondition(_) | StageError::Unimplemented(_))) => {
                            return Err(e.map_fields(|f| {
                                if f.starts_with("problem") {
                                    format!("pipeline.problems[{i}].{f}")
                                } else {
                                    format!("pipeline.{f}")
                                }
                            }));
                        }
                        Err(StageError::BudgetExhausted(m)) => {
                            self.failed(i, format!("not run: {m}"))
                        }
                        Err(e) => self.failed(i, e.to_string()),
                    };
                    ctx.results.put(i as u64, &result).await?;
                    ctx.progress.add_done();
                    ctx.log.emit(Event::DebateProblemDone(result)).await?;
                }
                () = ctx.gate.cancelled() => break,
            }
        }
        drop(work);
        self.finish(ctx, ctx.gate.is_cancelled()).await
    }
}

/// What one finished problem cost: its debate and its baselines.
fn problem_usage(r: &gw::DebateProblemResult) -> Usage {
    let mut u = convert::usage_from(r.debate.as_ref().and_then(|d| d.usage.clone()));
    u.add(&convert::usage_from(r.baselines.as_ref().and_then(|b| b.usage.clone())));
    u
}

/// The problems' stored results, by index (those a run stored before results had their own lane
/// included).
async fn stored_problems(ctx: &RunCtx) -> Result<Vec<gw::DebateProblemResult>, StageError> {
    let mut by_index: std::collections::BTreeMap<u32, gw::DebateProblemResult> = std::collections::BTreeMap::new();
    for (_, r) in ctx.checkpoints.all::<gw::DebateProblemResult>(LEGACY_PROBLEM).await? {
        by_index.insert(r.index, r);
    }
    for (_, r) in ctx.results.all::<gw::DebateProblemResult>().await? {
        by_index.insert(r.index, r);
    }
    Ok(by_index.into_values().collect())
}

impl super::Registered for assay_proto::pipelines::Debate {
    fn parse(request: Self::Request, stages: super::Stages) -> Result<std::sync::Arc<dyn Pipeline>, StageError> {
        Ok(std::sync::Arc::new(DebatePipeline::parse(request, stages)?))
    }
}
