//! Throwaway certificate authorities and server certificates for the TLS
//! tests (rcgen, pure Rust), and the local PostgreSQL's own certificate.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

use crate::Scratch;

/// A CA whose certificate is `ca.pem` in its own scratch directory.
pub struct TestCa {
    pub dir: Scratch,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").field("dir", &self.dir).finish()
    }
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("leaderd test CA {name}"));
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA");
        let dir = Scratch::new();
        std::fs::write(dir.path("ca.pem"), issuer.pem()).expect("write ca.pem");
        TestCa { dir, issuer }
    }

    /// The CA's certificate (PEM file).
    pub fn ca(&self) -> PathBuf {
        self.dir.path("ca.pem")
    }

    /// Issues a certificate for `names` (DNS names or IP addresses), written
    /// as `<stem>.pem` and `<stem>.key`, readable by other users (the server
    /// may run as `mysql`). Returns (certificate, key).
    pub fn issue(&self, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("params");
        params.distinguished_name.push(
            DnType::CommonName,
            names.first().cloned().unwrap_or_default(),
        );
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (c, k) = (
            self.dir.path(&format!("{stem}.pem")),
            self.dir.path(&format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("write cert");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }
}

/// The local PostgreSQL's server certificate (self-signed, for `localhost`),
/// read through SQL as the superuser (the file itself may be readable only by
/// `postgres`), written to `dir`.
pub fn postgres_server_cert(dir: &Scratch) -> PathBuf {
    let db = crate::TempDb::postgres();
    let pem = db.scalar("pg_read_file(current_setting('ssl_cert_file'))");
    assert!(
        pem.contains("BEGIN CERTIFICATE"),
        "no server certificate: {pem}"
    );
    let path = dir.path("pg-server.pem");
    std::fs::write(&path, pem).expect("write server cert");
    path
}

/// [`postgres_server_cert`] once per test process, at a fixed path in the
/// temporary directory (rewritten, not accumulated, by each process).
pub fn postgres_server_cert_shared() -> &'static std::path::Path {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let scratch = Scratch::new();
        let fresh = postgres_server_cert(&scratch);
        let path = std::env::temp_dir().join("leaderd-test-postgres-server.pem");
        // A rename, so a concurrent test process never reads half a file.
        let tmp = std::env::temp_dir().join(format!(
            "leaderd-test-postgres-server.{}.pem",
            std::process::id()
        ));
        std::fs::copy(&fresh, &tmp).expect("copy server cert");
        std::fs::rename(&tmp, &path).expect("rename server cert");
        path
    })
}
