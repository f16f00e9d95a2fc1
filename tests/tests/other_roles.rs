//! No other role of the database can turn leaderd against it. Tried as
//! the roles that meet leaderd's objects would: a role that may only
//! connect, or may create in a schema on the daemon's search_path (as
//! every role may in `public` on PostgreSQL 14 and earlier), plants
//! operators and functions for the daemon's own statements; the app's
//! role fences with a name of another collation; a role that may not
//! fence holds the election's advisory key of earlier versions; a fenced
//! transaction is prepared.

use std::time::{Duration, Instant};

use leaderd_store::{Attempt, LeaseRequest};
use leaderd_tests::pgserver::{oldest_bin, PgServer};
use leaderd_tests::store::{acquire, connect, migrated};
use leaderd_tests::traps::{gained, plant, sprung};
use leaderd_tests::{
    block_on, hand_over_by_sigterm, pg_exec, pg_session as session, print_logs, run_cli, serial,
    single_leader, try_wait_for, wait_for, wait_single_leader, Daemon, PgRole, Scratch, TempDb,
};

const EXCESS: &str = "more rights than it needs";

/// Two daemons at `url` elect; the leader's SIGTERM hands over; `leaderd
/// status` and `leaderd migrate` run there. Returns the daemons' logs.
fn elect_hand_over_and_inspect(url: &str, extra: &[&str]) -> Vec<String> {
    let dir = Scratch::new();
    let mut daemons: Vec<Daemon> = ["a", "b"]
        .iter()
        .map(|id| Daemon::start(url, id, &dir, extra))
        .collect();
    let first =
        try_wait_for(Duration::from_secs(20), || single_leader(&daemons)).unwrap_or_else(|| {
            print_logs(&daemons);
            panic!("no single leader at {url}")
        });
    let (leader, _) = hand_over_by_sigterm(&mut daemons, first);
    for args in [
        ["status", "--database-url", url],
        ["history", "--database-url", url],
        ["migrate", "--database-url", url],
    ] {
        let (code, _, err) = run_cli(&args, &[]);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    daemons.push(leader);
    daemons.iter().map(Daemon::log_text).collect()
}

/// The statements a SIGTERM handover does not run, at `url`: a release of
/// `election` naming a successor that is held off it, the read that shows
/// it named, and its giving up of its turn.
fn give_a_turn_up(url: &str, election: &'static str) {
    let url = url.to_owned();
    block_on(async move {
        let mut a = connect(&url).await;
        let mut d = connect(&url).await;
        let held = LeaseRequest {
            election,
            // A row made now is blocked for a ttl: a short one.
            ..req("ia", Duration::from_secs(1))
        };
        let token = acquire(&mut a, &held, Duration::from_secs(5)).await;
        let heir = leaderd_store::Successor {
            daemon: "0/d",
            window: Duration::from_secs(3),
        };
        let released = leaderd_store::Release {
            election,
            instance: "ia",
            successor: Some(heir),
        };
        assert!(a.release_one(&released).await.unwrap());
        let rows = d.elections(election).await.unwrap();
        assert_eq!(rows[0].successor.as_deref(), Some("0/d"));
        assert!(d.decline(election, "0/d", token).await.unwrap());
    });
}

/// The traps in `public` ran for nobody but their planter, who gained
/// nothing.
fn nothing_sprung(admin_url: &str, planter: &str) {
    let (url, planter) = (admin_url.to_owned(), planter.to_owned());
    block_on(async move {
        let admin = session(&url).await;
        let seen = sprung(&admin, "public").await;
        assert!(seen.is_empty(), "traps ran with others' rights: {seen:?}");
        assert_eq!(gained(&admin, &planter).await, None);
    });
}

/// Plants every trap in `public` of `url`'s database as `planter`.
fn plant_as(url: &str, planter: &str) {
    let (url, planter) = (url.to_owned(), planter.to_owned());
    block_on(async move {
        let s = session(&url).await;
        for sql in plant("public", &planter) {
            s.batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
    });
}

/// On the shared server (PostgreSQL 15), a role given CREATE on `public`
/// (every role's default before PostgreSQL 15) plants its traps before
/// leaderd ever runs. A superuser's daemons migrate, elect, hand over, and
/// the status and migrate commands run (the fence installed again, with
/// the traps there), and a named successor gives its turn up; then the
/// documented daemon role does the same. No
/// trap runs, and the planter gains nothing. The superuser's daemons say
/// they run with more rights than they need; the daemon role's do not.
#[test]
fn planted_operators_and_functions_run_for_nobody() {
    let _s = serial();
    let db = TempDb::postgres();
    let planter = PgRole::new(&db, "planter");
    db.exec(&[&format!(
        "GRANT CREATE ON SCHEMA public TO {}",
        planter.name
    )]);
    plant_as(&db.url_as(&planter.name), &planter.name);
    let logs = elect_hand_over_and_inspect(&db.url, &[]);
    give_a_turn_up(&db.url, "turn");
    nothing_sprung(&db.url, &planter.name);
    assert!(logs.iter().all(|l| l.contains(EXCESS)), "{logs:?}");

    let daemon = PgRole::new(&db, "daemon");
    db.exec(&[
        "DROP FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL)",
        &format!(
            "GRANT SELECT, INSERT, UPDATE ON service_leader_lock TO {}",
            daemon.name
        ),
        &format!(
            "GRANT USAGE ON SEQUENCE service_leader_lock_id_seq TO {}",
            daemon.name
        ),
        &format!("GRANT SELECT ON service_leader_history TO {}", daemon.name),
    ]);
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    let logs = elect_hand_over_and_inspect(&db.url_as(&daemon.name), &["--no-migrate"]);
    assert!(logs.iter().all(|l| !l.contains(EXCESS)), "{logs:?}");
    give_a_turn_up(&db.url_as(&daemon.name), "turn-2");
    nothing_sprung(&db.url, &planter.name);
}

/// A search_path that names `pg_catalog` after a schema another role may
/// create in (here set for the whole database): a type there named as a
/// built-in one (a domain `text`, `oid` or `timestamptz`, whose check runs its owner's
/// function as whoever checks a value) would be found first by a cast or a
/// declaration that does not name its schema. leaderd's migration, its
/// daemons, `status` and `history` run there as a superuser: the planter
/// gains nothing.
#[test]
fn types_named_as_built_in_ones_are_never_used() {
    let _s = serial();
    let db = TempDb::postgres();
    let planter = PgRole::new(&db, "planter");
    let p = &planter.name;
    db.exec(&[
        &format!("CREATE SCHEMA evil AUTHORIZATION {p}"),
        &format!(
            "ALTER DATABASE {} SET search_path = public, evil, pg_catalog",
            db.name()
        ),
    ]);
    pg_exec(
        &db.url_as(p),
        &[
            &format!(
                "CREATE FUNCTION evil.f(v pg_catalog.text) RETURNS pg_catalog.bool \
                 LANGUAGE plpgsql AS $$ BEGIN \
                 IF current_user OPERATOR(pg_catalog.<>) '{p}' THEN \
                   EXECUTE 'ALTER ROLE {p} SUPERUSER'; END IF; \
                 RETURN true; END $$"
            ),
            "CREATE DOMAIN evil.text AS pg_catalog.text CHECK (evil.f(VALUE))",
            "CREATE DOMAIN evil.oid AS pg_catalog.oid CHECK (evil.f(VALUE::pg_catalog.text))",
            "CREATE DOMAIN evil.timestamptz AS pg_catalog.timestamptz \
             CHECK (evil.f(VALUE::pg_catalog.text))",
        ],
    );
    elect_hand_over_and_inspect(&db.url, &[]);
    let (url, planter_name) = (db.url.clone(), p.clone());
    block_on(async move {
        let admin = session(&url).await;
        assert_eq!(gained(&admin, &planter_name).await, None);
    });
}

/// A lock table made (by an earlier version, or by hand) while such a
/// type was found first has a column of the planter's type: the
/// migration refuses it, and so does a daemon, naming the column.
#[test]
fn a_column_of_another_roles_type_is_refused() {
    let _s = serial();
    let db = TempDb::postgres();
    let planter = PgRole::new(&db, "planter");
    let p = &planter.name;
    db.exec(&[&format!("CREATE SCHEMA evil AUTHORIZATION {p}")]);
    pg_exec(
        &db.url_as(p),
        &["CREATE DOMAIN evil.timestamptz AS pg_catalog.timestamptz"],
    );
    db.exec(&[
        "SET search_path = public, evil, pg_catalog",
        "CREATE TABLE public.service_leader_lock (id BIGSERIAL PRIMARY KEY, \
           name VARCHAR(100) NOT NULL UNIQUE, holder VARCHAR(100), instance VARCHAR(64), \
           token BIGINT NOT NULL, acquired_at timestamptz, renewed_at timestamptz, \
           expires_at timestamptz NOT NULL)",
    ]);
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("made outside pg_catalog"), "{err}");
    let (code, _, err) = run_cli(&["status", "--database-url", &db.url], &[]);
    assert_ne!(code, 0, "{err}");
}

/// The same through PgBouncer in transaction pooling, where statements
/// are never prepared and each may run on another server connection.
#[test]
fn planted_operators_run_for_nobody_through_pgbouncer() {
    let _s = serial();
    let db = TempDb::postgres_through_pgbouncer(4);
    let planter = PgRole::new(&db, "planter");
    db.exec(&[&format!(
        "GRANT CREATE ON SCHEMA public TO {}",
        planter.name
    )]);
    plant_as(&db.direct_url_as(&planter.name), &planter.name);
    elect_hand_over_and_inspect(&db.url, &[]);
    nothing_sprung(&db.direct_url_as("postgres"), &planter.name);
}

/// On the oldest server leaderd supports (PostgreSQL 12), where every role
/// may create in `public`: a role with nothing granted plants its traps in
/// the database of a role that owns it, and in one a superuser owns; the
/// owner's daemons (the app's URL, as a shared server's set-up often has
/// it) and the superuser's elect and hand over there. Nothing runs, and
/// they lead. (A superuser's leaderd uses no tables another role owns, so
/// each has a database of its own.)
#[test]
fn planted_operators_run_for_nobody_on_the_oldest_server() {
    let _s = serial();
    let Some(bin) = oldest_bin() else {
        assert!(
            std::env::var_os("LEADERD_TEST_REQUIRE_OLDEST").is_none(),
            "no PostgreSQL 12: scripts/old-postgres installs it"
        );
        eprintln!("skipped: no PostgreSQL 12 (scripts/old-postgres installs it)");
        return;
    };
    let server = PgServer::start_with(bin, &[]);
    assert!(server.version().contains(" 12."), "{}", server.version());
    let at = |role: &str, db: &str| format!("postgres://{role}@127.0.0.1:{}/{db}", server.port);
    pg_exec(
        &server.url(),
        &[
            "CREATE ROLE owner LOGIN",
            "CREATE ROLE planter LOGIN",
            "CREATE DATABASE app OWNER owner",
            "CREATE DATABASE ops",
        ],
    );
    plant_as(&at("planter", "app"), "planter");
    plant_as(&at("planter", "ops"), "planter");
    let logs = elect_hand_over_and_inspect(&at("owner", "app"), &[]);
    // The owner may create in `public` (everyone may, there).
    assert!(logs.iter().all(|l| l.contains(EXCESS)), "{logs:?}");
    nothing_sprung(&at("postgres", "app"), "planter");
    elect_hand_over_and_inspect(&at("postgres", "ops"), &[]);
    nothing_sprung(&at("postgres", "ops"), "planter");
}

fn req<'a>(instance: &'a str, ttl: Duration) -> LeaseRequest<'a> {
    LeaseRequest {
        election: "e1",
        holder: instance,
        instance,
        ttl,
        held_token: None,
        daemon: None,
        address: None,
    }
}

/// Attempts `r` until `within` has passed or it is granted.
async fn granted_within(
    conn: &mut leaderd_store::Connection,
    r: &LeaseRequest<'_>,
    within: Duration,
) -> Option<i64> {
    let until = Instant::now() + within;
    loop {
        if let Attempt::Granted { token } = conn.acquire_or_renew(r).await.unwrap() {
            return Some(token);
        }
        if Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `election`'s lease has expired by the database's clock.
async fn wait_expired(c: &tokio_postgres::Client, election: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = c
            .query_one(
                "SELECT expires_at <= clock_timestamp() FROM service_leader_lock WHERE name = $1",
                &[&election],
            )
            .await
            .unwrap();
        if row.get::<_, bool>(0) {
            return;
        }
        assert!(Instant::now() < deadline, "{election} never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The SQLSTATE of a failed call, or "ok".
fn state<T>(r: &Result<T, tokio_postgres::Error>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => e
            .code()
            .map_or_else(|| e.to_string(), |c| c.code().to_owned()),
    }
}

/// The app passes the election's name with a case-insensitive collation
/// (a column of that collation, or an explicit COLLATE). The name is
/// compared byte by byte: `E1` is not `e1`. And `e1` so collated holds the
/// takeover off like any fence: the key is the name's bytes' hash, so the
/// takeover cannot go on while the fenced transaction is open, and the
/// write commits before it, never after.
#[tokio::test]
async fn a_name_of_another_collation_fences_the_same_election() {
    let db = TempDb::postgres();
    let ttl = Duration::from_millis(800);
    let mut a = migrated(&db.url).await;
    let token = acquire(&mut a, &req("a", ttl), Duration::from_secs(3)).await;
    let app = session(&db.url).await;
    app.batch_execute(
        "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false); \
         CREATE TABLE app_log (token BIGINT, at TIMESTAMPTZ DEFAULT clock_timestamp())",
    )
    .await
    .unwrap();
    app.batch_execute("BEGIN").await.unwrap();
    let other = app
        .query_one("SELECT leaderd_fence('E1' COLLATE ci, $1)", &[&token])
        .await;
    assert_eq!(state(&other), "LF001", "E1 was taken for e1");
    app.batch_execute("ROLLBACK; BEGIN").await.unwrap();
    app.query_one(
        "SELECT leaderd_fence('e1' COLLATE ci, $1, interval '20 seconds')",
        &[&token],
    )
    .await
    .expect("the live token, the name collated");
    app.execute("INSERT INTO app_log (token) VALUES ($1)", &[&token])
        .await
        .unwrap();
    // The leader stops renewing; its lease runs out while the app's
    // transaction is open.
    drop(a);
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    let mut b = connect(&db.url).await;
    let early = granted_within(&mut b, &req("b", ttl), Duration::from_millis(800)).await;
    assert_eq!(
        early, None,
        "taken over while the fenced transaction was open"
    );
    app.batch_execute("COMMIT")
        .await
        .expect("the fenced write commits");
    let taken = granted_within(&mut b, &req("b", ttl), Duration::from_secs(3))
        .await
        .expect("taken over once the transaction ended");
    assert!(taken > token);
    let admin = session(&db.url).await;
    let late: i64 = admin
        .query_one(
            "SELECT count(*) FROM app_log WHERE at >= \
             (SELECT acquired_at FROM service_leader_lock WHERE name = 'e1')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(late, 0, "a fenced write committed after the takeover");
}

/// The advisory key of an election that versions 4 and 5 of the fence held
/// (read as the owner: the seed is its alone).
async fn key_of(admin: &tokio_postgres::Client, election: &str) -> i64 {
    admin
        .query_one(
            "SELECT hashtextextended($1::text COLLATE \"C\", \
             (SELECT min(seed) FROM service_leader_fence_key))",
            &[&election],
        )
        .await
        .unwrap()
        .get(0)
}

/// A role that may only connect keeps the advisory key earlier versions
/// of the fence held (even knowing the seed, which it may not read), at
/// session level, shared and exclusively, and tries the gate: it may not
/// read or lock it. The leader stops renewing: the takeover comes within
/// a lease of the expiry. A fenced transaction waits for a takeover that
/// holds the gate (only the owner's functions can) no longer than its
/// bound, then fails with LF011.
#[tokio::test]
async fn a_role_that_may_only_connect_holds_no_takeover_off() {
    let db = TempDb::postgres();
    let ttl = Duration::from_millis(800);
    let squatter = PgRole::new(&db, "squatter");
    let app_role = PgRole::new(&db, "app");
    let mut a = migrated(&db.url).await;
    db.exec(&[&format!(
        "GRANT EXECUTE ON FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) TO {}",
        app_role.name
    )]);
    let token = acquire(&mut a, &req("a", ttl), Duration::from_secs(3)).await;
    let app = session(&db.url_as(&app_role.name)).await;
    let sq = session(&db.url_as(&squatter.name)).await;
    let admin = session(&db.url).await;
    let key = key_of(&admin, "e1").await;
    sq.query_one("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    // A fenced write goes on beside it.
    app.batch_execute("BEGIN").await.unwrap();
    app.query_one("SELECT leaderd_fence('e1', $1)", &[&token])
        .await
        .unwrap();
    app.batch_execute("COMMIT").await.unwrap();
    drop(a);
    wait_expired(&admin, "e1").await;
    let mut b = connect(&db.url).await;
    let taken = granted_within(&mut b, &req("b", ttl), ttl)
        .await
        .expect("not taken within a lease of the expiry");
    assert!(taken > token);
    let gate = sq
        .query("SELECT 1 FROM service_leader_fence_gate FOR KEY SHARE", &[])
        .await;
    assert_eq!(state(&gate), "42501", "{gate:?}");
    // A takeover holding the gate (the owner, by hand) makes a fence wait
    // for its bound at most.
    admin
        .batch_execute(
            "BEGIN; SELECT 1 FROM service_leader_fence_gate WHERE name = 'e1' FOR UPDATE",
        )
        .await
        .unwrap();
    app.batch_execute("BEGIN").await.unwrap();
    let started = Instant::now();
    let r = app
        .query_one(
            "SELECT leaderd_fence('e1', $1, interval '300 milliseconds')",
            &[&taken],
        )
        .await;
    assert_eq!(state(&r), "LF011", "{r:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    app.batch_execute("ROLLBACK").await.unwrap();
    admin.batch_execute("ROLLBACK").await.unwrap();
}

/// The app's role fences and then lifts its own timeouts (`SET LOCAL`),
/// keeping its transaction open past any bound. The takeover waits for
/// it, as for any fenced transaction; the daemon that would take over logs
/// a WARN naming the session's pid and role once it has waited longer
/// than a lease, and counts it; when the transaction ends, the daemon
/// leads.
#[test]
fn a_takeover_held_off_past_a_lease_is_named_in_a_warning() {
    let _s = serial();
    let db = TempDb::postgres();
    let app_role = PgRole::new(&db, "lingerer");
    let dir = Scratch::new();
    let a = Daemon::start(&db.url, "a", &dir, &[]);
    wait_for(Duration::from_secs(20), "a leads", || {
        a.is_leader().then_some(())
    });
    db.exec(&[&format!(
        "GRANT EXECUTE ON FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) TO {}",
        app_role.name
    )]);
    // The session lives as long as this runtime.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (pid, holder) = rt.block_on({
        let app_url = db.url_as(&app_role.name);
        let token: i64 = db
            .scalar("SELECT token FROM service_leader_lock WHERE name = 'default'")
            .parse()
            .unwrap();
        async move {
            let app = session(&app_url).await;
            app.batch_execute("BEGIN").await.unwrap();
            app.query_one("SELECT leaderd_fence('default', $1)", &[&token])
                .await
                .unwrap();
            app.batch_execute(
                "SET LOCAL statement_timeout = 0; \
                 SET LOCAL idle_in_transaction_session_timeout = 0",
            )
            .await
            .unwrap();
            let pid: i32 = app
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .unwrap()
                .get(0);
            (pid, app)
        }
    });
    a.sigkill();
    let b = Daemon::start(&db.url, "b", &dir, &[]);
    let warned = wait_for(Duration::from_secs(15), "b's warning", || {
        b.log_events().into_iter().find(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("a takeover is held off"))
        })
    });
    let said = warned.to_string();
    assert!(said.contains(&format!("pid {pid}")), "{said}");
    assert!(said.contains(&app_role.name), "{said}");
    assert!(!b.is_leader());
    let metrics = leaderd_tests::http_get(b.port, "/metrics").unwrap().1;
    assert!(
        metrics.contains("\nleaderd_takeovers_held_off_total 1\n"),
        "{metrics}"
    );
    rt.block_on(holder.batch_execute("COMMIT")).unwrap();
    wait_for(Duration::from_secs(10), "b leads", || {
        b.is_leader().then_some(())
    });
    drop(rt);
}

/// A fenced transaction cannot be prepared (two-phase): a prepared one
/// would keep the key, and the election's takeovers off, past any bound
/// until someone resolved it. On a server that allows prepared
/// transactions, PREPARE TRANSACTION after the fence is refused, and
/// nothing is left prepared.
#[test]
fn a_fenced_transaction_cannot_be_prepared() {
    let _s = serial();
    let server = PgServer::start_with(
        leaderd_tests::pgserver::newest_bin(),
        &[("max_prepared_transactions", "4")],
    );
    let url = server.url();
    block_on(async move {
        let mut a = migrated(&url).await;
        let token = acquire(
            &mut a,
            &req("a", Duration::from_secs(5)),
            Duration::from_secs(10),
        )
        .await;
        let app = session(&url).await;
        app.batch_execute("CREATE TABLE app_log (token BIGINT)")
            .await
            .unwrap();
        // Two-phase works here without the fence.
        app.batch_execute("BEGIN; INSERT INTO app_log VALUES (0); PREPARE TRANSACTION 'plain'")
            .await
            .unwrap();
        app.batch_execute("COMMIT PREPARED 'plain'").await.unwrap();
        app.batch_execute("BEGIN").await.unwrap();
        app.query_one("SELECT leaderd_fence('e1', $1)", &[&token])
            .await
            .unwrap();
        app.execute("INSERT INTO app_log VALUES ($1)", &[&token])
            .await
            .unwrap();
        let r = app.batch_execute("PREPARE TRANSACTION 'fenced'").await;
        let e = r.expect_err("a fenced transaction was prepared");
        assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{e}");
        let _ = app.batch_execute("ROLLBACK").await;
        let prepared: i64 = app
            .query_one("SELECT count(*) FROM pg_prepared_xacts", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(prepared, 0);
        // A prepared transaction holding the advisory key of earlier
        // versions (anyone who may connect can make one) holds nothing off.
        let key = key_of(&app, "e1").await;
        app.batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({key}); PREPARE TRANSACTION 'squat'"
        ))
        .await
        .unwrap();
        drop(a);
        let mut b = connect(&url).await;
        let ttl = Duration::from_secs(5);
        wait_expired(&app, "e1").await;
        let taken = granted_within(&mut b, &req("b", ttl), Duration::from_millis(500)).await;
        assert!(
            taken.is_some_and(|t| t > token),
            "held off by a prepared transaction holding the key"
        );
        app.batch_execute("ROLLBACK PREPARED 'squat'")
            .await
            .unwrap();
    });
}

/// Whoever may write a row (the daemon's role) chooses its name, holder
/// and address. `leaderd status` shows each control character escaped: no
/// escape sequence reaches the terminal, and no row forges another line.
#[test]
fn status_shows_what_rows_say_escaped() {
    let db = TempDb::postgres();
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    db.exec(&["INSERT INTO service_leader_lock \
         (name, holder, instance, token, expires_at, address, address_instance) VALUES \
         (E'x\\x1b[2Jy', E'h\\x1b]0;title\\x07', 'i', 1, now() + interval '1 hour', \
          E'a\\r\\nfake                           row', 'i')"]);
    let (code, out, err) = run_cli(&["status", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.chars()
            .chain(err.chars())
            .any(|c| c.is_control() && c != '\n'),
        "{out:?} {err:?}"
    );
    assert_eq!(out.lines().count(), 2, "the header and one row: {out}");
    assert!(out.contains("x\\u{1b}[2Jy"), "{out}");
    assert!(out.contains("a\\r\\nfake"), "{out}");
}

/// Index and sequential scans of the lock table so far (the server's
/// statistics, flushed by each backend about once a second).
async fn lock_table_reads(admin: &tokio_postgres::Client) -> i64 {
    admin
        .query_one(
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables \
             WHERE relname = 'service_leader_lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Any role that may connect may `NOTIFY leaderd, 'default'`, as often as
/// it likes. A follower asks for the row at most once per 50 ms whatever
/// arrives (an attempt is three or four index reads): its database's
/// lock-table reads (only leaderd's daemons use this database) with 500
/// notifications a second stay within 120 a second of its quiet rate
/// (each notification cost about three before).
#[test]
fn a_flood_of_release_notifications_costs_a_bounded_rate_of_reads() {
    let _s = serial();
    let db = TempDb::postgres();
    let stranger = PgRole::new(&db, "stranger");
    let dir = Scratch::new();
    let daemons: Vec<Daemon> = ["a", "b"]
        .iter()
        .map(|id| Daemon::start(&db.url, id, &dir, &[]))
        .collect();
    let refs: Vec<&Daemon> = daemons.iter().collect();
    wait_single_leader(&refs, Duration::from_secs(20));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let window = Duration::from_secs(5);
    let per_second = |reads: i64| reads as f64 / window.as_secs_f64();
    let (quiet, flooded, sent) = rt.block_on(async {
        let admin = session(&db.url).await;
        let sender = session(&db.url_as(&stranger.name)).await;
        // The daemons settle (the follower has seen the lease, the
        // presence rows exist), then a quiet window, then a flooded one.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let settle = Duration::from_millis(1500);
        let r0 = lock_table_reads(&admin).await;
        tokio::time::sleep(window).await;
        tokio::time::sleep(settle).await;
        let r1 = lock_table_reads(&admin).await;
        let started = Instant::now();
        let mut sent = 0u32;
        while started.elapsed() < window {
            sender
                .batch_execute("NOTIFY leaderd, 'default'")
                .await
                .unwrap();
            sent += 1;
            let next = started + Duration::from_millis(2) * sent;
            tokio::time::sleep_until(next.into()).await;
        }
        tokio::time::sleep(settle).await;
        let r2 = lock_table_reads(&admin).await;
        (r1 - r0, r2 - r1, sent)
    });
    // The quiet window's count includes the settle pause after it, as the
    // flooded one's does.
    let (quiet, flooded) = (per_second(quiet), per_second(flooded));
    eprintln!(
        "lock-table reads a second: {quiet:.0} quiet, {flooded:.0} with {sent} notifications"
    );
    assert!(sent >= 2000, "sent only {sent} notifications");
    assert!(
        flooded <= quiet + 120.0,
        "{flooded:.0} reads a second with {sent} notifications in {window:?}, \
         {quiet:.0} quiet"
    );
    assert!(single_leader(&daemons).is_some());
}

/// Before leaderd is installed, a role that may create in `public` (any
/// role, before PostgreSQL 15) makes what looks like a current
/// installation: the table with every column, triggers of leaderd's names
/// calling its own function, and a fence of the right version that passes
/// everything. Connected as the database's owner, `leaderd migrate`
/// refuses it, a daemon (with or without migrating) never uses it, and the
/// planter's code never runs.
#[test]
fn an_installation_made_by_another_role_is_never_used() {
    let _s = serial();
    let db = TempDb::postgres();
    let owner = PgRole::new(&db, "owner");
    let planter = PgRole::new(&db, "planter");
    db.exec(&[
        &format!("ALTER DATABASE {} OWNER TO {}", db.name(), owner.name),
        &format!("GRANT CREATE ON SCHEMA public TO {}", planter.name),
    ]);
    let fake = [
        "CREATE TABLE public.spied (who TEXT, what TEXT)",
        "GRANT INSERT ON public.spied TO PUBLIC",
        "CREATE FUNCTION public.spy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         INSERT INTO public.spied VALUES (current_user, TG_NAME); \
         RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END; END $$",
        "CREATE TABLE public.service_leader_lock (id BIGSERIAL PRIMARY KEY, \
         name VARCHAR(100) NOT NULL UNIQUE, holder VARCHAR(100), instance VARCHAR(64), \
         token BIGINT NOT NULL, acquired_at TIMESTAMPTZ, renewed_at TIMESTAMPTZ, \
         expires_at TIMESTAMPTZ NOT NULL, successor VARCHAR(64), address VARCHAR(255), \
         address_instance VARCHAR(64))",
        "GRANT ALL ON public.service_leader_lock TO PUBLIC",
        "GRANT ALL ON SEQUENCE public.service_leader_lock_id_seq TO PUBLIC",
        "CREATE TRIGGER service_leader_keep_token AFTER DELETE ON public.service_leader_lock \
         FOR EACH ROW EXECUTE FUNCTION public.spy()",
        "CREATE TRIGGER service_leader_take BEFORE UPDATE ON public.service_leader_lock \
         FOR EACH ROW EXECUTE FUNCTION public.spy()",
        "CREATE TRIGGER service_leader_take_new BEFORE INSERT ON public.service_leader_lock \
         FOR EACH ROW EXECUTE FUNCTION public.spy()",
        "CREATE FUNCTION public.leaderd_fence(election VARCHAR, token BIGINT, \
         bound INTERVAL DEFAULT NULL) RETURNS BIGINT LANGUAGE sql AS 'SELECT token'",
        "COMMENT ON FUNCTION public.leaderd_fence(VARCHAR, BIGINT, INTERVAL) IS 'leaderd fence 6'",
        "GRANT EXECUTE ON FUNCTION public.leaderd_fence(VARCHAR, BIGINT, INTERVAL) TO PUBLIC",
    ];
    pg_exec(&db.url_as(&planter.name), &fake);
    let as_owner = db.url_as(&owner.name);
    let (code, _, err) = run_cli(&["migrate", "--database-url", &as_owner], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unsafe database"), "{err}");
    let dir = Scratch::new();
    let daemons = [
        Daemon::start(&as_owner, "a", &dir, &["--no-migrate"]),
        Daemon::start(&as_owner, "b", &dir, &[]),
    ];
    for d in &daemons {
        wait_for(Duration::from_secs(10), "the daemon to refuse", || {
            d.log_text().contains("unsafe database").then_some(())
        });
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(daemons.iter().all(|d| !d.is_leader()));
    let spied = db.scalar("SELECT count(*) FROM public.spied");
    assert_eq!(spied, "0", "the planter's trigger ran");
}

/// An election whose row is free and has no gate row yet (made by a
/// daemon, taken by nobody), while another session's open transaction
/// makes that gate row (its own takeover, left uncommitted). The daemon's
/// next statement takes over that election and renews another it leads:
/// it answers at once, the free election refused, the renewal granted; it
/// never waits for the other transaction.
#[tokio::test]
async fn a_takeover_never_waits_for_another_transactions_gate_row() {
    let db = TempDb::postgres();
    let ttl = Duration::from_secs(5);
    let mut a = migrated(&db.url).await;
    let token = acquire(&mut a, &req("a", ttl), Duration::from_secs(10)).await;
    db.exec(
        &["INSERT INTO service_leader_lock (name, token, expires_at) \
               VALUES ('n1', 1, now())"],
    );
    let other = session(&db.url).await;
    other
        .batch_execute(
            "BEGIN; INSERT INTO service_leader_lock (name, instance, token, expires_at) \
             VALUES ('n1', 'x', 1, now()) ON CONFLICT (name) DO NOTHING",
        )
        .await
        .unwrap();
    let both = [
        LeaseRequest {
            election: "n1",
            ..req("a", ttl)
        },
        LeaseRequest {
            held_token: Some(token),
            ..req("a", ttl)
        },
    ];
    let started = Instant::now();
    let answers = tokio::time::timeout(Duration::from_secs(3), a.acquire_or_renew_many(&both))
        .await
        .expect("the statement waited for the other transaction")
        .unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_millis(500), "waited {took:?}");
    assert!(
        matches!(answers[0], Ok(Attempt::Refused(_))),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Ok(Attempt::Granted { token: t }) if t == token),
        "{:?}",
        answers[1]
    );
    other.batch_execute("ROLLBACK").await.unwrap();
}

/// The migrating role has given another role rights on every table it
/// makes in the schema (`ALTER DEFAULT PRIVILEGES`). The lock table keeps
/// them; the fence's own tables (the gate, the key's seed, the tokens of
/// deleted rows) do not: a role that could lock or update them could hold
/// takeovers off, or let one pass.
#[test]
fn default_privileges_give_no_role_the_fences_tables() {
    let _s = serial();
    let db = TempDb::postgres();
    let daemon = PgRole::new(&db, "daemon");
    db.exec(&[&format!(
        "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT ALL ON TABLES TO {}",
        daemon.name
    )]);
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    let may = |table: &str| {
        db.scalar(&format!(
            "has_table_privilege('{}', '{table}', 'SELECT, UPDATE, DELETE')",
            daemon.name
        ))
    };
    assert_eq!(may("service_leader_lock"), "true");
    for table in [
        "service_leader_fence_boot",
        "service_leader_fence_gate",
        "service_leader_fence_key",
        "service_leader_token",
    ] {
        assert_eq!(may(table), "false", "{table}");
    }
}

/// The app fences with a token that is not the live lease (at READ
/// COMMITTED), is refused, and leaves its aborted transaction open (a
/// client slow to roll back). The leader's lease runs out meanwhile: the
/// takeover comes within a lease of the expiry, held off by nothing.
#[tokio::test]
async fn a_refused_fence_holds_no_takeover_off() {
    let db = TempDb::postgres();
    let ttl = Duration::from_millis(800);
    let mut a = migrated(&db.url).await;
    let token = acquire(&mut a, &req("a", ttl), Duration::from_secs(3)).await;
    let app = session(&db.url).await;
    app.batch_execute("BEGIN").await.unwrap();
    let r = app
        .query_one("SELECT leaderd_fence('e1', $1)", &[&(token - 1)])
        .await;
    assert_eq!(state(&r), "LF001", "{r:?}");
    drop(a);
    let admin = session(&db.url).await;
    wait_expired(&admin, "e1").await;
    let mut b = connect(&db.url).await;
    let taken = granted_within(&mut b, &req("b", ttl), ttl)
        .await
        .expect("held off by a refused fence");
    assert!(taken > token);
    app.batch_execute("ROLLBACK").await.unwrap();
}

/// A role that may create in `public` makes the fence's gate table first,
/// with a trigger of its own, before the database's owner migrates. The
/// migration refuses it (it is not a plain table of the migrating role's),
/// nothing is installed on it, no daemon leads there, and the trigger,
/// which a takeover would have run with the owner's rights, never runs.
#[test]
fn a_gate_table_made_by_another_role_is_refused() {
    let _s = serial();
    let db = TempDb::postgres();
    let owner = PgRole::new(&db, "owner");
    let planter = PgRole::new(&db, "planter");
    db.exec(&[
        &format!("ALTER DATABASE {} OWNER TO {}", db.name(), owner.name),
        &format!("GRANT CREATE ON SCHEMA public TO {}", planter.name),
    ]);
    pg_exec(
        &db.url_as(&planter.name),
        &[
            "CREATE TABLE public.spied (who TEXT)",
            "GRANT INSERT ON public.spied TO PUBLIC",
            "CREATE FUNCTION public.spy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             INSERT INTO public.spied VALUES (current_user); RETURN NEW; END $$",
            "CREATE TABLE public.service_leader_fence_gate (name TEXT COLLATE \"C\" PRIMARY KEY, \
             old_fences TEXT[])",
            "GRANT ALL ON public.service_leader_fence_gate TO PUBLIC",
            "CREATE TRIGGER spy BEFORE INSERT OR UPDATE ON public.service_leader_fence_gate \
             FOR EACH ROW EXECUTE FUNCTION public.spy()",
        ],
    );
    let as_owner = db.url_as(&owner.name);
    let (code, _, err) = run_cli(&["migrate", "--database-url", &as_owner], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("service_leader_fence_gate"), "{err}");
    let dir = Scratch::new();
    let d = Daemon::start(&as_owner, "a", &dir, &[]);
    wait_for(Duration::from_secs(10), "the daemon to refuse", || {
        d.log_text().contains("unsafe database").then_some(())
    });
    assert!(!d.is_leader());
    let spied = db.scalar("SELECT count(*) FROM public.spied");
    assert_eq!(spied, "0", "the planter's trigger ran");
}

/// The app's role may create schemas in the database (it owns it, or runs
/// its own migrations). It makes one named as the daemon's role, which the
/// default search_path (`"$user", public`) puts first, with a lock table of
/// its own there. The daemon does not trust it (the schema's owner is not
/// trusted for the `"$user"` schema), never leads on it, and the app's
/// trigger never runs.
#[test]
fn a_schema_named_as_the_daemons_role_is_not_trusted() {
    let _s = serial();
    let db = TempDb::postgres();
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    let daemon = PgRole::new(&db, "daemon");
    let app = PgRole::new(&db, "app");
    let (d, a) = (&daemon.name, &app.name);
    db.exec(&[
        &format!("GRANT SELECT, INSERT, UPDATE ON service_leader_lock TO {d}"),
        &format!("GRANT USAGE ON SEQUENCE service_leader_lock_id_seq TO {d}"),
        &format!("GRANT CREATE ON DATABASE {} TO {a}", db.name()),
    ]);
    pg_exec(
        &db.url_as(a),
        &[
            &format!("CREATE SCHEMA {d}"),
            &format!("GRANT USAGE ON SCHEMA {d} TO PUBLIC"),
            &format!("CREATE TABLE {d}.spied (who TEXT)"),
            &format!("GRANT INSERT ON {d}.spied TO PUBLIC"),
            &format!(
                "CREATE FUNCTION {d}.spy() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 INSERT INTO {d}.spied VALUES (current_user); RETURN NEW; END $$"
            ),
            &format!(
                "CREATE TABLE {d}.service_leader_lock (id BIGSERIAL PRIMARY KEY, \
                 name VARCHAR(100) NOT NULL UNIQUE, holder VARCHAR(100), instance VARCHAR(64), \
                 token BIGINT NOT NULL, acquired_at TIMESTAMPTZ, renewed_at TIMESTAMPTZ, \
                 expires_at TIMESTAMPTZ NOT NULL, successor VARCHAR(64), address VARCHAR(255), \
                 address_instance VARCHAR(64))"
            ),
            &format!("GRANT ALL ON SEQUENCE {d}.service_leader_lock_id_seq TO PUBLIC"),
            &format!("GRANT ALL ON {d}.service_leader_lock TO PUBLIC"),
            &format!(
                "CREATE TRIGGER spy BEFORE INSERT OR UPDATE ON {d}.service_leader_lock \
                 FOR EACH ROW EXECUTE FUNCTION {d}.spy()"
            ),
        ],
    );
    let dir = Scratch::new();
    let daemon_proc = Daemon::start(&db.url_as(d), "a", &dir, &["--no-migrate"]);
    wait_for(Duration::from_secs(10), "the daemon to refuse", || {
        daemon_proc
            .log_text()
            .contains("unsafe database")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(!daemon_proc.is_leader());
    assert_eq!(db.scalar(&format!("SELECT count(*) FROM {d}.spied")), "0");
}

/// MariaDB: a user with no grant at all takes an election's wake-up lock
/// (a named lock, open to anyone who may connect) before its leader does.
/// The leader says so within a few seconds, naming that connection; the
/// election still elects (the lock is a wake-up only).
#[test]
fn a_squatted_wake_up_lock_is_named() {
    use mysql_async::prelude::Queryable;
    let _s = serial();
    let db = TempDb::mysql();
    let user = format!(
        "leaderd_stranger_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    leaderd_tests::mysql_exec(&format!("CREATE USER '{user}'@'%'"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = db
        .url
        .rsplit_once('/')
        .unwrap()
        .0
        .replacen("root@", &format!("{user}@"), 1);
    let (mut squatter, connection) = rt.block_on(async {
        let mut c = mysql_async::Conn::from_url(format!("{server}/"))
            .await
            .unwrap();
        let name = format!("{}/default", db.name());
        let got: Option<i64> = c
            .exec_first("SELECT GET_LOCK(CONCAT('leaderd:', SHA1(?)), 0)", (name,))
            .await
            .unwrap();
        assert_eq!(got, Some(1), "a user with no grant takes a named lock");
        let id: Option<u64> = c.query_first("SELECT CONNECTION_ID()").await.unwrap();
        (c, id.unwrap())
    });
    let dir = Scratch::new();
    let a = Daemon::start(&db.url, "a", &dir, &[]);
    let said = wait_for(Duration::from_secs(15), "the leader's warning", || {
        a.log_events().into_iter().find(|e| {
            e["message"].as_str().is_some_and(|m| {
                m.starts_with("another connection holds this leader's wake-up lock")
            })
        })
    });
    assert_eq!(said["connection"].as_u64(), Some(connection), "{said}");
    assert!(a.is_leader());
    rt.block_on(async { squatter.query_drop("DO RELEASE_ALL_LOCKS()").await })
        .unwrap();
    drop(squatter);
    drop(rt);
    leaderd_tests::drop_mysql_users(&[user]);
}
