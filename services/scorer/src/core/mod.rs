//! Checklist scoring: batch and item modes, every aggregate, logprob
//! confidence, reasoning, custom templates. No transport types here.

pub mod judge;
mod parse;

use std::sync::Arc;

use assay_domain::generator::default_scorer_for;
use assay_domain::template::render;
use assay_domain::{
    AggregateScores, Checklist, ConfidenceLevel, EventSink, ItemScore, ItemStatus, ModelRecord, Score, ScoreEvent,
    ScoreOutcome, ScoreRequest, ScoreTarget, Scorer, ScorerConfig, ScoringMode, ScoringPrompt, StageError, Usage,
    Violations,
};
use assay_llm::{ChatRequest, ChatResponse, Message, ModelHub, Purpose, ResolvedChat, ResponseFormat};
use futures::StreamExt;

pub use parse::{BatchAnswer, map_batch_answers, parse_batch_reply, parse_item_reply};

/// Configuration phase the scorer resolves its model for.
pub const PHASE: &str = "scorer";

/// Placeholders a scorer template may use.
pub use assay_domain::SCORER_PLACEHOLDERS as PLACEHOLDERS;

const BATCH_TEMPLATE: &str = include_str!("../../prompts/batch.txt");
const BATCH_REASONING_TEMPLATE: &str = include_str!("../../prompts/batch_reasoning.txt");
const ITEM_TEMPLATE: &str = include_str!("../../prompts/item.txt");
const RLCF_TEMPLATE: &str = include_str!("../../prompts/rlcf.txt");
const ROCKETEVAL_TEMPLATE: &str = include_str!("../../prompts/rocketeval.txt");

/// The built-in template for a configuration without a custom one. The RLCF and RocketEval
/// prompts judge one question at a time; in batch mode every preset uses the batch prompt.
pub fn builtin_template(config: &ScorerConfig) -> &'static str {
    match (config.mode, config.capture_reasoning, config.prompt) {
        (ScoringMode::Batch, false, _) => BATCH_TEMPLATE,
        (ScoringMode::Batch, true, _) => BATCH_REASONING_TEMPLATE,
        (ScoringMode::Item, _, ScoringPrompt::Rlcf) => RLCF_TEMPLATE,
        (ScoringMode::Item, _, ScoringPrompt::RocketEval) => ROCKETEVAL_TEMPLATE,
        (ScoringMode::Item, _, ScoringPrompt::Default) => ITEM_TEMPLATE,
    }
}

/// Tokens budgeted per checklist item in a batch reply.
pub const TOKENS_PER_ITEM: u32 = 100;

/// The scorer core.
#[derive(Clone)]
pub struct ScorerCore {
    hub: Arc<ModelHub>,
    /// Model calls of one request in flight at once, over all its targets and items, when the
    /// request sets no cap of its own.
    concurrency: usize,
}

impl ScorerCore {
    pub fn new(hub: Arc<ModelHub>, concurrency: usize) -> Self {
        Self { hub, concurrency: concurrency.max(1) }
    }

    /// The request's settings over the defaults of the preset its checklist comes from, checked.
    fn config(request: &ScoreRequest) -> Result<ScorerConfig, StageError> {
        let config = request.config.resolve(&default_scorer_for(&request.checklist.source_method));
        let mut v = Violations::new();
        config.check("config", &mut v);
        v.into_result()?;
        Ok(config)
    }
}

/// What one target's scoring produced.
struct TargetResult {
    score: Score,
    usage: Usage,
}

#[async_trait::async_trait]
impl Scorer for ScorerCore {
    async fn score(
        &self,
        request: ScoreRequest,
        events: EventSink<'_, ScoreEvent>,
    ) -> Result<ScoreOutcome, StageError> {
        let config = &Self::config(&request)?;
        let chat = self.hub.chat(PHASE, &request.model, "model")?;
        let template = config.prompt_template.as_deref().unwrap_or_else(|| builtin_template(config));
        let n = request.checklist.items.len() as u32;
        // A batch reply needs room for every item: that bound wins over a smaller configured limit.
        let purpose = match config.mode {
            ScoringMode::Batch => Purpose::new(TOKENS_PER_ITEM * n + 64).at_least(TOKENS_PER_ITEM * n + 64),
            ScoringMode::Item => Purpose::new(if config.capture_reasoning { 256 } else { 16 }),
        };
        let max_tokens = chat.max_tokens(purpose);
        let logprobs = config.wants_logprobs();
        let record = {
            let mut r: ModelRecord =
                chat.record(PHASE, max_tokens, assay_domain::template::template_sha256(template), logprobs);
            r.temperature = Some(r.temperature.unwrap_or(0.0));
            r
        };
        let concurrency = if config.concurrency > 0 { config.concurrency as usize } else { self.concurrency };
        let job = Job {
            chat: &chat,
            checklist: &request.checklist,
            config,
            template,
            purpose,
            concurrency,
            calls: tokio::sync::Semaphore::new(concurrency),
        };
        // Targets run concurrently and, in item mode, so do each target's items; every model call
        // holds a permit of one semaphore, so at most `concurrency` are in flight per request.
        let mut results: Vec<Option<TargetResult>> = (0..request.targets.len()).map(|_| None).collect();
        let targets = &request.targets;
        let job = &job;
        let mut stream = futures::stream::iter(0..targets.len())
            .map(|i| async move { (i, job.score_target(&targets[i]).await) })
            .buffer_unordered(concurrency);
        while let Some((i, r)) = stream.next().await {
            let r = r?;
            events(ScoreEvent::TargetScored { index: i as u32, score: r.score.clone() });
            results[i] = Some(r);
        }
        drop(stream);
        let mut usage = Usage::default();
        let mut scores = Vec::with_capacity(results.len());
        for r in results.into_iter().flatten() {
            usage.add(&r.usage);
            scores.push(r.score);
        }
        let aggregate = AggregateScores::compute(scores.iter().map(|s| (s, &request.checklist)));
        Ok(ScoreOutcome { scores, aggregate, usage, model: record })
    }
}

struct Job<'a> {
    chat: &'a ResolvedChat,
    checklist: &'a Checklist,
    config: &'a ScorerConfig,
    template: &'a str,
    /// The stage's defaults and bound for every call ([`ResolvedChat::request`]).
    purpose: Purpose,
    concurrency: usize,
    /// One permit per model call in flight.
    calls: tokio::sync::Semaphore,
}

impl Job<'_> {
    /// The request of sample `sample` (0-based). Sample 0 is the request as it is without repeated
    /// judging; sample i > 0 sends seed (the spec's seed, or 0) + i, so every sample is its own
    /// response-cache entry and an identical re-run hits them all. With judge models, sample i
    /// asks for `sample_models[i % len]`.
    fn request(&self, prompt: String, format: ResponseFormat, top_logprobs: Option<u8>, sample: u32) -> ChatRequest {
        let mut req = ChatRequest {
            response_format: format,
            top_logprobs,
            ..self.chat.request(vec![Message::user(prompt)], self.purpose)
        };
        if sample > 0 {
            req.seed = Some(req.seed.unwrap_or(0) + u64::from(sample));
        }
        let models = &self.config.sample_models;
        if !models.is_empty() {
            req.model = Some(models[sample as usize % models.len()].clone());
        }
        req
    }

    /// The prompt for `t`. Record text is untrusted: it is fenced (see
    /// [`assay_domain::template::fence_untrusted`]) so it cannot close the tags the built-in
    /// prompts quote it between; custom templates get the same values.
    fn render(&self, t: &ScoreTarget, question: &str) -> String {
        use assay_domain::template::fence_untrusted as fence;
        let question = fence(question);
        render(
            self.template,
            &[
                ("input", &fence(&t.input)),
                ("target", &fence(&t.target)),
                ("question", &question),
                ("checklist", &question),
                ("history", &fence(&t.history)),
                ("reference", &fence(&t.reference)),
            ],
        )
    }

    /// One model call, under the request's concurrency cap.
    async fn call(&self, req: ChatRequest) -> Result<ChatResponse, assay_llm::LlmError> {
        let _permit =
            self.calls.acquire().await.map_err(|_| assay_llm::LlmError::Unavailable("scorer closed".into()))?;
        self.chat.model.chat(req).await
    }

    /// Score `t` once per sample (concurrently; every call under the request's cap) and combine the
    /// samples ([`Score::combine_samples`]: one sample is the score itself).
    async fn score_target(&self, t: &ScoreTarget) -> Result<TargetResult, StageError> {
        let samples = self.config.samples.max(1);
        let runs = futures::future::try_join_all((0..samples).map(|i| self.score_sample(t, i))).await?;
        let mut usage = Usage::default();
        let mut scores = Vec::with_capacity(runs.len());
        for (score, u) in runs {
            usage.add(&u);
            scores.push(score);
        }
        let score = Score::combine_samples(self.checklist, scores, self.config.primary_metric);
        Ok(TargetResult { score, usage })
    }

    /// One sample's scoring of `t`: every item, every aggregate.
    async fn score_sample(&self, t: &ScoreTarget, sample: u32) -> Result<(Score, Usage), StageError> {
        let replies = match self.config.mode {
            ScoringMode::Batch => self.batch(t, sample).await?,
            ScoringMode::Item => self.items(t, sample).await?,
        };
        let mut score = Score::compute(self.checklist, replies.items, self.config.primary_metric);
        score.target_id = t.id.clone();
        score.schema_fallback = replies.schema_fallback;
        score.logprobs_unavailable = replies.logprobs_unavailable;
        score.off_answer_items = replies.off_answer;
        Ok((score, replies.usage))
    }

    async fn batch(&self, t: &ScoreTarget, sample: u32) -> Result<Replies, StageError> {
        let questions: String =
            self.checklist.items.iter().enumerate().map(|(i, it)| format!("Q{}: {}\n", i + 1, it.question)).collect();
        let schema = parse::batch_schema(self.config.capture_reasoning, self.checklist.items.len());
        let req = self.request(
            self.render(t, questions.trim_end()),
            ResponseFormat::JsonSchema { name: "checklist_answers".into(), schema },
            None,
            sample,
        );
        let reply: ChatResponse = self.call(req).await?;
        let items = match parse_batch_reply(&reply) {
            Ok(answers) => map_batch_answers(self.checklist, &answers),
            Err(why) => self
                .checklist
                .items
                .iter()
                .map(|it| ItemScore::missing(&it.id, ItemStatus::Unparseable, why.clone()))
                .collect(),
        };
        Ok(Replies { items, usage: reply.usage, schema_fallback: reply.schema_fallback, ..Replies::default() })
    }

    async fn items(&self, t: &ScoreTarget, sample: u32) -> Result<Replies, StageError> {
        let logprobs = self.config.wants_logprobs();
        let items = &self.checklist.items;
        let per_item = futures::stream::iter(0..items.len())
            .map(|idx| async move {
                let it = &items[idx];
                let prompt = self.render(t, &it.question);
                let (format, top) = if logprobs {
                    // The answer must be the first token for its logprobs to mean anything.
                    (ResponseFormat::Choice(vec!["YES".into(), "NO".into()]), Some(5))
                } else {
                    (
                        ResponseFormat::JsonSchema {
                            name: "checklist_answer".into(),
                            schema: parse::item_schema(self.config.capture_reasoning),
                        },
                        None,
                    )
                };
                let req = self.request(prompt, format, top, sample);
                (it, self.call(req).await)
            })
            .buffered(self.concurrency);
        let replies: Vec<_> = per_item.collect().await;
        let mut out = Replies { items: Vec::with_capacity(replies.len()), ..Replies::default() };
        for (it, reply) in replies {
            let reply = match reply {
                Ok(r) => r,
                // A deterministic refusal of the request fails the whole call; transient failures
                // already exhausted their retries and fail just this item.
                Err(e) if e.is_transient() => {
                    out.items.push(ItemScore::missing(&it.id, ItemStatus::Failed, e.to_string()));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            out.usage.add(&reply.usage);
            out.schema_fallback |= reply.schema_fallback;
            let mut score = if logprobs {
                if !begins_with_an_answer(&reply.text) {
                    out.off_answer += 1;
                }
                let alts = reply.first_token_logprobs.as_deref().filter(|l| !l.is_empty());
                if alts.is_none() {
                    out.logprobs_unavailable = true;
                }
                // No answer among the first token's alternatives: the reply's text, never a
                // made-up even chance.
                alts.and_then(|alts| confidence_score(&it.id, alts)).unwrap_or_else(|| parse_item_reply(&it.id, &reply))
            } else {
                parse_item_reply(&it.id, &reply)
            };
            if self.config.capture_reasoning && score.reasoning.is_none() && logprobs {
                let rest = reply.text.trim().trim_start_matches(|c: char| c.is_alphabetic()).trim();
                if !rest.is_empty() {
                    score.reasoning = Some(rest.to_string());
                }
            }
            if !self.config.capture_reasoning {
                score.reasoning = None;
            }
            out.items.push(score);
        }
        Ok(out)
    }
}

/// One sample's item replies read: the items, their usage, and what the replies said of the
/// backend.
#[derive(Default)]
struct Replies {
    items: Vec<ItemScore>,
    usage: Usage,
    schema_fallback: bool,
    logprobs_unavailable: bool,
    /// Logprob replies that did not begin with an answer.
    off_answer: u32,
}

/// Whether a reply begins with YES or NO (any case, punctuation around it ignored): its first
/// token is an answer, so the first token's logprobs are the model's choice between them.
pub fn begins_with_an_answer(text: &str) -> bool {
    let first = text.split_whitespace().next().unwrap_or_default();
    let word = first.trim_matches(|c: char| c.is_ascii_punctuation());
    word.eq_ignore_ascii_case("yes") || word.eq_ignore_ascii_case("no")
}

/// Confidence from the first token's alternatives: P(yes) / (P(yes) + P(no)), alternatives
/// lower-cased and stripped; `None` when neither is among them (the first token was something
/// else and the alternatives say nothing of the answer).
pub fn confidence_score(item_id: &str, alts: &[assay_llm::TokenLogprob]) -> Option<ItemScore> {
    let (mut p_yes, mut p_no) = (0.0f64, 0.0f64);
    for a in alts {
        let tok = a.token.trim().to_lowercase();
        let p = a.logprob.exp();
        if tok == "yes" {
            p_yes += p;
        } else if tok == "no" {
            p_no += p;
        }
    }
    if p_yes + p_no < 1e-9 {
        return None;
    }
    let confidence = p_yes / (p_yes + p_no);
    let level = ConfidenceLevel::of(confidence);
    let mut s = ItemScore::answered(item_id, level.answer());
    s.confidence = Some(confidence);
    s.confidence_level = Some(level);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use assay_domain::Answer;
    use assay_llm::TokenLogprob;

    fn lp(token: &str, p: f64) -> TokenLogprob {
        TokenLogprob { token: token.into(), logprob: p.ln() }
    }

    #[test]
    fn confidence_sums_matching_alternatives() {
        let s = confidence_score("a", &[lp("Yes", 0.6), lp(" YES", 0.2), lp("no", 0.1), lp("maybe", 0.1)]).unwrap();
        let c = s.confidence.unwrap();
        assert!((c - 0.8 / 0.9).abs() < 1e-9);
        assert_eq!(s.confidence_level, Some(ConfidenceLevel::Yes90));
        assert_eq!(s.answer, Some(Answer::Yes));
    }

    #[test]
    fn no_yes_no_mass_is_no_confidence_at_all() {
        // It was an even chance answered NO: a verdict from a token the model did not pick.
        assert_eq!(confidence_score("a", &[lp("The", 0.9)]), None);
    }

    #[test]
    fn replies_that_begin_with_an_answer() {
        for text in ["YES", "no", "Yes, it does.", " \"NO\" because", "No."] {
            assert!(begins_with_an_answer(text), "{text}");
        }
        for text in ["The answer is yes", "", "Yesterday", "I think no"] {
            assert!(!begins_with_an_answer(text), "{text}");
        }
    }
}
