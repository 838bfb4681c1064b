//! A run's summary as it stands (state, usage, progress counters) and the models it used: shared
//! by the other parts of a run's context, each reading or updating what is theirs.

use std::sync::{Arc, Mutex};

use assay_domain::ModelRecord;
use assay_proto::gateway::v1 as gw;

/// The run's summary and models used. Cheap to clone (shared).
#[derive(Clone)]
pub(crate) struct Summary {
    pub(crate) run: Arc<Mutex<gw::Run>>,
    models: Arc<Mutex<Vec<ModelRecord>>>,
}

impl Summary {
    pub(crate) fn new(run: gw::Run) -> Self {
        Self { run: Arc::new(Mutex::new(run)), models: Arc::default() }
    }

    pub(crate) fn snapshot(&self) -> gw::Run {
        self.run.lock().map(|r| r.clone()).unwrap_or_default()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut gw::Run)) {
        if let Ok(mut r) = self.run.lock() {
            f(&mut r);
        }
    }

    pub(crate) fn state(&self) -> gw::RunState {
        gw::RunState::try_from(self.snapshot().state).unwrap_or(gw::RunState::Unspecified)
    }

    pub(crate) fn add_model(&self, model: &ModelRecord) {
        if let Ok(mut m) = self.models.lock()
            && !m.contains(model)
        {
            m.push(model.clone());
        }
    }

    pub(crate) fn models(&self) -> Vec<ModelRecord> {
        self.models.lock().map(|m| m.clone()).unwrap_or_default()
    }
}
