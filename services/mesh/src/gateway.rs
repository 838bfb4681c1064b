//! The gateway's side of the wiring: its pipelines' stages as remote clients, its run engine,
//! and resuming the runs a previous gateway left unfinished.

use std::sync::Arc;

use assay_config::AssayConfig;
use assay_gateway::{Engine, Pipelines, RefinementStages, Stages};
use assay_runs::SpendCaps;

use crate::MeshError;
use crate::cores::gateway_settings;
use crate::remotes::Remotes;

/// The stages the gateway's pipelines call, every one a remote client from `remotes`.
pub fn stages(config: &AssayConfig, remotes: &Remotes) -> Result<Stages, MeshError> {
    let scorer = remotes.scorer()?;
    let refiners = remotes.refiners()?;
    let concurrency = gateway_settings(config).concurrency.unwrap_or(1);
    Ok(Stages::new(scorer.clone(), concurrency)
        .with_generator(remotes.generator()?)
        .with_refiners(refiners.clone())
        .with_refinement(RefinementStages {
            judge: scorer,
            arbiter: remotes.arbiter()?,
            editor: refiners.clone(),
            delta: remotes.delta_judge()?,
        })
        .with_self_refiner(refiners)
        .with_debate(remotes.debate()?))
}

/// The gateway's run engine over the configured run store (opened here: a shared store may need
/// a moment to connect and migrate) and the stages in `remotes`.
pub async fn engine(config: &AssayConfig, remotes: &Remotes) -> Result<Engine, MeshError> {
    let stages = stages(config, remotes)?;
    let store = assay_gateway::open_store(config).await.map_err(MeshError::Store)?;
    let caps = SpendCaps::from_config(config, store.clone()).map_err(MeshError::SpendCaps)?;
    Ok(Engine::new(store, Arc::new(Pipelines::new(stages)))
        .with_max_active_runs(config.gateway.max_active_runs as usize)
        .with_spend_caps(caps))
}

/// Take up the runs a previous gateway left unfinished (each registered before this returns, so a
/// client reattaching right away follows it live; their work goes on in the background).
pub async fn resume_unfinished(engine: &Engine) {
    match engine.resume_unfinished().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(runs = n, "resumed unfinished runs"),
        Err(e) => tracing::error!(error = %e, "could not resume unfinished runs"),
    }
}

/// Resume unfinished runs, then keep this gateway's leases, take over expired ones and keep the
/// store to its retention period, in the background.
pub fn resume_and_supervise(engine: Engine, config: &AssayConfig) {
    let lease = assay_gateway::lease(config);
    let retention = config.gateway.retention();
    tokio::spawn(async move {
        resume_unfinished(&engine).await;
        tokio::join!(engine.supervise(lease), engine.retain(retention));
    });
}
