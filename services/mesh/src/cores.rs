//! How each stage's core is built: the settings it takes from configuration, then the core from
//! those settings, the model hub and remote clients to the stages it calls. A stage on its own
//! (`assay serve <stage>`) and the in-process mesh both build through here (via
//! [`crate::StageDef::build`]).

use std::sync::Arc;

use assay_config::AssayConfig;
use assay_llm::ModelHub;
use tonic::service::Routes;

use crate::MeshError;
use crate::remotes::Remotes;

/// What a core takes from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CoreSettings {
    /// Model calls in flight per request when the request sets no cap of its own (the gateway:
    /// stage calls in flight per run); `None` = the core's built-in default.
    pub concurrency: Option<usize>,
    /// Self-refine's embedding step (`[convergence] embedding_step`); `None` = the built-in
    /// default.
    pub embedding_step: Option<bool>,
}

/// A stage's core, ready to serve.
#[derive(Clone)]
pub enum Core {
    Generator(Arc<assay_generator::Generator>),
    Refiners(Arc<assay_refiners::ChecklistRefiners>),
    Scorer(Arc<assay_scorer::ScorerCore>),
    Arbiter(Arc<assay_arbiter::ArbiterCore>),
    DeltaJudge(Arc<assay_delta_judge::DeltaJudgeCore>),
    Debate(Arc<assay_debate::DebateCore>),
}

/// A core and the settings it was built with.
#[derive(Clone)]
pub struct Built {
    pub core: Core,
    pub settings: CoreSettings,
}

impl Core {
    /// Its gRPC service.
    pub fn routes(&self) -> Routes {
        match self {
            Core::Generator(c) => assay_generator::routes(c.clone()),
            Core::Refiners(c) => assay_refiners::routes(c.clone()),
            Core::Scorer(c) => assay_scorer::routes(c.clone()),
            Core::Arbiter(c) => assay_arbiter::routes(c.clone()),
            Core::DeltaJudge(c) => assay_delta_judge::routes(c.clone()),
            Core::Debate(c) => assay_debate::routes(c.clone()),
        }
    }
}

/// The gateway: records scored (and checklists generated) at once per run.
pub fn gateway_settings(config: &AssayConfig) -> CoreSettings {
    CoreSettings { concurrency: Some(config.gateway.concurrency as usize), ..CoreSettings::default() }
}

/// The generator: its built-in bound on candidate calls.
pub fn generator_settings(_config: &AssayConfig) -> CoreSettings {
    CoreSettings::default()
}

/// The refiners: `scorer.concurrency`, like the scorer. The UnitTester makes one scorer call per
/// rewrite and the Tagger one model call per item: the same kind of fan-out the key bounds in the
/// scorer (there is no key of their own).
pub fn refiners_settings(config: &AssayConfig) -> CoreSettings {
    CoreSettings {
        concurrency: Some(config.scorer.concurrency as usize),
        embedding_step: Some(config.convergence.embedding_step),
    }
}

/// The scorer: `scorer.concurrency`.
pub fn scorer_settings(config: &AssayConfig) -> CoreSettings {
    CoreSettings { concurrency: Some(config.scorer.concurrency as usize), ..CoreSettings::default() }
}

/// Stages that take nothing from configuration (beyond the model hub).
pub fn no_settings(_config: &AssayConfig) -> CoreSettings {
    CoreSettings::default()
}

pub fn build_generator(settings: CoreSettings, hub: Arc<ModelHub>, remotes: &Remotes) -> Result<Built, MeshError> {
    let mut core = assay_generator::Generator::new(hub).with_refiners(remotes.refiners()?);
    if let Some(c) = settings.concurrency {
        core = core.with_concurrency(c);
    }
    Ok(Built { core: Core::Generator(Arc::new(core)), settings })
}

pub fn build_refiners(settings: CoreSettings, hub: Arc<ModelHub>, remotes: &Remotes) -> Result<Built, MeshError> {
    let mut core = assay_refiners::ChecklistRefiners::new(hub).with_scorer(remotes.scorer()?);
    if let Some(c) = settings.concurrency {
        core = core.with_concurrency(c);
    }
    if let Some(on) = settings.embedding_step {
        core = core.with_cascade(assay_llm::convergence::Cascade::new().with_embedding_step(on));
    }
    Ok(Built { core: Core::Refiners(Arc::new(core)), settings })
}

pub fn build_scorer(settings: CoreSettings, hub: Arc<ModelHub>, _remotes: &Remotes) -> Result<Built, MeshError> {
    let concurrency = settings.concurrency.unwrap_or(1);
    Ok(Built { core: Core::Scorer(Arc::new(assay_scorer::ScorerCore::new(hub, concurrency))), settings })
}

pub fn build_arbiter(settings: CoreSettings, hub: Arc<ModelHub>, _remotes: &Remotes) -> Result<Built, MeshError> {
    Ok(Built { core: Core::Arbiter(Arc::new(assay_arbiter::ArbiterCore::new(hub))), settings })
}

pub fn build_delta_judge(settings: CoreSettings, hub: Arc<ModelHub>, _remotes: &Remotes) -> Result<Built, MeshError> {
    Ok(Built { core: Core::DeltaJudge(Arc::new(assay_delta_judge::DeltaJudgeCore::new(hub))), settings })
}

pub fn build_debate(settings: CoreSettings, hub: Arc<ModelHub>, _remotes: &Remotes) -> Result<Built, MeshError> {
    Ok(Built { core: Core::Debate(Arc::new(assay_debate::DebateCore::new(hub))), settings })
}
