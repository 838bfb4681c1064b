//! TLS for servers and channels (rustls through tonic): what a server presents and whom it accepts,
//! what a channel trusts and presents. Built from PEM bytes; reading files and checking the
//! configuration is the configuration's job. Debug output never shows a private key.

use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Longest a TLS handshake may take, on either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A server's TLS: its certificate chain and key, and optionally the CA its clients' certificates
/// must chain to (mutual TLS).
#[derive(Clone)]
pub struct ServerTls {
    identity: Identity,
    client_ca: Option<Certificate>,
    require_client_cert: bool,
}

impl ServerTls {
    /// Serve TLS with this certificate chain and private key (PEM); no client certificates asked.
    pub fn new(cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        Self { identity: Identity::from_pem(cert_pem, key_pem), client_ca: None, require_client_cert: false }
    }

    /// Ask clients for a certificate signed by `ca_pem`: verified when presented, and required
    /// when `required` (a client without one is refused during the handshake).
    pub fn client_ca(mut self, ca_pem: impl AsRef<[u8]>, required: bool) -> Self {
        self.client_ca = Some(Certificate::from_pem(ca_pem));
        self.require_client_cert = required;
        self
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.client_ca.is_some() && self.require_client_cert
    }

    pub(crate) fn config(&self) -> ServerTlsConfig {
        let mut c = ServerTlsConfig::new().identity(self.identity.clone()).timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.client_ca {
            c = c.client_ca_root(ca.clone()).client_auth_optional(!self.require_client_cert);
        }
        c
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("identity", &"<certificate and key>")
            .field("client_ca", &self.client_ca.is_some())
            .field("require_client_cert", &self.require_client_cert)
            .finish()
    }
}

/// A channel's TLS: the CA it trusts (else the system's roots), the certificate it presents when a
/// server asks, and the name to verify in the server's certificate.
#[derive(Clone, Default)]
pub struct ClientTls {
    ca: Option<Certificate>,
    identity: Option<Identity>,
    domain: Option<String>,
}

impl ClientTls {
    /// Trust the system's roots, present no certificate, verify the dialled host's name.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trust servers whose certificates chain to these CA certificates (PEM) instead of the
    /// system's roots.
    pub fn ca(mut self, ca_pem: impl AsRef<[u8]>) -> Self {
        self.ca = Some(Certificate::from_pem(ca_pem));
        self
    }

    /// Present this certificate chain and key (PEM) to servers that ask (mutual TLS).
    pub fn identity(mut self, cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        self.identity = Some(Identity::from_pem(cert_pem, key_pem));
        self
    }

    /// Verify this name in the server's certificate instead of the dialled host.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    /// [`ClientTls::config`] for a replica dialled by address: the configured name, else `host`,
    /// is the one verified in its certificate.
    pub(crate) fn config_for(&self, host: &str) -> ClientTlsConfig {
        let c = self.config();
        if self.domain.is_some() { c } else { c.domain_name(host.to_string()) }
    }

    pub(crate) fn config(&self) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new().timeout(HANDSHAKE_TIMEOUT);
        c = match &self.ca {
            Some(ca) => c.ca_certificate(ca.clone()),
            None => c.with_native_roots(),
        };
        if let Some(id) = &self.identity {
            c = c.identity(id.clone());
        }
        if let Some(d) = &self.domain {
            c = c.domain_name(d.clone());
        }
        c
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.as_ref().map(|_| "<certificate and key>"))
            .field("domain", &self.domain)
            .finish()
    }
}

/// `url` with the scheme TLS needs: `http://` becomes `https://` (tonic dials TLS only for https);
/// any other address is returned as is.
pub fn https_url(url: &str) -> String {
    match url.strip_prefix("http://") {
        Some(rest) => format!("https://{rest}"),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_addresses_are_dialled_as_https() {
        assert_eq!(https_url("http://127.0.0.1:5"), "https://127.0.0.1:5");
        assert_eq!(https_url("https://scorer:5"), "https://scorer:5");
    }

    #[test]
    fn debug_never_shows_the_key() {
        let key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n";
        let server = ServerTls::new("cert", key).client_ca("ca", true);
        let client = ClientTls::new().identity("cert", key).domain("scorer");
        for text in [format!("{server:?}"), format!("{client:?}")] {
            assert!(!text.contains("c2VjcmV0"), "{text}");
        }
        assert!(server.requires_client_cert());
    }
}
