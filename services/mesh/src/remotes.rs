//! Remote clients to the stages a service calls, over gRPC. The stage table connects them
//! ([`crate::table`]): at their configured addresses (`assay serve <stage>`) or at their loopback
//! listeners (the in-process mesh).

use std::sync::Arc;

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
    pub fn generator(&self) -> Result<Arc<RemoteGenerator>, String> {
        self.generator.clone().ok_or_else(|| missing("assay-generator"))
    }

    pub fn refiners(&self) -> Result<Arc<RemoteRefiners>, String> {
        self.refiners.clone().ok_or_else(|| missing("assay-refiners"))
    }

    pub fn scorer(&self) -> Result<Arc<RemoteScorer>, String> {
        self.scorer.clone().ok_or_else(|| missing("assay-scorer"))
    }

    pub fn arbiter(&self) -> Result<Arc<RemoteArbiter>, String> {
        self.arbiter.clone().ok_or_else(|| missing("assay-arbiter"))
    }

    pub fn delta_judge(&self) -> Result<Arc<RemoteDeltaJudge>, String> {
        self.delta_judge.clone().ok_or_else(|| missing("assay-delta-judge"))
    }

    pub fn debate(&self) -> Result<Arc<RemoteDebate>, String> {
        self.debate.clone().ok_or_else(|| missing("assay-debate"))
    }
}

/// A client the table's `calls` should have connected (a wiring bug, reported rather than
/// panicking).
fn missing(binary: &str) -> String {
    format!("no client to {binary} was connected (missing from the stage table's calls)")
}
