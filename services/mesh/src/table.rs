//! The table of stages: one row per service, read by `assay serve <stage>` and by the
//! in-process mesh alike.

use std::sync::Arc;

use assay_config::{AssayConfig, Ports, Upstreams};
use assay_proto::service_names as names;
use assay_rpc::remote::{RemoteArbiter, RemoteDebate, RemoteDeltaJudge, RemoteGenerator, RemoteRefiners, RemoteScorer};
use tonic::transport::Channel;

use crate::MeshError;
use crate::cores::{self, Built, CoreSettings};
use crate::remotes::Remotes;

/// A service of the mesh.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    Gateway,
    Generator,
    Refiners,
    Scorer,
    Arbiter,
    DeltaJudge,
    Debate,
}

/// Builds a stage's core from its settings, the model hub and remote clients to the stages it
/// calls.
pub type BuildCore = fn(CoreSettings, Arc<assay_llm::ModelHub>, &Remotes) -> Result<Built, MeshError>;

/// Puts the remote client that reaches a stage over `channel` into a [`Remotes`].
pub type Connect = fn(&mut Remotes, Channel, Option<&str>);

/// One row of the table.
pub struct StageDef {
    pub stage: Stage,
    /// Its service name, `assay-<name>` ([`Stage::name`]): in logs, traces and metrics
    /// (`service.name`) and as its Kubernetes objects' name. `assay serve <name>` runs it.
    pub binary: &'static str,
    /// The gRPC service it serves (health, reflection).
    pub service_name: &'static str,
    /// Its key in `[ports]` and `[upstreams]`, as error messages name it.
    pub key: &'static str,
    /// Its port.
    pub port: fn(&Ports) -> u16,
    /// Where the stages calling it reach it when it runs on its own (empty: loopback at its
    /// port); `None` for the gateway, which no stage calls.
    pub upstream: Option<fn(&Upstreams) -> &str>,
    /// The remote client that reaches it; `None` for the gateway.
    pub connect: Option<Connect>,
    /// The stages it calls.
    pub calls: &'static [Stage],
    /// Whether it calls model backends (`assay serve` then builds them from config).
    pub uses_models: bool,
    /// What its core takes from configuration.
    pub settings: fn(&AssayConfig) -> CoreSettings,
    /// How its core is built; `None` for the gateway (its run engine opens a store:
    /// [`crate::gateway::engine`]).
    pub build: Option<BuildCore>,
}

/// Every service, the gateway first.
pub static STAGES: [StageDef; 7] = [
    StageDef {
        stage: Stage::Gateway,
        binary: "assay-gateway",
        service_name: names::GATEWAY,
        key: "gateway",
        port: |p| p.gateway,
        upstream: None,
        connect: None,
        calls: &[Stage::Generator, Stage::Refiners, Stage::Scorer, Stage::Arbiter, Stage::DeltaJudge, Stage::Debate],
        uses_models: false,
        settings: cores::gateway_settings,
        build: None,
    },
    StageDef {
        stage: Stage::Generator,
        binary: "assay-generator",
        service_name: names::GENERATOR,
        key: "generator",
        port: |p| p.generator,
        upstream: Some(|u| &u.generator),
        connect: Some(|r, ch, token| r.generator = Some(Arc::new(RemoteGenerator::new(ch, token)))),
        calls: &[Stage::Refiners],
        uses_models: true,
        settings: cores::generator_settings,
        build: Some(cores::build_generator),
    },
    StageDef {
        stage: Stage::Refiners,
        binary: "assay-refiners",
        service_name: names::REFINERS,
        key: "refiners",
        port: |p| p.refiners,
        upstream: Some(|u| &u.refiners),
        connect: Some(|r, ch, token| r.refiners = Some(Arc::new(RemoteRefiners::new(ch, token)))),
        calls: &[Stage::Scorer],
        uses_models: true,
        settings: cores::refiners_settings,
        build: Some(cores::build_refiners),
    },
    StageDef {
        stage: Stage::Scorer,
        binary: "assay-scorer",
        service_name: names::SCORER,
        key: "scorer",
        port: |p| p.scorer,
        upstream: Some(|u| &u.scorer),
        connect: Some(|r, ch, token| r.scorer = Some(Arc::new(RemoteScorer::new(ch, token)))),
        calls: &[],
        uses_models: true,
        settings: cores::scorer_settings,
        build: Some(cores::build_scorer),
    },
    StageDef {
        stage: Stage::Arbiter,
        binary: "assay-arbiter",
        service_name: names::ARBITER,
        key: "arbiter",
        port: |p| p.arbiter,
        upstream: Some(|u| &u.arbiter),
        connect: Some(|r, ch, token| r.arbiter = Some(Arc::new(RemoteArbiter::new(ch, token)))),
        calls: &[],
        uses_models: true,
        settings: cores::no_settings,
        build: Some(cores::build_arbiter),
    },
    StageDef {
        stage: Stage::DeltaJudge,
        binary: "assay-delta-judge",
        service_name: names::DELTA_JUDGE,
        key: "delta_judge",
        port: |p| p.delta_judge,
        upstream: Some(|u| &u.delta_judge),
        connect: Some(|r, ch, token| r.delta_judge = Some(Arc::new(RemoteDeltaJudge::new(ch, token)))),
        calls: &[],
        uses_models: true,
        settings: cores::no_settings,
        build: Some(cores::build_delta_judge),
    },
    StageDef {
        stage: Stage::Debate,
        binary: "assay-debate",
        service_name: names::DEBATE,
        key: "debate",
        port: |p| p.debate,
        upstream: Some(|u| &u.debate),
        connect: Some(|r, ch, token| r.debate = Some(Arc::new(RemoteDebate::new(ch, token)))),
        calls: &[],
        uses_models: true,
        settings: cores::no_settings,
        build: Some(cores::build_debate),
    },
];

impl Stage {
    /// Its row of [`STAGES`].
    pub fn def(self) -> &'static StageDef {
        // Every stage has a row (the table test checks it).
        STAGES.iter().find(|d| d.stage == self).unwrap_or(&STAGES[0])
    }

    /// Its name on the command line: `assay serve <name>` runs it on its own (one Kubernetes
    /// Deployment each).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Gateway => "gateway",
            Stage::Generator => "generator",
            Stage::Refiners => "refiners",
            Stage::Scorer => "scorer",
            Stage::Arbiter => "arbiter",
            Stage::DeltaJudge => "delta-judge",
            Stage::Debate => "debate",
        }
    }

    /// The stage named `name` (as [`Stage::name`] spells it).
    pub fn from_name(name: &str) -> Option<Stage> {
        STAGES.iter().map(|d| d.stage).find(|s| s.name() == name)
    }
}

impl StageDef {
    /// Build this stage's core from `config`: its settings row, `hub` and `remotes` (which must
    /// reach the stages it [`calls`](Self::calls)).
    pub fn build(
        &self,
        config: &AssayConfig,
        hub: Arc<assay_llm::ModelHub>,
        remotes: &Remotes,
    ) -> Result<Built, MeshError> {
        let build = self.build.ok_or(MeshError::NoCore(self.binary))?;
        build((self.settings)(config), hub, remotes)
    }
}

/// Connecting the clients a stage's `calls` name, from the table's rows.
impl Remotes {
    /// Clients to `stages` at the address `url` gives each, over TLS when `[tls]` is set and
    /// carrying the configured bearer token.
    pub fn connect(
        config: &AssayConfig,
        stages: &[Stage],
        url: impl Fn(&StageDef) -> String,
    ) -> Result<Remotes, MeshError> {
        let tls = assay_runtime::client_tls(config)?;
        let token = assay_runtime::auth_token(config);
        let mut remotes = Remotes::default();
        for stage in stages {
            let def = stage.def();
            let connect = def.connect.ok_or(MeshError::NotCalled(def.binary))?;
            let url = url(def);
            let channel = assay_rpc::remote::upstream_channel(&url, tls.as_ref(), def.service_name)
                .map_err(|source| MeshError::InvalidAddress { key: def.key, url: url.clone(), source })?;
            connect(&mut remotes, channel, token.as_deref());
        }
        Ok(remotes)
    }

    /// Clients to `stages` where a standalone service finds them: `upstreams.<stage>`, else
    /// loopback at `ports.<stage>`.
    pub fn configured(config: &AssayConfig, stages: &[Stage]) -> Result<Remotes, MeshError> {
        Self::connect(config, stages, |def| {
            let configured = def.upstream.map_or("", |u| u(&config.upstreams));
            assay_runtime::upstream_url(config, configured, (def.port)(&config.ports))
        })
    }

    /// Clients to `stages` at the listeners of the in-process mesh.
    pub fn loopback(
        config: &AssayConfig,
        addr: impl Fn(Stage) -> std::net::SocketAddr,
        stages: &[Stage],
    ) -> Result<Remotes, MeshError> {
        Self::connect(config, stages, |def| format!("http://{}", addr(def.stage)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_has_its_own_row_and_binary() {
        let all = [
            Stage::Gateway,
            Stage::Generator,
            Stage::Refiners,
            Stage::Scorer,
            Stage::Arbiter,
            Stage::DeltaJudge,
            Stage::Debate,
        ];
        for s in all {
            assert_eq!(s.def().stage, s, "{s:?} has a row");
            assert_eq!(STAGES.iter().filter(|d| d.stage == s).count(), 1, "{s:?} has one row");
        }
        let mut binaries: Vec<_> = STAGES.iter().map(|d| d.binary).collect();
        binaries.sort_unstable();
        binaries.dedup();
        assert_eq!(binaries.len(), STAGES.len());
        // Each name on the command line finds its stage, and names the service it runs.
        for d in &STAGES {
            assert_eq!(Stage::from_name(d.stage.name()), Some(d.stage));
            assert_eq!(d.binary, format!("assay-{}", d.stage.name()), "{:?}", d.stage);
        }
        assert_eq!(Stage::from_name("nonsense"), None);
        // Every stage a row calls can be reached.
        for d in &STAGES {
            for c in d.calls {
                assert!(c.def().connect.is_some(), "{:?} calls {c:?}, which has no remote client", d.stage);
            }
        }
    }
}
