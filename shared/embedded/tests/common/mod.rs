//! Shared helpers of the model tests. These tests need the real models: they FAIL (never skip)
//! when the models are missing. Fetch them first with `assay models fetch` or
//! `cargo run -p assay-embedded --example fetch_models` (CI does this before the tests).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use assay_embedded::{LocalChat, LocalChatOptions, LocalEmbedder, LocalModelChoice, ModelPaths};

/// The models directory; panics with instructions when the models are missing.
pub fn models_dir() -> PathBuf {
    let dir = assay_embedded::default_models_dir();
    let missing = assay_embedded::fetch::missing_files(&dir);
    assert!(
        missing.is_empty(),
        "local models missing in {} ({}). Fetch them with `assay models fetch` or \
         `cargo run -p assay-embedded --example fetch_models` (ASSAY_MODELS_DIR selects the directory)",
        dir.display(),
        missing.join(", ")
    );
    dir
}

pub fn embedder() -> &'static LocalEmbedder {
    static E: OnceLock<LocalEmbedder> = OnceLock::new();
    E.get_or_init(|| LocalEmbedder::load(&ModelPaths::in_dir(&models_dir()).minilm_dir).expect("load MiniLM"))
}

pub fn load_smollm2() -> LocalChat {
    let paths = ModelPaths::in_dir(&models_dir());
    LocalChat::load(&paths.smollm2_gguf, LocalModelChoice::Smollm2, LocalChatOptions::default()).expect("load SmolLM2")
}

pub fn smollm2() -> &'static LocalChat {
    static C: OnceLock<LocalChat> = OnceLock::new();
    C.get_or_init(load_smollm2)
}

pub fn gemma3() -> &'static LocalChat {
    static C: OnceLock<LocalChat> = OnceLock::new();
    C.get_or_init(|| {
        let paths = ModelPaths::in_dir(&models_dir());
        LocalChat::load(&paths.gemma3_gguf, LocalModelChoice::Gemma3, LocalChatOptions::default())
            .expect("load gemma-3")
    })
}
