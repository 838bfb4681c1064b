//! The debate's logic, no transport types: [`DebateCore`] runs the four stages over a model hub.
//!
//! - Solve: the three solvers concurrently, each its own model, persona and temperature.
//! - Review: every solver reviews the other two (six calls at once).
//! - Refine: every solver refines with exactly the two reviews about it (three calls at once).
//! - Judge: one call over the problem, the three originals, the six reviews and the three refined
//!   solutions; the final answer is the winner's refined answer. A reply that cannot be used gets
//!   one retry (the reply and the reason shown to the model); a judge still unusable falls back to
//!   a majority vote over the normalised refined answers, flagged with the reason. A solver,
//!   reviewer or refiner still unusable after its retry fails the stage (UNAVAILABLE naming it).
//! - A model call that fails transiently after the client's own retries (rate limited, backend
//!   unavailable) is made again [`CALL_RETRIES`] times before its stage fails: a round makes a
//!   dozen calls and any one failing loses the whole problem, so one call's bad luck should not.
//! - RunDebate: solve, then `rounds` review/refine rounds, then the judge; with
//!   `early_stop_on_agreement`, agreement of the solvers' answers (normalised) before a round's
//!   reviews or after its refinement ends the rounds; agreement before the first review ends the
//!   debate with the agreed answer and no judge.
//!
//! Every model is resolved before the first call, so an unknown backend costs nothing.
//!
//! Every artifact (solution, review, refined solution, judgment) keeps the raw text of the model
//! replies behind it (the first call's and the retry's, each up to
//! [`assay_domain::debate::MAX_RAW_REPLY_BYTES`]), with why a reply could not be used; a stage that
//! fails on unusable replies quotes the start of the last one in its error.

pub mod prompt;
pub mod reply;

use std::sync::Arc;
use std::time::Duration;

use assay_domain::debate::{
    DEFAULT_JUDGE_TEMPERATURE, Debate, DebateEvent, DebateOutcome, DebateRequest, DebateRound, DebateStage, Decision,
    JUDGE_PHASE, JudgeRequest, Judgment, REFINER_PHASE, REVIEWER_PHASE, RawReply, RefineOutcome, RefineRequest,
    RefinedSolution, Review, ReviewOutcome, ReviewRequest, SOLVER_PHASE, Solution, SolveOutcome, SolveRequest, Solver,
    StageArtifacts, answers_agree, head, majority_vote, normalize_answer, solver_temperature,
};
use assay_domain::template::template_sha256;
use assay_domain::{EventSink, ModelRecord, ModelSpec, StageError, UnusableReply, Usage};
use assay_llm::json::reply_json;
use assay_llm::{
    ChatRequest, ChatResponse, FinishReason, LlmError, Message, ModelHub, Purpose, ResolvedChat, ResponseFormat,
};
use prompt::Cut;
use serde_json::Value;

/// Times a call that failed transiently (its client's retries spent) is made again.
pub const CALL_RETRIES: u32 = 2;
/// Wait before the first such call again, doubled for the next.
const CALL_RETRY_WAIT: Duration = Duration::from_millis(250);

/// The debate over a model hub.
#[derive(Clone)]
pub struct DebateCore {
    hub: Arc<ModelHub>,
}

impl DebateCore {
    pub fn new(hub: Arc<ModelHub>) -> Self {
        Self { hub }
    }
}

/// A configured temperature (f32 in the settings) as the f64 it was written as.
fn configured_temperature(chat: &ResolvedChat) -> Option<f64> {
    chat.settings.temperature.map(|t| (f64::from(t) * 1e6).round() / 1e6)
}

/// Characters a token is taken to hold when a prompt is fitted to a model's context before the
/// server has said how many tokens it counted: fewer than English prose's four, so numbers, JSON
/// and other scripts fit too. A refusal naming the prompt's tokens gives the real figure.
const CHARS_PER_TOKEN: f64 = 3.0;
/// Tokens kept for the chat template's own text around a prompt.
const TEMPLATE_TOKENS: u32 = 64;
/// The smallest cut a prompt is fitted at (see [`prompt::Cut`]); a prompt still over the context
/// at it is refused, naming the context.
const MIN_CUT: usize = 40;

/// One model call with a JSON-schema reply.
struct Job<'a> {
    phase: &'static str,
    template: &'static str,
    schema_name: &'static str,
    schema: Value,
    /// The prompt with every quoted model text cut to at most so many characters.
    prompt: Box<dyn Fn(Cut) -> String + Send + Sync + 'a>,
    chat: &'a ResolvedChat,
    temperature: f64,
}

/// A prompt fitted to the model's context, with the reply tokens left beside it.
struct Fitted {
    prompt: String,
    max_tokens: u32,
    /// The cut quoted texts were held to; 0 for none.
    cut: u32,
}

/// What a job produced: the parsed value or why the replies could not be used, with the usage of
/// every call, the record of what made them and their raw replies.
struct Called<T> {
    value: Result<T, UnusableReply>,
    usage: Usage,
    record: ModelRecord,
    raw: Vec<RawReply>,
}

/// Bytes of the last unusable reply quoted in a stage's error.
const QUOTED_REPLY_BYTES: usize = 200;

impl<T> Called<T> {
    /// The value, or UNAVAILABLE naming what failed (`what`), why, and how the last reply began.
    fn usable(self, what: impl FnOnce() -> String) -> Result<(T, Usage, ModelRecord, Vec<RawReply>), StageError> {
        let Called { value, usage, record, raw } = self;
        match value {
            Ok(v) => Ok((v, usage, record, raw)),
            Err(why) => {
                let began = raw.last().map(|r| head(r.text.trim(), QUOTED_REPLY_BYTES).to_string()).unwrap_or_default();
                Err(StageError::Unavailable(format!(
                    "{} after one retry: {why}; the last reply began {began:?}",
                    what()
                )))
            }
        }
    }
}

/// The name of why the backend stopped.
fn finish_reason_name(reason: &FinishReason) -> &str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Other(other) => other,
    }
}

/// A reply's raw text as an artifact keeps it.
fn raw_reply(reply: &ChatResponse) -> RawReply {
    RawReply::new(&reply.text, finish_reason_name(&reply.finish_reason))
}

impl Job<'_> {
    /// The stage's part of every call of this job: room for the longest reply the schema allows,
    /// at the temperature the debate chose (a solver's spread, the judge's default) from the spec.
    fn purpose(&self) -> Purpose {
        Purpose::new(reply::reply_tokens(&self.schema)).chosen_temperature(self.temperature)
    }

    fn request(&self, messages: Vec<Message>, max_tokens: u32) -> ChatRequest {
        ChatRequest {
            response_format: ResponseFormat::JsonSchema { name: self.schema_name.into(), schema: self.schema.clone() },
            max_tokens: Some(max_tokens),
            ..self.chat.request(messages, self.purpose())
        }
    }

    /// The prompt fitted to `context` (tokens a call may hold; `None` while unknown, then the
    /// prompt goes whole), reading `chars_per_token` characters a token: room for the reply
    /// (`max_tokens`, at most half the context) is kept, and when the whole prompt does not fit
    /// in the rest, every quoted model text is cut to the most characters that let it (the
    /// problem and final answers are kept). The reply's tokens are held to what the prompt leaves.
    /// FAILED_PRECONDITION naming the context when even the [`MIN_CUT`] prompt is over it.
    fn fit(&self, context: Option<u32>, max_tokens: u32, chars_per_token: f64) -> Result<Fitted, StageError> {
        let whole = (self.prompt)(Cut::WHOLE);
        let Some(context) = context else {
            return Ok(Fitted { prompt: whole, max_tokens, cut: 0 });
        };
        let tokens = |p: &str| (p.chars().count() as f64 / chars_per_token).ceil() as u32 + TEMPLATE_TOKENS;
        let room = context.saturating_sub(max_tokens.min(context / 2));
        let fitted = |prompt: String, cut: usize| Fitted {
            max_tokens: max_tokens.min(context.saturating_sub(tokens(&prompt))).max(1),
            prompt,
            cut: u32::try_from(cut).unwrap_or(u32::MAX),
        };
        if tokens(&whole) <= room {
            return Ok(fitted(whole, 0));
        }
        let at = |n: usize| (self.prompt)(Cut(n));
        let least = tokens(&at(MIN_CUT));
        if least > room {
            return Err(StageError::FailedPrecondition(format!(
                "the {} prompt needs about {least} tokens even with each quoted text cut to {MIN_CUT} characters, \
                 and backend {:?} (model {:?}) holds {context} tokens a call, prompt and reply: give the model a \
                 larger context (llama-server: --ctx-size) or debate a shorter problem",
                self.phase,
                self.chat.backend,
                self.chat.model_name()
            )));
        }
        let (mut lo, mut hi) = (MIN_CUT, whole.chars().count());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if tokens(&at(mid)) <= room { lo = mid } else { hi = mid - 1 }
        }
        tracing::info!(phase = self.phase, context, cut = lo, "prompt cut to fit the model's context");
        Ok(fitted(at(lo), lo))
    }

    /// The first call with its prompt fitted to the model's context as the backend knows it; a
    /// refusal for being over the context (which names the context, or the prompt's tokens) fits
    /// the prompt again by its figures and calls once more.
    async fn first_call(&self, max_tokens: u32) -> Result<(ChatResponse, Fitted), StageError> {
        let model = self.chat.model_name();
        let fitted = self.fit(self.chat.model.context_tokens(&model).await, max_tokens, CHARS_PER_TOKEN)?;
        let error = match self.call(vec![Message::user(fitted.prompt.clone())], fitted.max_tokens).await {
            Ok(reply) => return Ok((reply, fitted)),
            Err(e) => e,
        };
        let Some(refusal) = assay_llm::context_refusal(&error) else {
            return Err(error.into());
        };
        let Some(context) = (match refusal.context_tokens {
            Some(context) => Some(context),
            None => self.chat.model.context_tokens(&model).await,
        }) else {
            return Err(error.into());
        };
        // The characters a token the server counted (its count includes the chat template, so
        // this errs short), a little less again; without its count, two thirds of the guess.
        let chars_per_token = refusal
            .prompt_tokens
            .filter(|t| *t > 0)
            .map_or(CHARS_PER_TOKEN * 2.0 / 3.0, |t| fitted.prompt.chars().count() as f64 / f64::from(t) * 0.95);
        tracing::warn!(phase = self.phase, context, prompt_tokens = ?refusal.prompt_tokens, "prompt over the model's context, fitting it");
        let again = self.fit(Some(context), max_tokens, chars_per_token)?;
        let reply = self.call(vec![Message::user(again.prompt.clone())], again.max_tokens).await?;
        Ok((reply, again))
    }

    /// Why `reply` cannot be used, if it cannot.
    fn read<T>(
        reply: &ChatResponse,
        max_tokens: u32,
        parse: &impl Fn(&Value) -> Result<T, UnusableReply>,
    ) -> Result<T, UnusableReply> {
        let cut = reply.finish_reason == FinishReason::Length;
        let value = reply_json(reply);
        let parsed = match value {
            Some(v) => parse(&v),
            None => Err("the reply holds no JSON object".into()),
        };
        parsed.map_err(|why| if cut { format!("{why} (the reply was cut at {max_tokens} tokens)").into() } else { why })
    }

    /// One model call; a transient failure is tried again [`CALL_RETRIES`] times.
    async fn call(&self, messages: Vec<Message>, max_tokens: u32) -> Result<ChatResponse, LlmError> {
        let mut failed = 0u32;
        loop {
            match self.chat.model.chat(self.request(messages.clone(), max_tokens)).await {
                Ok(reply) => return Ok(reply),
                Err(e) if e.is_transient() && failed < CALL_RETRIES => {
                    tracing::warn!(phase = self.phase, error = %e, again = failed + 1, "model call failed after its retries, calling again");
                    tokio::time::sleep(CALL_RETRY_WAIT.saturating_mul(1 << failed)).await;
                    failed += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The call, and one retry showing the model its unusable reply and why.
    async fn ask<T>(&self, parse: impl Fn(&Value) -> Result<T, UnusableReply>) -> Result<Called<T>, StageError> {
        // The caller's or the configuration's limit, else room for the longest reply the schema allows.
        let (first, fitted) = self.first_call(self.chat.max_tokens(self.purpose())).await?;
        let max_tokens = fitted.max_tokens;
        let mut record = self.chat.record(self.phase, max_tokens, template_sha256(self.template), false);
        record.temperature = Some(self.temperature);
        record.prompt_cut_chars = fitted.cut;
        let mut usage = Usage::default();
        usage.add(&first.usage);
        let why = match Self::read(&first, max_tokens, &parse) {
            Ok(value) => return Ok(Called { value: Ok(value), usage, record, raw: vec![raw_reply(&first)] }),
            Err(why) => why,
        };
        let mut raw = vec![raw_reply(&first).unusable(why.as_str())];
        tracing::info!(phase = self.phase, reason = %why, "unusable reply, retrying once");
        let messages = vec![
            Message::user(fitted.prompt),
            Message::assistant(first.text.clone()),
            Message::user(prompt::retry(why.as_str())),
        ];
        let second = match self.call(messages, max_tokens).await {
            Ok(second) => second,
            // The reply shown back can take the conversation over the context: the reply stays
            // unusable, with why.
            Err(e) if assay_llm::context_refusal(&e).is_some() => {
                let why = format!("{why}; the retry with the reply shown was over the model's context ({e})");
                return Ok(Called { value: Err(why.into()), usage, record, raw });
            }
            Err(e) => return Err(e.into()),
        };
        usage.add(&second.usage);
        let value = Self::read(&second, max_tokens, &parse);
        raw.push(match &value {
            Ok(_) => raw_reply(&second),
            Err(again) => raw_reply(&second).unusable(again.as_str()),
        });
        let value =
            value.map_err(|again| if again == why { why } else { format!("{why}; after the retry: {again}").into() });
        Ok(Called { value, usage, record, raw })
    }
}

/// The chats of one solver for the three phases it works in.
struct SolverChats {
    solve: ResolvedChat,
    review: ResolvedChat,
    refine: ResolvedChat,
}

impl DebateCore {
    /// Resolve `phase` for every solver (fields `solvers[i].model`).
    fn chats(&self, phase: &str, solvers: &[Solver]) -> Result<Vec<ResolvedChat>, StageError> {
        solvers
            .iter()
            .enumerate()
            .map(|(i, s)| self.hub.chat(phase, &s.model, &format!("solvers[{i}].model")))
            .collect()
    }

    fn solver_chats(&self, solvers: &[Solver]) -> Result<Vec<SolverChats>, StageError> {
        let solve = self.chats(SOLVER_PHASE, solvers)?;
        let review = self.chats(REVIEWER_PHASE, solvers)?;
        let refine = self.chats(REFINER_PHASE, solvers)?;
        Ok(solve
            .into_iter()
            .zip(review)
            .zip(refine)
            .map(|((solve, review), refine)| SolverChats { solve, review, refine })
            .collect())
    }

    fn judge_chat(&self, spec: &ModelSpec) -> Result<ResolvedChat, StageError> {
        self.hub.chat(JUDGE_PHASE, spec, "judge_model")
    }

    /// Stage 1 over checked solvers.
    async fn run_solve(
        &self,
        problem: &str,
        solvers: &[Solver],
        chats: &[&ResolvedChat],
    ) -> Result<SolveOutcome, StageError> {
        let calls = solvers.iter().zip(chats).enumerate().map(|(i, (solver, chat))| async move {
            let job = Job {
                phase: SOLVER_PHASE,
                template: prompt::SOLVE_TEMPLATE,
                schema_name: "debate_solution",
                schema: reply::solution_schema(),
                prompt: Box::new(move |_| prompt::solve(problem, solver)),
                chat,
                temperature: solver_temperature(&solver.model, configured_temperature(chat), i),
            };
            let called = job.ask(|v| reply::parse_solution(v, &solver.id)).await?;
            let (solution, usage, record, raw) =
                called.usable(|| format!("solver {:?} gave no usable solution", solver.id))?;
            Ok::<_, StageError>((Solution { model: Some(record), raw_replies: raw, ..solution }, usage))
        });
        let done = futures::future::try_join_all(calls).await?;
        let mut usage = Usage::default();
        let solutions = done
            .into_iter()
            .map(|(s, u)| {
                usage.add(&u);
                s
            })
            .collect();
        Ok(SolveOutcome { solutions, usage })
    }

    /// Stage 2 over checked input: `solutions[i]` is the solution of `solvers[i]`.
    async fn run_review(
        &self,
        problem: &str,
        solvers: &[Solver],
        chats: &[&ResolvedChat],
        solutions: &[Solution],
    ) -> Result<ReviewOutcome, StageError> {
        let pairs: Vec<(usize, usize)> =
            (0..solvers.len()).flat_map(|r| (0..solvers.len()).filter(move |t| *t != r).map(move |t| (r, t))).collect();
        let calls = pairs.into_iter().map(|(r, t)| async move {
            let (reviewer, target, chat) = (&solvers[r], &solutions[t], chats[r]);
            let job = Job {
                phase: REVIEWER_PHASE,
                template: prompt::REVIEW_TEMPLATE,
                schema_name: "debate_review",
                schema: reply::review_schema(target.reasoning_steps.len()),
                prompt: Box::new(move |cut| prompt::review(problem, reviewer, target, cut)),
                chat,
                temperature: solver_temperature(&reviewer.model, configured_temperature(chat), r),
            };
            let called = job.ask(|v| reply::parse_review(v, &reviewer.id, &target.solver_id)).await?;
            let (review, usage, record, raw) = called
                .usable(|| format!("solver {:?} gave no usable review of {:?}", reviewer.id, target.solver_id))?;
            Ok::<_, StageError>((Review { model: Some(record), raw_replies: raw, ..review }, usage))
        });
        let done = futures::future::try_join_all(calls).await?;
        let mut usage = Usage::default();
        let reviews = done
            .into_iter()
            .map(|(r, u)| {
                usage.add(&u);
                r
            })
            .collect();
        Ok(ReviewOutcome { reviews, usage })
    }

    /// Stage 3 over checked input: `solutions[i]` is the solution of `solvers[i]`; each solver gets
    /// exactly the reviews whose target it is, in solver order.
    async fn run_refine(
        &self,
        problem: &str,
        solvers: &[Solver],
        chats: &[&ResolvedChat],
        solutions: &[Solution],
        reviews: &[Review],
    ) -> Result<RefineOutcome, StageError> {
        let calls = solvers.iter().zip(solutions).zip(chats).enumerate().map(|(i, ((solver, own), chat))| {
            let mine: Vec<&Review> = solvers
                .iter()
                .filter_map(|by| reviews.iter().find(|r| r.reviewer_id == by.id && r.target_solver_id == solver.id))
                .collect();
            async move {
                let job = Job {
                    phase: REFINER_PHASE,
                    template: prompt::REFINE_TEMPLATE,
                    schema_name: "debate_refinement",
                    schema: reply::refinement_schema(own.reasoning_steps.len(), reply::critiques_of(&mine)),
                    prompt: Box::new(|cut| prompt::refine(problem, solver, own, &mine, cut)),
                    chat,
                    temperature: solver_temperature(&solver.model, configured_temperature(chat), i),
                };
                let called = job.ask(|v| reply::parse_refinement(v, &solver.id, &own.final_answer)).await?;
                let (r, usage, record, raw) =
                    called.usable(|| format!("solver {:?} gave no usable refinement", solver.id))?;
                Ok::<_, StageError>((RefinedSolution { model: Some(record), raw_replies: raw, ..r }, usage))
            }
        });
        let done = futures::future::try_join_all(calls).await?;
        let mut usage = Usage::default();
        let refined = done
            .into_iter()
            .map(|(r, u)| {
                usage.add(&u);
                r
            })
            .collect();
        Ok(RefineOutcome { refined, usage })
    }

    /// Stage 4 over checked input. The judge's unusable replies fall back to a majority vote.
    async fn run_judge(
        &self,
        problem: &str,
        solutions: &[Solution],
        reviews: &[Review],
        refined: &[RefinedSolution],
        spec: &ModelSpec,
        chat: &ResolvedChat,
    ) -> Result<Judgment, StageError> {
        let ids: Vec<String> = solutions.iter().map(|s| s.solver_id.clone()).collect();
        let job = Job {
            phase: JUDGE_PHASE,
            template: prompt::JUDGE_TEMPLATE,
            schema_name: "debate_judgment",
            schema: reply::judgment_schema(&ids),
            prompt: Box::new(move |cut| prompt::judge(problem, solutions, reviews, refined, cut)),
            chat,
            temperature: spec.temperature.or(configured_temperature(chat)).unwrap_or(DEFAULT_JUDGE_TEMPERATURE),
        };
        let called = job.ask(|v| reply::parse_judgment(v, &ids)).await?;
        let Called { value, usage, record, raw } = called;
        match value {
            Ok(j) => {
                let final_answer = refined
                    .iter()
                    .find(|r| r.solver_id == j.winner_solver_id)
                    .map(|r| r.final_answer.clone())
                    .ok_or_else(|| {
                        StageError::Internal(format!("no refined solution of the winner {:?}", j.winner_solver_id))
                    })?;
                Ok(Judgment {
                    winner_solver_id: j.winner_solver_id,
                    confidence: j.confidence,
                    reasoning: j.reasoning,
                    final_answer,
                    majority_vote_fallback: false,
                    fallback_reason: String::new(),
                    usage,
                    model: Some(record),
                    raw_replies: raw,
                })
            }
            Err(why) => {
                tracing::warn!(reason = %why, "the judge's replies could not be used; majority vote");
                let vote = majority_vote(refined)
                    .ok_or_else(|| StageError::Internal("no refined solutions to vote over".into()))?;
                Ok(Judgment {
                    reasoning: format!(
                        "majority vote over the refined answers (normalised): {} of {} solvers answer {:?}; the judge's replies could not be used",
                        vote.votes, vote.total, vote.answer
                    ),
                    confidence: vote.votes as f64 / vote.total.max(1) as f64,
                    winner_solver_id: vote.winner_solver_id,
                    final_answer: vote.answer,
                    majority_vote_fallback: true,
                    fallback_reason: why.0,
                    usage,
                    model: Some(record),
                    raw_replies: raw,
                })
            }
        }
    }
}

/// `solutions` in solver order (the checks guarantee one per solver).
fn in_solver_order(solvers: &[Solver], solutions: &[Solution]) -> Result<Vec<Solution>, StageError> {
    solvers
        .iter()
        .map(|s| {
            solutions
                .iter()
                .find(|x| x.solver_id == s.id)
                .cloned()
                .ok_or_else(|| StageError::invalid("solutions", format!("has no solution of solver {:?}", s.id)))
        })
        .collect()
}

/// A refined solution as the solution the next round reviews (the original approach kept).
fn as_solution(r: &RefinedSolution, previous: &Solution) -> Solution {
    Solution {
        solver_id: r.solver_id.clone(),
        reasoning_steps: r.reasoning_steps.clone(),
        final_answer: r.final_answer.clone(),
        approach: previous.approach.clone(),
        confidence: r.confidence,
        model: r.model.clone(),
        raw_replies: r.raw_replies.clone(),
    }
}

/// The most confident solver (earlier on a tie).
fn most_confident(solutions: &[Solution]) -> Option<&Solution> {
    solutions
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.confidence.total_cmp(&b.confidence).then(j.cmp(i)))
        .map(|(_, s)| s)
}

fn completed(stage: DebateStage, round: u32, artifacts: StageArtifacts) -> DebateEvent {
    DebateEvent::StageCompleted { stage, round, artifacts }
}

#[async_trait::async_trait]
impl Debate for DebateCore {
    async fn solve(&self, request: SolveRequest) -> Result<SolveOutcome, StageError> {
        let request = request.checked("")?;
        let chats = self.chats(SOLVER_PHASE, &request.solvers)?;
        let chats: Vec<&ResolvedChat> = chats.iter().collect();
        self.run_solve(&request.problem, &request.solvers, &chats).await
    }

    async fn review(&self, request: ReviewRequest) -> Result<ReviewOutcome, StageError> {
        let request = request.checked("")?;
        let chats = self.chats(REVIEWER_PHASE, &request.solvers)?;
        let chats: Vec<&ResolvedChat> = chats.iter().collect();
        let solutions = in_solver_order(&request.solvers, &request.solutions)?;
        self.run_review(&request.problem, &request.solvers, &chats, &solutions).await
    }

    async fn refine(&self, request: RefineRequest) -> Result<RefineOutcome, StageError> {
        let request = request.checked("")?;
        let chats = self.chats(REFINER_PHASE, &request.solvers)?;
        let chats: Vec<&ResolvedChat> = chats.iter().collect();
        let solutions = in_solver_order(&request.solvers, &request.solutions)?;
        self.run_refine(&request.problem, &request.solvers, &chats, &solutions, &request.reviews).await
    }

    async fn judge(&self, request: JudgeRequest) -> Result<Judgment, StageError> {
        let request = request.checked("")?;
        let chat = self.judge_chat(&request.judge_model)?;
        let r = &request;
        self.run_judge(&r.problem, &r.solutions, &r.reviews, &r.refined, &r.judge_model, &chat).await
    }

    async fn run_debate(
        &self,
        request: DebateRequest,
        events: EventSink<'_, DebateEvent>,
    ) -> Result<DebateOutcome, StageError> {
        let request = request.checked("")?;
        let (problem, solvers) = (&request.problem, &request.solvers);
        let chats = self.solver_chats(solvers)?;
        let judge_chat = self.judge_chat(&request.judge_model)?;
        let pick = |f: fn(&SolverChats) -> &ResolvedChat| chats.iter().map(f).collect::<Vec<_>>();
        let mut usage = Usage::default();

        let solved = self.run_solve(problem, solvers, &pick(|c| &c.solve)).await?;
        usage.add(&solved.usage);
        let originals = solved.solutions;
        let agree = |s: &[Solution]| answers_agree(s.iter().map(|x| x.final_answer.as_str()));
        events(completed(
            DebateStage::Solve,
            0,
            StageArtifacts {
                solutions: originals.clone(),
                consensus: agree(&originals),
                usage: solved.usage,
                ..StageArtifacts::default()
            },
        ));

        let mut rounds: Vec<DebateRound> = Vec::new();
        let mut current = originals.clone();
        let mut stopped_early = false;
        for round in 1..=request.rounds {
            if request.early_stop_on_agreement && agree(&current) {
                tracing::info!(round, "the solvers agree; no more rounds");
                stopped_early = true;
                break;
            }
            let reviewed = self.run_review(problem, solvers, &pick(|c| &c.review), &current).await?;
            usage.add(&reviewed.usage);
            events(completed(
                DebateStage::Review,
                round,
                StageArtifacts {
                    reviews: reviewed.reviews.clone(),
                    usage: reviewed.usage,
                    ..StageArtifacts::default()
                },
            ));
            let refined = self.run_refine(problem, solvers, &pick(|c| &c.refine), &current, &reviewed.reviews).await?;
            usage.add(&refined.usage);
            let consensus = answers_agree(refined.refined.iter().map(|r| r.final_answer.as_str()));
            events(completed(
                DebateStage::Refine,
                round,
                StageArtifacts {
                    refined: refined.refined.clone(),
                    consensus,
                    usage: refined.usage,
                    ..StageArtifacts::default()
                },
            ));
            current = refined.refined.iter().zip(&current).map(|(r, prev)| as_solution(r, prev)).collect();
            rounds.push(DebateRound { round, reviews: reviewed.reviews, refined: refined.refined, consensus });
            if request.early_stop_on_agreement && consensus && round < request.rounds {
                tracing::info!(round, "the solvers agree after refinement; no more rounds");
                stopped_early = true;
                break;
            }
        }

        let consensus = agree(&current);
        let answers_changed = current
            .iter()
            .zip(&originals)
            .any(|(now, before)| normalize_answer(&now.final_answer) != normalize_answer(&before.final_answer));
        let (judgment, final_answer, winner_solver_id, decided_by) = match rounds.last() {
            None => {
                // Agreement before any review: the agreed answer, in the words of the most
                // confident solver.
                let winner = most_confident(&current)
                    .ok_or_else(|| StageError::Internal("a debate without solutions".into()))?;
                (None, winner.final_answer.clone(), winner.solver_id.clone(), Decision::Consensus)
            }
            Some(last) => {
                let judgment = self
                    .run_judge(problem, &originals, &last.reviews, &last.refined, &request.judge_model, &judge_chat)
                    .await?;
                usage.add(&judgment.usage);
                events(completed(
                    DebateStage::Judge,
                    rounds.len() as u32,
                    StageArtifacts {
                        judgment: Some(judgment.clone()),
                        usage: judgment.usage.clone(),
                        ..StageArtifacts::default()
                    },
                ));
                let decided_by = if judgment.majority_vote_fallback { Decision::MajorityVote } else { Decision::Judge };
                let (answer, winner) = (judgment.final_answer.clone(), judgment.winner_solver_id.clone());
                (Some(judgment), answer, winner, decided_by)
            }
        };
        Ok(DebateOutcome {
            solutions: originals,
            rounds,
            judgment,
            final_answer,
            winner_solver_id,
            decided_by,
            consensus,
            answers_changed,
            stopped_early,
            usage,
        })
    }
}
