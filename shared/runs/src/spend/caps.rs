//! The daily caps of one gateway: what each capped backend has spent today, and which runs may start.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use assay_config::{AssayConfig, ConfigError};
use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

use super::backends::named_backends;
use crate::store::RunStore;

pub(super) const NANO: f64 = 1e9;

/// The UTC day of `time`, `YYYY-MM-DD`.
pub(super) fn day_of(time: &prost_types::Timestamp) -> String {
    time.to_string().chars().take(10).collect()
}

/// Today, UTC.
pub(super) fn today() -> String {
    day_of(&crate::clock::now())
}

/// Spend recording and the daily caps of one gateway. Cheap to share.
pub struct SpendCaps {
    pub(super) store: RunStore,
    /// Cap per backend, nano-dollars.
    pub(super) caps: BTreeMap<String, i64>,
    /// The backends the configured phases route to.
    pub(super) configured: BTreeSet<String>,
    /// The latest total this gateway learned per capped backend: (day, nano-dollars).
    pub(super) known: Mutex<BTreeMap<String, (String, i64)>>,
    /// Woken when a hold of this gateway is settled or given back.
    pub(super) released: tokio::sync::Notify,
    /// Holds waiting for room take turns on it.
    pub(super) waiting: tokio::sync::Mutex<()>,
    /// Per capped backend: the least a call this gateway held needed and could not get, (day,
    /// nano-dollars): new runs are refused while less than that is left.
    pub(super) refused: Mutex<BTreeMap<String, (String, i64)>>,
}

/// Why `backend`, at `spent` of its `cap` on `day`, cannot pay for a call of `need`.
pub(super) fn at_cap(backend: &str, day: &str, cap: i64, spent: i64, need: i64) -> String {
    format!(
        "backend {backend} is at its daily spend cap (backends.{backend}.daily_spend_usd = ${:.2}): ${:.4} spent on \
         {day} (UTC) leaves less than a call may cost (${:.4}), the cap resets at 00:00 UTC",
        cap as f64 / NANO,
        spent as f64 / NANO,
        need as f64 / NANO
    )
}

/// A cap of `backend` that cannot be kept, as the configuration error naming its key.
fn cap_error(backend: &str, message: String) -> ConfigError {
    ConfigError::Backend { backend: backend.to_string(), key: "daily_spend_usd", message }
}

impl SpendCaps {
    /// The caps of `config` over `store`. A cap must be a finite positive number, on a backend
    /// with a price table (a call without a price costs an unknown amount, which no cap can count).
    pub fn from_config(config: &AssayConfig, store: RunStore) -> Result<Arc<SpendCaps>, ConfigError> {
        let mut caps = BTreeMap::new();
        for (name, b) in &config.backends {
            if b.daily_spend_usd == 0.0 {
                continue;
            }
            if !b.daily_spend_usd.is_finite() || b.daily_spend_usd < 0.0 {
                return Err(cap_error(
                    name,
                    format!("must be a finite number of US dollars >= 0 (0 = no cap), got {}", b.daily_spend_usd),
                ));
            }
            if b.prices.is_empty() {
                return Err(cap_error(
                    name,
                    format!(
                        "needs a price table (backends.{name}.prices): the calls of a model without a price cost an \
                         unknown amount, which a cap cannot count"
                    ),
                ));
            }
            caps.insert(name.clone(), (b.daily_spend_usd * NANO).round() as i64);
        }
        // The default's backend (an unknown phase resolves to it) and every phase's.
        let phases = std::iter::once("").chain(config.models.phases.keys().map(String::as_str));
        let mut configured = BTreeSet::new();
        for phase in phases {
            let settings = config.models.resolve(phase);
            // A capped backend must price every model the configuration sends it: the calls of a
            // model without a price could not be counted against its cap.
            let named = settings.model.clone().filter(|m| !m.is_empty());
            let model =
                named.or_else(|| Some(config.backends.get(&settings.backend)?.model.clone()).filter(|m| !m.is_empty()));
            if let (Some(model), Some(b)) = (model, config.backends.get(&settings.backend))
                && caps.contains_key(&settings.backend)
                && !b.prices.contains_key(&model)
                && !b.prices.contains_key("*")
            {
                let at = if phase.is_empty() { "models.default".to_string() } else { format!("models.phases.{phase}") };
                return Err(cap_error(
                    &settings.backend,
                    format!(
                        "{at} sends model {model:?} to backend {0}, whose price table (backends.{0}.prices) has no \
                         entry for it and no \"*\" row: its calls could not be counted against the cap",
                        settings.backend
                    ),
                ));
            }
            configured.insert(settings.backend);
        }
        Ok(Arc::new(SpendCaps {
            store,
            caps,
            configured,
            known: Mutex::default(),
            released: tokio::sync::Notify::new(),
            waiting: tokio::sync::Mutex::new(()),
            refused: Mutex::default(),
        }))
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
        if spent.is_empty() {
            return Ok(());
        }
        // What calls refused on the caps needed, by any process sharing the store today.
        let stored: BTreeMap<String, i64> = self.store.needs(&day).await?.into_iter().collect();
        for (b, total) in spent {
            let reason = self
                .reached(&b, &day, total)
                .or_else(|| self.too_little_left(&b, &day, total, stored.get(&b).copied()));
            if let Some(reason) = reason {
                return Err(StageError::ResourceExhausted(format!(
                    "{reason}; new runs that use it are refused until then"
                )));
            }
        }
        Ok(())
    }

    /// Why `backend` can pay for no more calls today, when a call held for today was refused for
    /// lack of room (by this gateway, or by any process sharing the store: `stored`) and what is
    /// left is still less than it needed.
    fn too_little_left(&self, backend: &str, day: &str, total: i64, stored: Option<i64>) -> Option<String> {
        let cap = *self.caps.get(backend)?;
        let mine = self.refused.lock().ok()?.get(backend).filter(|(d, _)| d == day).map(|(_, n)| *n);
        let need = match (mine, stored) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        (cap - total < need).then(|| at_cap(backend, day, cap, total, need))
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
    pub(super) fn reached(&self, backend: &str, day: &str, total: i64) -> Option<String> {
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

    pub(super) fn learn(&self, backend: &str, day: &str, total: i64) {
        if let Ok(mut k) = self.known.lock() {
            let entry = k.entry(backend.to_string()).or_insert_with(|| (day.to_string(), total));
            if entry.0 != day || entry.1 < total {
                *entry = (day.to_string(), total);
            }
        }
    }
}
