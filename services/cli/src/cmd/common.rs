//! What several verbs share: their common options (the model backend, the budget), the
//! configuration they load, the preset names, the progress display.

use std::path::Path;

use assay_config::AssayConfig;

use super::error::CliError;

/// The model backend of a verb that runs models (`--backend`, `--model`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BackendArgs {
    /// Model backend for every phase the configuration does not send elsewhere: `local` (embedded,
    /// offline) or `openai` (any OpenAI-compatible server from OPENAI_BASE_URL / OPENAI_API_KEY). A
    /// phase whose backend the configuration names (`models.phases.<phase>.backend`) keeps it.
    #[arg(long)]
    pub backend: Option<String>,
    /// Model name on that backend.
    #[arg(long)]
    pub model: Option<String>,
}

/// The configuration (`--config`, layered over the defaults) with the backend flags applied; no
/// flags: `BackendArgs::default()`.
pub fn load_config(path: Option<&Path>, backend: &BackendArgs) -> Result<AssayConfig, CliError> {
    let mut config = assay_config::load(path)?;
    if let Some(b) = &backend.backend {
        if !config.backends.contains_key(b) {
            return Err(CliError::Failed(format!(
                "--backend {b:?} is not configured (known: {})",
                config.backends.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        // The flag fills what the configuration left unset: the default backend, which every
        // phase without a backend of its own inherits. A phase the configuration sent to a backend
        // by name (`models.phases.embedding.backend = "local"` beside a chat-only server) keeps it.
        config.models.default.backend = b.clone();
    }
    if let Some(m) = &backend.model {
        let name = config.models.default.backend.clone();
        if let Some(entry) = config.backends.get_mut(&name) {
            entry.model = m.clone();
        }
        config.models.default.model = Some(m.clone());
    }
    Ok(config)
}

/// A preset by its lower-case name (`tick`, `rlcf_direct`, `feedback`, ...).
pub fn preset(name: &str) -> Result<assay_proto::generator::v1::Preset, String> {
    assay_proto::generator::v1::Preset::from_str_name(&format!("PRESET_{}", name.to_ascii_uppercase()))
        .filter(|p| *p != assay_proto::generator::v1::Preset::Unspecified)
        .ok_or_else(|| {
            format!(
                "unknown preset {name:?} (tick, rocketeval, rlcf_direct, rlcf_candidate, rlcf_candidates_only, \
                 openrubrics_pairwise, openrubrics_listwise, feedback, checkeval, interacteval)"
            )
        })
}

/// A progress display on standard error: a bar on a terminal, else one line per tenth of the work.
pub struct Progress {
    bar: indicatif::ProgressBar,
    total: u64,
    done: u64,
    terminal: bool,
    failed: u64,
    /// Where the run stands beyond its counts (a comparison's interval), after them.
    detail: String,
}

impl Progress {
    pub fn new(total: u64, what: &str) -> Self {
        use std::io::IsTerminal;
        let terminal = std::io::stderr().is_terminal();
        let bar = if terminal {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
                "{{elapsed_precise}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{per_sec}}, eta {{eta}}) {{msg}}"
            )) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        Self { bar, total, done: 0, terminal, failed: 0, detail: String::new() }
    }

    /// What follows the counts: the failures, then the detail.
    fn message(&self) -> String {
        let failed = (self.failed > 0).then(|| format!("{} failed", self.failed));
        let detail = (!self.detail.is_empty()).then_some(self.detail.as_str());
        failed.as_deref().into_iter().chain(detail).collect::<Vec<_>>().join("; ")
    }

    /// Show `detail` after the counts from now on (a run that stops when decided: its interval); off
    /// a terminal, a progress line at once (the detail changes at most once a second).
    pub fn set_detail(&mut self, detail: String) {
        self.detail = detail;
        if self.terminal {
            self.bar.set_message(self.message());
        } else {
            eprintln!("progress: {}/{} ({} failed; {})", self.done, self.total, self.failed, self.detail);
        }
    }

    /// One more unit done; `failed` units are counted in the message.
    pub fn inc(&mut self, failed: u64) {
        self.done += 1;
        self.failed = failed;
        if self.terminal {
            self.bar.inc(1);
            self.bar.set_message(self.message());
        } else {
            let step = (self.total / 10).max(1);
            if self.done.is_multiple_of(step) || self.done == self.total {
                let detail = if self.detail.is_empty() { String::new() } else { format!("; {}", self.detail) };
                eprintln!("progress: {}/{} ({failed} failed{detail})", self.done, self.total);
            }
        }
    }

    /// A status line above the bar.
    pub fn note(&self, line: &str) {
        if self.terminal { self.bar.println(line) } else { eprintln!("{line}") }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// A run's spending limit, on every verb that runs a pipeline.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct BudgetArgs {
    /// Stop starting model calls once the run used this many tokens (prompt + completion); the
    /// run then ends partial with what it has.
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Stop starting model calls once the run cost this many US dollars (from the backends'
    /// price tables; a model without a price stops such a run).
    #[arg(long)]
    pub max_cost: Option<f64>,
}

impl BudgetArgs {
    /// The request's budget; None when neither limit is given.
    pub fn budget(&self) -> Option<assay_proto::gateway::v1::RunBudget> {
        (self.max_tokens.is_some() || self.max_cost.is_some())
            .then_some(assay_proto::gateway::v1::RunBudget { max_tokens: self.max_tokens, max_cost_usd: self.max_cost })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_progress_message_holds_the_failures_then_the_detail() {
        let mut p = super::Progress::new(10, "records");
        assert_eq!(p.message(), "");
        p.inc(0);
        p.set_detail("b vs a: +0.100 [+0.020, +0.180] better (40 pairs)".into());
        assert_eq!(p.message(), "b vs a: +0.100 [+0.020, +0.180] better (40 pairs)");
        p.inc(2);
        assert_eq!(p.message(), "2 failed; b vs a: +0.100 [+0.020, +0.180] better (40 pairs)");
    }

    use super::*;

    /// `--backend` fills what the configuration left unset and never overrides a phase it sent to a
    /// backend by name (issue 60: `--backend openai` sent the embeddings the README's configuration
    /// keeps local to a chat-only server, and the run failed).
    #[test]
    fn the_backend_flag_keeps_the_phases_the_configuration_set() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cfg.toml");
        std::fs::write(
            &file,
            "[models.phases.embedding]\nbackend = \"local\"\n[models.phases.scorer]\nmodel = \"judge\"\n",
        )
        .unwrap();
        let flags = BackendArgs { backend: Some("openai".into()), model: Some("chat".into()) };
        let c = load_config(Some(&file), &flags).unwrap();
        assert_eq!(c.models.default.backend, "openai");
        assert_eq!(c.models.resolve_embedding("scorer").backend, "local", "the configured phase is kept");
        let scorer = c.models.resolve("scorer");
        assert_eq!((scorer.backend.as_str(), scorer.model.as_deref()), ("openai", Some("judge")));
        assert_eq!(c.models.resolve("stage_6_patcher").model.as_deref(), Some("chat"));
        // Without a configuration every phase follows the flag.
        let c = load_config(None, &flags).unwrap();
        assert_eq!(c.models.resolve_embedding("scorer").backend, "openai");
        // An unknown backend is refused, naming the ones configured.
        let bad = BackendArgs { backend: Some("nope".into()), model: None };
        assert!(load_config(None, &bad).unwrap_err().to_string().contains("--backend \"nope\" is not configured"));
    }
}
