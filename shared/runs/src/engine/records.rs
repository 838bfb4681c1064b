//! Open runs' records: appended (checked by the run's pipeline, stored as rows, the executing
//! run woken).

use assay_domain::StageError;
use assay_domain::limits::MAX_RECORDS;
use assay_proto::gateway::v1 as gw;

use super::Engine;
use crate::clock::is_terminal;
use crate::store::Appended;

impl Engine {
    /// Append `records` to open run `run_id` (sealing it when `seal`): checked by the run's
    /// pipeline, stored as rows, and the run woken when this gateway executes it.
    pub async fn append(&self, run_id: &str, records: Vec<gw::EvalRecord>, seal: bool) -> Result<Appended, StageError> {
        if run_id.is_empty() {
            return Err(StageError::invalid("run_id", "must not be empty"));
        }
        if records.len() > MAX_RECORDS {
            return Err(StageError::invalid(
                "records",
                format!("has {} records; the limit is {MAX_RECORDS} per message", records.len()),
            ));
        }
        let live = self.live(run_id);
        let (rows, max) = match &live {
            Some(l) => (l.pipeline.check_records(records)?, l.pipeline.max_records()),
            None => {
                // Executed by another gateway (or about to be resumed): its stored request says
                // how the records are checked.
                let stored =
                    self.store.get(run_id).await?.ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
                if is_terminal(stored.run.state) {
                    return Err(crate::store::state_refused(run_id, stored.run.state));
                }
                if !stored.request.open {
                    return Err(StageError::FailedPrecondition(format!(
                        "run {run_id} was not created open (RunPipelineRequest.open): its records came with its request"
                    )));
                }
                let pipeline = self.factory.parse(&stored.request)?;
                (pipeline.check_records(records)?, pipeline.max_records())
            }
        };
        let appended = self.store.append_records(run_id, rows, seal, max).await?;
        if let Some(l) = live {
            l.ctx.inputs.nudge();
        }
        Ok(appended)
    }
}
