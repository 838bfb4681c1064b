//! `assay up` (the in-process mesh) and `assay serve <stage>` (one per Deployment) build every
//! stage alike from the same configuration: both go through the stage table's builders, and the
//! settings a core takes from configuration are the same in both.

use std::net::SocketAddr;
use std::sync::Arc;

use assay_llm::ModelHub;
use assay_mesh::{Core, MeshAddrs, STAGES, Stage, gateway, mesh, standalone};

/// Non-default values, so a core left at its built-in default shows.
fn config() -> assay_config::AssayConfig {
    assay_config::load_from("[scorer]\nconcurrency = 13\n[gateway]\nconcurrency = 7\n").expect("config")
}

/// Where the in-process mesh would listen (nothing is dialled: channels connect on first use).
fn addrs() -> MeshAddrs {
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    MeshAddrs {
        gateway: at(1),
        generator: at(2),
        refiners: at(3),
        scorer: at(4),
        arbiter: at(5),
        delta_judge: at(6),
        debate: at(7),
        admin: None,
    }
}

/// The settings read back from a built core, where its type exposes them.
fn applied(core: &Core) -> Option<usize> {
    match core {
        Core::Refiners(c) => Some(c.concurrency()),
        Core::Generator(_) | Core::Scorer(_) | Core::Arbiter(_) | Core::DeltaJudge(_) | Core::Debate(_) => None,
    }
}

#[tokio::test]
async fn the_mesh_and_the_standalone_binaries_build_every_stage_with_the_same_settings() {
    let config = config();
    let hub = Arc::new(ModelHub::default());
    let loopback = mesh::loopback_remotes(&config, &addrs()).expect("loopback clients");
    for def in STAGES.iter().filter(|d| d.stage != Stage::Gateway) {
        let alone = standalone::build(def.stage, &config, hub.clone()).expect("standalone core");
        let in_mesh = def.build(&config, hub.clone(), &loopback).expect("in-process core");
        assert_eq!(alone.settings, in_mesh.settings, "{}: same settings", def.binary);
        assert_eq!(alone.settings, (def.settings)(&config), "{}: the table's settings", def.binary);
        assert_eq!(applied(&alone.core), applied(&in_mesh.core), "{}: same core", def.binary);
        if let Some(c) = applied(&alone.core) {
            assert_eq!(Some(c), alone.settings.concurrency, "{}: the core runs with its settings", def.binary);
        }
    }
}

#[tokio::test]
async fn the_refiners_take_the_configured_concurrency_under_assay_up_and_alone() {
    let config = config();
    let hub = Arc::new(ModelHub::default());
    let built_in = assay_refiners::ChecklistRefiners::new(hub.clone()).concurrency();
    assert_ne!(built_in, 13, "the configured value differs from the built-in one");
    let loopback = mesh::loopback_remotes(&config, &addrs()).expect("loopback clients");
    let in_mesh = Stage::Refiners.def().build(&config, hub.clone(), &loopback).expect("in-process core");
    let alone = standalone::build(Stage::Refiners, &config, hub).expect("standalone core");
    assert_eq!(applied(&in_mesh.core), Some(13), "assay up: scorer.concurrency");
    assert_eq!(applied(&alone.core), Some(13), "assay-refiners: scorer.concurrency");
}

#[tokio::test]
async fn the_gateway_runs_its_stages_with_the_configured_concurrency_both_ways() {
    let config = config();
    let configured = assay_mesh::Remotes::configured(&config, Stage::Gateway.def().calls).expect("clients");
    let loopback = mesh::loopback_remotes(&config, &addrs()).expect("loopback clients");
    assert_eq!(gateway::stages(&config, &configured).expect("standalone stages").concurrency, 7);
    assert_eq!(gateway::stages(&config, &loopback).expect("in-process stages").concurrency, 7);
}

#[tokio::test]
async fn an_invalid_upstream_address_is_an_error_naming_its_key() {
    let config = assay_config::load_from("[upstreams]\nscorer = \"http://no such host:1\"\n").expect("config");
    let Err(e) = standalone::build(Stage::Refiners, &config, Arc::new(ModelHub::default())) else {
        panic!("an invalid scorer address is refused")
    };
    assert!(matches!(e, assay_mesh::MeshError::InvalidAddress { key: "scorer", .. }), "{e:?}");
    assert!(e.to_string().starts_with("upstreams.scorer: invalid address"), "{e}");
}
