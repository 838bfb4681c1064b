//! Remote clients to the stages a service calls, over gRPC. The stage table connects them
//! ([`crate::table`]): at their configured addresses (`assay serve <stage>`) or at their loopback
//! listeners (the in-process mesh).

use std::sync::Arc;

use crate::MeshError;
use assay_rpc::remote::{RemoteArbiter, RemoteDebate, RemoteDeltaJudge, RemoteGenerator, RemoteRefiners, RemoteScorer};

/// One remote client per stage connected (lazily: nothing is dialled until the first call).
#[derive(Clone, Default)]
pub struct Remotes {
    pub(crate) generator: Option<Arc<RemoteGenerator>>,
    pub(crate) refiners: Option<Arc<RemoteRefiners>>,
    pub(crate) scorer: Option<Arc<RemoteScorer>>,
    pub(crate) arbiter: Option<Arc<RemoteArbiter>>,
    pub(crate) delta_judge: Option<Arc<RemoteDeltaJudge>>,
    pub(crate) debate: Option<Arc<RemoteDebate>>,
}

impl Remotes {
    pub fn generator(&self) -> Result<Arc<RemoteGenerator>, MeshError> {
        self.generator.clone().ok_or(MeshError::NotConnected("assay-generator"))
    }

    pub fn refiners(&self) -> Result<Arc<RemoteRefiners>, MeshError> {
        self.refiners.clone().ok_or(MeshError::NotConnected("assay-refiners"))
    }

    pub fn scorer(&self) -> Result<Arc<RemoteScorer>, MeshError> {
        self.scorer.clone().ok_or(MeshError::NotConnected("assay-scorer"))
    }

    pub fn arbiter(&self) -> Result<Arc<RemoteArbiter>, MeshError> {
        self.arbiter.clone().ok_or(MeshError::NotConnected("assay-arbiter"))
    }

    pub fn delta_judge(&self) -> Result<Arc<RemoteDeltaJudge>, MeshError> {
        self.delta_judge.clone().ok_or(MeshError::NotConnected("assay-delta-judge"))
    }

    pub fn debate(&self) -> Result<Arc<RemoteDebate>, MeshError> {
        self.debate.clone().ok_or(MeshError::NotConnected("assay-debate"))
    }
}
