//! Daily caps and holds.

use std::collections::{BTreeMap, BTreeSet};

use assay_domain::Usage;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;

use super::backends::named_backends;
use super::caps::{NANO, SpendCaps, day_of};
use super::hold::HOLD_POLL;
use crate::store::{HoldOutcome, RunStore, SpendHold};

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
    let e = SpendCaps::from_config(&config, store.clone()).err().unwrap().to_string();
    assert!(e.contains("backends.openai.daily_spend_usd: needs a price table"), "{e}");
    let openai = config.backends.get_mut("openai").unwrap();
    openai.prices.insert("*".into(), assay_config::Price { input: 1.0, output: 1.0, cached_input: None });
    openai.daily_spend_usd = f64::INFINITY;
    let e = SpendCaps::from_config(&config, store.clone()).err().unwrap().to_string();
    assert!(e.contains("backends.openai.daily_spend_usd: must be a finite number"), "{e}");
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
    let usage = |usd: f64| Usage { cost_by_backend: BTreeMap::from([("openai".to_string(), usd)]), ..Usage::default() };
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
    assert_eq!(store.spend("2020-01-01").await.unwrap(), vec![("openai".to_string(), 300)], "the dead hold is spent");
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
