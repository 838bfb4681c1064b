//! Token accounting, carried by every stage outcome (the model crate re-exports it).

use serde::{Deserialize, Serialize};

/// Token accounting for one or many calls.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Calls that reached a backend (cache hits excluded).
    pub calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cache_hits: u32,
    pub retries: u32,
    /// True when a backend rejected the JSON schema and the request was retried without it.
    pub schema_fallbacks: u32,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.calls += other.calls;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cache_hits += other.cache_hits;
        self.retries += other.retries;
        self.schema_fallbacks += other.schema_fallbacks;
    }
}
