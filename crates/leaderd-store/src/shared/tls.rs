//! TLS for the database connections: what the URL asks for, and the rustls
//! client configuration that does it.
//!
//! rustls with the *ring* provider (pure Rust and assembly: no OpenSSL, no
//! libpq). Trusted roots are the URL's CA file when given, else the system's
//! store as `rustls-native-certs` finds it (`/etc/ssl/certs`, or
//! `SSL_CERT_FILE`/`SSL_CERT_DIR`; distroless images ship one), read only for
//! `verify-*` and only once. Every file the URL names is read when a
//! connection is made, never cached, so a rotated Kubernetes Secret is used
//! by the next connection without a restart.
//!
//! This module does not connect: `postgres` hands the configuration to
//! tokio-postgres; MySQL's driver (mysql_async) builds its own from the same
//! options (see `mysql`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::error::StoreError;

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Encryption only (libpq's `prefer`/`require`, MySQL's
    /// `PREFERRED`/`REQUIRED`): a certificate from anyone is accepted.
    Nothing,
    /// The chain up to a trusted root, not the name (`verify-ca`; MySQL's
    /// `VERIFY_CA` is refused, see `shared::url`).
    Chain,
    /// The chain and the host name of the URL (`verify-full`,
    /// `VERIFY_IDENTITY`).
    Full,
}

/// The files a URL names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Files {
    /// PEM file of trusted CAs; the system's store when absent.
    pub(crate) root: Option<PathBuf>,
    /// PEM client certificate (chain) and its key, for servers that ask;
    /// both or neither (the URL is refused otherwise).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls client configuration for one connection, reading `files` now.
pub(crate) fn client_config(
    verify: Verify,
    files: &Files,
) -> Result<rustls::ClientConfig, StoreError> {
    let provider = provider();
    let verifier = Arc::new(Verifier {
        webpki: match verify {
            Verify::Nothing => None,
            Verify::Chain | Verify::Full => Some(
                WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots(files.root.as_deref())?),
                    provider.clone(),
                )
                .build()
                .map_err(|e| StoreError::Tls(format!("cannot use the trusted CAs: {e}")))?,
            ),
        },
        check_name: verify == Verify::Full,
        provider: provider.clone(),
    });
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match &files.client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = certificates(cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| StoreError::Tls(format!("client certificate unusable: {e}")))
        }
    }
}

/// The trusted roots: the given PEM file, else the system's store.
fn roots(file: Option<&Path>) -> Result<RootCertStore, StoreError> {
    let mut store = RootCertStore::empty();
    match file {
        Some(path) => {
            let (added, _ignored) = store.add_parsable_certificates(certificates(path)?);
            if added == 0 {
                return Err(StoreError::Tls(format!(
                    "{}: no usable CA certificate in it",
                    path.display()
                )));
            }
        }
        None => {
            let found = system_roots();
            if found.is_empty() {
                return Err(StoreError::Tls(
                    "no CA file given and the system's CA store is empty or unreadable; \
                     name one (sslrootcert / ssl-ca)"
                        .into(),
                ));
            }
            store.add_parsable_certificates(found);
        }
    }
    Ok(store)
}

/// The system's trusted roots (DER), as OpenSSL would find them. Unreadable
/// entries are skipped: one bad file in `/etc/ssl/certs` must not stop the
/// rest from being used.
pub(crate) fn system_roots() -> Vec<CertificateDer<'static>> {
    // Read once: the image's store does not change under a running process
    // (a CA file named in the URL, a mounted Secret, is read at every
    // connect instead), and only `verify-*` asks for it at all.
    static SYSTEM: std::sync::OnceLock<Vec<CertificateDer<'static>>> = std::sync::OnceLock::new();
    SYSTEM
        .get_or_init(|| rustls_native_certs::load_native_certs().certs)
        .clone()
}

/// Every certificate in a PEM file.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(StoreError::Tls(format!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}

fn file_error(path: &Path, e: rustls::pki_types::pem::Error) -> StoreError {
    let why = match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item found".into(),
        other => format!("{other:?}"),
    };
    StoreError::Tls(format!("cannot read {}: {why}", path.display()))
}

/// webpki's verification, less what the mode leaves out. Handshake
/// signatures are always checked (they prove the server holds the key of the
/// certificate it sent, whatever is thought of the certificate).
#[derive(Debug)]
struct Verifier {
    /// `None`: any certificate (encryption only).
    webpki: Option<Arc<WebPkiServerVerifier>>,
    /// Whether a certificate for another name is refused.
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
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else {
            return Ok(ServerCertVerified::assertion());
        };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // webpki checks the chain before the name, so a name error means
            // the chain itself was good.
            Err(rustls::Error::InvalidCertificate(
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
