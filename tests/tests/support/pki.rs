//! Test PKI made at test time with rcgen: a CA, certificates it signs (valid for localhost and
//! 127.0.0.1, usable by servers and clients), PEM files in a temporary directory, and the `[tls]`
//! section that points at them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use assay_config::TlsConfig;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate chain and its private key, PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("ca key");
        Ca { issuer: CertifiedIssuer::self_signed(params, key).expect("ca certificate") }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `name`, also valid for localhost and 127.0.0.1, for servers and clients.
    pub fn leaf(&self, name: &str) -> Leaf {
        let mut params = CertificateParams::new(vec![name.to_string(), "localhost".into(), "127.0.0.1".into()])
            .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("leaf certificate");
        Leaf { cert: cert.pem(), key: key.serialize_pem() }
    }
}

/// Write `contents` to `dir/file` and return the path as a string.
pub fn write(dir: &Path, file: &str, contents: &str) -> String {
    let path: PathBuf = dir.join(file);
    std::fs::write(&path, contents).expect("write pem");
    path.to_string_lossy().into_owned()
}

/// A `[tls]` section for a mesh: every service serves `server` and trusts `ca`; with `client`,
/// channels present it instead of `server`.
pub fn mesh_tls(dir: &Path, ca: &Ca, server: &Leaf, client: Option<&Leaf>, require_client_cert: bool) -> TlsConfig {
    let (client_cert, client_key) = match client {
        Some(c) => (write(dir, "client.pem", &c.cert), write(dir, "client.key", &c.key)),
        None => (String::new(), String::new()),
    };
    TlsConfig {
        cert: write(dir, "server.pem", &server.cert),
        key: write(dir, "server.key", &server.key),
        ca: write(dir, "ca.pem", &ca.pem()),
        client_cert,
        client_key,
        require_client_cert,
        server_name: String::new(),
    }
}
