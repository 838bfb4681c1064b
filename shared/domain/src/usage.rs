//! Token accounting, carried by every stage outcome (the model crate re-exports it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Token accounting for one or many calls.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Calls that reached a backend (cache hits excluded).
    pub calls: u32,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cache_hits: u32,
    pub retries: u32,
    /// True when a backend rejected the JSON schema and the request was retried without it.
    pub schema_fallbacks: u32,
    /// Prompt tokens the provider served from its own prompt cache (part of `prompt_tokens`).
    #[serde(default)]
    pub cached_prompt_tokens: u64,
    /// Cost in USD of the priced calls.
    #[serde(default)]
    pub cost_usd: f64,
    /// Calls whose model has no price: while any, the total cost is unknown.
    #[serde(default)]
    pub unpriced_calls: u32,
    /// `cost_usd` by the backend (its name in config) that served the priced calls: what a
    /// backend's daily spend cap counts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cost_by_backend: BTreeMap<String, f64>,
    /// Attempts given up on after they were sent (timed out, cut off, or answered with a body
    /// that could not be read) that the backend may have served: part of `calls`, each counted at
    /// its reservation (the prompt estimated plus its completion limit), not measured.
    #[serde(default)]
    pub abandoned_calls: u32,
    /// The tokens of `abandoned_calls` (part of `prompt_tokens` and `completion_tokens`).
    #[serde(default)]
    pub abandoned_tokens: u64,
    /// The cost of `abandoned_calls` (part of `cost_usd`).
    #[serde(default)]
    pub abandoned_cost_usd: f64,
    /// Duplicate requests (hedges, or the request a hedge answered for) whose reply was not the
    /// one used: part of `calls`, each counted at the usage of the reply that was.
    #[serde(default)]
    pub hedged_calls: u32,
    /// Structured replies that did not match the JSON schema they were asked for (not JSON, or
    /// JSON the schema rejects), whatever form the schema was sent in. Under a form that claims
    /// enforcement they are evidence the backend ignores it (see the OpenAI client's ladder).
    #[serde(default)]
    pub schema_violations: u32,
}

impl Usage {
    pub fn add(&mut self, other: &Usage) {
        self.calls += other.calls;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cache_hits += other.cache_hits;
        self.retries += other.retries;
        self.schema_fallbacks += other.schema_fallbacks;
        self.cached_prompt_tokens += other.cached_prompt_tokens;
        self.cost_usd += other.cost_usd;
        self.unpriced_calls += other.unpriced_calls;
        for (backend, usd) in &other.cost_by_backend {
            *self.cost_by_backend.entry(backend.clone()).or_default() += usd;
        }
        self.abandoned_calls += other.abandoned_calls;
        self.abandoned_tokens += other.abandoned_tokens;
        self.abandoned_cost_usd += other.abandoned_cost_usd;
        self.hedged_calls += other.hedged_calls;
        self.schema_violations += other.schema_violations;
    }

    /// The cost in USD, or None when some call's model has no price.
    pub fn cost(&self) -> Option<f64> {
        (self.unpriced_calls == 0).then_some(self.cost_usd)
    }

    /// Prompt plus completion tokens.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}
