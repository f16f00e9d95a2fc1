//! Fenced writes (docs/integrating.md, "Fenced writes"): an app's own transaction, fenced
//! by `leaderd_fence`, commits only while its token leads; a takeover waits
//! for it (a named successor's take too), and a transaction that hangs
//! holds takeovers off for its bound only. Each case is an interleaving of
//! an app's transaction with leaderd's statements, run with real sessions:
//! leaderd's own statements (`leaderd_store`) for the leader and the
//! follower, a plain client for the app (`fence_interleavings.rs` runs the
//! main ones at every isolation level).

use std::time::{Duration, Instant};

use leaderd_store::{Attempt, Connection, FenceStatus, LeaseRequest, Release, Successor};
use leaderd_tests::sqlstate::{
    mysql as state, mysql_wait_expired, pg as code, pg_wait_expired as wait_expired,
};
use leaderd_tests::store::{acquire, connect, migrated};
use leaderd_tests::{pg_exec, TempDb};
use tokio_postgres::Client;

/// Long enough that a loaded machine renews in time; the hung-transaction
/// bound defaults to it.
const TTL: Duration = Duration::from_millis(800);

/// The fence's own SQLSTATE.
const FENCED_OUT: &str = "LF001";

fn req<'a>(instance: &'a str, held_token: Option<i64>) -> LeaseRequest<'a> {
    LeaseRequest {
        election: "e",
        holder: instance,
        instance,
        ttl: TTL,
        held_token,
        daemon: None,
        address: None,
    }
}

/// An app's session (autocommit until it says `BEGIN`).
async fn app(url: &str) -> Client {
    leaderd_tests::pg_session(url).await
}

/// A migrated database with the app's table, its leader `a` holding `e`:
/// the leader's connection and its token.
async fn led() -> (TempDb, Connection, i64) {
    let db = TempDb::postgres();
    let mut a = migrated(&db.url).await;
    pg_exec(
        &db.url,
        &[
            "CREATE TABLE app_log (seq BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL, \
           at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
        ],
    );
    let token = acquire(&mut a, &req("a", None), Duration::from_secs(3)).await;
    (db, a, token)
}

fn message<T>(r: &Result<T, tokio_postgres::Error>) -> String {
    match r {
        Ok(_) => String::new(),
        Err(e) => e
            .as_db_error()
            .map_or_else(|| e.to_string(), |d| d.message().to_owned()),
    }
}

/// How many rows the app wrote.
async fn logged(app: &Client) -> i64 {
    app.query_one("SELECT count(*) FROM app_log", &[])
        .await
        .unwrap()
        .get(0)
}

/// The fence with a bound above the tests' stalls (the default, the
/// lease's ttl, would end the idle transaction before the follower's
/// attempts).
const FENCE_10S: &str = "SELECT leaderd_fence('e', $1, interval '10 seconds')";

/// `BEGIN`, the fence (`fence` binds the token as `$1`), one row written:
/// the transaction left open.
async fn fence_and_log(app: &Client, fence: &str, token: i64) {
    app.batch_execute("BEGIN").await.unwrap();
    app.query_one(fence, &[&token]).await.unwrap();
    app.execute("INSERT INTO app_log (token) VALUES ($1)", &[&token])
        .await
        .unwrap();
}

/// Attempts with `req` (the follower's, or the named successor's) for
/// `for_`: none may be granted while a fenced transaction is open.
async fn refused_throughout(b: &mut Connection, req: &LeaseRequest<'_>, for_: Duration) -> usize {
    let until = Instant::now() + for_;
    let mut tries = 0;
    while Instant::now() < until {
        match b.acquire_or_renew(req).await.unwrap() {
            Attempt::Refused(_) => tries += 1,
            other => panic!(
                "a take by {} while a fenced transaction is open: {other:?}",
                req.holder
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tries
}

/// The leader `a`'s release of `e` naming the daemon [`HEIR`]
/// for a window longer than the tests' stalls.
fn release_to_heir() -> Release<'static> {
    Release {
        election: "e",
        instance: "a",
        successor: Some(Successor {
            daemon: HEIR,
            window: Duration::from_secs(5),
        }),
    }
}

/// The named successor's daemon instance.
const HEIR: &str = "0/heir";

/// `req` from the named successor's daemon.
fn heir_req() -> LeaseRequest<'static> {
    LeaseRequest {
        daemon: Some(HEIR),
        address: None,
        ..req("heir", None)
    }
}

#[tokio::test]
async fn a_stalled_fenced_transaction_holds_the_takeover_off_until_it_commits() {
    let (db, mut leader, token) = led().await;
    let app = app(&db.url).await;
    fence_and_log(&app, FENCE_10S, token).await;
    // The leader renews meanwhile (each renewal a new row version: the
    // fence's lock carries over to it)...
    for _ in 0..3 {
        assert_eq!(
            leader
                .acquire_or_renew(&req("a", Some(token)))
                .await
                .unwrap(),
            Attempt::Granted { token }
        );
    }
    // ...then the app stalls; its leader stops renewing (paused, cut off)
    // and the lease expires by the database's clock.
    let watcher = self::app(&db.url).await;
    wait_expired(&watcher).await;
    let mut b = connect(&db.url).await;
    let tries = refused_throughout(&mut b, &req("b", None), Duration::from_millis(600)).await;
    assert!(tries >= 5, "only {tries} attempts");
    app.batch_execute("COMMIT").await.unwrap();
    let taken = acquire(&mut b, &req("b", None), Duration::from_secs(2)).await;
    assert!(taken > token, "token {taken} after {token}");
    // In commit order the app's write comes first: the takeover's time is
    // after the write's.
    let row = watcher
        .query_one(
            "SELECT (SELECT max(at) FROM app_log) < acquired_at FROM service_leader_lock \
             WHERE name = 'e'",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0), "the takeover came before the write");
}

/// A graceful handover to a named successor is a takeover like any other
/// for the fence: a fenced transaction the leader's app opened before the
/// release holds the successor's take off (the window does not open the
/// row to it while the fence holds it), its write comes first in commit
/// order, and the old token is refused once the successor leads.
#[tokio::test]
async fn a_named_successor_waits_for_a_fenced_transaction_opened_before_the_release() {
    let (db, mut leader, token) = led().await;
    let app = app(&db.url).await;
    fence_and_log(&app, FENCE_10S, token).await;
    // The release itself does not wait for the app (its lock does not
    // conflict with the fence's).
    assert!(leader.release_one(&release_to_heir()).await.unwrap());
    let mut heir = connect(&db.url).await;
    let tries = refused_throughout(&mut heir, &heir_req(), Duration::from_millis(600)).await;
    assert!(tries >= 5, "only {tries} attempts");
    app.batch_execute("COMMIT").await.unwrap();
    let taken = acquire(&mut heir, &heir_req(), Duration::from_secs(2)).await;
    assert!(taken > token, "token {taken} after {token}");
    let watcher = self::app(&db.url).await;
    let row = watcher
        .query_one(
            "SELECT (SELECT max(at) FROM app_log) < acquired_at AND holder = 'heir' \
             FROM service_leader_lock WHERE name = 'e'",
            &[],
        )
        .await
        .unwrap();
    assert!(
        row.get::<_, bool>(0),
        "the successor's take came before the write"
    );
    app.batch_execute("BEGIN").await.unwrap();
    let stale = app
        .query_one("SELECT leaderd_fence('e', $1)", &[&token])
        .await;
    assert_eq!(code(&stale), FENCED_OUT, "{}", message(&stale));
    app.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_takeover_in_flight_makes_the_fence_wait_then_fail() {
    let (db, _leader, token) = led().await;
    // A takeover that has locked the row and not committed yet, of a lease
    // still live (forced, as an operator's UPDATE would: an expired one is
    // refused at the fence's first look, before any wait), so that the
    // fence's first look passes and its lock waits for the takeover's key.
    let takeover = app(&db.url).await;
    takeover.batch_execute("BEGIN").await.unwrap();
    takeover
        .batch_execute(
            "SELECT 1 FROM service_leader_lock WHERE name = 'e' FOR UPDATE; \
             UPDATE service_leader_lock SET token = token + 1, holder = 'b', instance = 'b', \
             acquired_at = now(), renewed_at = now(), expires_at = now() + interval '10 s' \
             WHERE name = 'e'",
        )
        .await
        .unwrap();
    let url = db.url.clone();
    let fenced = tokio::spawn(async move {
        let app = app(&url).await;
        app.batch_execute("BEGIN").await.unwrap();
        let r = app
            .query_one("SELECT leaderd_fence('e', $1)", &[&token])
            .await;
        (Instant::now(), code(&r), message(&r))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !fenced.is_finished(),
        "the fence did not wait for the takeover"
    );
    let committed = Instant::now();
    takeover.batch_execute("COMMIT").await.unwrap();
    let (answered, code, message) = fenced.await.unwrap();
    assert!(answered >= committed);
    assert_eq!(code, FENCED_OUT, "{message}");
    assert!(
        message.contains("\"e\"") && message.contains(&token.to_string()),
        "{message}"
    );
}

#[tokio::test]
async fn a_stale_token_is_refused() {
    let (db, _leader, token) = led().await;
    let app = app(&db.url).await;
    for stale in [token - 1, token + 1] {
        let r = app
            .query_one("SELECT leaderd_fence('e', $1)", &[&stale])
            .await;
        assert_eq!(code(&r), FENCED_OUT, "{}", message(&r));
        assert!(message(&r).contains(&format!("token {stale} is not the live lease")));
    }
    let r = app
        .query_one("SELECT leaderd_fence('nope', $1)", &[&token])
        .await;
    assert_eq!(code(&r), FENCED_OUT, "{}", message(&r));
    // The live token is not told to a caller who does not know it.
    let r = app
        .query_one("SELECT leaderd_fence('e', $1)", &[&(token - 1)])
        .await;
    assert!(!message(&r).contains(&token.to_string()), "{}", message(&r));
    // A row nobody holds (created, blocked for a ttl) fences nothing.
    let mut c = connect(&db.url).await;
    assert_eq!(
        c.acquire_or_renew(&LeaseRequest {
            election: "fresh",
            ..req("c", None)
        })
        .await
        .unwrap(),
        Attempt::Created
    );
    let fresh: i64 = app
        .query_one(
            "SELECT token FROM service_leader_lock WHERE name = 'fresh'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let r = app
        .query_one(
            "SELECT leaderd_fence('fresh', $1, interval '1 minute')",
            &[&fresh],
        )
        .await;
    assert_eq!(code(&r), FENCED_OUT, "an unheld row: {}", message(&r));
    // A temporary table of the lock table's name does not stand in for it
    // (temporary tables come first in a search_path that does not place
    // them).
    app.batch_execute(
        "CREATE TEMP TABLE service_leader_lock (name VARCHAR(100), holder VARCHAR(100), \
         instance VARCHAR(64), token BIGINT, acquired_at TIMESTAMPTZ, renewed_at TIMESTAMPTZ, \
         expires_at TIMESTAMPTZ); \
         INSERT INTO service_leader_lock VALUES ('e', 'x', 'x', 42, now(), now(), \
         now() + interval '1 hour')",
    )
    .await
    .unwrap();
    let r = app.query_one("SELECT leaderd_fence('e', 42)", &[]).await;
    assert_eq!(code(&r), FENCED_OUT, "a temporary table: {}", message(&r));
    let r = app
        .query_one("SELECT leaderd_fence('e', $1)", &[&token])
        .await;
    assert_eq!(code(&r), "ok", "{}", message(&r));
}

/// A fence outside a transaction block protects nothing (its lock ends
/// with its statement). Refused where the server lets the function tell:
/// the call alone in a simple-protocol query that began the transaction
/// (psql's `-c`, a script without BEGIN, a driver sending text). Accepted
/// after BEGIN, and in one query string behind it; the extended protocol in
/// autocommit cannot be told (docs/integrating.md says so).
#[tokio::test]
async fn a_fence_outside_a_transaction_block_is_refused_where_it_can_be_told() {
    let (db, _leader, token) = led().await;
    let app = app(&db.url).await;
    for sql in [
        format!("SELECT leaderd_fence('e', {token})"),
        format!("  select * from public.leaderd_fence('e', {token}, interval '1 second');  "),
        format!("/* a driver's comment */ SELECT leaderd_fence('e', {token})"),
        format!("-- a line comment\nSELECT 1, leaderd_fence('e', {token}) AS fenced"),
    ] {
        let r = app.simple_query(&sql).await;
        assert_eq!(code(&r), "LF004", "{sql}: {}", message(&r));
        assert!(message(&r).contains("not in a transaction block"));
    }
    let r = app
        .simple_query(&format!(
            "BEGIN; SELECT leaderd_fence('e', {token}); INSERT INTO app_log (token) VALUES ({token}); COMMIT"
        ))
        .await;
    assert_eq!(code(&r), "ok", "{}", message(&r));
    app.batch_execute("BEGIN").await.unwrap();
    let r = app
        .simple_query(&format!("SELECT leaderd_fence('e', {token})"))
        .await;
    assert_eq!(code(&r), "ok", "{}", message(&r));
    app.batch_execute("COMMIT").await.unwrap();
    assert_eq!(logged(&app).await, 1);
}

/// A bound the server's timeouts cannot hold (past 2^31 - 1 ms, about
/// 24.8 days) is refused with the fence's own message, not the server's
/// raw error about a setting.
#[tokio::test]
async fn a_bound_past_what_the_server_can_time_is_refused_by_name() {
    let (db, _leader, token) = led().await;
    let app = app(&db.url).await;
    for (bound, refused) in [("25 days", true), ("24 days", false)] {
        app.batch_execute("BEGIN").await.unwrap();
        let r = app
            .query_one(
                &format!("SELECT leaderd_fence('e', $1, interval '{bound}')"),
                &[&token],
            )
            .await;
        if refused {
            assert_eq!(code(&r), "22023", "{bound}: {}", message(&r));
            assert!(message(&r).contains("at most 24 days"), "{}", message(&r));
        } else {
            assert_eq!(code(&r), "ok", "{bound}: {}", message(&r));
        }
        app.batch_execute("ROLLBACK").await.unwrap();
    }
}

/// `now()` is the transaction's start: a fence judged by it would pass on a
/// lease that expired since.
#[tokio::test]
async fn an_expired_lease_is_refused_in_a_transaction_begun_before_it_expired() {
    let (db, _leader, token) = led().await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let app = app(&db.url).await;
        app.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let live = app
            .query_one(
                "SELECT expires_at > now() FROM service_leader_lock WHERE name = 'e'",
                &[],
            )
            .await
            .unwrap();
        if !live.get::<_, bool>(0) {
            // The lease has expired (the previous level's wait); the
            // case is the same from here.
            eprintln!("{level}: begun after expiry");
        }
        wait_expired(&app).await;
        let r = app
            .query_one("SELECT leaderd_fence('e', $1)", &[&token])
            .await;
        assert_eq!(code(&r), FENCED_OUT, "{level}: {}", message(&r));
        // Said as for a wrong token: the error tells nothing of the live one.
        assert!(
            message(&r).contains("is not the live lease"),
            "{}",
            message(&r)
        );
    }
}

#[tokio::test]
async fn every_isolation_level_fences_and_renewals_go_on() {
    let (db, mut leader, token) = led().await;
    for level in ["READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE"] {
        let app = app(&db.url).await;
        app.batch_execute(&format!("BEGIN ISOLATION LEVEL {level}"))
            .await
            .unwrap();
        let r = app
            .query_one("SELECT leaderd_fence('e', $1)", &[&token])
            .await;
        assert_eq!(code(&r), "ok", "{level}: {}", message(&r));
        // The leader renews while the fenced transaction is open.
        for _ in 0..3 {
            assert_eq!(
                leader
                    .acquire_or_renew(&req("a", Some(token)))
                    .await
                    .unwrap(),
                Attempt::Granted { token },
                "{level}: a renewal refused beside a fenced transaction"
            );
        }
        app.execute("INSERT INTO app_log (token) VALUES ($1)", &[&token])
            .await
            .unwrap();
        app.batch_execute("COMMIT").await.unwrap();
    }
    let watcher = app(&db.url).await;
    let n = logged(&watcher).await;
    assert_eq!(n, 3);
}

/// The app's role has rights on its own table only (not on the lock table),
/// and EXECUTE on the fence, granted (the migration revokes it from PUBLIC).
#[tokio::test]
async fn a_role_with_data_rights_only_can_fence() {
    let (db, _leader, token) = led().await;
    let app_role = leaderd_tests::PgRole::new(&db, "app");
    let role = &app_role.name;
    pg_exec(
        &db.url,
        &[
            &format!("GRANT SELECT, INSERT ON app_log TO {role}"),
            &format!("GRANT USAGE ON SEQUENCE app_log_seq_seq TO {role}"),
        ],
    );
    let app = app(&db.url_as(role)).await;
    let denied = app
        .query("SELECT 1 FROM service_leader_lock FOR KEY SHARE", &[])
        .await;
    assert_eq!(code(&denied), "42501", "{}", message(&denied));
    let denied = app
        .query_one("SELECT leaderd_fence('e', $1)", &[&token])
        .await;
    assert_eq!(code(&denied), "42501", "not granted: {}", message(&denied));
    pg_exec(
        &db.url,
        &[&format!(
            "GRANT EXECUTE ON FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) TO {role}"
        )],
    );
    assert_eq!(
        connect(&db.url_as(role))
            .await
            .fence_status()
            .await
            .unwrap(),
        FenceStatus::Installed,
        "as the app's role sees it"
    );
    app.batch_execute("BEGIN").await.unwrap();
    let r = app
        .query_one("SELECT leaderd_fence('e', $1)", &[&token])
        .await;
    assert_eq!(code(&r), "ok", "{}", message(&r));
    app.execute("INSERT INTO app_log (token) VALUES ($1)", &[&token])
        .await
        .unwrap();
    app.batch_execute("COMMIT").await.unwrap();
    let r = app
        .query_one("SELECT leaderd_fence('e', $1)", &[&(token - 1)])
        .await;
    assert_eq!(code(&r), FENCED_OUT, "{}", message(&r));
    drop(app);
    pg_exec(&db.url, &[&format!("DROP OWNED BY {role}")]);
    drop(db);
    pg_exec(
        &leaderd_tests::postgres_admin_url(),
        &[&format!("DROP ROLE IF EXISTS {role}")],
    );
}

/// `leaderd status` says whether the fence is installed, on stderr beside
/// the table and in each election's JSON: installed once migrated, not when
/// the function is gone, and SQLite's recipe on SQLite.
#[tokio::test]
async fn leaderd_status_says_whether_the_fence_is_installed() {
    use leaderd_tests::run_cli;
    let fence_of = |url: &str| {
        let (code, out, err) = run_cli(&["status", "--json", "--database-url", url], &[]);
        assert_eq!(code, 0, "{err}");
        let list: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        assert_eq!(list.len(), 1, "{out}");
        list[0]["fence"].as_str().unwrap_or_default().to_owned()
    };
    let (db, _leader, _) = led().await;
    assert_eq!(fence_of(&db.url), "installed");
    let (code, _, err) = run_cli(&["status", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("fenced writes"), "{err}");
    assert!(err.contains("installed"), "{err}");
    // The leader here is leaderd's statements alone, as an older release
    // would hold: no presence row, so it is named as one to upgrade before
    // apps fence.
    assert!(
        err.contains("holders without a presence row") && err.ends_with(": a\n"),
        "{err}"
    );
    let (_, out, _) = run_cli(&["status", "--json", "--database-url", &db.url], &[]);
    let list: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(list[0]["holder_predates_presence"], true, "{out}");
    pg_exec(&db.url, &["DROP FUNCTION leaderd_fence"]);
    assert_eq!(fence_of(&db.url), "not_installed");
    let sqlite = TempDb::sqlite();
    let mut a = migrated(&sqlite.url).await;
    acquire(&mut a, &req("a", None), Duration::from_secs(3)).await;
    assert_eq!(fence_of(&sqlite.url), "sqlite_recipe");
}

/// A fenced transaction left idle holds takeovers off for the bound (by
/// default the lease's ttl as the row shows it), then the server ends it:
/// its write is lost, never late.
#[tokio::test]
async fn an_idle_fenced_transaction_is_ended_after_its_bound() {
    let (db, _leader, token) = led().await;
    let app = app(&db.url).await;
    fence_and_log(&app, "SELECT leaderd_fence('e', $1)", token).await;
    let idle_since = Instant::now();
    let mut b = connect(&db.url).await;
    let taken = acquire(&mut b, &req("b", None), Duration::from_secs(5)).await;
    let waited = idle_since.elapsed();
    assert!(taken > token);
    // Not before the bound (the lease's 800 ms) and not much after it.
    assert!(
        waited >= TTL && waited < TTL + Duration::from_secs(2),
        "taken {waited:?} after the app went idle"
    );
    let commit = app.batch_execute("COMMIT").await;
    assert!(commit.is_err(), "the hung transaction committed late");
    let watcher = self::app(&db.url).await;
    let n = logged(&watcher).await;
    assert_eq!(n, 0, "the hung transaction's write landed");
}

/// A fenced transaction running one long statement is cut at its bound
/// (here given: 1 s): by statement_timeout from the statement's start, or
/// on PostgreSQL 17 and later by transaction_timeout from the
/// transaction's, which also ends the session.
#[tokio::test]
async fn a_running_fenced_transaction_is_ended_after_its_bound() {
    let (db, _leader, token) = led().await;
    let app = app(&db.url).await;
    let started = Instant::now();
    fence_and_log(
        &app,
        "SELECT leaderd_fence('e', $1, interval '1 second')",
        token,
    )
    .await;
    let url = db.url.clone();
    let follower = tokio::spawn(async move {
        let mut b = connect(&url).await;
        acquire(&mut b, &req("b", None), Duration::from_secs(6)).await;
        Instant::now()
    });
    let long = app.batch_execute("SELECT pg_sleep(30)").await;
    let cut = started.elapsed();
    assert!(
        ["57014", "25P04"].contains(&code(&long).as_str()),
        "{}",
        message(&long)
    );
    assert!(
        cut >= Duration::from_secs(1) && cut < Duration::from_secs(3),
        "cut after {cut:?}"
    );
    let taken_at = follower.await.unwrap();
    assert!(
        taken_at.duration_since(started) >= Duration::from_secs(1),
        "taken over while the fenced statement ran"
    );
    let _ = app.batch_execute("COMMIT").await;
    let n = logged(&self::app(&db.url).await).await;
    assert_eq!(n, 0, "the cut transaction's write landed");
}

/// The bound never lifts a shorter timeout the app set itself.
#[tokio::test]
async fn a_shorter_timeout_of_the_app_is_kept() {
    let (db, _leader, token) = led().await;
    let app = app(&db.url).await;
    app.batch_execute("BEGIN; SET LOCAL statement_timeout = '200ms'")
        .await
        .unwrap();
    app.query_one(
        "SELECT leaderd_fence('e', $1, interval '10 seconds')",
        &[&token],
    )
    .await
    .unwrap();
    let started = Instant::now();
    let r = app.batch_execute("SELECT pg_sleep(5)").await;
    assert_eq!(code(&r), "57014", "{}", message(&r));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Four workers run fenced 20 ms transactions back to back for 10 s while
/// the leader renews every 100 ms: no renewal is refused or Busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_never_busy_beside_fenced_transactions() {
    let (db, mut leader, token) = led().await;
    let until = Instant::now() + Duration::from_secs(10);
    let mut workers = Vec::new();
    for _ in 0..4 {
        let url = db.url.clone();
        workers.push(tokio::spawn(async move {
            let app = app(&url).await;
            let mut done = 0u32;
            while Instant::now() < until {
                app.batch_execute("BEGIN").await.unwrap();
                app.query_one("SELECT leaderd_fence('e', $1)", &[&token])
                    .await
                    .unwrap();
                app.execute(
                    "INSERT INTO app_log (token) SELECT $1 FROM pg_sleep(0.02)",
                    &[&token],
                )
                .await
                .unwrap();
                app.batch_execute("COMMIT").await.unwrap();
                done += 1;
            }
            done
        }));
    }
    renew_beside(&mut leader, token, until, workers).await;
}

/// The leader renews every 100 ms until `until` while `workers` run fenced
/// transactions (each answers how many it committed): every renewal granted,
/// and the workers kept busy.
async fn renew_beside(
    leader: &mut Connection,
    token: i64,
    until: Instant,
    workers: Vec<tokio::task::JoinHandle<u32>>,
) {
    let (mut renewed, mut not) = (0, Vec::new());
    while Instant::now() < until {
        match leader.acquire_or_renew(&req("a", Some(token))).await {
            Ok(Attempt::Granted { token: t }) if t == token => renewed += 1,
            other => not.push(format!("{other:?}")),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut fenced = 0;
    for w in workers {
        fenced += w.await.unwrap();
    }
    assert!(not.is_empty(), "renewals not granted: {not:?}");
    assert!(renewed >= 50, "{renewed} renewals");
    assert!(fenced >= 4 * 100, "only {fenced} fenced transactions");
    eprintln!("{renewed} renewals, {fenced} fenced transactions, 0 refused");
}

/// MariaDB (MySQL's statements are the same; MySQL 8 is not on this
/// machine): the fence row per election, written by triggers when the token
/// changes, read `LOCK IN SHARE MODE` by the procedure.
mod mariadb {
    use super::*;
    use mysql_async::prelude::Queryable;
    use mysql_async::Conn;

    async fn app(url: &str) -> Conn {
        Conn::from_url(url)
            .await
            .unwrap_or_else(|e| panic!("app cannot connect: {e}"))
    }

    fn said<T>(r: &Result<T, mysql_async::Error>) -> String {
        match r {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    async fn led() -> (TempDb, Connection, i64) {
        let db = TempDb::mysql();
        let mut a = migrated(&db.url).await;
        db.exec(&[
            "CREATE TABLE app_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, \
                   token BIGINT NOT NULL, at DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6))",
        ]);
        let token = acquire(&mut a, &req("a", None), Duration::from_secs(3)).await;
        (db, a, token)
    }

    async fn fence(
        app: &mut Conn,
        token: i64,
        bound_ms: Option<i64>,
    ) -> Result<(), mysql_async::Error> {
        app.exec_drop("CALL leaderd_fence('e', ?, ?)", (token, bound_ms))
            .await
    }

    /// An app's session with a transaction open: fenced with `token` (a
    /// bound above the tests' stalls) and one row written.
    async fn fenced_and_logged(url: &str, token: i64) -> Conn {
        let mut app = app(url).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        fence(&mut app, token, Some(10_000)).await.unwrap();
        app.exec_drop("INSERT INTO app_log (token) VALUES (?)", (token,))
            .await
            .unwrap();
        app
    }

    async fn count(url: &str) -> i64 {
        let mut c = app(url).await;
        c.query_first("SELECT COUNT(*) FROM app_log")
            .await
            .unwrap()
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_stalled_fenced_transaction_holds_single_and_batched_takeovers_off() {
        let (db, mut leader, token) = led().await;
        let mut app = fenced_and_logged(&db.url, token).await;
        for _ in 0..3 {
            assert_eq!(
                leader
                    .acquire_or_renew(&req("a", Some(token)))
                    .await
                    .unwrap(),
                Attempt::Granted { token },
                "a renewal refused beside a fenced transaction"
            );
        }
        let mut watcher = self::app(&db.url).await;
        mysql_wait_expired(&mut watcher).await;
        let mut b = connect(&db.url).await;
        let tries = refused_throughout(&mut b, &req("b", None), Duration::from_millis(400)).await;
        assert!(tries >= 3, "only {tries} attempts");
        // The batched take (several expired rows in one statement).
        let other = LeaseRequest {
            election: "other",
            ..req("b", None)
        };
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            let answers = b
                .acquire_or_renew_many(&[req("b", None), other])
                .await
                .unwrap();
            assert!(
                !matches!(answers[0], Ok(Attempt::Granted { .. })),
                "a batched takeover while fenced: {answers:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        app.query_drop("COMMIT").await.unwrap();
        let taken = acquire(&mut b, &req("b", None), Duration::from_secs(2)).await;
        assert!(taken > token);
        let first: Option<i64> = watcher
            .query_first(
                "SELECT (SELECT MAX(at) FROM app_log) < acquired_at FROM service_leader_lock \
                 WHERE name = 'e'",
            )
            .await
            .unwrap();
        assert_eq!(first, Some(1), "the takeover came before the write");
    }

    /// The named successor's take, as anyone's: held off by a fenced
    /// transaction opened before the release (its trigger cannot write the
    /// fence row), granted after the commit, with the write first.
    #[tokio::test]
    async fn a_named_successor_waits_for_a_fenced_transaction_opened_before_the_release() {
        let (db, mut leader, token) = led().await;
        let mut app = fenced_and_logged(&db.url, token).await;
        assert!(leader.release_one(&release_to_heir()).await.unwrap());
        let mut heir = connect(&db.url).await;
        let tries = refused_throughout(&mut heir, &heir_req(), Duration::from_millis(400)).await;
        assert!(tries >= 3, "only {tries} attempts");
        app.query_drop("COMMIT").await.unwrap();
        let taken = acquire(&mut heir, &heir_req(), Duration::from_secs(2)).await;
        assert!(taken > token);
        let mut watcher = self::app(&db.url).await;
        let first: Option<i64> = watcher
            .query_first(
                "SELECT (SELECT MAX(at) FROM app_log) < acquired_at AND holder = 'heir' \
                 FROM service_leader_lock WHERE name = 'e'",
            )
            .await
            .unwrap();
        assert_eq!(first, Some(1), "the successor's take came before the write");
    }

    #[tokio::test]
    async fn a_takeover_in_flight_makes_the_fence_fail() {
        let (db, _leader, token) = led().await;
        let mut takeover = app(&db.url).await;
        mysql_wait_expired(&mut takeover).await;
        takeover.query_drop("START TRANSACTION").await.unwrap();
        takeover
            .query_drop(
                "UPDATE service_leader_lock SET token = token + 1, holder = 'b', instance = 'b', \
                 acquired_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6), \
                 expires_at = UTC_TIMESTAMP(6) + INTERVAL 10 SECOND WHERE name = 'e'",
            )
            .await
            .unwrap();
        let url = db.url.clone();
        let fenced = tokio::spawn(async move {
            let mut app = app(&url).await;
            app.query_drop("START TRANSACTION").await.unwrap();
            let r = fence(&mut app, token, None).await;
            (Instant::now(), state(&r), said(&r))
        });
        // The lease it would fence has expired: refused at once, by the
        // plain reads, before any lock (PostgreSQL waits for the takeover).
        tokio::time::sleep(Duration::from_millis(300)).await;
        takeover.query_drop("COMMIT").await.unwrap();
        let (_, state, said) = fenced.await.unwrap();
        assert_eq!(state, FENCED_OUT, "{said}");
        assert!(said.contains(&token.to_string()), "{said}");
    }

    #[tokio::test]
    async fn stale_unheld_and_unknown_are_refused() {
        let (db, _leader, token) = led().await;
        let mut app = app(&db.url).await;
        for stale in [token - 1, token + 1] {
            app.query_drop("START TRANSACTION").await.unwrap();
            let r = fence(&mut app, stale, None).await;
            assert_eq!(state(&r), FENCED_OUT, "{}", said(&r));
            // Rolled back before the error: nothing of it is held.
            let open: Option<i64> = app.query_first("SELECT @@in_transaction").await.unwrap();
            assert_eq!(open, Some(0), "a refused call left its transaction open");
        }
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('nope', ?, NULL)", (token,))
            .await;
        assert_eq!(state(&r), FENCED_OUT, "{}", said(&r));
        let mut c = connect(&db.url).await;
        assert_eq!(
            c.acquire_or_renew(&LeaseRequest {
                election: "fresh",
                ..req("c", None)
            })
            .await
            .unwrap(),
            Attempt::Created
        );
        // A new transaction: this one's snapshot predates the new row.
        app.query_drop("ROLLBACK").await.unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        let fresh: i64 = app
            .query_first("SELECT token FROM service_leader_lock WHERE name = 'fresh'")
            .await
            .unwrap()
            .unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('fresh', ?, 60000)", (fresh,))
            .await;
        assert_eq!(state(&r), FENCED_OUT, "an unheld row: {}", said(&r));
        app.query_drop("START TRANSACTION").await.unwrap();
        assert_eq!(state(&fence(&mut app, token, None).await), "ok");
    }

    /// A refused call holds nothing (its transaction goes on after the
    /// error): no fence row, no gap of a missing name. And a call outside a
    /// transaction is refused (its lock would end with the CALL).
    #[tokio::test]
    async fn a_refused_or_autocommit_call_holds_no_takeover_off() {
        let (db, _leader, token) = led().await;
        let mut stale = app(&db.url).await;
        stale.query_drop("START TRANSACTION").await.unwrap();
        assert_eq!(state(&fence(&mut stale, token - 1, None).await), FENCED_OUT);
        stale.query_drop("START TRANSACTION").await.unwrap();
        let r = stale
            .exec_drop("CALL leaderd_fence('missing', ?, NULL)", (token,))
            .await;
        assert_eq!(state(&r), FENCED_OUT, "{}", said(&r));
        let mut auto = app(&db.url).await;
        let r = fence(&mut auto, token, Some(60_000)).await;
        assert_eq!(state(&r), "LF004", "{}", said(&r));
        // Both sessions stay open; a takeover and a create go through.
        let mut watcher = app(&db.url).await;
        mysql_wait_expired(&mut watcher).await;
        let mut b = connect(&db.url).await;
        let taken = acquire(&mut b, &req("b", None), Duration::from_secs(2)).await;
        assert!(taken > token);
        let r = b
            .acquire_or_renew(&LeaseRequest {
                election: "missinh",
                ..req("b", None)
            })
            .await;
        assert!(matches!(r, Ok(Attempt::Created)), "{r:?}");
        stale.query_drop("ROLLBACK").await.unwrap();
    }

    #[tokio::test]
    async fn an_expired_lease_is_refused_in_a_transaction_begun_before_it_expired() {
        let (db, _leader, token) = led().await;
        for level in ["READ COMMITTED", "REPEATABLE READ"] {
            let mut app = app(&db.url).await;
            app.query_drop(format!("SET TRANSACTION ISOLATION LEVEL {level}"))
                .await
                .unwrap();
            app.query_drop("START TRANSACTION").await.unwrap();
            // The snapshot is taken now (REPEATABLE READ), before expiry.
            let _: Option<i64> = app
                .query_first("SELECT token FROM service_leader_lock WHERE name = 'e'")
                .await
                .unwrap();
            mysql_wait_expired(&mut app).await;
            let r = fence(&mut app, token, None).await;
            assert_eq!(state(&r), FENCED_OUT, "{level}: {}", said(&r));
        }
    }

    #[tokio::test]
    async fn isolation_levels_work_or_are_refused_and_renewals_go_on() {
        let (db, mut leader, token) = led().await;
        for level in [
            "READ UNCOMMITTED",
            "READ COMMITTED",
            "REPEATABLE READ",
            "SERIALIZABLE",
        ] {
            let mut app = app(&db.url).await;
            // The session's level: one set for the next transaction only
            // cannot be seen by the fence (docs/integrating.md).
            app.query_drop(format!("SET SESSION TRANSACTION ISOLATION LEVEL {level}"))
                .await
                .unwrap();
            app.query_drop("START TRANSACTION").await.unwrap();
            let r = fence(&mut app, token, None).await;
            if level == "SERIALIZABLE" {
                assert_eq!(state(&r), "LF003", "{}", said(&r));
                assert!(said(&r).contains("SERIALIZABLE"), "{}", said(&r));
                continue;
            }
            assert_eq!(state(&r), "ok", "{level}: {}", said(&r));
            for _ in 0..3 {
                assert_eq!(
                    leader
                        .acquire_or_renew(&req("a", Some(token)))
                        .await
                        .unwrap(),
                    Attempt::Granted { token },
                    "{level}: a renewal refused beside a fenced transaction"
                );
            }
            app.exec_drop("INSERT INTO app_log (token) VALUES (?)", (token,))
                .await
                .unwrap();
            app.query_drop("COMMIT").await.unwrap();
        }
        assert_eq!(count(&db.url).await, 3);
    }

    /// A row deleted while fenced is not made again (its trigger writes the
    /// fence row) until the fenced transaction ends.
    #[tokio::test]
    async fn a_row_is_not_recreated_while_fenced() {
        let (db, _leader, token) = led().await;
        let mut app = app(&db.url).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        fence(&mut app, token, Some(10_000)).await.unwrap();
        db.exec(&["DELETE FROM service_leader_lock WHERE name = 'e'"]);
        let mut b = connect(&db.url).await;
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            let r = b.acquire_or_renew(&req("b", None)).await;
            assert!(
                matches!(r, Err(leaderd_store::StoreError::Busy)),
                "while fenced: {r:?}"
            );
            let r = b
                .acquire_or_renew_many(&[
                    req("b", None),
                    LeaseRequest {
                        election: "other",
                        ..req("b", None)
                    },
                ])
                .await
                .unwrap();
            assert!(
                matches!(r[0], Err(leaderd_store::StoreError::Busy)),
                "{r:?}"
            );
        }
        app.query_drop("COMMIT").await.unwrap();
        let taken = acquire(&mut b, &req("b", None), Duration::from_secs(3)).await;
        assert!(taken > token, "token {taken} after {token}");
    }

    #[tokio::test]
    async fn a_role_with_data_rights_only_can_fence() {
        let (db, _leader, token) = led().await;
        let user = format!(
            "leaderd_app_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let schema = db
            .url
            .rsplit('/')
            .next()
            .unwrap()
            .split('?')
            .next()
            .unwrap()
            .to_owned();
        leaderd_tests::mysql_exec(&format!("CREATE USER '{user}'@'%'"));
        leaderd_tests::mysql_exec(&format!(
            "GRANT SELECT, INSERT ON {schema}.app_log TO '{user}'@'%'"
        ));
        let url = db.url.replacen("root@", &format!("{user}@"), 1);
        let mut app = app(&url).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        let denied = fence(&mut app, token, None).await;
        assert!(state(&denied) != "ok", "no EXECUTE, yet: {}", said(&denied));
        leaderd_tests::mysql_exec(&format!(
            "GRANT EXECUTE ON PROCEDURE {schema}.leaderd_fence TO '{user}'@'%'"
        ));
        // Asked as the migrating user, it is installed; this user cannot
        // see the triggers (TRIGGER privilege), and says it cannot tell
        // (docs/integrating.md, "Is it installed?").
        assert_eq!(
            connect(&db.url).await.fence_status().await.unwrap(),
            FenceStatus::Installed
        );
        assert_eq!(
            connect(&url).await.fence_status().await.unwrap(),
            FenceStatus::NotVisible
        );
        let mut app = self::app(&url).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = fence(&mut app, token, None).await;
        assert_eq!(state(&r), "ok", "{}", said(&r));
        app.exec_drop("INSERT INTO app_log (token) VALUES (?)", (token,))
            .await
            .unwrap();
        app.query_drop("COMMIT").await.unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        assert_eq!(state(&fence(&mut app, token - 1, None).await), FENCED_OUT);
        app.query_drop("ROLLBACK").await.unwrap();
        drop(app);
        leaderd_tests::mysql_exec(&format!("DROP USER '{user}'@'%'"));
    }

    /// Left idle, a fenced transaction is ended after its bound (by default
    /// the lease's ttl, rounded up to whole seconds: MariaDB's idle timeout
    /// counts seconds), and its write is lost.
    #[tokio::test]
    async fn an_idle_fenced_transaction_is_ended_after_its_bound() {
        let (db, _leader, token) = led().await;
        let mut app = app(&db.url).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        fence(&mut app, token, None).await.unwrap();
        app.exec_drop("INSERT INTO app_log (token) VALUES (?)", (token,))
            .await
            .unwrap();
        let idle_since = Instant::now();
        let mut b = connect(&db.url).await;
        let taken = acquire(&mut b, &req("b", None), Duration::from_secs(5)).await;
        let waited = idle_since.elapsed();
        assert!(taken > token);
        assert!(
            waited >= TTL && waited < Duration::from_secs(3),
            "taken {waited:?} after the app went idle"
        );
        assert!(
            app.query_drop("COMMIT").await.is_err(),
            "the hung transaction committed late"
        );
        assert_eq!(
            count(&db.url).await,
            0,
            "the hung transaction's write landed"
        );
    }

    /// A server with binary logging refuses triggers to a user without
    /// SUPER (or `log_bin_trust_function_creators`): the migration goes on
    /// without them, election works, and the fence says it is not
    /// installed; never a silent pass.
    #[tokio::test]
    async fn without_triggers_the_fence_says_it_is_not_installed() {
        use leaderd_tests::mariadbserver::MariaDbServer;
        let server = MariaDbServer::start_with(&["--log-bin=binlog"]);
        let admin = server.admin_url();
        let mut root = app(&admin).await;
        root.query_drop("CREATE USER 'migrator'@'%'; GRANT ALL ON test.* TO 'migrator'@'%'")
            .await
            .unwrap();
        let url = server.url().replacen("root@", "migrator@", 1);
        // The triggers (the kept-tokens one and the fence's) are refused;
        // the migration goes on without them, and says so in the log.
        connect(&url)
            .await
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("cannot migrate: {e}"));
        let mut a = connect(&url).await;
        let token = acquire(&mut a, &req("a", None), Duration::from_secs(3)).await;
        let mut app = self::app(&url).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        // MariaDB's installation makes the procedure only once the
        // triggers are in: absent, never a silent pass (MySQL 8's
        // installs a stub that says "not installed", LF002).
        let r = fence(&mut app, token, None).await;
        assert!(
            matches!(&r, Err(mysql_async::Error::Server(e)) if e.code == 1305),
            "{}",
            said(&r)
        );
        assert_eq!(a.fence_status().await.unwrap(), FenceStatus::NotInstalled);
        let triggers = || async {
            let mut root = self::app(&admin).await;
            let n: Option<i64> = root
                .query_first(
                    "SELECT COUNT(*) FROM information_schema.triggers \
                     WHERE trigger_schema = 'test' AND event_object_table = 'service_leader_lock' \
                     AND trigger_name NOT LIKE 'service\\_leader\\_history%'",
                )
                .await
                .unwrap();
            n.unwrap_or(-1)
        };
        assert_eq!(triggers().await, 0);
        app.query_drop("ROLLBACK").await.unwrap();
        // A user who may (root) installs all three; the fence then works.
        connect(&server.url()).await.migrate().await.unwrap();
        assert_eq!(triggers().await, 3);
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = fence(&mut app, token, None).await;
        assert_eq!(state(&r), "ok", "{}", said(&r));
        app.query_drop("ROLLBACK").await.unwrap();
        // The kept-tokens trigger lost (as a database migrated by an
        // earlier version, whose step was refused, has it): the user who
        // may not make it migrates again and the fence stays as it is.
        root.query_drop("DROP TRIGGER test.service_leader_keep_token")
            .await
            .unwrap();
        connect(&url).await.migrate().await.unwrap();
        assert_eq!(triggers().await, 2);
        assert_eq!(a.fence_status().await.unwrap(), FenceStatus::Installed);
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = fence(&mut app, token, None).await;
        assert_eq!(state(&r), "ok", "the fence was replaced: {}", said(&r));
        app.query_drop("ROLLBACK").await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn renewals_are_never_busy_beside_fenced_transactions() {
        let (db, mut leader, token) = led().await;
        let until = Instant::now() + Duration::from_secs(10);
        let mut workers = Vec::new();
        for _ in 0..4 {
            let url = db.url.clone();
            workers.push(tokio::spawn(async move {
                let mut app = app(&url).await;
                let mut done = 0u32;
                while Instant::now() < until {
                    app.query_drop("START TRANSACTION").await.unwrap();
                    fence(&mut app, token, None).await.unwrap();
                    app.exec_drop(
                        "INSERT INTO app_log (token) SELECT ? FROM (SELECT SLEEP(0.02)) s",
                        (token,),
                    )
                    .await
                    .unwrap();
                    app.query_drop("COMMIT").await.unwrap();
                    done += 1;
                }
                done
            }));
        }
        renew_beside(&mut leader, token, until, workers).await;
    }
}

/// SQLite: no function in the database (it has no server); the documented
/// recipe (docs/integrating.md, "Fenced writes"): `BEGIN IMMEDIATE` (the write lock every
/// takeover needs), then a check of name, token, holder, boot id and the
/// boot clock, then the writes. Run here as an app would.
mod sqlite {
    use super::*;
    use diesel::connection::SimpleConnection;
    use diesel::{Connection as _, RunQueryDsl, SqliteConnection};

    #[derive(diesel::QueryableByName)]
    struct Live {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }

    /// The recipe's check, in the app's transaction: whether `token` is the
    /// live lease of `e` now.
    fn fenced(app: &mut SqliteConnection, token: i64) -> bool {
        let boot = leaderd_store::boot_id().unwrap();
        let now = i64::try_from(leaderd_store::boot_now().since_boot().as_micros()).unwrap();
        let live: Vec<Live> = diesel::sql_query(
            "SELECT COUNT(*) AS n FROM service_leader_lock WHERE name = 'e' AND token = ? \
             AND instance IS NOT NULL AND boot_id = ? AND expires_at > ?",
        )
        .bind::<diesel::sql_types::BigInt, _>(token)
        .bind::<diesel::sql_types::Text, _>(boot)
        .bind::<diesel::sql_types::BigInt, _>(now)
        .load(app)
        .unwrap();
        live[0].n == 1
    }

    fn app(db: &TempDb) -> SqliteConnection {
        let mut c = SqliteConnection::establish(db.url.trim_start_matches("sqlite://")).unwrap();
        c.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
        c
    }

    #[tokio::test]
    async fn the_recipe_holds_the_takeover_off_and_refuses_stale_and_expired() {
        let db = TempDb::sqlite();
        let mut leader = migrated(&db.url).await;
        let token = acquire(&mut leader, &req("a", None), Duration::from_secs(3)).await;
        let mut app = app(&db);
        app.batch_execute("CREATE TABLE app_log (token INTEGER NOT NULL)")
            .unwrap();
        app.batch_execute("BEGIN IMMEDIATE").unwrap();
        assert!(!fenced(&mut app, token - 1), "a stale token passed");
        assert!(fenced(&mut app, token), "the live token was refused");
        app.batch_execute(&format!("INSERT INTO app_log VALUES ({token})"))
            .unwrap();
        // The app stalls past the lease; no takeover while it holds the
        // write lock (the follower's statements wait 500 ms, then answer).
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        let mut b = connect(&db.url).await;
        let until = Instant::now() + Duration::from_millis(1200);
        while Instant::now() < until {
            let r = b.acquire_or_renew(&req("b", None)).await;
            assert!(
                !matches!(r, Ok(Attempt::Granted { .. })),
                "a takeover while the fenced transaction is open"
            );
        }
        app.batch_execute("COMMIT").unwrap();
        let taken = acquire(&mut b, &req("b", None), Duration::from_secs(3)).await;
        assert!(taken > token);
        // The old token, and the new one once expired, are refused.
        app.batch_execute("BEGIN IMMEDIATE").unwrap();
        assert!(!fenced(&mut app, token));
        assert!(fenced(&mut app, taken));
        app.batch_execute("COMMIT").unwrap();
        tokio::time::sleep(TTL + Duration::from_millis(100)).await;
        app.batch_execute("BEGIN IMMEDIATE").unwrap();
        assert!(!fenced(&mut app, taken), "an expired lease passed");
        app.batch_execute("ROLLBACK").unwrap();
    }
}
