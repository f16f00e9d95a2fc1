//! What a statement answered, as the fence's and the installed SQL's tests
//! compare it: "ok", or the server's SQLSTATE.

use std::time::{Duration, Instant};

/// The SQLSTATE of a failed PostgreSQL statement, or "ok".
pub fn pg<T>(r: &Result<T, tokio_postgres::Error>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => e
            .code()
            .map_or_else(|| format!("no code: {e}"), |c| c.code().to_owned()),
    }
}

/// The SQLSTATE of a failed MySQL/MariaDB statement, or "ok".
pub fn mysql<T>(r: &Result<T, mysql_async::Error>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(mysql_async::Error::Server(e)) => e.state.clone(),
        Err(e) => format!("not a server error: {e}"),
    }
}

/// Waits (5 s at most) until election `e`'s lease has expired by
/// PostgreSQL's clock.
pub async fn pg_wait_expired(c: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let row = c
            .query_one(
                "SELECT expires_at <= clock_timestamp() FROM service_leader_lock WHERE name = 'e'",
                &[],
            )
            .await
            .unwrap();
        if row.get::<_, bool>(0) {
            return;
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// [`pg_wait_expired`] on MySQL/MariaDB.
pub async fn mysql_wait_expired(c: &mut mysql_async::Conn) {
    use mysql_async::prelude::Queryable;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let expired: Option<i64> = c
            .query_first(
                "SELECT expires_at <= UTC_TIMESTAMP(6) FROM service_leader_lock WHERE name = 'e'",
            )
            .await
            .unwrap();
        if expired == Some(1) {
            return;
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
