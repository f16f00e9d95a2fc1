//! Connections to the lock table through `leaderd_store` itself, for the
//! tests that drive the store without a daemon (the conformance suite, TLS).

use std::time::{Duration, Instant};

use leaderd_store::{Attempt, Connection, DatabaseUrl, LeaseRequest};

/// A connection to `url`, or why not (the URL's or the connect's error).
pub async fn try_connect(url: &str) -> Result<Connection, String> {
    let url = DatabaseUrl::parse(url).map_err(|e| e.to_string())?;
    Connection::connect(&url).await.map_err(|e| e.to_string())
}

/// A connection to `url`; panics naming why not.
pub async fn connect(url: &str) -> Connection {
    try_connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect: {e}"))
}

/// A connection to `url` once the table is migrated. A migration that
/// fails is tried once more on a new connection, as the daemon tries again
/// at its next connect: on MariaDB, right after a full CI run, a
/// migration's connection was closed under it ("connection closed") 3
/// times in about 40 runs of these tests; the cause was not found, and
/// the tests here are about the statements, not the link.
pub async fn migrated(url: &str) -> Connection {
    if let Err(e) = connect(url).await.migrate().await {
        eprintln!("migration failed, trying once more: {e}");
        connect(url)
            .await
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("cannot migrate: {e}"));
    }
    connect(url).await
}

/// Attempts until granted (the first attempt creates the row, blocked for one
/// ttl), failing after `within`; the token granted.
pub async fn acquire(conn: &mut Connection, r: &LeaseRequest<'_>, within: Duration) -> i64 {
    let deadline = Instant::now() + within;
    loop {
        match conn.acquire_or_renew(r).await.unwrap() {
            Attempt::Granted { token } => return token,
            other => assert!(
                Instant::now() < deadline,
                "not granted in {within:?}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
