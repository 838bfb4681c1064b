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

use assay_config::AssayConfig;
use assay_domain::{StageError, Usage};
use assay_proto::gateway::v1 as gw;
use prost_reflect::{DynamicMessage, ReflectMessage, Value};

use crate::store::{HoldOutcome, RunStore, SpendHold};

const NANO: f64 = 1e9;

/// The UTC day of `time`, `YYYY-MM-DD`.
fn day_of(time: &prost_types::Timestamp) -> String {
    time.to_string().chars().take(10).collect()
}

/// Today, UTC.
fn today() -> String {
    day_of(&crate::clock::now())
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
    /// Woken when a hold of this gateway is settled or given back.
    released: tokio::sync::Notify,
    /// Holds waiting for room take turns on it.
    waiting: tokio::sync::Mutex<()>,
    /// Per capped backend: the least a call this gateway held needed and could not get, (day,
    /// nano-dollars): new runs are refused while less than that is left.
    refused: Mutex<BTreeMap<String, (String, i64)>>,
}

/// Why `backend`, at `spent` of its `cap` on `day`, cannot pay for a call of `need`.
fn at_cap(backend: &str, day: &str, cap: i64, spent: i64, need: i64) -> String {
    format!(
        "backend {backend} is at its daily spend cap (backends.{backend}.daily_spend_usd = ${:.2}): ${:.4} spent on \
         {day} (UTC) leaves less than a call may cost (${:.4}), the cap resets at 00:00 UTC",
        cap as f64 / NANO,
        spent as f64 / NANO,
        need as f64 / NANO
    )
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
                return Err(format!(
                    "backends.{0}.daily_spend_usd: {at} sends model {model:?} to backend {0}, whose price table \
                     (backends.{0}.prices) has no entry for it and no \"*\" row: its calls could not be counted \
                     against the cap",
                    settings.backend
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
        for (b, total) in spent {
            let reason = self.reached(&b, &day, total).or_else(|| self.too_little_left(&b, &day, total));
            if let Some(reason) = reason {
                return Err(StageError::ResourceExhausted(format!(
                    "{reason}; new runs that use it are refused until then"
                )));
            }
        }
        Ok(())
    }

    /// Why `backend` can pay for no more calls today, when a call this gateway held for today was
    /// refused for lack of room and what is left is still less than it needed.
    fn too_little_left(&self, backend: &str, day: &str, total: i64) -> Option<String> {
        let cap = *self.caps.get(backend)?;
        let need = self.refused.lock().ok()?.get(backend).filter(|(d, _)| d == day).map(|(_, n)| *n)?;
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
}

/// How long a hold on a cap lasts unsettled before it counts as spent (its gateway is taken to
/// have died with the call in flight). Longer than any stage call is allowed to take.
pub const HOLD_LEASE: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// How soon a hold that must wait for other gateways' holds asks the store again (doubling up to
/// [`HOLD_POLL_MAX`]); a hold of this gateway settled wakes it at once.
const HOLD_POLL: std::time::Duration = std::time::Duration::from_millis(50);
const HOLD_POLL_MAX: std::time::Duration = std::time::Duration::from_millis(800);

impl SpendCaps {
    /// What the caps of `backends` have free now (the least over them), nano-dollars, as last
    /// learned (holds of other runs not counted); None when none of them is capped.
    pub fn free(&self, backends: &BTreeSet<String>) -> Option<u64> {
        let day = today();
        let known = self.known.lock().ok()?;
        backends
            .iter()
            .filter_map(|b| {
                let cap = *self.caps.get(b)?;
                let total = known.get(b).filter(|(d, _)| *d == day).map_or(0, |(_, t)| *t);
                Some((cap - total).max(0) as u64)
            })
            .min()
    }

    /// Hold at least `min` and up to `want` nano-dollars on the cap of each capped backend in
    /// `backends` for one stage call of run `run_id` (the call may spend it on any of them):
    /// waits while other runs' holds take what it needs, refused (RESOURCE_EXHAUSTED, a budget
    /// refusal naming the backend and its cap) when the day's spend leaves less than `min`.
    pub async fn hold(
        self: &Arc<Self>,
        run_id: &str,
        backends: &BTreeSet<String>,
        min: u64,
        want: u64,
    ) -> Result<CapHold, StageError> {
        let day = today();
        let mut hold = CapHold { caps: self.clone(), day: day.clone(), held: Vec::new(), settled: false };
        let mut want = want.max(min) as i64;
        let expires_at = std::time::SystemTime::now()
            .checked_add(HOLD_LEASE)
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(i64::MAX, |d| d.as_secs() as i64);
        for backend in backends {
            let Some(&cap) = self.caps.get(backend) else { continue };
            let request = SpendHold {
                id: uuid::Uuid::now_v7().to_string(),
                run_id: run_id.to_string(),
                day: day.clone(),
                backend: backend.clone(),
                nano_usd: want,
                expires_at,
            };
            // This gateway's waiters take turns (first come, first served): one at a time asks
            // the store again, when a hold of this gateway is settled or, for other gateways'
            // holds, after a backoff.
            let mut turn = None;
            let mut backoff = HOLD_POLL;
            loop {
                let settled = self.released.notified();
                tokio::pin!(settled);
                settled.as_mut().enable();
                match self.store.hold_spend(&request, min as i64, cap).await? {
                    HoldOutcome::Granted(n) => {
                        hold.held.push((backend.clone(), request.id.clone(), n));
                        want = want.min(n);
                        break;
                    }
                    HoldOutcome::Wait if turn.is_none() => turn = Some(self.waiting.lock().await),
                    HoldOutcome::Wait => {
                        tokio::select! {
                            () = settled => {}
                            () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(HOLD_POLL_MAX),
                        }
                    }
                    HoldOutcome::Refused(spent) => {
                        self.learn(backend, &day, spent);
                        if let Ok(mut refused) = self.refused.lock() {
                            let entry = refused.entry(backend.clone()).or_insert_with(|| (day.clone(), min as i64));
                            if entry.0 != day || entry.1 > min as i64 {
                                *entry = (day.clone(), min as i64);
                            }
                        }
                        let reason = self
                            .reached(backend, &day, spent)
                            .unwrap_or_else(|| at_cap(backend, &day, cap, spent, min as i64));
                        return Err(StageError::ResourceExhausted(format!("{}: {reason}", assay_budget::EXHAUSTED)));
                    }
                }
            }
        }
        Ok(hold)
    }
}

/// Money held on the daily caps for one stage call. Settle it with the call's usage; dropped
/// unsettled, it is given back (off the caller's path).
pub struct CapHold {
    caps: Arc<SpendCaps>,
    day: String,
    /// (backend, hold id, nano-dollars held).
    held: Vec<(String, String, i64)>,
    settled: bool,
}

impl CapHold {
    /// What is held on every capped backend: the least of the holds, nano-dollars (None when
    /// nothing is capped).
    pub fn granted(&self) -> Option<u64> {
        self.held.iter().map(|(_, _, n)| (*n).max(0) as u64).min()
    }

    /// The call spent `usage`: each hold removed and the backend's priced cost added to its
    /// day's spend.
    pub async fn settle(mut self, usage: &Usage) {
        self.settled = true;
        let held = std::mem::take(&mut self.held);
        settle_holds(&self.caps, &self.day, held, Some(usage)).await;
    }
}

async fn settle_holds(caps: &SpendCaps, day: &str, held: Vec<(String, String, i64)>, usage: Option<&Usage>) {
    for (backend, id, reserved) in held {
        let actual = usage.and_then(|u| u.cost_by_backend.get(&backend)).map_or(0, |usd| (usd * NANO).round() as i64);
        // A store that fails now may answer in a moment: an unsettled hold would keep its money
        // from every run until it expires.
        let mut wait = HOLD_POLL;
        for attempt in 1..=5 {
            match caps.store.settle_spend(day, &backend, &id, reserved, actual).await {
                Ok(total) => {
                    caps.learn(&backend, day, total);
                    break;
                }
                Err(e) => {
                    tracing::warn!(backend = %backend, attempt, error = %e, "could not settle a hold on the backend's daily cap");
                    tokio::time::sleep(wait).await;
                    wait *= 4;
                }
            }
        }
    }
    caps.released.notify_waiters();
}

impl Drop for CapHold {
    fn drop(&mut self) {
        if self.settled || self.held.is_empty() {
            return;
        }
        let (caps, day, held) = (self.caps.clone(), self.day.clone(), std::mem::take(&mut self.held));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { settle_holds(&caps, &day, held, None).await });
        }
    }
}

/// Add to `out` every backend named by a model spec anywhere in `request`.
fn named_backends(request: &gw::RunPipelineRequest, out: &mut BTreeSet<String>) {
    let Ok(pool) = assay_proto::descriptor_pool() else { return };
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
        let mut config = assay_config::load_from("").unwrap();
        let openai = config.backends.get_mut("openai").unwrap();
        openai.daily_spend_usd = 5.0;
        let e = SpendCaps::from_config(&config, store.clone()).err().unwrap();
        assert!(e.contains("backends.openai.daily_spend_usd needs a price table"), "{e}");
        let openai = config.backends.get_mut("openai").unwrap();
        openai.prices.insert("*".into(), assay_config::Price { input: 1.0, output: 1.0, cached_input: None });
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
        let mut config = assay_config::load_from("[models.default]\nbackend = \"openai\"\n").unwrap();
        let openai = config.backends.get_mut("openai").unwrap();
        openai.prices.insert("*".into(), assay_config::Price { input: 1.0, output: 1.0, cached_input: None });
        openai.daily_spend_usd = 1.0;
        let caps = SpendCaps::from_config(&config, store).unwrap();
        let used = caps.capped_backends_of(&gw::RunPipelineRequest::default());
        assert_eq!(used, BTreeSet::from(["openai".to_string()]));
        caps.admit(&used).await.unwrap();
        let usage =
            |usd: f64| Usage { cost_by_backend: BTreeMap::from([("openai".to_string(), usd)]), ..Usage::default() };
        let nano = |usd: f64| (usd * NANO) as u64;
        // A hold takes what it wants of the free cap; settled, only what was spent stays.
        let a = caps.hold("run", &used, nano(0.1), nano(0.9)).await.unwrap();
        assert_eq!(a.granted(), Some(nano(0.9)));
        let b = caps.hold("run", &used, nano(0.05), nano(0.5)).await.unwrap();
        assert_eq!(b.granted(), Some(nano(0.1)), "what a's hold leaves");
        drop(b);
        a.settle(&usage(0.75)).await;
        assert_eq!(caps.free(&used), Some(nano(0.25)));
        // More than the day's spend leaves is refused, naming the cap.
        let e = caps.hold("run", &used, nano(0.3), nano(0.3)).await.err().unwrap().to_string();
        assert!(e.contains("budget exhausted: backend openai is at its daily spend cap"), "{e}");
        assert!(e.contains("$0.7500 spent") && e.contains("($0.3000)"), "{e}");
        // A hold that fits only once another is settled waits for it.
        let c = caps.hold("run", &used, nano(0.2), nano(0.2)).await.unwrap();
        let waiter = {
            let caps = caps.clone();
            let used = used.clone();
            tokio::spawn(async move { caps.hold("run", &used, nano(0.1), nano(0.1)).await.map(|h| h.granted()) })
        };
        tokio::time::sleep(HOLD_POLL * 3).await;
        assert!(!waiter.is_finished(), "0.05 free of a 0.25 remainder: the hold waits");
        c.settle(&usage(0.05)).await;
        assert_eq!(waiter.await.unwrap().unwrap(), Some(nano(0.1)));
        caps.hold("run", &used, nano(0.1), nano(0.1)).await.unwrap().settle(&usage(0.4)).await;
        let e = caps.admit(&used).await.unwrap_err().to_string();
        assert!(e.contains("backend openai reached its daily spend cap") && e.contains("$1.20"), "{e}");
    }

    #[tokio::test]
    async fn a_hold_of_a_dead_gateway_counts_as_spent_once_it_expires() {
        let store = RunStore::open(":memory:").unwrap();
        let hold = |id: &str, nano: i64, expires_at: i64| SpendHold {
            id: id.into(),
            run_id: "r".into(),
            day: "2020-01-01".into(),
            backend: "openai".into(),
            nano_usd: nano,
            expires_at,
        };
        // Expired long ago: its gateway died with the call in flight.
        assert_eq!(store.hold_spend(&hold("dead", 300, 1), 1, 1_000).await.unwrap(), HoldOutcome::Granted(300));
        let live = hold("live", 800, i64::MAX);
        assert_eq!(store.hold_spend(&live, 1, 1_000).await.unwrap(), HoldOutcome::Granted(700));
        assert_eq!(
            store.spend("2020-01-01").await.unwrap(),
            vec![("openai".to_string(), 300)],
            "the dead hold is spent"
        );
        assert_eq!(store.hold_spend(&hold("x", 10, i64::MAX), 10, 1_000).await.unwrap(), HoldOutcome::Wait);
        assert_eq!(store.hold_spend(&hold("y", 800, i64::MAX), 800, 1_000).await.unwrap(), HoldOutcome::Refused(300));
        // Settling the expired hold later corrects its estimate to what it really spent.
        assert_eq!(store.settle_spend("2020-01-01", "openai", "dead", 300, 120).await.unwrap(), 120);
        assert_eq!(store.settle_spend("2020-01-01", "openai", "live", 700, 500).await.unwrap(), 620);
    }

    #[test]
    fn day_is_the_utc_date() {
        assert_eq!(day_of(&prost_types::Timestamp { seconds: 86_400 * 365 + 3_600, nanos: 0 }), "1971-01-01");
    }
}
