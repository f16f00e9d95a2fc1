//! TLS to the database, end to end: the local PostgreSQL (TLS on, a
//! self-signed certificate for `localhost`) and a TLS-only MariaDB the test
//! starts with a CA it makes. The conformance suite over TLS is in
//! `store.rs`.

use std::time::Duration;

use leaderd_store::LeaseRequest;
use leaderd_tests::certs::{postgres_server_cert, TestCa};
use leaderd_tests::mariadbserver::MariaDbServer;
use leaderd_tests::store::{acquire, migrated, try_connect};
use leaderd_tests::{http_get, serial, wait_for, wait_single_leader, Daemon, Scratch, TempDb};

const WITHIN: Duration = Duration::from_secs(10);

/// Connects, migrates and wins the (fresh) election: the connection works.
async fn leads(url: &str) {
    let mut c = migrated(url).await;
    let req = LeaseRequest {
        election: "tls",
        holder: "a",
        instance: "ia",
        ttl: Duration::from_millis(200),
        held_token: None,
        daemon: None,
        address: None,
    };
    acquire(&mut c, &req, Duration::from_secs(3)).await;
}

/// `(application_name:ssl)` of every other session on the database.
fn sessions(db: &TempDb) -> String {
    db.scalar(
        "SELECT string_agg(DISTINCT a.application_name || ':' || s.ssl, ',') \
         FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()",
    )
}

/// `localhost` instead of `127.0.0.1`: the name in the server's certificate.
fn on_localhost(url: &str) -> String {
    url.replace("@127.0.0.1:", "@localhost:")
}

#[tokio::test]
async fn postgres_require_encrypts_and_names_the_session_leaderd() {
    let db = TempDb::postgres_with("sslmode=require");
    leads(&db.url).await;
    let c = try_connect(&db.url).await.unwrap();
    assert_eq!(sessions(&db), "leaderd:true");
    drop(c);
}

#[tokio::test]
async fn postgres_verify_full_with_the_servers_certificate() {
    let dir = Scratch::new();
    let cert = postgres_server_cert(&dir);
    let db = TempDb::postgres_with(&format!(
        "sslmode=verify-full&sslrootcert={}&application_name=tls-full",
        cert.display()
    ));
    let url = on_localhost(&db.url);
    leads(&url).await;
    let _c = try_connect(&url).await.unwrap();
    assert_eq!(sessions(&db), "tls-full:true");
    // verify-full checks the name: the certificate is not for 127.0.0.1.
    let err = try_connect(&db.url).await.unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
    // verify-ca does not.
    leads(&db.url.replace("verify-full", "verify-ca")).await;
}

#[tokio::test]
async fn postgres_wrong_ca_is_refused_and_says_why() {
    let ca = TestCa::new("wrong");
    let db = TempDb::postgres_with(&format!(
        "sslmode=verify-full&sslrootcert={}",
        ca.ca().display()
    ));
    let err = try_connect(&on_localhost(&db.url)).await.unwrap_err();
    assert!(
        err.contains("TLS") && err.contains("UnknownIssuer"),
        "{err}"
    );
    // A CA file that is not there is a clear error too, not plain text.
    let db = TempDb::postgres_with("sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem");
    let err = try_connect(&db.url).await.unwrap_err();
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}

/// A daemon that cannot verify the server never leads, says so once with
/// the cause, and `/readyz` is down.
#[test]
fn postgres_daemon_with_a_wrong_ca_never_leads() {
    let _serial = serial();
    let dir = Scratch::new();
    let ca = TestCa::new("wrong");
    let db = TempDb::postgres_with(&format!(
        "sslmode=verify-full&sslrootcert={}",
        ca.ca().display()
    ));
    let d = Daemon::start(&on_localhost(&db.url), "a", &dir, &[]);
    wait_for(WITHIN, "the TLS failure to be logged", || {
        d.log_text().contains("UnknownIssuer").then_some(())
    });
    // Several attempts later, still once.
    std::thread::sleep(Duration::from_millis(2500));
    let warned = d.logged("database attempt failed; retrying").len();
    assert_eq!(warned, 1, "{}", d.log_text());
    assert_eq!(d.leader().unwrap().0, 503);
    assert_eq!(http_get(d.port, "/readyz").unwrap().0, 503);
}

/// Three daemons over verified TLS: one leader.
#[test]
fn postgres_daemons_elect_over_verify_full() {
    let _serial = serial();
    let dir = Scratch::new();
    let cert = postgres_server_cert(&dir);
    let db = TempDb::postgres_with(&format!(
        "sslmode=verify-full&sslrootcert={}&application_name=tls-daemons",
        cert.display()
    ));
    let url = on_localhost(&db.url);
    let ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| Daemon::start(&url, id, &dir, &[]))
        .collect();
    wait_single_leader(&ds.iter().collect::<Vec<_>>(), WITHIN);
    assert_eq!(sessions(&db), "tls-daemons:true");
}

/// MariaDB with `--require-secure-transport=ON` and a certificate from a CA
/// the test makes.
#[test]
fn mariadb_tls_only() {
    let _serial = serial();
    let ca = TestCa::new("mariadb");
    let server = MariaDbServer::start_tls(&ca);
    let db = TempDb::mysql_on(&server.admin_url(), "");
    // The harness reaches the server on `localhost`; leaderd on either.
    let base = db.url.replace("@localhost:", "@127.0.0.1:");
    let local = on_localhost(&base);
    let with = |url: &str, params: &str| format!("{url}?{params}");
    let ca_file = ca.ca().display().to_string();
    let (b, l) = (base.clone(), local.clone());
    leaderd_tests::block_on(async move {
        let (base, local) = (b, l);
        // Plain text is refused by the server.
        let err = try_connect(&with(&base, "ssl-mode=DISABLED"))
            .await
            .unwrap_err();
        // (MariaDB answers "access denied" to a plain login it refuses for
        // want of TLS.)
        assert!(
            err.contains("insecure transport") || err.contains("Access denied"),
            "{err}"
        );
        // The default (PREFERRED) and REQUIRED encrypt without checking.
        leads(&base).await;
        leads(&with(&base, "ssl-mode=REQUIRED")).await;
        // VERIFY_IDENTITY with the CA, on the certificate's name.
        leads(&with(
            &local,
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca_file}"),
        ))
        .await;
        // Another name is refused.
        let err = try_connect(&with(
            &base,
            &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca_file}"),
        ))
        .await
        .unwrap_err();
        assert!(err.contains("not valid for name"), "{err}");
        // Another CA, or the system's store, does not know this one.
        let wrong = TestCa::new("wrong");
        for params in [
            format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", wrong.ca().display()),
            "ssl-mode=VERIFY_IDENTITY".to_owned(),
        ] {
            let err = try_connect(&with(&local, &params)).await.unwrap_err();
            assert!(err.contains("UnknownIssuer"), "{params}: {err}");
        }
    });
    // Daemons: REQUIRED and VERIFY_IDENTITY lead together.
    let dir = Scratch::new();
    let required = with(&base, "ssl-mode=REQUIRED");
    let verified = with(
        &local,
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca.ca().display()),
    );
    let a = Daemon::start(&required, "a", &dir, &[]);
    let b = Daemon::start(&verified, "b", &dir, &[]);
    let leader = wait_single_leader(&[&a, &b], WITHIN);
    // The follower is healthy too: no failed attempt.
    let follower = [&a, &b][1 - leader];
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !follower.log_text().contains("database attempt failed"),
        "{}",
        follower.log_text()
    );
}

/// A typo in a URL parameter is a configuration error (exit 2) naming it,
/// never a plain-text connection; the password stays hidden.
#[test]
fn a_bad_url_parameter_is_exit_2_naming_it() {
    for (url, named) in [
        (
            "postgres://u:s3cr3t@127.0.0.1/d?sslmode=requre",
            "sslmode=requre",
        ),
        (
            "postgres://u:s3cr3t@127.0.0.1/d?ssl_mode=require",
            "ssl_mode",
        ),
        (
            "mysql://u:s3cr3t@127.0.0.1/d?ssl-mode=REQUIRE",
            "ssl-mode=REQUIRE",
        ),
    ] {
        let (code, _, stderr) = leaderd_tests::run_cli(&["run", "--database-url", url], &[]);
        assert_eq!(code, 2, "{url}: {stderr}");
        assert!(stderr.contains(named), "{url}: {stderr}");
        assert!(!stderr.contains("s3cr3t"), "{stderr}");
    }
}

/// Against a server without TLS (the local MariaDB): `REQUIRED` is refused
/// and says why; the default (`PREFERRED`) connects in plain text.
#[tokio::test]
async fn mysql_required_against_a_server_without_tls_is_refused() {
    let db = TempDb::mysql();
    let err = try_connect(&format!("{}?ssl-mode=REQUIRED", db.url))
        .await
        .unwrap_err();
    assert!(
        err.contains("server does not have this capability"),
        "{err}"
    );
    leads(&db.url).await;
}

/// No TLS over a Unix socket, whatever `sslmode` says (as libpq): the server
/// offers none there, and the channel never leaves the host.
#[tokio::test]
async fn postgres_over_a_unix_socket_with_any_sslmode() {
    let db = TempDb::postgres();
    let name = db.url.rsplit('/').next().unwrap().to_owned();
    for mode in ["disable", "prefer", "require"] {
        let url = format!("postgres://postgres@%2Fvar%2Frun%2Fpostgresql/{name}?sslmode={mode}");
        leads(&url).await;
        let _open = try_connect(&url).await.unwrap();
        let over_socket = db.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND application_name = 'leaderd' AND client_addr IS NULL",
        );
        // Sessions of earlier rounds may still be closing.
        let n: u32 = over_socket.parse().unwrap();
        assert!(n >= 1, "{mode}: no session over the socket");
    }
}
