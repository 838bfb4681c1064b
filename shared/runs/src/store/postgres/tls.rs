//! TLS to PostgreSQL, configured the way libpq reads it from the store URL:
//!
//! | `sslmode`     | encrypted                  | server certificate checked                     |
//! |---------------|----------------------------|------------------------------------------------|
//! | `disable`     | no                         | -                                              |
//! | `allow`, `prefer` (default) | if the server offers TLS | as `require`                    |
//! | `require`     | yes                        | not checked; chain checked if `sslrootcert` set |
//! | `verify-ca`   | yes                        | chain to `sslrootcert` (else the system roots) |
//! | `verify-full` | yes                        | chain, and the host name or IP in the URL      |
//!
//! `sslrootcert` is a PEM file of trusted CA certificates; `sslcert` + `sslkey` (PEM) a client
//! certificate for servers that ask for one. tokio-postgres knows only `disable`, `prefer` and
//! `require`, and none of the file parameters: [`split`] takes them out of the URL and gives it the
//! mode it knows. rustls (aws-lc) does the TLS.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, danger};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Encrypt without checking who answers (libpq's `require`).
    None,
    /// The chain must lead to a trusted root; the name is not checked.
    Chain,
    /// The chain, and the name the client connected to.
    Full,
}

/// TLS settings taken from a store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TlsSettings {
    /// `None`: no TLS (`sslmode=disable`).
    pub check: Option<Check>,
    pub root_cert: Option<String>,
    pub client_cert: Option<(String, String)>,
}

/// Why a store URL's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum TlsError {
    #[error("sslmode={0:?} is not one of disable, allow, prefer, require, verify-ca, verify-full")]
    Mode(String),
    #[error("sslcert and sslkey go together: set both or neither")]
    HalfPair,
    /// A certificate or key file that cannot be used (the parameter and the file named).
    #[error("{0}")]
    Unusable(String),
}

/// Split a `postgres://` URL into the URL tokio-postgres parses and the TLS settings. An error
/// names the parameter and says what it accepts.
pub(super) fn split(url: &str) -> Result<(String, TlsSettings), TlsError> {
    // Only the query is touched: the rest (several hosts, a socket directory) is tokio-postgres's.
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut mode = None;
    let (mut root_cert, mut cert, mut key) = (None, None, None);
    let mut kept = Vec::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "sslmode" => mode = Some(v.into_owned()),
            "sslrootcert" => root_cert = Some(v.into_owned()),
            "sslcert" => cert = Some(v.into_owned()),
            "sslkey" => key = Some(v.into_owned()),
            _ => kept.push((k.into_owned(), v.into_owned())),
        }
    }
    let mode = mode.unwrap_or_else(|| "prefer".to_string());
    let (pg_mode, check) = match mode.as_str() {
        "disable" => ("disable", None),
        "allow" | "prefer" => ("prefer", Some(if root_cert.is_some() { Check::Chain } else { Check::None })),
        "require" => ("require", Some(if root_cert.is_some() { Check::Chain } else { Check::None })),
        "verify-ca" => ("require", Some(Check::Chain)),
        "verify-full" => ("require", Some(Check::Full)),
        other => {
            return Err(TlsError::Mode(other.to_string()));
        }
    };
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(TlsError::HalfPair),
    };
    kept.push(("sslmode".into(), pg_mode.into()));
    let query = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(kept).finish();
    Ok((format!("{base}?{query}"), TlsSettings { check, root_cert, client_cert }))
}

/// The tokio-postgres connector for `settings` (`None` for `sslmode=disable`). An error names the
/// file that could not be used.
pub(super) fn connector(settings: &TlsSettings) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, TlsError> {
    let Some(check) = settings.check else {
        return Ok(None);
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let chain = match check {
        Check::None => None,
        Check::Chain | Check::Full => {
            let mut roots = RootCertStore::empty();
            match &settings.root_cert {
                Some(path) => {
                    let certs = CertificateDer::pem_file_iter(path)
                        .map_err(|e| TlsError::Unusable(format!("sslrootcert {path}: {e}")))?
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(|e| TlsError::Unusable(format!("sslrootcert {path}: {e}")))?;
                    if certs.is_empty() {
                        return Err(TlsError::Unusable(format!("sslrootcert {path}: no PEM certificate in it")));
                    }
                    for c in certs {
                        roots.add(c).map_err(|e| TlsError::Unusable(format!("sslrootcert {path}: {e}")))?;
                    }
                }
                None => {
                    let native = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(native.certs);
                    if roots.is_empty() {
                        return Err(TlsError::Unusable("no system CA certificates; set sslrootcert".into()));
                    }
                }
            }
            let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| TlsError::Unusable(format!("sslrootcert: {e}")))?;
            Some(verifier)
        }
    };
    let verifier = Arc::new(Verifier { chain, check_name: check == Check::Full, provider: provider.clone() });
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Unusable(format!("TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &settings.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = CertificateDer::pem_file_iter(cert)
                .map_err(|e| TlsError::Unusable(format!("sslcert {cert}: {e}")))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| TlsError::Unusable(format!("sslcert {cert}: {e}")))?;
            let key_der =
                PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Unusable(format!("sslkey {key}: {e}")))?;
            builder
                .with_client_auth_cert(certs, key_der)
                .map_err(|e| TlsError::Unusable(format!("sslcert/sslkey: {e}")))?
        }
    };
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// libpq's checks: none, the chain only, or the chain and the name. Handshake signatures are
/// always verified.
#[derive(Debug)]
struct Verifier {
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            // The name is checked after the chain: this error means the chain is good.
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<danger::HandshakeSignatureValid, Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_modes_map_to_what_tokio_postgres_knows() {
        let (url, s) =
            split("postgres://u:p@db:5432/runs?sslmode=verify-full&sslrootcert=/ca.pem&application_name=a").unwrap();
        assert_eq!(url, "postgres://u:p@db:5432/runs?application_name=a&sslmode=require");
        assert_eq!(s, TlsSettings { check: Some(Check::Full), root_cert: Some("/ca.pem".into()), client_cert: None });
        let (url, s) = split("postgres://db/runs").unwrap();
        assert_eq!(url, "postgres://db/runs?sslmode=prefer");
        let (url, _) = split("postgresql://u@h1:5432,h2:5433/runs?target_session_attrs=read-write").unwrap();
        assert_eq!(url, "postgresql://u@h1:5432,h2:5433/runs?target_session_attrs=read-write&sslmode=prefer");
        url.parse::<tokio_postgres::Config>().expect("several hosts stay as tokio-postgres reads them");
        assert_eq!(s.check, Some(Check::None), "libpq's default, prefer, encrypts when it can, unchecked");
        assert_eq!(split("postgres://db/r?sslmode=require&sslrootcert=/c").unwrap().1.check, Some(Check::Chain));
        assert_eq!(split("postgres://db/r?sslmode=verify-ca").unwrap().1.check, Some(Check::Chain));
        assert_eq!(split("postgres://db/r?sslmode=disable").unwrap().1.check, None);
        let (_, s) = split("postgres://db/r?sslmode=require&sslcert=/c.pem&sslkey=/k.pem").unwrap();
        assert_eq!(s.client_cert, Some(("/c.pem".into(), "/k.pem".into())));
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = split("postgres://db/r?sslmode=strict").unwrap_err().to_string();
        assert!(e.contains("sslmode=\"strict\"") && e.contains("verify-full"), "{e}");
        let e = split("postgres://db/r?sslcert=/c.pem").unwrap_err().to_string();
        assert!(e.contains("sslcert and sslkey"), "{e}");
        let (_, s) = split("postgres://db/r?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").unwrap();
        let e = connector(&s).err().expect("a missing file is an error").to_string();
        assert!(e.starts_with("sslrootcert /nonexistent/ca.pem"), "{e}");
    }
}
