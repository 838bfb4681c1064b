//! A run's results, one per position (a record's, or a response's of a record): stored in order
//! with the run's events, read back by position a page at a time. Where they are kept is the run
//! engine's business: pipelines store and page them by position, `ListRunResults` pages them
//! through [`crate::Engine::results_page`], and a spread run's claims store them with
//! [`crate::store::ChunkCommit::result`].

use assay_domain::StageError;

use super::inputs::Inputs;
use super::log::{EventLog, Written};
use crate::store::result_keys::{PREFIX, after, index_of, key};

fn decode<M: prost::Message + Default>(raw: Vec<(String, Vec<u8>)>) -> Result<Vec<(u64, M)>, StageError> {
    raw.into_iter()
        .map(|(k, bytes)| {
            let m = M::decode(bytes.as_slice())
                .map_err(|e| StageError::Internal(format!("run store: corrupt result {k}: {e}")))?;
            Ok((index_of(&k)?, m))
        })
        .collect()
}

/// A run's results. Cheap to clone (shared).
#[derive(Clone)]
pub struct Results {
    log: EventLog,
    inputs: Inputs,
}

impl Results {
    pub(crate) fn new(log: EventLog, inputs: Inputs) -> Self {
        Self { log, inputs }
    }

    /// Store the result at `index` (a result already stored there is replaced).
    pub async fn put(&self, index: u64, result: &impl prost::Message) -> Result<(), StageError> {
        self.queued(index, result).await
    }

    /// Queue the result at `index` without waiting for it to be stored (in order with the run's
    /// events); see [`EventLog::emit_queued`].
    pub fn queued(&self, index: u64, result: &impl prost::Message) -> Written {
        self.log.put_queued(&key(index), result.encode_to_vec())
    }

    /// Up to `limit` results from position `first` on, by position (gaps skipped), decoded: as this
    /// context stored them (in memory for a run kept there).
    pub async fn page<M: prost::Message + Default>(
        &self,
        first: u64,
        limit: usize,
    ) -> Result<Vec<(u64, M)>, StageError> {
        decode(self.log.raw_page(PREFIX, &after(first), limit).await?)
    }

    /// Every result, by position (a run whose results are bounded: its request's records).
    pub async fn all<M: prost::Message + Default>(&self) -> Result<Vec<(u64, M)>, StageError> {
        decode(self.log.raw(PREFIX).await?)
    }

    /// The results stored for positions `[first, first + count)`, read from the store whatever this
    /// context keeps its own writes in (a helper keeps none).
    pub async fn stored_range<M: prost::Message + Default>(
        &self,
        first: u64,
        count: u32,
    ) -> Result<Vec<(u64, M)>, StageError> {
        let end = first + u64::from(count);
        let page = self.inputs.stored_page(PREFIX, &after(first), count as usize).await?;
        Ok(decode(page)?.into_iter().filter(|(i, _)| *i < end).collect())
    }
}

/// Up to `limit` of a stored run's results from position `first` on, by position, encoded.
pub(crate) async fn stored_page(
    store: &crate::store::RunStore,
    run_id: &str,
    first: u64,
    limit: usize,
) -> Result<Vec<(u64, Vec<u8>)>, StageError> {
    store
        .checkpoints_page(run_id, PREFIX, &after(first), limit)
        .await?
        .into_iter()
        .map(|(k, bytes)| Ok((index_of(&k)?, bytes)))
        .collect()
}
