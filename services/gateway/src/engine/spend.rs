//! Spend per model backend and UTC day, and the daily spend caps (`backends.<name>.daily_spend_usd`).
//!
//! Every stage call's usage carries its priced cost by backend (`Usage.cost_by_backend`, priced
//! where the model is called). The gateway adds it to the run store's `spend` table, one row per
//! (UTC day, backend), atomically with every other gateway sharing the store, and learns the
//! day's total from the same statement. With a cap on a backend:
//! - a new run that uses the backend (the configured phases route to it, or the request names it
//!   in a model spec) is refused with RESOURCE_EXHAUSTED naming the backend and the cap once the
//!   day's total reached it;
//! - a running run that uses it gets the cap's remainder as a ceiling on its budget, lowered after
//!   every charge with the total the store returned (so spend by other gateways counts too): the
//!   remainder travels with each stage call like a budget, and once it is spent no new model call
//!   starts and the run ends as at the end of a budget.
//!
//! The count is of priced calls: a call whose model has no price costs an unknown amount and is
//! not counted (a cap therefore needs the backend's price table).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use assay_domain::{StageError, Usage};
use assay_proto::gateway::v1 as gw;
use assay_runtime::assay_config::AssayConfig;
use prost_reflect::{DynamicMessage, ReflectMessage, Value};

use super::store::RunStore;

const NANO: f64 = 1e9;

/// The UTC day of `time`, `YYYY-MM-DD`.
fn day_of(time: &prost_types::Timestamp) -> String {
    time.to_string().chars().take(10).collect()
}

/// Today, UTC.
fn today() -> String {
    day_of(&super::ctx::now())
}

/// Spend recording and the daily caps of one gateway. Cheap to share.
pub struct SpendCaps {
    store: RunStore,
    /// Cap per backend, nano-dollars.
    caps: BTreeMap<String, i64>,
    /// The backends the configured phases route to.
    configured: BTreeSet<String>,
    /// The latest total this gateway learned per capped backend: (day, nano-dollars).
    known: Mutex<BTreeMap<String, (String, i64)>>,
}

impl SpendCaps {
    /// The caps of `config` over `store`. A cap must be a finite positive number, on a backend
    /// with a price table (a call without a price costs an unknown amount, which no cap can count).
    pub fn from_config(config: &AssayConfig, store: RunStore) -> Result<Arc<SpendCaps>, String> {
        let mut caps = BTreeMap::new();
        for (name, b) in &config.backends {
            if b.daily_spend_usd == 0.0 {
                continue;
            }
            if !b.daily_spend_usd.is_finite() || b.daily_spend_usd < 0.0 {
                return Err(format!(
                    "backends.{name}.daily_spend_usd must be a finite number of US dollars >= 0 (0 = no cap), got {}",
                    b.daily_spend_usd
                ));
            }
            if b.prices.is_empty() {
                return Err(format!(
                    "backends.{name}.daily_spend_usd needs a price table (backends.{name}.prices): the calls of a \
                     model without a price cost an unknown amount, which a cap cannot count"
                ));
            }
            caps.insert(name.clone(), (b.daily_spend_usd * NANO).round() as i64);
        }
        // The default's backend (an unknown phase resolves to it) and every phase's.
        let phases = std::iter::once("").chain(config.models.phases.keys().map(String::as_str));
        let configured: BTreeSet<String> = phases.map(|p| config.models.resolve(p).backend).collect();
        Ok(Arc::new(SpendCaps { store, caps, configured, known: Mutex::default() }))
    }

    /// Whether any backend has a cap.
    pub fn any(&self) -> bool {
        !self.caps.is_empty()
    }

    /// The capped backends a run of `request` may call: those the configured phases route to,
    /// and any its model specs name.
    pub fn capped_backends_of(&self, request: &gw::RunPipelineRequest) -> BTreeSet<String> {
        if self.caps.is_empty() {
            return BTreeSet::new();
        }
        let mut used = self.configured.clone();
        named_backends(request, &mut used);
        used.retain(|b| self.caps.contains_key(b));
        used
    }

    /// Refuse a new run that needs a backend whose cap is reached today (read from the store, so
    /// what other gateways spent counts), RESOURCE_EXHAUSTED naming the backend and the cap.
    pub async fn admit(&self, backends: &BTreeSet<String>) -> Result<(), StageError> {
        let (day, spent) = self.refresh(backends).await?;
        for (b, total) in spent {
            if let Some(reason) = self.reached(&b, &day, total) {
                return Err(StageError::ResourceExhausted(format!(
                    "{reason}; new runs that use it are refused until then"
                )));
            }
        }
        Ok(())
    }

    /// Learn today's spend of `backends` from the store; returns the day and each one's total.
    pub async fn refresh(&self, backends: &BTreeSet<String>) -> Result<(String, Vec<(String, i64)>), StageError> {
        let day = today();
        if backends.is_empty() {
            return Ok((day, Vec::new()));
        }
        let spent: BTreeMap<String, i64> = self.store.spend(&day).await?.into_iter().collect();
        let totals: Vec<(String, i64)> =
            backends.iter().map(|b| (b.clone(), spent.get(b).copied().unwrap_or(0))).collect();
        for (b, total) in &totals {
            self.learn(b, &day, *total);
        }
        Ok((day, totals))
    }

    /// Why `backend` may spend no more today, when its cap is reached at `total`.
    fn reached(&self, backend: &str, day: &str, total: i64) -> Option<String> {
        let cap = *self.caps.get(backend)?;
        (total >= cap).then(|| {
            format!(
                "backend {backend} reached its daily spend cap (backends.{backend}.daily_spend_usd = ${:.2}): \
                 ${:.4} spent on {day} (UTC), the cap resets at 00:00 UTC",
                cap as f64 / NANO,
                total as f64 / NANO
            )
        })
    }

    fn learn(&self, backend: &str, day: &str, total: i64) {
        if let Ok(mut k) = self.known.lock() {
            let entry = k.entry(backend.to_string()).or_insert_with(|| (day.to_string(), total));
            if entry.0 != day || entry.1 < total {
                *entry = (day.to_string(), total);
            }
        }
    }

    /// What a run using `backends` may still spend today (the least remainder over them) and the
    /// reason that ends it, as last learned; None when none of them is capped.
    pub fn ceiling(&self, backends: &BTreeSet<String>) -> Option<(f64, String)> {
        let day = today();
        let known = self.known.lock().ok()?;
        backends
            .iter()
            .filter_map(|b| {
                let cap = *self.caps.get(b)?;
                let total = known.get(b).filter(|(d, _)| *d == day).map_or(0, |(_, t)| *t);
                let reason = self.reached(b, &day, total.max(cap)).unwrap_or_default();
                Some(((cap - total).max(0) as f64 / NANO, reason))
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// Add a stage call's priced cost to today's spend of each capped backend in the store.
    pub async fn record(&self, usage: &Usage) {
        let day = today();
        for (backend, usd) in &usage.cost_by_backend {
            let nano = (usd * NANO).round() as i64;
            if nano <= 0 || !self.caps.contains_key(backend) {
                continue;
            }
            match self.store.add_spend(&day, backend, nano).await {
                Ok(total) => self.learn(backend, &day, total),
                Err(e) => tracing::warn!(backend = %backend, error = %e, "could not record the backend's spend"),
            }
        }
    }
}

/// Add to `out` every backend named by a model spec anywhere in `request`.
fn named_backends(request: &gw::RunPipelineRequest, out: &mut BTreeSet<String>) {
    let Ok(pool) = crate::admin::descriptor_pool() else { return };
    let Some(desc) = pool.get_message_by_name("assay.gateway.v1.RunPipelineRequest") else { return };
    let Ok(msg) = DynamicMessage::decode(desc, prost::Message::encode_to_vec(request).as_slice()) else { return };
    walk(&msg, out);
}

fn walk(msg: &DynamicMessage, out: &mut BTreeSet<String>) {
    if msg.descriptor().full_name() == "assay.common.v1.ModelSpec" {
        if let Some(Value::String(b)) = msg.get_field_by_name("backend").as_deref()
            && !b.is_empty()
        {
            out.insert(b.clone());
        }
        return;
    }
    for (_, value) in msg.fields() {
        visit(value, out);
    }
}

fn visit(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Message(m) => walk(m, out),
        Value::List(items) => items.iter().for_each(|v| visit(v, out)),
        Value::Map(entries) => entries.values().for_each(|v| visit(v, out)),
        Value::Bool(_)
        | Value::I32(_)
        | Value::I64(_)
        | Value::U32(_)
        | Value::U64(_)
        | Value::F32(_)
        | Value::F64(_)
        | Value::String(_)
        | Value::Bytes(_)
        | Value::EnumNumber(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use assay_proto::common::v1 as common;

    #[test]
    fn a_model_spec_anywhere_in_the_request_names_its_backend() {
        let request = gw::RunPipelineRequest {
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(gw::ChecklistEvalPipeline {
                scorer_model: Some(common::ModelSpec { backend: "paid".into(), ..Default::default() }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut out = BTreeSet::new();
        named_backends(&request, &mut out);
        assert_eq!(out, BTreeSet::from(["paid".to_string()]));
    }

    #[test]
    fn a_cap_needs_a_price_table_and_a_sane_number() {
        let store = RunStore::open(":memory:").unwrap();
        let mut config = assay_runtime::assay_config::load_from("").unwrap();
        let openai = config.backends.get_mut("openai").unwrap();
        openai.daily_spend_usd = 5.0;
        let e = SpendCaps::from_config(&config, store.clone()).err().unwrap();
        assert!(e.contains("backends.openai.daily_spend_usd needs a price table"), "{e}");
        let openai = config.backends.get_mut("openai").unwrap();
        openai
            .prices
            .insert("*".into(), assay_runtime::assay_config::Price { input: 1.0, output: 1.0, cached_input: None });
        openai.daily_spend_usd = f64::INFINITY;
        let e = SpendCaps::from_config(&config, store.clone()).err().unwrap();
        assert!(e.contains("finite number"), "{e}");
        config.backends.get_mut("openai").unwrap().daily_spend_usd = 5.0;
        let caps = SpendCaps::from_config(&config, store).unwrap();
        assert!(caps.any());
        // The default phases route to the embedded backend: only a request naming openai uses it.
        assert!(caps.capped_backends_of(&gw::RunPipelineRequest::default()).is_empty());
    }

    #[tokio::test]
    async fn spend_adds_up_per_day_and_backend_and_the_cap_refuses() {
        let store = RunStore::open(":memory:").unwrap();
        assert_eq!(store.add_spend("2020-01-01", "openai", 5).await.unwrap(), 5);
        assert_eq!(store.add_spend("2020-01-01", "openai", 7).await.unwrap(), 12);
        assert_eq!(store.add_spend("2020-01-02", "openai", 1).await.unwrap(), 1);
        assert_eq!(store.spend("2020-01-01").await.unwrap(), vec![("openai".to_string(), 12)]);
        let mut config = assay_runtime::assay_config::load_from("[models.default]\nbackend = \"openai\"\n").unwrap();
        let openai = config.backends.get_mut("openai").unwrap();
        openai
            .prices
            .insert("*".into(), assay_runtime::assay_config::Price { input: 1.0, output: 1.0, cached_input: None });
        openai.daily_spend_usd = 1.0;
        let caps = SpendCaps::from_config(&config, store).unwrap();
        let used = caps.capped_backends_of(&gw::RunPipelineRequest::default());
        assert_eq!(used, BTreeSet::from(["openai".to_string()]));
        caps.admit(&used).await.unwrap();
        let usage = Usage { cost_by_backend: BTreeMap::from([("openai".to_string(), 0.75)]), ..Usage::default() };
        caps.record(&usage).await;
        let (left, _) = caps.ceiling(&used).unwrap();
        assert!((left - 0.25).abs() < 1e-9, "{left}");
        caps.record(&usage).await;
        assert_eq!(caps.ceiling(&used).unwrap().0, 0.0);
        let e = caps.admit(&used).await.unwrap_err().to_string();
        assert!(e.contains("backend openai reached its daily spend cap") && e.contains("$1.50"), "{e}");
    }

    #[test]
    fn day_is_the_utc_date() {
        assert_eq!(day_of(&prost_types::Timestamp { seconds: 86_400 * 365 + 3_600, nanos: 0 }), "1971-01-01");
    }
}
