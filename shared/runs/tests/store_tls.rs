//! The PostgreSQL run store over TLS, against a real server started on loopback with a
//! certificate made here (rcgen): libpq's `sslmode` values from `disable` to `verify-full`, a
//! server certificate from the wrong CA or for the wrong name refused, and a server without TLS
//! refused when TLS is required. Skipped with a message when PostgreSQL is not installed (required
//! when `ASSAY_REQUIRE_POSTGRES=1`).

use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_runs::store::PostgresStore;
use assay_testkit::TempPostgres;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A server certificate for 127.0.0.1 only (not `localhost`), and its key.
fn server_cert(issuer: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, "assay test postgres");
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

async fn connect(url: &str) -> Result<PostgresStore, String> {
    PostgresStore::connect(url, "gateway-tls".into(), Duration::from_secs(15)).await.map_err(|e| e.to_string())
}

/// The store works (a run written and read back) and says whether its connection is encrypted.
async fn works(url: &str) -> bool {
    let store = connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    let id = format!("run-{}", uuid_like());
    let run = gw::Run { run_id: id.clone(), state: gw::RunState::Running as i32, ..Default::default() };
    use assay_runs::store::RunStorage;
    store.create(run, gw::RunPipelineRequest::default()).await.unwrap();
    assert_eq!(store.get(&id).await.unwrap().unwrap().run.run_id, id);
    store.encrypted().await.unwrap()
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sslmode_against_a_tls_server() {
    let trusted = ca("assay test ca");
    let (cert, key) = server_cert(&trusted);
    let pg = match TempPostgres::start_with_tls(&cert, &key) {
        Ok(pg) => pg,
        Err(e) if std::env::var("ASSAY_REQUIRE_POSTGRES").as_deref() == Ok("1") => {
            panic!("PostgreSQL is required (ASSAY_REQUIRE_POSTGRES=1): {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED every_sslmode_against_a_tls_server: {e}");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, trusted.pem()).unwrap();
    let other_file = dir.path().join("other-ca.pem");
    std::fs::write(&other_file, ca("some other ca").pem()).unwrap();
    let (ca_file, other_file) = (ca_file.display().to_string(), other_file.display().to_string());
    let url = pg.url(); // postgres://assay@127.0.0.1:PORT/postgres
    let localhost = url.replace("127.0.0.1", "localhost");

    assert!(works(&format!("{url}?sslmode=verify-full&sslrootcert={ca_file}")).await, "verify-full: encrypted");
    assert!(works(&format!("{localhost}?sslmode=verify-ca&sslrootcert={ca_file}")).await, "verify-ca ignores the name");
    assert!(works(&format!("{url}?sslmode=require")).await, "require: encrypted, unchecked");
    assert!(works(&url).await, "prefer (the default) encrypts when the server offers TLS");
    assert!(!works(&format!("{url}?sslmode=disable")).await, "disable: plaintext");

    let wrong_ca = connect(&format!("{url}?sslmode=verify-full&sslrootcert={other_file}")).await.err();
    let wrong_ca = wrong_ca.expect("a certificate from another CA is refused");
    assert!(wrong_ca.to_lowercase().contains("certificate"), "{wrong_ca}");
    let wrong_name = connect(&format!("{localhost}?sslmode=verify-full&sslrootcert={ca_file}")).await.err();
    let wrong_name = wrong_name.expect("a certificate for another name is refused by verify-full");
    assert!(wrong_name.to_lowercase().contains("certificate"), "{wrong_name}");
    // require with a root certificate checks the chain, as libpq does.
    assert!(connect(&format!("{url}?sslmode=require&sslrootcert={other_file}")).await.is_err());

    let bad = connect(&format!("{url}?sslmode=strict")).await.err().expect("an unknown sslmode");
    assert!(bad.contains("gateway.store") && bad.contains("sslmode=\"strict\""), "{bad}");
    let missing = connect(&format!("{url}?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")).await.err();
    assert!(missing.expect("a missing CA file").contains("sslrootcert /nonexistent/ca.pem"));
    eprintln!("wrong CA: {wrong_ca}\nwrong name: {wrong_name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_is_refused_when_tls_is_required() {
    let Some(pg) = TempPostgres::start_or_skip("a_server_without_tls_is_refused_when_tls_is_required") else {
        return;
    };
    let url = pg.url();
    let refused = connect(&format!("{url}?sslmode=require")).await.err().expect("no TLS, refused");
    assert!(refused.to_lowercase().contains("tls") || refused.to_lowercase().contains("ssl"), "{refused}");
    assert!(!works(&url).await, "prefer falls back to plaintext");
}
