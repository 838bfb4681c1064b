//! `assay up`: the whole mesh in this process until Ctrl-C or SIGTERM, with the admin page.

use std::path::Path;

use assay_config::AssayConfig;

use super::common::{BackendArgs, load_config};
use super::error::{CliError, Ending, Outcome};
use super::session::start;

/// Options of `assay up`.
#[derive(clap::Args, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// UNSAFE: serve the admin page with no token when no auth_token is configured (by default
    /// a fresh token is generated per start and printed once with the page's URL). Any web
    /// page opened in a local browser, and any local process, can then read and control every
    /// run.
    #[arg(long)]
    pub no_admin_auth: bool,
}

/// `assay up` with the configuration at `config` (`--config`): 0 stopped, 1 it could not start.
pub async fn run(config: Option<&Path>, args: UpArgs) -> Outcome {
    let mut config = load_config(config, &args.backend)?;
    config.admin.no_auth |= args.no_admin_auth;
    up(config).await?;
    Ok(Ending::Done)
}

async fn up(mut config: AssayConfig) -> Result<(), CliError> {
    config.ports.admin = Some(config.ports.admin.unwrap_or(assay_config::DEFAULT_ADMIN_PORT));
    let mesh = start(&config).await?;
    eprintln!("assay mesh is up: gateway on {} (ctrl-c or SIGTERM to stop)", mesh.addrs.gateway);
    for line in describe_backends(&config) {
        eprintln!("{line}");
    }
    if let Some(url) = mesh.admin_url() {
        // The one line that shows a generated token (on stderr, never through the log pipeline).
        eprintln!("admin page: {url}");
        if *mesh.admin_auth() == assay_mesh::admin::AdminAuth::Open {
            eprintln!("warning: the admin page has no token (--no-admin-auth): any local web page can control runs");
        }
    }
    assay_rpc::shutdown_signal().await;
    eprintln!("stopping: draining in-flight calls");
    mesh.shutdown().await.map_err(|e| CliError::Failed(e.to_string()))
}

/// One line per backend the phases use: what it is and which model answers.
fn describe_backends(config: &AssayConfig) -> Vec<String> {
    let mut used: Vec<&str> = vec![config.models.default.backend.as_str()];
    for s in config.models.phases.values() {
        if !used.contains(&s.backend.as_str()) {
            used.push(s.backend.as_str());
        }
    }
    used.into_iter()
        .filter_map(|name| config.backends.get(name).map(|b| (name, b)))
        .map(|(name, b)| {
            if b.kind == "local" {
                let dir = if b.models_dir.is_empty() {
                    assay_embedded::default_models_dir()
                } else {
                    std::path::PathBuf::from(&b.models_dir)
                };
                let choice = assay_embedded::LocalModelChoice::parse(&b.model).unwrap_or_default();
                let paths = assay_embedded::ModelPaths::in_dir(&dir);
                let file = match choice {
                    assay_embedded::LocalModelChoice::Smollm2 => paths.smollm2_gguf,
                    assay_embedded::LocalModelChoice::Gemma3 => paths.gemma3_gguf,
                };
                format!(
                    "backend {name}: embedded (llama.cpp in process), chat model {} ({}), embeddings {}",
                    choice.model_name(),
                    file.display(),
                    paths.minilm_dir.display()
                )
            } else {
                let c = assay_runtime::openai_client(b).map(|c| c.config().clone());
                match c {
                    Ok(c) => format!(
                        "backend {name}: OpenAI-compatible at {}, model {}, up to {} requests at once (adaptive from {})",
                        c.base_url, c.default_model, c.max_concurrency, c.initial_concurrency
                    ),
                    Err(e) => format!("backend {name}: {e}"),
                }
            }
        })
        .collect()
}
