//! Local sentence embeddings: all-MiniLM-L6-v2 in-process with candle.
//!
//! Tokenization pads to the longest text of each internal batch (at most 256 tokens), the encoder
//! runs with the attention mask, token states are mean-pooled over real tokens and L2-normalised,
//! as sentence-transformers does. Padding is masked out, so a text's vector does not depend on what
//! else is in its batch (up to float rounding, well below 1e-5).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use assay_llm::{EmbeddingModel, EmbeddingRequest, EmbeddingResponse, LlmError, Usage};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

/// Model name reported by the local embedder.
pub const MINILM_MODEL_NAME: &str = "all-MiniLM-L6-v2";
/// Longest input, in tokens (sentence-transformers' `max_seq_length` for this model).
pub const MAX_TOKENS: usize = 256;
/// Texts per forward pass.
pub const BATCH_SIZE: usize = 32;
/// Embedding dimension.
pub const DIMENSIONS: usize = 384;

/// Errors while loading the embedder.
#[derive(Debug, thiserror::Error)]
pub enum EmbedLoadError {
    #[error("reading {path}: {message}")]
    Read { path: String, message: String },
    #[error("loading the MiniLM model: {0}")]
    Model(String),
}

struct Inner {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
}

/// all-MiniLM-L6-v2 embeddings computed in-process. Cheap to clone.
#[derive(Clone)]
pub struct LocalEmbedder {
    inner: Arc<Inner>,
    /// One inference at a time: candle already uses every core for one batch, unless it was
    /// told to use one thread (see `workers`).
    gate: Arc<tokio::sync::Semaphore>,
    /// Parts each internal batch is split into, embedded at once on threads of their own: 1 when
    /// candle spreads one batch over every core itself (the default), one per core when the
    /// process runs candle single-threaded (`RAYON_NUM_THREADS=1`), which is faster on few
    /// cores (less synchronisation per operation).
    workers: usize,
}

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEmbedder").field("model", &MINILM_MODEL_NAME).finish()
    }
}

impl LocalEmbedder {
    /// Loads the model from a directory holding `model.safetensors`, `tokenizer.json` and
    /// `config.json` (see [`crate::ModelPaths::minilm_dir`]).
    pub fn load(dir: &Path) -> Result<Self, EmbedLoadError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path)
                .map_err(|e| EmbedLoadError::Read { path: path.display().to_string(), message: e.to_string() })
        };
        let config: Config = serde_json::from_slice(&read("config.json")?)
            .map_err(|e| EmbedLoadError::Model(format!("config.json: {e}")))?;
        let mut tokenizer = Tokenizer::from_bytes(read("tokenizer.json")?)
            .map_err(|e| EmbedLoadError::Model(format!("tokenizer.json: {e}")))?;
        let pad_id = tokenizer.get_padding().map(|p| p.pad_id).unwrap_or(0);
        let pad_token = tokenizer.get_padding().map(|p| p.pad_token.clone()).unwrap_or_else(|| "[PAD]".into());
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_id,
            pad_token,
            ..Default::default()
        }));
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: MAX_TOKENS, ..Default::default() }))
            .map_err(|e| EmbedLoadError::Model(format!("truncation: {e}")))?;
        let device = Device::Cpu;
        let weights = dir.join("model.safetensors");
        let vb = VarBuilder::from_buffered_safetensors(read("model.safetensors")?, DType::F32, &device)
            .map_err(|e| EmbedLoadError::Model(format!("{}: {e}", weights.display())))?;
        let model = BertModel::load(vb, &config).map_err(|e| EmbedLoadError::Model(e.to_string()))?;
        let workers = if candle_core::utils::get_num_threads() == 1 {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
        } else {
            1
        };
        Ok(Self {
            inner: Arc::new(Inner { model, tokenizer, device }),
            gate: Arc::new(tokio::sync::Semaphore::new(1)),
            workers,
        })
    }

    /// Parts each internal batch is split into and embedded at once (1: candle threads one batch).
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// The same model, splitting each internal batch into `n` parts embedded at once.
    #[must_use]
    pub fn with_workers(&self, n: usize) -> Self {
        Self { inner: self.inner.clone(), gate: Arc::new(tokio::sync::Semaphore::new(1)), workers: n.max(1) }
    }

    /// Embeds texts synchronously on the calling thread (batches of [`BATCH_SIZE`]). Returns the
    /// vectors and the number of tokens processed.
    pub fn embed_blocking(&self, texts: &[String]) -> Result<(Vec<Vec<f32>>, u64), LlmError> {
        let mut out = Vec::with_capacity(texts.len());
        let mut tokens = 0u64;
        for chunk in texts.chunks(BATCH_SIZE) {
            let (vectors, n) = self.inner.embed_batch(chunk)?;
            out.extend(vectors);
            tokens += n;
        }
        Ok((out, tokens))
    }
}

impl Inner {
    fn embed_batch(&self, texts: &[String]) -> Result<(Vec<Vec<f32>>, u64), LlmError> {
        if texts.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let internal = |e: &dyn std::fmt::Display| LlmError::Unavailable(format!("local embedder: {e}"));
        let inputs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let encodings = self.tokenizer.encode_batch(inputs, true).map_err(|e| internal(&e))?;
        let seq = encodings.iter().map(|e| e.get_ids().len()).max().unwrap_or(0).max(1);
        let n = encodings.len();
        let mut ids = Vec::with_capacity(n * seq);
        let mut mask = Vec::with_capacity(n * seq);
        let mut tokens = 0u64;
        for e in &encodings {
            let (i, m) = (e.get_ids(), e.get_attention_mask());
            ids.extend(i.iter().copied().chain(std::iter::repeat(0)).take(seq));
            mask.extend(m.iter().copied().chain(std::iter::repeat(0)).take(seq));
            tokens += m.iter().map(|&x| u64::from(x)).sum::<u64>();
        }
        let run = || -> candle_core::Result<Vec<Vec<f32>>> {
            let ids = Tensor::from_vec(ids, (n, seq), &self.device)?;
            let mask = Tensor::from_vec(mask, (n, seq), &self.device)?;
            let type_ids = ids.zeros_like()?;
            let hidden = self.model.forward(&ids, &type_ids, Some(&mask))?; // (n, seq, 384)
            let maskf = mask.to_dtype(DType::F32)?.unsqueeze(2)?; // (n, seq, 1)
            let summed = hidden.broadcast_mul(&maskf)?.sum(1)?; // (n, 384)
            let counts = maskf.sum(1)?.clamp(1e-9f32, f32::MAX)?; // (n, 1)
            let mean = summed.broadcast_div(&counts)?;
            let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12f32, f32::MAX)?;
            mean.broadcast_div(&norm)?.to_vec2::<f32>()
        };
        let vectors = run().map_err(|e| internal(&e))?;
        Ok((vectors, tokens))
    }
}

#[async_trait::async_trait]
impl EmbeddingModel for LocalEmbedder {
    fn backend(&self) -> &str {
        "local"
    }

    fn default_model(&self) -> &str {
        MINILM_MODEL_NAME
    }

    async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError> {
        if let Some(model) = request.model.as_deref()
            && !model.eq_ignore_ascii_case(MINILM_MODEL_NAME)
            && !model.eq_ignore_ascii_case("sentence-transformers/all-MiniLM-L6-v2")
        {
            return Err(LlmError::InvalidRequest(format!(
                "the local embedder serves {MINILM_MODEL_NAME}, not {model}"
            )));
        }
        let deadline = request.deadline;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(LlmError::DeadlineExceeded);
        }
        let _permit = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), self.gate.clone().acquire_owned())
                .await
                .map_err(|_| LlmError::DeadlineExceeded)?,
            None => self.gate.clone().acquire_owned().await,
        }
        .map_err(|_| LlmError::Unavailable("local embedder closed".into()))?;
        let this = self.clone();
        let texts = request.texts;
        let mut vectors = Vec::with_capacity(texts.len());
        let mut tokens = 0u64;
        // One blocking task per internal batch, so a caller that goes away stops between batches.
        for chunk in texts.chunks(BATCH_SIZE) {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LlmError::DeadlineExceeded);
            }
            // Parts of at least 4 texts, one per worker, embedded at once.
            let part = chunk.len().div_ceil(self.workers).max(4);
            let tasks: Vec<_> = chunk
                .chunks(part)
                .map(|p| {
                    let (inner, p) = (this.inner.clone(), p.to_vec());
                    tokio::task::spawn_blocking(move || inner.embed_batch(&p))
                })
                .collect();
            for task in tasks {
                let (v, n) = task.await.map_err(|e| LlmError::Unavailable(format!("local embedder task: {e}")))??;
                vectors.extend(v);
                tokens += n;
            }
        }
        Ok(EmbeddingResponse {
            vectors,
            model: MINILM_MODEL_NAME.to_string(),
            usage: Usage { calls: 1, prompt_tokens: tokens, ..Usage::default() },
        })
    }
}
