//! A run's checkpoints: what a pipeline stores to go on from after a restart, read back by key
//! prefix. Written through the run's event log, in order with its events.

use assay_domain::StageError;

use super::log::{EventLog, Written};

/// A run's checkpoints. Cheap to clone (shared).
#[derive(Clone)]
pub struct Checkpoints {
    log: EventLog,
}

impl Checkpoints {
    pub(crate) fn new(log: EventLog) -> Self {
        Self { log }
    }

    /// Store a checkpoint under `key` (a resumed run reads it back with [`Checkpoints::all`]).
    pub async fn put(&self, key: &str, value: &impl prost::Message) -> Result<(), StageError> {
        self.log.put(key, value.encode_to_vec()).await
    }

    /// Queue a checkpoint without waiting for it to be stored (in order with the run's events and
    /// other checkpoints); see [`EventLog::emit_queued`].
    pub fn queued(&self, key: &str, value: &impl prost::Message) -> Written {
        self.log.put_queued(key, value.encode_to_vec())
    }

    /// The checkpoints whose key starts with `prefix`, by key, decoded.
    pub async fn all<M: prost::Message + Default>(&self, prefix: &str) -> Result<Vec<(String, M)>, StageError> {
        decode_all(self.log.raw(prefix).await?)
    }

    /// Up to `limit` checkpoints under `prefix` whose key sorts after `after` (empty: from the
    /// first), by key, decoded: a run's checkpoints read a page at a time.
    pub async fn page<M: prost::Message + Default>(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, M)>, StageError> {
        decode_all(self.log.raw_page(prefix, after, limit).await?)
    }

    /// The checkpoints stored under any of `keys` (those that exist), decoded.
    pub async fn get_many<M: prost::Message + Default>(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<(String, M)>, StageError> {
        decode_all(self.log.raw_keys(keys).await?)
    }

    /// Store a serde value as a checkpoint under `key` (JSON).
    pub async fn put_json(&self, key: &str, value: &impl serde::Serialize) -> Result<(), StageError> {
        let bytes = serde_json::to_vec(value).map_err(|e| StageError::Internal(format!("checkpoint {key}: {e}")))?;
        self.log.put(key, bytes).await
    }

    /// The serde checkpoints whose key starts with `prefix`, by key (one read).
    pub async fn all_json<T: serde::de::DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(String, T)>, StageError> {
        self.log
            .raw(prefix)
            .await?
            .into_iter()
            .map(|(k, bytes)| match serde_json::from_slice(&bytes) {
                Ok(v) => Ok((k, v)),
                Err(e) => Err(StageError::Internal(format!("run store: corrupt checkpoint {k}: {e}"))),
            })
            .collect()
    }

    /// Up to `limit` serde checkpoints under `prefix` whose key sorts after `after` (empty: from
    /// the first), by key.
    pub async fn page_json<T: serde::de::DeserializeOwned>(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, T)>, StageError> {
        self.log
            .raw_page(prefix, after, limit)
            .await?
            .into_iter()
            .map(|(k, bytes)| match serde_json::from_slice(&bytes) {
                Ok(v) => Ok((k, v)),
                Err(e) => Err(StageError::Internal(format!("run store: corrupt checkpoint {k}: {e}"))),
            })
            .collect()
    }

    /// The serde checkpoint stored under `key`, if any.
    pub async fn load_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StageError> {
        let raw = self.log.raw(key).await?;
        let Some((_, bytes)) = raw.into_iter().find(|(k, _)| k == key) else { return Ok(None) };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StageError::Internal(format!("run store: corrupt checkpoint {key}: {e}")))
    }
}

fn decode_all<M: prost::Message + Default>(raw: Vec<(String, Vec<u8>)>) -> Result<Vec<(String, M)>, StageError> {
    raw.into_iter()
        .map(|(k, v)| {
            M::decode(v.as_slice())
                .map(|m| (k, m))
                .map_err(|e| StageError::Internal(format!("run store: corrupt checkpoint: {e}")))
        })
        .collect()
}
