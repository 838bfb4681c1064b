//! TLS and mutual TLS on every service and between them: the whole mesh on loopback with
//! certificates made by rcgen at test time; plaintext clients, clients without a certificate and
//! clients with a certificate from another CA refused; configuration errors naming the key.

use std::net::SocketAddr;

use assay_config::TlsConfig;
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_rpc::ClientTls;
use assay_rpc::remote::{channel, channel_with};
use assay_testkit::Reply;
use assay_tests::{MeshSandbox, SandboxOptions};
use serde_json::json;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[path = "support/pki.rs"]
mod pki;

use pki::{Ca, mesh_tls, write};

fn evaluate_request() -> gw::EvaluateRequest {
    let checklist = pb::Checklist {
        id: "haiku".into(),
        input: "Write a haiku about autumn.".into(),
        items: vec![
            pb::ChecklistItem { id: "lines".into(), question: "Is it three lines?".into(), ..Default::default() },
            pb::ChecklistItem { id: "topic".into(), question: "Is it about autumn?".into(), ..Default::default() },
        ],
        ..Default::default()
    };
    gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
            records: vec![gw::EvalRecord {
                id: "r0".into(),
                target: "red leaves fall\nslowly\ndown".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        budget: None,
    }
}

fn judge(sandbox: &MeshSandbox) {
    sandbox.llm.set_handler(|_| {
        Reply::json(json!({"answers": [
            {"question_index": 1, "answer": "YES"},
            {"question_index": 2, "answer": "YES"}
        ]}))
    });
}

async fn start(tls: TlsConfig) -> MeshSandbox {
    let sandbox = MeshSandbox::start_with(SandboxOptions { tls: Some(tls), ..Default::default() }).await;
    judge(&sandbox);
    sandbox
}

/// Evaluate through the gateway on `ch`; the pass rate on success.
async fn evaluate(ch: Channel) -> Result<f64, tonic::Status> {
    let r = GatewayServiceClient::new(ch).evaluate(evaluate_request()).await?.into_inner();
    Ok(r.results[0].score.clone().expect("score").pass_rate)
}

async fn health(ch: Channel) -> Result<i32, tonic::Status> {
    Ok(HealthClient::new(ch).check(HealthCheckRequest { service: String::new() }).await?.into_inner().status)
}

fn url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

fn tls_channel(addr: SocketAddr, tls: &ClientTls) -> Channel {
    channel_with(&url(addr), Some(tls)).expect("channel")
}

#[tokio::test]
async fn the_whole_mesh_serves_tls_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("assay test ca");
    let server = ca.leaf("assay-mesh");
    let sandbox = start(mesh_tls(dir.path(), &ca, &server, None, false)).await;

    // The sandbox's channel trusts the CA: an evaluation goes client -> gateway -> scorer over TLS
    // (the scorer serves nothing else), and the scorer reached the backend.
    let pass = evaluate(sandbox.gateway().await).await.expect("evaluate over tls");
    assert_eq!(pass, 1.0);
    assert!(sandbox.llm.request_count() >= 1);

    let trusted = ClientTls::new().ca(ca.pem());
    let other_ca = ClientTls::new().ca(Ca::new("someone else").pem());
    for (name, addr) in sandbox.mesh().addrs.all() {
        // Every service answers over TLS...
        let status = health(tls_channel(addr, &trusted)).await.unwrap_or_else(|s| panic!("{name} over tls: {s}"));
        assert_eq!(status, ServingStatus::Serving as i32, "{name}");
        // ...and refuses a plaintext client and one that does not trust its certificate.
        let plain = health(channel(&url(addr)).unwrap()).await;
        assert!(plain.is_err(), "{name} answered plaintext: {plain:?}");
        let untrusted = health(tls_channel(addr, &other_ca)).await;
        assert!(untrusted.is_err(), "{name} passed as another CA's server: {untrusted:?}");
    }
    // The name checked can be set apart from the address dialled.
    let by_name = ClientTls::new().ca(ca.pem()).domain("assay-mesh");
    assert_eq!(evaluate(tls_channel(sandbox.mesh().addrs.gateway, &by_name)).await.unwrap(), 1.0);
    let wrong_name = ClientTls::new().ca(ca.pem()).domain("not-the-mesh");
    assert!(evaluate(tls_channel(sandbox.mesh().addrs.gateway, &wrong_name)).await.is_err());

    let plain = evaluate(channel(&sandbox.gateway_url()).unwrap()).await;
    let err = plain.expect_err("a plaintext evaluate is refused");
    assert!(matches!(err.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal), "{err:?}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_good_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("assay test ca");
    let server = ca.leaf("assay-mesh");
    // The gateway presents its own client certificate (tls.client_cert / tls.client_key) to the stages.
    let gateway_client = ca.leaf("assay-gateway-client");
    let sandbox = start(mesh_tls(dir.path(), &ca, &server, Some(&gateway_client), true)).await;
    let gateway = sandbox.mesh().addrs.gateway;

    // A client with a certificate from the mesh's CA: the evaluation crosses gateway -> scorer,
    // which also requires a client certificate.
    let good = ca.leaf("a-good-client");
    let with_cert = ClientTls::new().ca(ca.pem()).identity(&good.cert, &good.key);
    assert_eq!(evaluate(tls_channel(gateway, &with_cert)).await.expect("a client with a good certificate"), 1.0);
    let calls = sandbox.llm.request_count();
    assert!(calls >= 1);

    // Without a certificate, with one from another CA, or in plaintext: refused on every service.
    let stranger_ca = Ca::new("stranger ca");
    let stranger = stranger_ca.leaf("a-stranger");
    let no_cert = ClientTls::new().ca(ca.pem());
    let foreign_cert = ClientTls::new().ca(ca.pem()).identity(&stranger.cert, &stranger.key);
    for (name, addr) in sandbox.mesh().addrs.all() {
        assert_eq!(health(tls_channel(addr, &with_cert)).await.unwrap(), ServingStatus::Serving as i32, "{name}");
        let r = health(tls_channel(addr, &no_cert)).await;
        assert!(r.is_err(), "{name} accepted a client without a certificate: {r:?}");
        let r = health(tls_channel(addr, &foreign_cert)).await;
        assert!(r.is_err(), "{name} accepted a certificate from another CA: {r:?}");
        let r = health(channel(&url(addr)).unwrap()).await;
        assert!(r.is_err(), "{name} answered plaintext: {r:?}");
    }
    for refused in [&no_cert, &foreign_cert] {
        let err = evaluate(tls_channel(gateway, refused)).await.expect_err("refused");
        assert!(
            matches!(err.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal),
            "{err:?}"
        );
    }
    assert_eq!(sandbox.llm.request_count(), calls, "no refused call reached a stage");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_presents_the_serving_certificate_when_no_client_certificate_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("assay test ca");
    let server = ca.leaf("assay-mesh");
    let sandbox = start(mesh_tls(dir.path(), &ca, &server, None, true)).await;
    // The sandbox's own channel presents tls.cert as well.
    assert_eq!(evaluate(sandbox.gateway().await).await.expect("mutual tls with the serving certificate"), 1.0);
    sandbox.shutdown().await.unwrap();
}

fn config_error(toml: &str) -> String {
    match assay_config::load_from(toml) {
        Ok(_) => panic!("accepted:\n{toml}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn tls_configuration_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("assay test ca");
    let leaf = ca.leaf("assay-mesh");
    let cert = write(dir.path(), "server.pem", &leaf.cert);
    let key = write(dir.path(), "server.key", &leaf.key);
    let ca_pem = write(dir.path(), "ca.pem", &ca.pem());
    let missing = dir.path().join("missing.pem").to_string_lossy().into_owned();

    let e = config_error(&format!("[tls]\ncert = {cert:?}\n"));
    assert!(e.contains("tls.cert") && e.contains("tls.key") && e.contains("both or neither"), "{e}");
    let e = config_error(&format!("[tls]\nkey = {key:?}\n"));
    assert!(e.starts_with("configuration error: tls.key:") && e.contains("tls.cert"), "{e}");
    let e = config_error(&format!("[tls]\nclient_cert = {cert:?}\n"));
    assert!(e.contains("tls.client_cert") && e.contains("tls.client_key"), "{e}");
    let e = config_error(&format!("[tls]\ncert = {cert:?}\nkey = {missing:?}\n"));
    assert!(e.contains("tls.key: cannot read") && e.contains("missing.pem"), "{e}");
    let e = config_error(&format!("[tls]\ncert = {cert:?}\nkey = {key:?}\nca = {missing:?}\n"));
    assert!(e.contains("tls.ca: cannot read"), "{e}");
    // A certificate where the key belongs, and a key where a certificate belongs.
    let e = config_error(&format!("[tls]\ncert = {cert:?}\nkey = {cert:?}\n"));
    assert!(e.contains("tls.key:") && e.contains("no PEM private key"), "{e}");
    let e = config_error(&format!("[tls]\ncert = {key:?}\nkey = {key:?}\n"));
    assert!(e.contains("tls.cert:") && e.contains("no PEM certificate"), "{e}");
    let e = config_error(&format!("[tls]\ncert = {cert:?}\nkey = {key:?}\nrequire_client_cert = true\n"));
    assert!(e.contains("tls.require_client_cert") && e.contains("tls.ca"), "{e}");
    let e = config_error(&format!("[tls]\nca = {ca_pem:?}\nrequire_client_cert = true\n"));
    assert!(e.contains("tls.require_client_cert") && e.contains("tls.cert"), "{e}");
    // The key's contents never show in an error.
    let body = leaf.key.lines().nth(1).unwrap();
    assert!(!e.contains(body));

    // Complete settings load.
    let ok = assay_config::load_from(&format!(
        "[tls]\ncert = {cert:?}\nkey = {key:?}\nca = {ca_pem:?}\nrequire_client_cert = true\n"
    ))
    .expect("complete tls settings load");
    assert!(ok.tls.is_configured());
    assert!(assay_config::AssayConfig::defaults().tls.load().unwrap().server.is_none(), "tls is off by default");

    // A file gone after loading: starting the mesh fails naming the key.
    let mut config = ok.clone();
    config.ports = assay_config::Ports::ephemeral();
    config.gateway.store = ":memory:".into();
    config.tls.key = missing.clone();
    let e = assay_runtime::serve_options(&config).expect_err("the key file is gone");
    assert!(matches!(e, assay_runtime::RuntimeError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("tls.key: cannot read"), "{e}");
    let hub = std::sync::Arc::new(assay_llm::ModelHub::default());
    let e = match assay_cli::start_mesh(&config, hub, true).await {
        Ok(_) => panic!("a mesh started without its key"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("tls.key"), "{e}");
}
