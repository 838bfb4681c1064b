//! Local generation on a GGUF model with llama.cpp (through `llama-cpp-2`).
//!
//! One worker thread owns the model and its context; requests reach it through a bounded FIFO
//! queue. A request whose caller went away (the `chat` future was dropped) is skipped, or stopped
//! between tokens. The KV cache keeps the previous prompt, so requests sharing a prefix (same system
//! prompt, repeated judge prompts) only evaluate the new tokens.
//!
//! Sampling is done here, from the logits: greedy for temperature 0, else a seeded
//! temperature/top-p draw with a fixed PRNG (same seed, same prompt, same output). Constrained
//! formats use llama.cpp's grammar engine only as a mask: the highest-logit candidates are checked
//! first and the whole vocabulary only when none of them is allowed, which keeps grammar decoding
//! fast on large vocabularies (gemma-3 has 262k tokens). Greedy decoding under a grammar is exact;
//! sampling under a grammar draws among the allowed tokens of the top [`FAST_CANDIDATES`] when there
//! are any.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use assay_llm::{ChatModel, ChatRequest, ChatResponse, FinishReason, LlmError, ResponseFormat, TokenLogprob, Usage};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::token::data::LlamaTokenData;
use llama_cpp_2::token::data_array::LlamaTokenDataArray;
use tokio::sync::{mpsc, oneshot};

use crate::template::{self, LocalModelChoice, PromptStyle, Segment};
use assay_llm::grammar;

/// Candidates checked against the grammar before falling back to the whole vocabulary.
pub const FAST_CANDIDATES: usize = 64;
/// Completion tokens when a request sets no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// Default context window (prompt + completion), clamped to the model's training context: the
/// panel judge's prompt for an 18,000-character, 8-section lesson
/// (`tests/fixtures/lesson_compound_interest.json`) is about 5,700 tokens, over the 4,096 this
/// was, so every judge of the default backend failed on a full-size document.
pub const DEFAULT_N_CTX: u32 = 8192;

/// Options of [`LocalChat`].
#[derive(Debug, Clone)]
pub struct LocalChatOptions {
    /// Context window in tokens (prompt + completion).
    pub n_ctx: u32,
    /// Requests waiting for the model at most; further callers wait for room (FIFO).
    pub queue_capacity: usize,
    /// CPU threads; `None` uses [`default_threads`].
    pub threads: Option<i32>,
    /// Prompt format; `None` uses the model's default.
    pub prompt_style: Option<PromptStyle>,
}

impl Default for LocalChatOptions {
    fn default() -> Self {
        Self { n_ctx: DEFAULT_N_CTX, queue_capacity: 64, threads: None, prompt_style: None }
    }
}

/// Errors while loading a chat model.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ChatLoadError {
    #[error("model file {0} not found (run `assay models fetch`)")]
    Missing(PathBuf),
    #[error("llama.cpp: {0}")]
    Llama(String),
}

/// Facts about a loaded model.
#[derive(Debug, Clone)]
pub struct ChatModelInfo {
    pub choice: LocalModelChoice,
    pub path: PathBuf,
    pub n_vocab: usize,
    pub n_ctx: u32,
    pub n_params: u64,
    pub load_time: Duration,
}

/// Per-request timings, for benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenStats {
    /// Prompt tokens actually evaluated (the rest came from the KV cache).
    pub prompt_evaluated: u64,
    pub prompt_time: Duration,
    pub gen_time: Duration,
    pub gen_tokens: u64,
}

/// A reply with its timings.
#[derive(Debug, Clone)]
pub struct TimedResponse {
    pub response: ChatResponse,
    pub stats: GenStats,
}

struct Job {
    request: ChatRequest,
    reply: oneshot::Sender<Result<TimedResponse, LlmError>>,
}

/// A GGUF chat model running in-process. Cheap to clone; the model is freed when the last clone
/// is dropped.
#[derive(Clone)]
pub struct LocalChat {
    tx: mpsc::Sender<Job>,
    info: std::sync::Arc<ChatModelInfo>,
}

impl std::fmt::Debug for LocalChat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalChat").field("model", &self.info.choice.model_name()).finish()
    }
}

/// Environment variable overriding the number of CPU threads of the local chat model.
pub const THREADS_ENV: &str = "ASSAY_LOCAL_THREADS";

/// Default CPU threads for generation: `$ASSAY_LOCAL_THREADS`, else half the cores (at least 1).
///
/// llama.cpp's threads synchronise with spinning barriers after every operation; when the cores
/// are shared (other services, the embedder, builds) a thread per core collapses throughput
/// (measured on 2 busy cores: 22 tok/s with 1 thread, 5 tok/s with 2).
pub fn default_threads() -> i32 {
    if let Some(n) = std::env::var(THREADS_ENV).ok().and_then(|v| v.trim().parse::<i32>().ok()).filter(|n| *n > 0) {
        return n;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    (cores / 2).clamp(1, 8) as i32
}

/// The process-wide llama.cpp backend (it can be initialised once only).
fn backend() -> Result<&'static LlamaBackend, ChatLoadError> {
    static BACKEND: OnceLock<Result<LlamaBackend, ChatLoadError>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            llama_cpp_2::send_logs_to_tracing(llama_cpp_2::LogOptions::default().with_logs_enabled(false));
            LlamaBackend::init().map_err(|e| ChatLoadError::Llama(e.to_string()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl LocalChat {
    /// Loads `path` (a GGUF of model `choice`) on a new worker thread and waits until it is ready.
    /// Blocks for the load time (well under a second for the bundled models).
    pub fn load(path: &Path, choice: LocalModelChoice, options: LocalChatOptions) -> Result<Self, ChatLoadError> {
        if !path.is_file() {
            return Err(ChatLoadError::Missing(path.to_path_buf()));
        }
        let (tx, rx) = mpsc::channel::<Job>(options.queue_capacity.max(1));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let path_buf = path.to_path_buf();
        std::thread::Builder::new()
            .name(format!("assay-local-{choice}"))
            .spawn(move || worker(path_buf, choice, options, rx, ready_tx))
            .map_err(|e| ChatLoadError::Llama(format!("spawning the model thread: {e}")))?;
        let info = ready_rx.recv().map_err(|_| ChatLoadError::Llama("model thread exited during load".into()))??;
        Ok(Self { tx, info: std::sync::Arc::new(info) })
    }

    /// [`LocalChat::load`] on a blocking thread.
    pub async fn load_async(
        path: PathBuf,
        choice: LocalModelChoice,
        options: LocalChatOptions,
    ) -> Result<Self, ChatLoadError> {
        tokio::task::spawn_blocking(move || Self::load(&path, choice, options))
            .await
            .map_err(|e| ChatLoadError::Llama(e.to_string()))?
    }

    pub fn info(&self) -> &ChatModelInfo {
        &self.info
    }

    /// Like [`ChatModel::chat`], also returning timings.
    pub async fn chat_timed(&self, request: ChatRequest) -> Result<TimedResponse, LlmError> {
        if let Some(model) = request.model.as_deref()
            && !model.eq_ignore_ascii_case(self.info.choice.model_name())
            && LocalModelChoice::parse(model) != Some(self.info.choice)
            && !model.eq_ignore_ascii_case("local")
        {
            return Err(LlmError::InvalidRequest(format!(
                "the local backend serves {}, not {model}",
                self.info.choice.model_name()
            )));
        }
        if let Some(k) = request.top_logprobs
            && !(1..=20).contains(&k)
        {
            return Err(LlmError::InvalidRequest(format!("top_logprobs must be 1..=20, got {k}")));
        }
        let deadline = request.deadline;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(LlmError::DeadlineExceeded);
        }
        let (reply, rx) = oneshot::channel();
        let job = Job { request, reply };
        let closed = || LlmError::Unavailable("local model worker stopped".into());
        match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), self.tx.send(job))
                .await
                .map_err(|_| LlmError::DeadlineExceeded)?
                .map_err(|_| closed())?,
            None => self.tx.send(job).await.map_err(|_| closed())?,
        }
        match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), rx).await.map_err(|_| LlmError::DeadlineExceeded)?,
            None => rx.await,
        }
        .map_err(|_| closed())?
    }
}

#[async_trait::async_trait]
impl ChatModel for LocalChat {
    fn backend(&self) -> &str {
        "local"
    }

    fn default_model(&self) -> &str {
        self.info.choice.model_name()
    }

    fn supports_logprobs(&self) -> bool {
        true
    }

    async fn context_tokens(&self, _model: &str) -> Option<u32> {
        Some(self.info.n_ctx)
    }

    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        self.chat_timed(request).await.map(|t| t.response)
    }
}

fn worker(
    path: PathBuf,
    choice: LocalModelChoice,
    options: LocalChatOptions,
    mut rx: mpsc::Receiver<Job>,
    ready: std::sync::mpsc::Sender<Result<ChatModelInfo, ChatLoadError>>,
) {
    let started = Instant::now();
    let backend = match backend() {
        Ok(b) => b,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let model = match LlamaModel::load_from_file(backend, &path, &LlamaModelParams::default()) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(ChatLoadError::Llama(format!("loading {}: {e}", path.display()))));
            return;
        }
    };
    let threads = options.threads.unwrap_or_else(default_threads);
    let n_ctx = options.n_ctx.clamp(256, model.n_ctx_train().max(256));
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(512)
        .with_n_ubatch(512)
        .with_n_seq_max(1)
        .with_n_threads(threads)
        .with_n_threads_batch(threads)
        // Full-size sliding-window cache (gemma-3), so the KV cache can be truncated at any
        // position and prompt prefixes reused.
        .with_swa_full(true);
    let ctx = match model.new_context(backend, params) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(ChatLoadError::Llama(format!("creating a context: {e}"))));
            return;
        }
    };
    let info = ChatModelInfo {
        choice,
        path: path.clone(),
        n_vocab: model.n_vocab().max(0) as usize,
        n_ctx,
        n_params: model.n_params(),
        load_time: started.elapsed(),
    };
    let mut engine = Engine::new(&model, ctx, choice, options.prompt_style.unwrap_or(choice.default_prompt_style()));
    if ready.send(Ok(info)).is_err() {
        return;
    }
    while let Some(job) = rx.blocking_recv() {
        if job.reply.is_closed() {
            continue; // the caller went away while queued
        }
        if job.request.deadline.is_some_and(|d| Instant::now() >= d) {
            let _ = job.reply.send(Err(LlmError::DeadlineExceeded));
            continue;
        }
        let cancelled = || job.reply.is_closed();
        let result = engine.run(&job.request, &cancelled);
        if let Err(LlmError::Unavailable(msg)) = &result {
            tracing::warn!(error = %msg, "local generation failed");
        }
        let _ = job.reply.send(result);
    }
}

/// Deterministic PRNG (SplitMix64): the same seed gives the same draws on every platform and
/// across dependency upgrades.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Engine<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    choice: LocalModelChoice,
    style: PromptStyle,
    /// Tokens whose keys/values are in the KV cache, in order from position 0.
    kv_tokens: Vec<LlamaToken>,
    batch: LlamaBatch<'static>,
    n_batch: usize,
    n_ctx: usize,
    /// Detokenized pieces (control tokens render empty).
    pieces: Vec<Vec<u8>>,
    /// Pieces with control tokens rendered, for logprob alternatives.
    display: Vec<String>,
    eog: Vec<bool>,
}

/// Why the token loop stopped.
enum Stop {
    Eog,
    Sequence,
    Length,
}

impl<'m> Engine<'m> {
    fn new(model: &'m LlamaModel, ctx: LlamaContext<'m>, choice: LocalModelChoice, style: PromptStyle) -> Self {
        let vocab = model.vocab();
        let n_vocab = model.n_vocab().max(0) as usize;
        let mut pieces = Vec::with_capacity(n_vocab);
        let mut display = Vec::with_capacity(n_vocab);
        let mut eog = Vec::with_capacity(n_vocab);
        for id in 0..n_vocab {
            let t = LlamaToken::new(id as i32);
            let p = vocab.token_to_piece(t, false, None);
            let d = vocab.token_to_piece(t, true, None);
            pieces.push(p);
            display.push(String::from_utf8_lossy(&d).into_owned());
            eog.push(vocab.is_eog(t));
        }
        let n_batch = ctx.n_batch() as usize;
        let n_ctx = ctx.n_ctx() as usize;
        Self {
            model,
            ctx,
            choice,
            style,
            kv_tokens: Vec::new(),
            batch: LlamaBatch::new(n_batch, 1),
            n_batch,
            n_ctx,
            pieces,
            display,
            eog,
        }
    }

    fn tokenize(&self, segments: &[Segment]) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut out = Vec::new();
        if vocab.should_add_bos() {
            out.push(vocab.bos());
        }
        for s in segments {
            match s {
                Segment::Markup(t) => out.extend(vocab.tokenize(t.as_bytes(), false, true)),
                Segment::Content(t) => out.extend(vocab.tokenize(t.as_bytes(), false, false)),
            }
        }
        out
    }

    /// Evaluates `prompt`, reusing the cached prefix; leaves the logits of the last prompt token
    /// at batch index `self.batch.n_tokens() - 1`. Returns how many tokens were evaluated.
    fn eval_prompt(&mut self, prompt: &[LlamaToken], cancelled: &dyn Fn() -> bool) -> Result<usize, LlmError> {
        let common = self.kv_tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        // At least the last prompt token is evaluated again, for its logits.
        let mut keep = common.min(prompt.len() - 1);
        if keep < self.kv_tokens.len() {
            let ok = self.ctx.clear_kv_cache_seq(Some(0), Some(keep as u32), None).unwrap_or(false);
            if !ok {
                self.ctx.clear_kv_cache();
                keep = 0;
            }
            self.kv_tokens.truncate(keep);
        }
        let mut pos = keep;
        while pos < prompt.len() {
            if cancelled() {
                return Err(LlmError::Unavailable("cancelled".into()));
            }
            let end = (pos + self.n_batch).min(prompt.len());
            self.batch.clear();
            for (i, t) in prompt[pos..end].iter().enumerate() {
                let p = pos + i;
                self.batch.add(*t, p as i32, &[0], p + 1 == prompt.len()).map_err(internal)?;
            }
            if let Err(e) = self.ctx.decode(&mut self.batch) {
                self.ctx.clear_kv_cache();
                self.kv_tokens.clear();
                return Err(internal(e));
            }
            self.kv_tokens.extend_from_slice(&prompt[pos..end]);
            pos = end;
        }
        Ok(prompt.len() - keep)
    }

    fn decode_one(&mut self, token: LlamaToken) -> Result<(), LlmError> {
        let pos = self.kv_tokens.len();
        self.batch.clear();
        self.batch.add(token, pos as i32, &[0], true).map_err(internal)?;
        if let Err(e) = self.ctx.decode(&mut self.batch) {
            self.ctx.clear_kv_cache();
            self.kv_tokens.clear();
            return Err(internal(e));
        }
        self.kv_tokens.push(token);
        Ok(())
    }

    /// Token ids among `candidates` that the grammar allows next.
    fn grammar_filter(grammar: &mut LlamaSampler, logits: &[f32], candidates: &[usize]) -> Vec<usize> {
        let data: Vec<LlamaTokenData> =
            candidates.iter().map(|&i| LlamaTokenData::new(LlamaToken::new(i as i32), logits[i], 0.0)).collect();
        let mut arr = LlamaTokenDataArray::new(data, false);
        arr.apply_sampler(grammar);
        arr.data.iter().filter(|d| d.logit().is_finite()).map(|d| d.id().0 as usize).collect()
    }

    fn run(&mut self, req: &ChatRequest, cancelled: &dyn Fn() -> bool) -> Result<TimedResponse, LlmError> {
        let grammar_src = match &req.response_format {
            ResponseFormat::Text => None,
            ResponseFormat::Choice(opts) => {
                Some(grammar::choice_grammar(opts).map_err(|e| LlmError::InvalidRequest(e.to_string()))?)
            }
            ResponseFormat::JsonSchema { schema, .. } => {
                Some(grammar::json_schema_grammar(schema).map_err(|e| LlmError::InvalidRequest(e.to_string()))?)
            }
        };
        let mut grammar = match &grammar_src {
            Some(src) => Some(
                LlamaSampler::grammar(self.model, src, "root")
                    .map_err(|e| LlmError::InvalidRequest(format!("grammar rejected by llama.cpp: {e}\n{src}")))?,
            ),
            None => None,
        };
        let hint = template::format_hint(&req.response_format, &req.messages);
        let segments = template::render(self.choice, self.style, &req.messages, hint.as_deref());
        let prompt = self.tokenize(&segments);
        if prompt.is_empty() {
            return Err(LlmError::InvalidRequest("empty prompt".into()));
        }
        let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).max(1) as usize;
        if prompt.len() + 1 > self.n_ctx {
            return Err(LlmError::InvalidRequest(format!(
                "prompt of {} tokens exceeds the local context window of {} tokens",
                prompt.len(),
                self.n_ctx
            )));
        }
        let max_tokens = max_tokens.min(self.n_ctx - prompt.len());

        let t0 = Instant::now();
        let evaluated = self.eval_prompt(&prompt, cancelled)?;
        let prompt_time = t0.elapsed();
        let t1 = Instant::now();

        let temperature = req.temperature.unwrap_or(1.0).max(0.0);
        let top_p = req.top_p.unwrap_or(1.0).clamp(0.0, 1.0);
        let seed = req.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
        });
        let mut rng = SplitMix64(seed);
        let mut out: Vec<u8> = Vec::new();
        let mut first_logprobs = None;
        let mut generated = 0usize;
        let mut stop_reason = Stop::Length;
        let mut stop_at: Option<usize> = None;
        let n_vocab = self.pieces.len();
        let mut order: Vec<usize> = (0..n_vocab).collect();

        while generated < max_tokens {
            if cancelled() {
                return Err(LlmError::Unavailable("cancelled".into()));
            }
            if req.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LlmError::DeadlineExceeded);
            }
            let logits = self.ctx.get_logits_ith(self.batch.n_tokens() - 1);
            let logits = &logits[..n_vocab.min(logits.len())];
            // Top candidates by logit.
            let fast = FAST_CANDIDATES.min(n_vocab);
            order.iter_mut().enumerate().for_each(|(i, o)| *o = i);
            order.select_nth_unstable_by(fast - 1, |&a, &b| logits[b].total_cmp(&logits[a]));
            let top = &mut order[..fast];
            top.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
            let want_k = if generated == 0 { req.top_logprobs.map(usize::from) } else { None };
            // Allowed candidates, best first; `None` means the whole vocabulary.
            let allowed: Option<Vec<usize>> = match grammar.as_mut() {
                None => None,
                Some(g) => {
                    let mut a = Self::grammar_filter(g, logits, top);
                    let need = want_k.unwrap_or(1);
                    if a.len() < need {
                        let all: Vec<usize> = (0..n_vocab).collect();
                        a = Self::grammar_filter(g, logits, &all);
                        a.sort_unstable_by(|&x, &y| logits[y].total_cmp(&logits[x]));
                    }
                    if a.is_empty() {
                        return Err(LlmError::Unavailable("grammar allows no token".into()));
                    }
                    Some(a)
                }
            };
            if let Some(k) = want_k {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
                let lse = max + sum.ln();
                let ranked: &[usize] = allowed.as_deref().unwrap_or(top);
                first_logprobs = Some(
                    ranked
                        .iter()
                        .take(k)
                        .map(|&i| TokenLogprob { token: self.display[i].clone(), logprob: logits[i] as f64 - lse })
                        .collect::<Vec<_>>(),
                );
            }
            let token = if temperature <= 0.0 {
                match &allowed {
                    Some(a) => a[0],
                    None => top[0],
                }
            } else {
                let pool: Vec<usize> = match &allowed {
                    Some(a) => a.clone(),
                    None => {
                        // Tokens within e^-30 of the best: the rest has no probability mass in f32.
                        let best = logits[top[0]];
                        let floor = best - 30.0 * temperature;
                        let mut p: Vec<usize> = (0..n_vocab).filter(|&i| logits[i] >= floor).collect();
                        p.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                        p
                    }
                };
                sample(&pool, logits, temperature, top_p, &mut rng)
            };
            if self.eog[token] {
                stop_reason = Stop::Eog;
                break;
            }
            if let Some(g) = grammar.as_mut() {
                g.accept(LlamaToken::new(token as i32));
            }
            let before = out.len();
            out.extend_from_slice(&self.pieces[token]);
            generated += 1;
            if !req.stop.is_empty() {
                let text = String::from_utf8_lossy(&out);
                // Only matches that end in the new bytes are new.
                let search_from = before.saturating_sub(req.stop.iter().map(String::len).max().unwrap_or(0));
                let search_from = (0..=search_from).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
                if let Some(pos) = req
                    .stop
                    .iter()
                    .filter(|s| !s.is_empty())
                    .filter_map(|s| text[search_from..].find(s.as_str()).map(|p| p + search_from))
                    .min()
                {
                    stop_at = Some(pos);
                    stop_reason = Stop::Sequence;
                    break;
                }
            }
            if generated >= max_tokens {
                break;
            }
            self.decode_one(LlamaToken::new(token as i32))?;
        }
        let gen_time = t1.elapsed();
        let mut text = String::from_utf8_lossy(&out).into_owned();
        if let Some(p) = stop_at {
            text.truncate(p);
        }
        if let ResponseFormat::Choice(opts) = &req.response_format
            && let Some(option) = grammar::canonical_choice(opts, &text)
        {
            text = option.to_string();
        }
        let finish_reason = match stop_reason {
            Stop::Eog | Stop::Sequence => FinishReason::Stop,
            Stop::Length => FinishReason::Length,
        };
        let json = match &req.response_format {
            ResponseFormat::JsonSchema { .. } => serde_json::from_str(text.trim()).ok(),
            ResponseFormat::Text | ResponseFormat::Choice(_) => None,
        };
        Ok(TimedResponse {
            response: ChatResponse {
                text,
                json,
                first_token_logprobs: first_logprobs,
                finish_reason,
                model: self.choice.model_name().to_string(),
                usage: Usage {
                    calls: 1,
                    prompt_tokens: prompt.len() as u64,
                    completion_tokens: generated as u64,
                    ..Usage::default()
                },
                schema_fallback: false,
                cached: false,
            },
            stats: GenStats { prompt_evaluated: evaluated as u64, prompt_time, gen_time, gen_tokens: generated as u64 },
        })
    }
}

/// Temperature + top-p draw among `pool` (sorted by logit, best first).
fn sample(pool: &[usize], logits: &[f32], temperature: f32, top_p: f32, rng: &mut SplitMix64) -> usize {
    let t = temperature as f64;
    let best = logits[pool[0]] as f64;
    let weights: Vec<f64> = pool.iter().map(|&i| ((logits[i] as f64 - best) / t).exp()).collect();
    let total: f64 = weights.iter().sum();
    // Nucleus: the smallest prefix whose mass reaches top_p.
    let mut cut = weights.len();
    if top_p < 1.0 {
        let mut acc = 0.0;
        for (i, w) in weights.iter().enumerate() {
            acc += w / total;
            if acc >= top_p as f64 {
                cut = i + 1;
                break;
            }
        }
    }
    let mass: f64 = weights[..cut].iter().sum();
    let mut r = rng.next_f64() * mass;
    for (i, w) in weights[..cut].iter().enumerate() {
        if r < *w {
            return pool[i];
        }
        r -= w;
    }
    pool[cut - 1]
}

fn internal(e: impl std::fmt::Display) -> LlmError {
    LlmError::Unavailable(format!("local model: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_is_stable() {
        let mut r = SplitMix64(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        let x = r.next_f64();
        assert!((0.0..1.0).contains(&x));
    }

    #[test]
    fn sample_respects_pool_and_top_p() {
        let logits = [0.0f32, 10.0, 9.0, -5.0];
        let mut rng = SplitMix64(7);
        for _ in 0..100 {
            let t = sample(&[1, 2, 0], &logits, 1.0, 1.0, &mut rng);
            assert!([0, 1, 2].contains(&t));
            // top_p small: only the best token.
            assert_eq!(sample(&[1, 2, 0], &logits, 1.0, 0.1, &mut rng), 1);
        }
    }
}
