//! The store conformance suite: the same cases against every backend, each
//! case in a fresh database on the real server.

use std::time::{Duration, Instant};

use leaderd_store::{
    Attempt, Connection, DatabaseUrl, LeaseRequest, Migrated, Release, Released, StoreError,
    Successor, Waiter, WakeLock,
};
use leaderd_tests::pgserver::PgServer;
use leaderd_tests::store::{acquire, connect, migrated, try_connect};
use leaderd_tests::TempDb;

/// Short enough to keep the suite quick, long enough that a loaded machine
/// does not let a renewing holder's lease lapse between two renewals.
const TTL: Duration = Duration::from_millis(800);
const TTL_US: i64 = 800_000;

fn req<'a>(election: &'a str, holder: &'a str, instance: &'a str) -> LeaseRequest<'a> {
    LeaseRequest {
        election,
        holder,
        instance,
        ttl: TTL,
        held_token: None,
        daemon: None,
        address: None,
    }
}

fn refused(a: Attempt) -> leaderd_store::Observed {
    match a {
        Attempt::Refused(o) => o,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

pub async fn missing_row_is_created_blocked_for_one_ttl(url: &str) {
    let mut c = migrated(url).await;
    let r = req("e", "a", "ia");
    assert_eq!(c.acquire_or_renew(&r).await.unwrap(), Attempt::Created);
    let seen = refused(c.acquire_or_renew(&r).await.unwrap());
    assert_eq!(seen.holder, None);
    assert!(
        seen.remaining_us > 0 && seen.remaining_us <= TTL_US,
        "{seen:?}"
    );
    let started = Instant::now();
    acquire(&mut c, &r, Duration::from_secs(3)).await;
    assert!(started.elapsed() >= TTL / 2, "blocked row was taken early");
}

pub async fn grant_then_refusal_names_the_holder(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    let token = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    let seen = refused(b.acquire_or_renew(&req("e", "b", "ib")).await.unwrap());
    assert_eq!(seen.holder.as_deref(), Some("a"));
    assert_eq!(seen.instance.as_deref(), Some("ia"));
    assert_eq!(seen.token, token);
    assert!(
        seen.remaining_us > 0 && seen.remaining_us <= TTL_US,
        "{seen:?}"
    );
}

pub async fn renewal_keeps_the_token_and_extends(url: &str) {
    let mut a = migrated(url).await;
    let r = req("e", "a", "ia");
    let token = acquire(&mut a, &r, Duration::from_secs(3)).await;
    // Renew well past the original ttl: the lease stays ours, same token.
    let until = Instant::now() + TTL + Duration::from_millis(400);
    while Instant::now() < until {
        assert_eq!(
            a.acquire_or_renew(&r).await.unwrap(),
            Attempt::Granted { token }
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut b = connect(url).await;
    assert_eq!(
        refused(b.acquire_or_renew(&req("e", "b", "ib")).await.unwrap()).token,
        token
    );
}

pub async fn takeover_after_expiry_bumps_the_token(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    let t1 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    let t2 = acquire(&mut b, &req("e", "b", "ib"), Duration::from_secs(3)).await;
    assert_eq!(t2, t1 + 1);
    // The old holder is refused now, and re-taking bumps again.
    let seen = refused(a.acquire_or_renew(&req("e", "a", "ia")).await.unwrap());
    assert_eq!(seen.holder.as_deref(), Some("b"));
    let t3 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    assert_eq!(t3, t2 + 1);
}

pub async fn same_id_other_instance_is_refused(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    acquire(&mut a, &req("e", "pod", "first"), Duration::from_secs(3)).await;
    let seen = refused(
        b.acquire_or_renew(&req("e", "pod", "second"))
            .await
            .unwrap(),
    );
    assert_eq!(seen.holder.as_deref(), Some("pod"));
    assert_eq!(seen.instance.as_deref(), Some("first"));
}

pub async fn release_by_the_holder_only(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    let t1 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    assert!(
        !b.release("e", "ib").await.unwrap(),
        "a non-holder released"
    );
    assert!(!b.release("e", "nobody").await.unwrap());
    assert_eq!(
        refused(b.acquire_or_renew(&req("e", "b", "ib")).await.unwrap())
            .holder
            .as_deref(),
        Some("a")
    );
    assert!(a.release("e", "ia").await.unwrap());
    // Free at once: the next attempt wins with the next token.
    assert_eq!(
        b.acquire_or_renew(&req("e", "b", "ib")).await.unwrap(),
        Attempt::Granted { token: t1 + 1 }
    );
    assert!(!a.release("e", "ia").await.unwrap(), "released twice");
}

/// The holder's advertised address goes with its lease: reported to
/// others while that instance holds the row (through renewals), cleared
/// at release, and never carried over to a holder that wrote none, even an
/// earlier version's daemon, whose takeover leaves the columns as they were.
pub async fn the_holders_address_goes_with_its_lease(db: &TempDb) {
    let (a_addr, b_addr) = ("http://10.0.0.1:8080", "http://10.0.0.2:8080/ü");
    let mut a = migrated(&db.url).await;
    let mut b = connect(&db.url).await;
    let ra = LeaseRequest {
        address: Some(a_addr),
        ..req("e", "a", "ia")
    };
    let rb = LeaseRequest {
        address: Some(b_addr),
        ..req("e", "b", "ib")
    };
    let address = |c: Attempt| refused(c).address;
    let listed = |rows: Vec<leaderd_store::ElectionRow>| rows[0].address.clone();
    let token = acquire(&mut a, &ra, Duration::from_secs(3)).await;
    assert_eq!(
        address(b.acquire_or_renew(&rb).await.unwrap()).as_deref(),
        Some(a_addr)
    );
    assert_eq!(
        listed(b.elections("").await.unwrap()).as_deref(),
        Some(a_addr)
    );
    let renewal = LeaseRequest {
        held_token: Some(token),
        ..ra
    };
    assert_eq!(
        a.acquire_or_renew(&renewal).await.unwrap(),
        Attempt::Granted { token }
    );
    // Several elections at once take the batch statements.
    let others: Vec<LeaseRequest<'_>> = [
        rb,
        LeaseRequest {
            election: "f",
            ..rb
        },
    ]
    .to_vec();
    let answers = b.acquire_or_renew_many(&others).await.unwrap();
    assert_eq!(
        address(answers.into_iter().next().unwrap().unwrap()).as_deref(),
        Some(a_addr)
    );
    assert!(a.release("e", "ia").await.unwrap());
    assert_eq!(
        listed(b.elections("").await.unwrap()),
        None,
        "cleared at release"
    );
    acquire(&mut b, &rb, Duration::from_secs(3)).await;
    assert_eq!(
        address(a.acquire_or_renew(&ra).await.unwrap()).as_deref(),
        Some(b_addr)
    );
    // An earlier version's takeover writes holder, instance and token only.
    db.exec(&[
        "UPDATE service_leader_lock SET holder = 'old', instance = 'i-old', \
               token = token + 1 WHERE name = 'e'",
    ]);
    let seen = refused(a.acquire_or_renew(&ra).await.unwrap());
    assert_eq!((seen.holder.as_deref(), seen.address), (Some("old"), None));
    assert_eq!(listed(a.elections("").await.unwrap()), None);
}

/// A release naming no successor.
fn rel<'a>(election: &'a str, instance: &'a str) -> Release<'a> {
    Release {
        election,
        instance,
        successor: None,
    }
}

/// A release naming daemon `heir` for `window`.
fn rel_to<'a>(
    election: &'a str,
    instance: &'a str,
    heir: &'a str,
    window: Duration,
) -> Release<'a> {
    Release {
        successor: Some(Successor {
            daemon: heir,
            window,
        }),
        ..rel(election, instance)
    }
}

/// `req` from the daemon `daemon`.
fn from<'a>(daemon: &'a str, r: LeaseRequest<'a>) -> LeaseRequest<'a> {
    LeaseRequest {
        daemon: Some(daemon),
        address: None,
        ..r
    }
}

/// Spec, Handover, "Successor": a row released to a named daemon is free
/// but blocked for the window; only that daemon takes it before then (with
/// the next token), alone or in a batch; anyone else is refused and sees
/// it free and blocked; a grant clears the name; after the window anyone
/// takes it.
pub async fn a_named_successor_alone_takes_the_row_within_its_window(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    let mut c = connect(url).await;
    let window = Duration::from_secs(3);
    let t1 = acquire(&mut a, &from("da", req("e", "a", "ia")), TTL * 4).await;
    assert!(a
        .release_one(&rel_to("e", "ia", "db", window))
        .await
        .unwrap());
    for other in [from("dc", req("e", "c", "ic")), req("e", "c", "ic")] {
        let seen = refused(c.acquire_or_renew(&other).await.unwrap());
        assert_eq!((seen.holder, seen.instance), (None, None));
        assert!(
            (1_000_000..=3_000_000).contains(&seen.remaining_us),
            "blocked for the window: {}",
            seen.remaining_us
        );
    }
    assert_eq!(
        b.acquire_or_renew(&from("db", req("e", "b", "ib")))
            .await
            .unwrap(),
        Attempt::Granted { token: t1 + 1 }
    );
    // The grant cleared the name: a plain release frees the row for anyone.
    assert!(b.release("e", "ib").await.unwrap());
    assert_eq!(
        c.acquire_or_renew(&req("e", "c", "ic")).await.unwrap(),
        Attempt::Granted { token: t1 + 2 }
    );
    // Named, the successor gone: anyone takes it once the window is over
    // (by the database's clock), not before.
    let short = Duration::from_millis(400);
    assert!(c
        .release_one(&rel_to("e", "ic", "gone", short))
        .await
        .unwrap());
    let released = Instant::now();
    let t = acquire(&mut a, &from("da", req("e", "a", "ia2")), TTL * 4).await;
    assert_eq!(t, t1 + 3);
    assert!(
        released.elapsed() >= Duration::from_millis(300),
        "taken {:?} after a release naming another",
        released.elapsed()
    );
    // Several rows in one batch, released together to one daemon: the
    // batch statements (PostgreSQL's, MySQL's reads and takes together)
    // let it take both at once, the others not.
    let held = [req("x1", "a", "ia2"), req("x2", "a", "ia2")];
    for r in &held {
        acquire(&mut a, r, TTL * 4).await;
    }
    assert_eq!(
        each(
            a.release_many(&[
                rel_to("x1", "ia2", "db", window),
                rel_to("x2", "ia2", "db", window)
            ])
            .await
        ),
        [true, true]
    );
    let others = [
        from("dc", req("x1", "c", "ic")),
        from("dc", req("x2", "c", "ic")),
    ];
    for answer in c.acquire_or_renew_many(&others).await.unwrap() {
        assert_eq!(refused(answer.unwrap()).holder, None);
    }
    let heirs = [
        from("db", req("x1", "b", "ib")),
        from("db", req("x2", "b", "ib")),
    ];
    for answer in b.acquire_or_renew_many(&heirs).await.unwrap() {
        assert!(matches!(answer, Ok(Attempt::Granted { .. })), "{answer:?}");
    }
}

/// A named successor that will not take the row (held off it, draining)
/// gives its turn up: the row is open to anyone at once, not at the
/// window's end. Only the named daemon can do so, only for the release it
/// saw (its token), only while the row is free and its window runs;
/// otherwise nothing changes.
pub async fn a_named_successor_can_give_its_turn_up(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    let mut c = connect(url).await;
    let window = Duration::from_secs(3);
    let t1 = acquire(&mut a, &from("da", req("e", "a", "ia")), TTL * 4).await;
    assert!(
        !b.decline("e", "db", t1).await.unwrap(),
        "a held row is not given up"
    );
    assert!(a
        .release_one(&rel_to("e", "ia", "db", window))
        .await
        .unwrap());
    assert!(
        !c.decline("e", "dc", t1).await.unwrap(),
        "only the named daemon gives its turn up"
    );
    assert!(
        !b.decline("e", "db", t1 - 1).await.unwrap(),
        "only the release it saw"
    );
    let seen = refused(
        c.acquire_or_renew(&from("dc", req("e", "c", "ic")))
            .await
            .unwrap(),
    );
    assert!(seen.remaining_us > 1_000_000, "still blocked: {seen:?}");
    assert!(b.decline("e", "db", t1).await.unwrap());
    assert!(!b.decline("e", "db", t1).await.unwrap(), "given up once");
    assert_eq!(
        c.acquire_or_renew(&from("dc", req("e", "c", "ic")))
            .await
            .unwrap(),
        Attempt::Granted { token: t1 + 1 },
        "open to anyone once given up"
    );
    assert!(!b.decline("e", "db", t1 + 1).await.unwrap(), "taken since");
    // Released to it again: a late decline of the first release does not
    // give up this one.
    assert!(c
        .release_one(&rel_to("e", "ic", "db", window))
        .await
        .unwrap());
    assert!(!b.decline("e", "db", t1).await.unwrap());
    let seen = refused(a.acquire_or_renew(&req("e", "a", "ia2")).await.unwrap());
    assert!(seen.remaining_us > 1_000_000, "still blocked: {seen:?}");
    // Once the window is over, nothing is left to give up.
    let short = Duration::from_millis(200);
    let t = acquire(&mut b, &from("db", req("e", "b", "ib")), TTL * 4).await;
    assert!(b
        .release_one(&rel_to("e", "ib", "dc", short))
        .await
        .unwrap());
    tokio::time::sleep(short + Duration::from_millis(100)).await;
    assert!(
        !c.decline("e", "dc", t).await.unwrap(),
        "the window is over"
    );
    // Released to nobody: there is no turn to give up.
    assert_eq!(
        a.acquire_or_renew(&req("e", "a", "ia3")).await.unwrap(),
        Attempt::Granted { token: t + 1 }
    );
    assert!(a.release("e", "ia3").await.unwrap());
    assert!(!b.decline("e", "db", t + 1).await.unwrap());
}

/// A presence row (not an election) is open as soon as it is made: a
/// replica just started is a candidate from its first round. An election's
/// row stays blocked for a ttl.
pub async fn a_presence_row_is_open_as_soon_as_it_is_made(url: &str) {
    let mut a = migrated(url).await;
    let slot = req("leaderd-presence/0123456789abcdef/slot-0", "a", "ia");
    assert_eq!(a.acquire_or_renew(&slot).await.unwrap(), Attempt::Created);
    assert!(matches!(
        a.acquire_or_renew(&slot).await.unwrap(),
        Attempt::Granted { .. }
    ));
    let election = req("e", "a", "ia");
    assert_eq!(
        a.acquire_or_renew(&election).await.unwrap(),
        Attempt::Created
    );
    assert!(refused(a.acquire_or_renew(&election).await.unwrap()).remaining_us > 0);
    // The same in one batch.
    let both = [
        req("leaderd-presence/0123456789abcdef/slot-1", "a", "ia"),
        req("e2", "a", "ia"),
    ];
    for answer in a.acquire_or_renew_many(&both).await.unwrap() {
        assert_eq!(answer.unwrap(), Attempt::Created);
    }
    let answers = a.acquire_or_renew_many(&both).await.unwrap();
    assert!(
        matches!(answers[0], Ok(Attempt::Granted { .. })),
        "{answers:?}"
    );
    assert!(matches!(answers[1], Ok(Attempt::Refused(_))), "{answers:?}");
}

pub async fn concurrent_attempts_give_exactly_one_holder(url: &str) {
    migrated(url).await;
    // Create the row and let its block lapse, so all tasks race for a free row.
    let mut c = connect(url).await;
    acquire(&mut c, &req("race", "seed", "seed"), Duration::from_secs(3)).await;
    assert!(c.release("race", "seed").await.unwrap());
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let url = url.to_owned();
            tokio::spawn(async move {
                let mut conn = connect(&url).await;
                let (id, inst) = (format!("r{i}"), format!("i{i}"));
                conn.acquire_or_renew(&req("race", &id, &inst))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut granted = 0;
    for t in tasks {
        if matches!(t.await.unwrap(), Attempt::Granted { .. }) {
            granted += 1;
        }
    }
    assert_eq!(granted, 1);
}

pub async fn tokens_never_decrease_across_a_deleted_row(url: &str, delete: impl FnOnce()) {
    let mut a = migrated(url).await;
    let t1 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    delete();
    assert_eq!(
        a.acquire_or_renew(&req("e", "a", "ia")).await.unwrap(),
        Attempt::Created
    );
    let t2 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    assert!(t2 > t1, "token went from {t1} to {t2}");
}

/// A re-created row's token is seeded from a clock (the database's; on
/// SQLite the host's wall clock), which may have stepped back since the
/// deleted row's token was drawn (here the row carries a token a day ahead
/// of the clock): the new token is still above it (tokens never
/// decrease, even across a deleted row).
pub async fn tokens_never_decrease_when_the_seed_clock_stepped_back(db: &TempDb) {
    let mut a = migrated(&db.url).await;
    let t1 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    let ahead = t1 + 86_400 * 1_000_000;
    db.exec(&[&format!("UPDATE service_leader_lock SET token = {ahead}")]);
    db.exec(&["DELETE FROM service_leader_lock"]);
    assert_eq!(
        a.acquire_or_renew(&req("e", "a", "ia")).await.unwrap(),
        Attempt::Created
    );
    let t2 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    assert!(t2 > ahead, "token went from {ahead} to {t2}");
    // Again: the kept token only grows.
    db.exec(&["DELETE FROM service_leader_lock"]);
    a.acquire_or_renew(&req("e", "a", "ia")).await.unwrap();
    let t3 = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    assert!(t3 > t2, "token went from {t2} to {t3}");
}

pub async fn migration_is_idempotent_and_concurrent(url: &str) {
    let runs: Vec<_> = (0..6)
        .map(|_| {
            let url = url.to_owned();
            tokio::spawn(async move { connect(&url).await.migrate().await })
        })
        .collect();
    let mut applied = 0;
    for r in runs {
        if r.await.unwrap().unwrap() == Migrated::Applied {
            applied += 1;
        }
    }
    assert!(applied <= 1, "applied {applied} times");
    assert_eq!(
        connect(url).await.migrate().await.unwrap(),
        Migrated::UpToDate
    );
    assert!(connect(url).await.elections("").await.unwrap().is_empty());
}

pub async fn migrate_recreates_a_dropped_table(db: &TempDb) {
    migrated(&db.url).await;
    db.exec(&["DROP TABLE service_leader_lock"]);
    assert_eq!(
        connect(&db.url).await.migrate().await.unwrap(),
        Migrated::Applied
    );
    let mut c = connect(&db.url).await;
    assert_eq!(
        c.acquire_or_renew(&req("e", "a", "ia")).await.unwrap(),
        Attempt::Created
    );
}

pub async fn status_lists_every_election(url: &str) {
    let mut a = migrated(url).await;
    acquire(&mut a, &req("one", "a", "ia"), Duration::from_secs(3)).await;
    assert_eq!(
        a.acquire_or_renew(&req("two", "a", "ia")).await.unwrap(),
        Attempt::Created
    );
    let rows = a.elections("").await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["one", "two"]
    );
    assert_eq!(rows[0].holder.as_deref(), Some("a"));
    assert!(rows[0].remaining_us > 0);
    assert_eq!(rows[1].holder, None);
    // A prefix is filtered by the database, literally (no pattern
    // characters), and counted in characters of any width.
    // Quotes and backslashes too.
    for name in ["é/2", "q'x", "b\\x"] {
        assert_eq!(
            a.acquire_or_renew(&req(name, "a", "ia")).await.unwrap(),
            Attempt::Created
        );
    }
    for (prefix, want) in [
        ("q'", &["q'x"][..]),
        ("q''", &[]),
        ("b\\", &["b\\x"]),
        ("b\\\\", &[]),
        ("'", &[]),
        ("\\", &[]),
        ("t", &["two"]),
        ("on", &["one"]),
        ("é", &["é/2"]),
        ("é/", &["é/2"]),
        ("e", &[]),
        ("%", &[]),
        ("_", &[]),
        ("one!", &[]),
    ] {
        let rows = a.elections(prefix).await.unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, want, "prefix {prefix:?}");
    }
}

pub async fn refusal_does_not_wait_for_row_locks(db: &TempDb) {
    let mut a = migrated(&db.url).await;
    let mut b = connect(&db.url).await;
    acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    // Another transaction holds the row's write lock: a refusal must not
    // wait for it, because it never asks for it.
    let lock = db.lock_row("e");
    for _ in 0..10 {
        let r = tokio::time::timeout(
            Duration::from_millis(250),
            b.acquire_or_renew(&req("e", "b", "ib")),
        )
        .await;
        assert!(matches!(r, Ok(Ok(Attempt::Refused(_)))), "{r:?}");
    }
    drop(lock);
}

pub async fn a_missing_table_is_a_clear_error(url: &str) {
    let mut c = connect(url).await;
    let err = c
        .acquire_or_renew(&req("e", "a", "ia"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("service_leader_lock"), "{err}");
}

pub async fn names_differ_by_trailing_space(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    acquire(&mut a, &req("x", "a", "ia"), Duration::from_secs(3)).await;
    // A padding collation would find `x`'s row and refuse.
    assert_eq!(
        b.acquire_or_renew(&req("x ", "b", "ib")).await.unwrap(),
        Attempt::Created
    );
    let names: Vec<String> = a
        .elections("")
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["x", "x "]);
}

pub async fn renewal_checks_the_held_token(url: &str) {
    let mut a = migrated(url).await;
    let t = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    // A renewal that claims a token the row does not carry must not be
    // granted under that token.
    let stale = LeaseRequest {
        held_token: Some(t - 1),
        ..req("e", "a", "ia")
    };
    assert_eq!(
        a.acquire_or_renew(&stale).await.unwrap(),
        Attempt::Granted { token: t }
    );
}

const DIESEL_TABLE: &str = "CREATE TABLE __diesel_schema_migrations (\
    version VARCHAR(50) PRIMARY KEY NOT NULL, \
    run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP)";

pub async fn migration_leaves_the_apps_bookkeeping_alone(db: &TempDb) {
    migrated(&db.url).await;
    assert!(db.has_table("service_leader_lock"));
    assert!(!db.has_table("__diesel_schema_migrations"));
    // An app that uses diesel on the same database, migrated by an earlier
    // leaderd that recorded its own version there.
    db.exec(&[
        DIESEL_TABLE,
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('20200101000000')",
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('20261122000000')",
    ]);
    connect(&db.url).await.migrate().await.unwrap();
    assert_eq!(
        db.scalar("SELECT COUNT(*) FROM __diesel_schema_migrations"),
        "1"
    );
    assert_eq!(
        db.scalar("SELECT MIN(version) FROM __diesel_schema_migrations"),
        "20200101000000"
    );
}

pub async fn legacy_bookkeeping_of_leaderd_alone_is_dropped(db: &TempDb) {
    db.exec(&[
        DIESEL_TABLE,
        "INSERT INTO __diesel_schema_migrations (version) VALUES ('20261122000000')",
    ]);
    migrated(&db.url).await;
    assert!(!db.has_table("__diesel_schema_migrations"));
}

macro_rules! conformance {
    ($backend:ident, $make:expr, $delete_row:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn missing_row_is_created_blocked_for_one_ttl() {
                let db: TempDb = $make;
                super::missing_row_is_created_blocked_for_one_ttl(&db.url).await;
            }
            #[tokio::test]
            async fn grant_then_refusal_names_the_holder() {
                let db: TempDb = $make;
                super::grant_then_refusal_names_the_holder(&db.url).await;
            }
            #[tokio::test]
            async fn renewal_keeps_the_token_and_extends() {
                let db: TempDb = $make;
                super::renewal_keeps_the_token_and_extends(&db.url).await;
            }
            #[tokio::test]
            async fn takeover_after_expiry_bumps_the_token() {
                let db: TempDb = $make;
                super::takeover_after_expiry_bumps_the_token(&db.url).await;
            }
            #[tokio::test]
            async fn same_id_other_instance_is_refused() {
                let db: TempDb = $make;
                super::same_id_other_instance_is_refused(&db.url).await;
            }
            #[tokio::test]
            async fn the_holders_address_goes_with_its_lease() {
                let db: TempDb = $make;
                super::the_holders_address_goes_with_its_lease(&db).await;
            }
            #[tokio::test]
            async fn release_by_the_holder_only() {
                let db: TempDb = $make;
                super::release_by_the_holder_only(&db.url).await;
            }
            #[tokio::test]
            async fn a_named_successor_alone_takes_the_row_within_its_window() {
                let db: TempDb = $make;
                super::a_named_successor_alone_takes_the_row_within_its_window(&db.url).await;
            }
            #[tokio::test]
            async fn a_named_successor_can_give_its_turn_up() {
                let db: TempDb = $make;
                super::a_named_successor_can_give_its_turn_up(&db.url).await;
            }
            #[tokio::test]
            async fn a_presence_row_is_open_as_soon_as_it_is_made() {
                let db: TempDb = $make;
                super::a_presence_row_is_open_as_soon_as_it_is_made(&db.url).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_attempts_give_exactly_one_holder() {
                let db: TempDb = $make;
                super::concurrent_attempts_give_exactly_one_holder(&db.url).await;
            }
            #[tokio::test]
            async fn tokens_never_decrease_across_a_deleted_row() {
                let db: TempDb = $make;
                let delete = $delete_row;
                super::tokens_never_decrease_across_a_deleted_row(&db.url, || delete(&db)).await;
            }
            #[tokio::test]
            async fn tokens_never_decrease_when_the_seed_clock_stepped_back() {
                let db: TempDb = $make;
                super::tokens_never_decrease_when_the_seed_clock_stepped_back(&db).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn migration_is_idempotent_and_concurrent() {
                let db: TempDb = $make;
                super::migration_is_idempotent_and_concurrent(&db.url).await;
            }
            #[tokio::test]
            async fn refusal_does_not_wait_for_row_locks() {
                let db: TempDb = $make;
                super::refusal_does_not_wait_for_row_locks(&db).await;
            }
            #[tokio::test]
            async fn a_missing_table_is_a_clear_error() {
                let db: TempDb = $make;
                super::a_missing_table_is_a_clear_error(&db.url).await;
            }
            #[tokio::test]
            async fn migrate_recreates_a_dropped_table() {
                let db: TempDb = $make;
                super::migrate_recreates_a_dropped_table(&db).await;
            }
            #[tokio::test]
            async fn status_lists_every_election() {
                let db: TempDb = $make;
                super::status_lists_every_election(&db.url).await;
            }
            #[tokio::test]
            async fn names_differ_by_trailing_space() {
                let db: TempDb = $make;
                super::names_differ_by_trailing_space(&db.url).await;
            }
            #[tokio::test]
            async fn a_batch_answers_each_election_as_alone() {
                let db: TempDb = $make;
                super::a_batch_answers_each_election_as_alone(&db.url).await;
            }
            #[tokio::test]
            async fn renewal_checks_the_held_token() {
                let db: TempDb = $make;
                super::renewal_checks_the_held_token(&db.url).await;
            }
            #[tokio::test]
            async fn migration_leaves_the_apps_bookkeeping_alone() {
                let db: TempDb = $make;
                super::migration_leaves_the_apps_bookkeeping_alone(&db).await;
            }
            #[tokio::test]
            async fn legacy_bookkeeping_of_leaderd_alone_is_dropped() {
                let db: TempDb = $make;
                super::legacy_bookkeeping_of_leaderd_alone_is_dropped(&db).await;
            }
        }
    };
}

/// Several elections in one call: each answered as it would be alone —
/// created, granted, refused naming the holder, renewed with its token, a
/// renewal of a lease no longer held refused — and released together.
pub async fn a_batch_answers_each_election_as_alone(url: &str) {
    let mut a = migrated(url).await;
    let mut b = connect(url).await;
    let names = ["e1", "e2", "e3", "e4"];
    let reqs: Vec<LeaseRequest<'_>> = names.iter().map(|n| req(n, "a", "ia")).collect();
    let first = a.acquire_or_renew_many(&reqs).await.unwrap();
    assert!(
        first.iter().all(|r| matches!(r, Ok(Attempt::Created))),
        "{first:?}"
    );
    // B takes e4 once the rows are no longer blocked.
    let t4 = acquire(&mut b, &req("e4", "b", "ib"), TTL * 3).await;
    let deadline = Instant::now() + TTL * 3;
    let tokens = loop {
        let answers = a.acquire_or_renew_many(&reqs[..3]).await.unwrap();
        let granted: Vec<i64> = answers
            .iter()
            .filter_map(|r| match r {
                Ok(Attempt::Granted { token }) => Some(*token),
                _ => None,
            })
            .collect();
        if granted.len() == 3 {
            break granted;
        }
        assert!(Instant::now() < deadline, "not all granted: {answers:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // Renew all three and try e4, held by b, in one call.
    let mut next: Vec<LeaseRequest<'_>> = reqs
        .iter()
        .zip(&tokens)
        .map(|(r, t)| LeaseRequest {
            held_token: Some(*t),
            ..*r
        })
        .collect();
    next.push(req("e4", "a", "ia"));
    let answers = a.acquire_or_renew_many(&next).await.unwrap();
    for (answer, token) in answers.iter().zip(&tokens) {
        assert_eq!(
            answer.as_ref().unwrap(),
            &Attempt::Granted { token: *token }
        );
    }
    let seen = refused(answers[3].as_ref().unwrap().clone());
    assert_eq!((seen.holder.as_deref(), seen.token), (Some("b"), t4));
    // e2 released by a, taken by b: a's renewal of it is refused, the
    // others still renew.
    assert_eq!(each(a.release_many(&[rel("e2", "ia")]).await), [true]);
    let t2 = acquire(&mut b, &req("e2", "b", "ib"), TTL).await;
    let answers = a.acquire_or_renew_many(&next[..3]).await.unwrap();
    assert_eq!(
        answers[0].as_ref().unwrap(),
        &Attempt::Granted { token: tokens[0] }
    );
    let seen = refused(answers[1].as_ref().unwrap().clone());
    assert_eq!((seen.holder.as_deref(), seen.token), (Some("b"), t2));
    assert_eq!(
        answers[2].as_ref().unwrap(),
        &Attempt::Granted { token: tokens[2] }
    );
    // Released together; only what each instance holds.
    let released = each(
        a.release_many(&[
            rel("e1", "ia"),
            rel("e2", "ia"),
            rel("e3", "ia"),
            rel("e4", "ib"),
        ])
        .await,
    );
    assert_eq!(released, [true, false, true, true]);
    let rows = a.elections("").await.unwrap();
    let holders: Vec<Option<&str>> = rows.iter().map(|r| r.live_holder()).collect();
    assert_eq!(holders, [None, Some("b"), None, None], "{rows:?}");
}

/// Whether each release of a batch was released; any error fails the test.
fn each(released: Result<Vec<Result<bool, StoreError>>, StoreError>) -> Vec<bool> {
    released.unwrap().into_iter().map(|r| r.unwrap()).collect()
}

fn delete_rows(db: &TempDb) {
    db.exec(&["DELETE FROM service_leader_lock"]);
}

conformance!(postgres, TempDb::postgres(), delete_rows);
conformance!(mysql, TempDb::mysql(), delete_rows);
conformance!(sqlite, TempDb::sqlite(), delete_rows);
// The same cases over TLS: PostgreSQL checking the chain up to its own
// (self-signed) certificate, MariaDB the chain and the name, on a TLS-only
// server shared by the cases.
conformance!(postgres_tls, postgres_tls(), delete_rows);
conformance!(mysql_tls, mysql_tls(), delete_rows);

/// Named prepared statements (prepared once, the fast path) only where the
/// server's peer is this process's own socket; through PgBouncer, unnamed.
#[tokio::test]
async fn postgres_named_statements_only_when_direct() {
    // The check answers beside the first statements.
    async fn settled(mut c: Connection) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(named) = c.named_statements() {
                return named;
            }
            assert!(Instant::now() < deadline, "the check never answered");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let direct = TempDb::postgres();
    assert!(settled(connect(&direct.url).await).await);
    let tls = postgres_tls();
    assert!(settled(connect(&tls.url).await).await);
    let pooled = TempDb::postgres_through_pgbouncer(1);
    assert!(!settled(connect(&pooled.url).await).await);
    // And the pooled connection works.
    connect(&pooled.url).await.migrate().await.unwrap();
    let mut c = connect(&pooled.url).await;
    acquire(&mut c, &req("e", "a", "ia"), Duration::from_secs(3)).await;
}

/// A connection's warm-up runs (its insert took a value of the row ids'
/// sequence) and leaves nothing: no row, gate or term of its own, no
/// transaction open, no lock held; and the first takeover after it works
/// as any other.
#[tokio::test]
async fn postgres_warm_up_runs_the_takeover_path_and_leaves_nothing() {
    let db = TempDb::postgres();
    let mut c = migrated(&db.url).await;
    let admin = leaderd_tests::pg_session(&db.url).await;
    // The values the sequence has handed out (none yet: `is_called` false).
    let seq = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END \
               FROM public.service_leader_lock_id_seq";
    let before: i64 = admin.query_one(seq, &[]).await.unwrap().get(0);
    c.warm_up().await.unwrap();
    let after: i64 = admin.query_one(seq, &[]).await.unwrap().get(0);
    assert!(after > before, "no row was made: {before} → {after}");
    for table in [
        "service_leader_lock",
        "service_leader_fence_gate",
        "service_leader_history",
    ] {
        let left: i64 = admin
            .query_one(
                &format!("SELECT count(*) FROM public.{table} WHERE name LIKE 'leaderd-warm-up%'"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 0, "{table}");
    }
    // Every other client session of this database: the warm-up's, idle.
    let busy: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity a \
             WHERE a.datname = pg_catalog.current_database() AND a.pid <> pg_catalog.pg_backend_pid() \
               AND a.backend_type = 'client backend' \
               AND (a.state <> 'idle' OR a.backend_xid IS NOT NULL \
                    OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks l \
                                WHERE l.pid = a.pid AND l.locktype <> 'virtualxid'))",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(busy, 0);
    // On this direct connection it then ran one election's takeover and
    // release, prepared, in a transaction it ended: last, its `ROLLBACK`.
    let ended: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity a \
             WHERE a.datname = pg_catalog.current_database() AND a.query = 'ROLLBACK'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended, 1);
    // A row of the name those use, made by hand (and expired: a takeover
    // would take it), is left as it was.
    admin
        .batch_execute(
            "INSERT INTO public.service_leader_lock (name, holder, instance, token, expires_at) \
             VALUES ('leaderd-warm-up/plan', 'x', 'ix', 7, now() - interval '1 hour')",
        )
        .await
        .unwrap();
    connect(&db.url).await.warm_up().await.unwrap();
    let row = admin
        .query_one(
            "SELECT holder, instance, token FROM public.service_leader_lock \
             WHERE name = 'leaderd-warm-up/plan'",
            &[],
        )
        .await
        .unwrap();
    let row: (String, String, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(row, ("x".to_owned(), "ix".to_owned(), 7));
    let a = req("e", "a", "ia");
    let token = acquire(&mut c, &a, Duration::from_secs(3)).await;
    assert!(c.release("e", "ia").await.unwrap());
    let mut b = connect(&db.url).await;
    b.warm_up().await.unwrap();
    assert!(acquire(&mut b, &req("e", "b", "ib"), Duration::from_secs(3)).await > token);
}

/// Another session's lock on the table holds the warm-up up for its bound
/// (100 ms), not longer: it then fails, answered, and the connection works.
#[tokio::test]
async fn postgres_warm_up_waits_for_no_lock_beyond_its_bound() {
    let db = TempDb::postgres();
    migrated(&db.url).await;
    let mut c = connect(&db.url).await;
    let locker = leaderd_tests::pg_session(&db.url).await;
    locker
        .batch_execute("BEGIN; LOCK TABLE public.service_leader_lock IN SHARE MODE")
        .await
        .unwrap();
    let started = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(10), c.warm_up())
        .await
        .expect("the warm-up waited on the lock")
        .expect_err("the warm-up wrote under another's SHARE lock");
    // 100 ms and a round trip; a busy machine's margin on top.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(e.answered(), "{e}");
    assert!(e.to_string().contains("lock timeout"), "{e}");
    locker.batch_execute("ROLLBACK").await.unwrap();
    acquire(&mut c, &req("e", "a", "ia"), Duration::from_secs(3)).await;
}

/// A release's commit waits for neither the disk nor a synchronous
/// standby; a renewal's waits for both. On a server whose synchronous
/// standby never connects, a commit that waits for it waits for ever: the
/// releases (one alone, and a batch) answer and the rows are free, while
/// a renewal does not answer. The leases are taken while the database's
/// sessions commit locally only; the connection that releases is made
/// after that default is gone, so it commits as any client does.
#[tokio::test]
async fn postgres_a_release_waits_for_no_standby_and_a_renewal_does() {
    let server = PgServer::start_with(
        leaderd_tests::pgserver::newest_bin(),
        &[("synchronous_standby_names", "nobody")],
    );
    let url = server.url();
    let admin = leaderd_tests::pg_session(&url).await;
    let local = "SET synchronous_commit = local; \
                 ALTER DATABASE postgres SET synchronous_commit = local";
    admin.batch_execute(local).await.unwrap();
    let mut c = migrated(&url).await;
    for e in ["e", "f", "g", "h"] {
        acquire(&mut c, &req(e, "a", "ia"), Duration::from_secs(3)).await;
    }
    admin
        .batch_execute("ALTER DATABASE postgres RESET synchronous_commit")
        .await
        .unwrap();
    let mut c = connect(&url).await;
    let within = Duration::from_secs(10);
    let alone = tokio::time::timeout(within, c.release("e", "ia")).await;
    assert!(alone.expect("the release waited for the standby").unwrap());
    let batch =
        tokio::time::timeout(within, c.release_many(&[rel("g", "ia"), rel("h", "ia")])).await;
    assert_eq!(
        each(batch.expect("the batch waited for the standby")),
        [true, true]
    );
    let held: Vec<String> = admin
        .query(
            "SELECT name FROM public.service_leader_lock WHERE instance IS NOT NULL ORDER BY name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(held, ["f"]);
    // The server does hold durable commits back: this renewal's never ends.
    let renewal = tokio::time::timeout(
        Duration::from_secs(1),
        c.acquire_or_renew(&req("f", "a", "ia")),
    )
    .await;
    assert!(renewal.is_err(), "a renewal did not wait: {renewal:?}");
}

fn postgres_tls() -> TempDb {
    let cert = leaderd_tests::certs::postgres_server_cert_shared();
    TempDb::postgres_with(&format!("sslmode=verify-ca&sslrootcert={}", cert.display()))
}

fn mysql_tls() -> TempDb {
    let (ca, server) = leaderd_tests::mariadbserver::MariaDbServer::shared_tls();
    TempDb::mysql_on(
        &server.admin_url(),
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", ca.ca().display()),
    )
}

/// A statement never waits on a row lock another transaction holds: a
/// waiting server-side statement outlives the client's timeout, and each
/// retry would tie up one more connection.
pub async fn a_locked_row_never_makes_a_statement_wait(db: &TempDb) {
    let mut a = migrated(&db.url).await;
    let t = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
    let lock = db.lock_row("e");
    let renew = LeaseRequest {
        held_token: Some(t),
        ..req("e", "a", "ia")
    };
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(2), a.acquire_or_renew(&renew))
        .await
        .expect("the renewal waited on the row lock");
    assert!(r.is_err(), "a locked row is not a grant or a loss: {r:?}");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    drop(lock);
    // The connection is still good, and so is the lease.
    let mut a = connect(&db.url).await;
    assert_eq!(
        a.acquire_or_renew(&renew).await.unwrap(),
        Attempt::Granted { token: t }
    );
    // Nor does a named successor's giving up of its turn, on the row
    // released to it.
    let heir = Successor {
        daemon: "db",
        window: Duration::from_secs(3),
    };
    assert!(a
        .release_one(&Release {
            election: "e",
            instance: "ia",
            successor: Some(heir),
        })
        .await
        .unwrap());
    let lock = db.lock_row("e");
    let mut b = connect(&db.url).await;
    let started = Instant::now();
    let declined = tokio::time::timeout(Duration::from_secs(2), b.decline("e", "db", t))
        .await
        .expect("giving up a turn waited on the row lock");
    assert!(!matches!(declined, Ok(true)), "{declined:?}");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    drop(lock);
    assert!(
        b.decline("e", "db", t).await.unwrap(),
        "once the lock is gone"
    );
}

#[tokio::test]
async fn postgres_a_locked_row_never_makes_a_statement_wait() {
    a_locked_row_never_makes_a_statement_wait(&TempDb::postgres()).await;
}

#[tokio::test]
async fn mysql_a_locked_row_never_makes_a_statement_wait() {
    a_locked_row_never_makes_a_statement_wait(&TempDb::mysql()).await;
}

/// MySQL/MariaDB: sessions it refuses, names it keeps apart.
mod mysql_safety {
    use super::*;
    use leaderd_tests::mariadbserver::MariaDbServer;

    /// A leader's wake-up locks (see `leaderd_store::Presence`): taken
    /// and freed in one statement each, and taken once per session however
    /// often it asks (MySQL counts a lock taken twice by one session, and
    /// one free would leave it held: the next leader could not take it, and
    /// its releases would wake nobody).
    #[tokio::test]
    async fn wake_up_locks_are_taken_once_and_freed_together() {
        let db = TempDb::mysql();
        let mut a = connect(&db.url).await;
        let mut b = connect(&db.url).await;
        let names = ["jobs", r#"jöb "é" \ 😀"#, "mailer"];
        // Whether each is held by this session; a lock another session
        // holds names it.
        async fn held(c: &mut Connection, names: &[&str]) -> Result<Vec<bool>, StoreError> {
            let locks = c.hold_wake_locks(names).await?;
            for lock in &locks {
                assert!(
                    matches!(lock, WakeLock::Held | WakeLock::Busy(Some(_))),
                    "{lock:?}"
                );
            }
            Ok(locks.iter().map(|l| *l == WakeLock::Held).collect())
        }
        assert_eq!(held(&mut a, &names).await.unwrap(), [true; 3]);
        // Asked again (a presence retaking what it holds): still held once.
        assert_eq!(held(&mut a, &names[..2]).await.unwrap(), [true; 2]);
        assert_eq!(held(&mut b, &names).await.unwrap(), [false; 3]);
        a.free_wake_locks(&names[..2]).await.unwrap();
        assert_eq!(
            held(&mut b, &names).await.unwrap(),
            [true, true, false],
            "freed once, the first two are free"
        );
        // Freeing what another session holds changes nothing.
        a.free_wake_locks(&names[..1]).await.unwrap();
        assert_eq!(held(&mut a, &names[..1]).await.unwrap(), [false]);
    }

    #[tokio::test]
    async fn a_server_with_autocommit_off_is_refused() {
        let server = MariaDbServer::start_with(&["--autocommit=0"]);
        let err = try_connect(&server.url()).await.unwrap_err();
        assert!(err.contains("autocommit"), "{err}");
    }

    #[tokio::test]
    async fn a_table_with_padded_names_is_converted() {
        let db = TempDb::mysql();
        // The table as the first release created it.
        db.exec(&[
            "CREATE TABLE service_leader_lock (\
                id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                name VARCHAR(100) NOT NULL, holder VARCHAR(100) NULL, \
                instance VARCHAR(64) NULL, token BIGINT NOT NULL, \
                acquired_at DATETIME(6) NULL, renewed_at DATETIME(6) NULL, \
                expires_at DATETIME(6) NOT NULL, \
                UNIQUE KEY service_leader_lock_name (name)) \
             ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
            "INSERT INTO service_leader_lock (name, token, expires_at) \
             VALUES ('x', 5, UTC_TIMESTAMP(6))",
        ]);
        assert_eq!(
            connect(&db.url).await.migrate().await.unwrap(),
            Migrated::Applied
        );
        names_differ_by_trailing_space(&db.url).await;
    }
}

/// SQLite: rows from another boot, and the file system check.
mod sqlite_safety {
    use super::*;

    #[tokio::test]
    async fn a_row_from_another_boot_is_taken_only_once_nobody_renews_it() {
        let db = TempDb::sqlite();
        let mut a = migrated(&db.url).await;
        // Another host (or an earlier boot) holds the row; its clock means
        // nothing here.
        db.exec(&[
            "INSERT INTO service_leader_lock (name, holder, instance, token, renewed_at, expires_at, boot_id) \
             VALUES ('e', 'other', 'io', 7, 1000000, 1800000, 'another-boot')",
        ]);
        // While the other holder renews, the row is never taken.
        let until = Instant::now() + TTL * 3;
        let mut renewed = 1_000_000;
        let mut last_seen = Instant::now();
        while Instant::now() < until {
            renewed += 100_000;
            db.exec(&[&format!(
                "UPDATE service_leader_lock SET renewed_at = {renewed}, expires_at = {} WHERE name = 'e'",
                renewed + 800_000
            )]);
            let seen = refused(a.acquire_or_renew(&req("e", "a", "ia")).await.unwrap());
            assert_eq!(seen.holder.as_deref(), Some("other"));
            assert!(seen.remaining_us > 0, "{seen:?}");
            last_seen = Instant::now();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Once it stops, the row is taken one lease after it was last seen
        // changed, not before.
        let t = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
        assert!(last_seen.elapsed() >= TTL, "{:?}", last_seen.elapsed());
        assert_eq!(t, 8);
    }

    /// A daemon's elections share one connection: rows of two elections
    /// from another boot, looked at in turn, are each taken once unchanged
    /// for a lease (one wait for all of them restarted at every look at the
    /// other's row, and neither was ever taken).
    #[tokio::test]
    async fn rows_of_several_elections_from_another_boot_are_each_taken() {
        let db = TempDb::sqlite();
        let mut a = migrated(&db.url).await;
        db.exec(&[
            "INSERT INTO service_leader_lock (name, holder, instance, token, renewed_at, expires_at, boot_id) \
             VALUES ('e1', 'other', 'io', 7, 1000000, 1800000, 'another-boot'), \
                    ('e2', 'other', 'io', 3, 1000000, 1800000, 'another-boot')",
        ]);
        let reqs = [req("e1", "a", "ia"), req("e2", "a", "ia")];
        let mut tokens = [None, None];
        let deadline = Instant::now() + TTL * 5;
        while tokens.iter().any(Option::is_none) {
            assert!(Instant::now() < deadline, "not taken: {tokens:?}");
            for (r, token) in reqs.iter().zip(&mut tokens) {
                if token.is_none() {
                    if let Attempt::Granted { token: t } = a.acquire_or_renew(r).await.unwrap() {
                        *token = Some(t);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(tokens, [Some(8), Some(4)]);
    }

    /// A database made by an earlier leaderd (no kept tokens yet) is
    /// brought up to date by the migration at start.
    #[tokio::test]
    async fn an_older_schema_gets_the_kept_tokens() {
        let db = TempDb::sqlite();
        let mut a = migrated(&db.url).await;
        acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
        db.exec(&[
            "DROP TRIGGER service_leader_keep_token",
            "DROP TABLE service_leader_token",
        ]);
        drop(a);
        let mut a = migrated(&db.url).await;
        db.exec(&["DELETE FROM service_leader_lock"]);
        assert_eq!(db.scalar("SELECT COUNT(*) FROM service_leader_token"), "1");
        a.acquire_or_renew(&req("e", "a", "ia")).await.unwrap();
    }

    #[tokio::test]
    async fn a_local_file_passes_the_file_system_check() {
        // The check itself is unit-tested by file system type; here: a local
        // file passes and connects.
        let db = TempDb::sqlite();
        leaderd_store::check_file_system(db.url.trim_start_matches("sqlite://")).unwrap();
        migrated(&db.url).await;
    }
}

/// PostgreSQL specifics: what a refusal does not do, NOTIFY, and a user with
/// data rights only.
mod postgres_only {
    use super::*;
    use leaderd_store::Listener;
    use leaderd_tests::{block_on, pg_exec};

    fn scalar(url: &str, sql: &str) -> String {
        let (url, sql) = (url.to_owned(), sql.to_owned());
        block_on(async move {
            use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
            #[derive(diesel::QueryableByName)]
            struct V {
                #[diesel(sql_type = diesel::sql_types::Text)]
                v: String,
            }
            let mut c = AsyncPgConnection::establish(&url).await.unwrap();
            let rows: Vec<V> = diesel::sql_query(format!("SELECT ({sql})::text AS v"))
                .load(&mut c)
                .await
                .unwrap();
            rows.into_iter().next().unwrap().v
        })
    }

    #[tokio::test]
    async fn refusal_writes_nothing_and_burns_no_sequence_value() {
        let db = TempDb::postgres();
        let mut a = migrated(&db.url).await;
        let mut b = connect(&db.url).await;
        acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
        let version = scalar(
            &db.url,
            "SELECT xmin FROM service_leader_lock WHERE name = 'e'",
        );
        let seq = scalar(&db.url, "SELECT last_value FROM service_leader_lock_id_seq");
        for _ in 0..20 {
            assert!(matches!(
                b.acquire_or_renew(&req("e", "b", "ib")).await.unwrap(),
                Attempt::Refused(_)
            ));
        }
        assert_eq!(
            scalar(
                &db.url,
                "SELECT xmin FROM service_leader_lock WHERE name = 'e'"
            ),
            version
        );
        assert_eq!(
            scalar(&db.url, "SELECT last_value FROM service_leader_lock_id_seq"),
            seq
        );
    }

    /// A leader of thousands of elections dies: a follower takes them all
    /// in one call, on a plan made for any batch (a prepared statement's
    /// generic plan guesses ten rows per array). One statement takes at
    /// most 512 (each holds an advisory lock until it commits): the call
    /// sends it again for the rest. How long that takes is measured by
    /// `leaderd-bench batch` (a debug build among the other tests is no
    /// measure of it).
    #[tokio::test]
    async fn thousands_of_expired_elections_are_taken_in_one_call() {
        const N: usize = 5_000;
        let db = TempDb::postgres();
        migrated(&db.url).await;
        // 5,000 expired among 30,000; a live leader holds the rest.
        db.exec(&[
            &format!(
                "ALTER DATABASE {} SET plan_cache_mode = force_generic_plan",
                db.scalar("current_database()")
            ),
            // Held rows made by one statement each take the fence's key
            // (30,000 would fill the server's lock table): an operator's
            // bulk load goes around the trigger, as here.
            "ALTER TABLE service_leader_lock DISABLE TRIGGER service_leader_take_new",
            "INSERT INTO service_leader_lock (name, holder, instance, token, expires_at) \
             SELECT 'job-' || i, 'dead', 'dead-instance', i, \
                    CASE WHEN i % 6 = 0 THEN now() - interval '1 second' \
                         ELSE now() + interval '1 hour' END \
             FROM generate_series(1, 30000) i",
            "ALTER TABLE service_leader_lock ENABLE TRIGGER service_leader_take_new",
            "ANALYZE service_leader_lock",
        ]);
        let names: Vec<String> = (1..=N).map(|i| format!("job-{}", i * 6)).collect();
        let reqs: Vec<LeaseRequest<'_>> = names.iter().map(|n| req(n, "b", "ib")).collect();
        let mut b = connect(&db.url).await;
        let started = Instant::now();
        let answers = b.acquire_or_renew_many(&reqs).await.unwrap();
        let took = started.elapsed();
        let granted = answers
            .iter()
            .filter(|a| matches!(a, Ok(Attempt::Granted { .. })))
            .count();
        assert_eq!(
            granted,
            N,
            "{:?}",
            answers
                .iter()
                .find(|a| !matches!(a, Ok(Attempt::Granted { .. })))
        );
        eprintln!("{N} takeovers took {took:?}");
        assert_eq!(
            db.scalar(
                "SELECT count(*) FROM service_leader_lock \
                 WHERE instance = 'ib' AND token = substr(name, 5)::bigint + 1"
            ),
            N.to_string()
        );
    }

    const FILLFACTOR: &str = "SELECT coalesce(array_to_string(reloptions, ','), '') \
        FROM pg_class WHERE oid = 'service_leader_lock'::regclass";

    #[tokio::test]
    async fn the_table_leaves_room_for_renewals_on_new_and_old_installs() {
        let db = TempDb::postgres();
        migrated(&db.url).await;
        assert_eq!(scalar(&db.url, FILLFACTOR), "fillfactor=50");
        // Made by an earlier version (current by the catalog check): set
        // at the next migrate all the same.
        pg_exec(
            &db.url,
            &["ALTER TABLE service_leader_lock RESET (fillfactor)"],
        );
        assert_eq!(scalar(&db.url, FILLFACTOR), "");
        // While someone holds a lock on the table that the change needs (an
        // index being built): no wait beyond a moment, tried again later.
        {
            use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
            let mut holder = AsyncPgConnection::establish(&db.url).await.unwrap();
            holder
                .batch_execute(
                    "BEGIN; LOCK TABLE service_leader_lock IN SHARE UPDATE EXCLUSIVE MODE",
                )
                .await
                .unwrap();
            let migrating = connect(&db.url).await.migrate();
            let answer = tokio::time::timeout(Duration::from_secs(5), migrating)
                .await
                .expect("migrate waited on the table's lock");
            assert_eq!(answer.unwrap(), Migrated::UpToDate);
            assert_eq!(scalar(&db.url, FILLFACTOR), "");
        }
        assert_eq!(
            connect(&db.url).await.migrate().await.unwrap(),
            Migrated::UpToDate
        );
        assert_eq!(scalar(&db.url, FILLFACTOR), "fillfactor=50");
        // A fillfactor someone chose is theirs.
        pg_exec(
            &db.url,
            &["ALTER TABLE service_leader_lock SET (fillfactor = 70)"],
        );
        connect(&db.url).await.migrate().await.unwrap();
        assert_eq!(scalar(&db.url, FILLFACTOR), "fillfactor=70");
    }

    #[tokio::test]
    async fn release_notifies_listeners() {
        let db = TempDb::postgres();
        let mut a = migrated(&db.url).await;
        let url = DatabaseUrl::parse(&db.url).unwrap();
        let mut listener = Listener::connect(&url).await.unwrap();
        assert!(
            listener
                .probe(Duration::from_secs(3), "store-test")
                .await
                .unwrap()
                .delivered
        );
        acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
        assert!(a.release("e", "ia").await.unwrap());
        let payload = tokio::time::timeout(Duration::from_secs(2), listener.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(payload, "e");
    }

    #[tokio::test]
    async fn the_listen_probe_keeps_real_notifications() {
        let db = TempDb::postgres();
        let url = DatabaseUrl::parse(&db.url).unwrap();
        let mut listener = Listener::connect(&url).await.unwrap();
        // A release of election `e` notified just before the probe.
        pg_exec(&db.url, &["SELECT pg_notify('leaderd', 'e')"]);
        let probe = listener
            .probe(Duration::from_secs(3), "store-test")
            .await
            .unwrap();
        assert!(probe.delivered);
        assert_eq!(probe.others, ["e"]);
    }

    /// A table migrated by an earlier version gets the fence at the next
    /// migration, and one that has it is left alone.
    #[tokio::test]
    async fn the_fence_is_installed_on_an_earlier_schema() {
        let db = TempDb::postgres();
        migrated(&db.url).await;
        let has = "to_regprocedure('leaderd_fence(varchar, bigint, interval)') IS NOT NULL";
        assert_eq!(scalar(&db.url, has), "true");
        pg_exec(
            &db.url,
            &["DROP FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL)"],
        );
        assert_eq!(
            connect(&db.url).await.migrate().await.unwrap(),
            Migrated::Applied
        );
        assert_eq!(scalar(&db.url, has), "true");
        assert_eq!(
            connect(&db.url).await.migrate().await.unwrap(),
            Migrated::UpToDate
        );
    }

    #[tokio::test]
    async fn a_user_with_data_rights_only_works_once_the_table_exists() {
        let db = TempDb::postgres();
        migrated(&db.url).await;
        let role = format!("leaderd_data_{}", uuid::Uuid::new_v4().simple());
        pg_exec(
            &db.url,
            &[
                &format!("CREATE ROLE {role} LOGIN"),
                &format!("GRANT SELECT, INSERT, UPDATE ON service_leader_lock TO {role}"),
                &format!("GRANT USAGE ON SEQUENCE service_leader_lock_id_seq TO {role}"),
                &format!("REVOKE CREATE ON SCHEMA public FROM {role}"),
            ],
        );
        let as_role = db.url_as(&role);
        // A table an earlier version made, without the fillfactor: only its
        // owner may set that, and a user who may not goes on without it.
        // And without the fence, which it may not create either: it goes on
        // without it (logged), and the fence stays absent, not faked.
        pg_exec(
            &db.url,
            &[
                "ALTER TABLE service_leader_lock RESET (fillfactor)",
                "DROP FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL)",
            ],
        );
        assert_eq!(
            connect(&as_role).await.migrate().await.unwrap(),
            Migrated::UpToDate
        );
        assert_eq!(scalar(&db.url, FILLFACTOR), "");
        assert_eq!(
            scalar(
                &db.url,
                "to_regprocedure('leaderd_fence(varchar, bigint, interval)') IS NULL"
            ),
            "true"
        );
        let mut c = connect(&as_role).await;
        acquire(&mut c, &req("e", "a", "ia"), Duration::from_secs(3)).await;
        drop(c);
        pg_exec(&db.url, &[&format!("DROP OWNED BY {role}")]);
        drop(db);
        pg_exec(
            &leaderd_tests::postgres_admin_url(),
            &[&format!("DROP ROLE IF EXISTS {role}")],
        );
    }
}

/// MySQL/MariaDB: expiry must not depend on the server's time zone. The
/// driver sets the session to UTC when it connects, but leaderd does not rely
/// on that (a multiplexing proxy may not keep session state) and uses
/// `UTC_TIMESTAMP(6)` throughout; this checks a server whose global time
/// zone is not UTC.
mod mysql_only {
    use super::*;

    /// Sets the server's global time zone (which new sessions inherit) and
    /// restores the default when dropped.
    struct GlobalTimeZone;

    impl GlobalTimeZone {
        fn set(tz: &str) -> GlobalTimeZone {
            leaderd_tests::mysql_exec(&format!("SET GLOBAL time_zone = '{tz}'"));
            GlobalTimeZone
        }
    }

    impl Drop for GlobalTimeZone {
        fn drop(&mut self) {
            leaderd_tests::mysql_exec("SET GLOBAL time_zone = 'SYSTEM'");
        }
    }

    #[tokio::test]
    async fn expiry_ignores_the_session_time_zone() {
        for tz in ["+05:00", "-09:30"] {
            let db = TempDb::mysql();
            let _tz = GlobalTimeZone::set(tz);
            let mut a = migrated(&db.url).await;
            let mut b = connect(&db.url).await;
            let token = acquire(&mut a, &req("e", "a", "ia"), Duration::from_secs(3)).await;
            let seen = refused(b.acquire_or_renew(&req("e", "b", "ib")).await.unwrap());
            assert_eq!(seen.token, token);
            assert!(
                seen.remaining_us > 0 && seen.remaining_us <= TTL_US,
                "time zone {tz}: {seen:?}"
            );
            let rows = b.elections("").await.unwrap();
            assert!(
                rows[0].remaining_us > 0 && rows[0].remaining_us <= TTL_US,
                "{rows:?}"
            );
            // And it expires on time by the server's clock.
            let t2 = acquire(&mut b, &req("e", "b", "ib"), Duration::from_secs(3)).await;
            assert_eq!(t2, token + 1);
        }
    }
}

/// A waiter for the election `e` (and every other name it hears).
async fn waiter(db: &TempDb) -> Waiter {
    let url = DatabaseUrl::parse(&db.url).unwrap();
    Waiter::connect(&url, &[std::sync::Arc::from("e")], Duration::from_secs(1))
        .await
        .unwrap()
}

/// The next release the waiter hears, within a bound.
async fn heard(w: &mut Waiter) -> Released {
    tokio::time::timeout(Duration::from_secs(5), w.next(&|_| true))
        .await
        .expect("a release heard within 5 s")
        .unwrap()
}

/// Takes `e` on `c`, and releases it.
async fn take_and_release(c: &mut Connection, e: &str) {
    acquire(c, &req(e, "a", "ia"), Duration::from_secs(3)).await;
    assert!(c.release(e, "ia").await.unwrap());
}

fn election(name: &str) -> Released {
    Released::Election(name.to_owned())
}

/// A presence row's release wakes nobody: nobody waits to take it, and
/// a follower woken for nothing spends its wake-up (the engine takes
/// one each 50 ms), so the lease released a moment later was taken
/// 50 ms late (SQLite). On PostgreSQL its notification would wake every
/// listening session, the server's and each daemon's, in the middle of a
/// handover. (MySQL's wake-ups are the elections' own named locks.)
#[tokio::test]
async fn a_presence_rows_release_wakes_nobody() {
    for db in [TempDb::sqlite(), TempDb::postgres()] {
        presence_releases_wake_nobody(&db).await;
    }
}

async fn presence_releases_wake_nobody(db: &TempDb) {
    let mut c = migrated(&db.url).await;
    let mut w = waiter(db).await;
    let presence = "leaderd-presence/0123456789abcdef/slot-0";
    let away = "leaderd-presence/away/0123456789abcdef/a";
    let long = Duration::from_secs(3);
    for row in [presence, away] {
        take_and_release(&mut c, row).await;
    }
    take_and_release(&mut c, "e").await;
    // The first thing heard: the presence rows' releases said nothing.
    assert_eq!(heard(&mut w).await, election("e"));
    // Together (a shutdown): heard for the election, not the presence.
    for row in [presence, "f"] {
        acquire(&mut c, &req(row, "a", "ia"), long).await;
    }
    let released = c
        .release_many(&[rel(presence, "ia"), rel("f", "ia")])
        .await
        .unwrap();
    assert!(
        released.iter().all(|r| matches!(r, Ok(true))),
        "{released:?}"
    );
    assert_eq!(heard(&mut w).await, election("f"));
}

/// SQLite: many processes opening a brand-new file at once (each switching
/// it to WAL) all get a working connection.
mod sqlite_only {
    use super::*;

    /// The file releases append to, beside the database.
    fn wake_file(db: &TempDb) -> String {
        format!("{}.leaderd-wake", db.url.trim_start_matches("sqlite://"))
    }

    /// Appends `bytes` to the file at `path` by hand, as a writer other
    /// than a release would.
    fn append(path: &str, bytes: &[u8]) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
    }

    /// Each release is heard by its name, however close together, so that
    /// one election's release does not spend another's followers' wake-up
    /// (the file once held only the last name, and every follower of every
    /// election woke at each release).
    #[tokio::test]
    async fn every_release_is_heard_by_its_name() {
        let db = TempDb::sqlite();
        let mut a = migrated(&db.url).await;
        let mut b = connect(&db.url).await;
        let mut w = waiter(&db).await;
        let long = Duration::from_secs(3);
        acquire(&mut a, &req("e1", "a", "ia"), long).await;
        acquire(&mut b, &req("e2", "b", "ib"), long).await;
        for e in ["g", "h"] {
            acquire(&mut a, &req(e, "a", "ia"), long).await;
        }
        assert!(a.release("e1", "ia").await.unwrap());
        assert!(b.release("e2", "ib").await.unwrap());
        let both = a
            .release_many(&[rel("g", "ia"), rel("h", "ia")])
            .await
            .unwrap();
        assert!(both.iter().all(|r| matches!(r, Ok(true))), "{both:?}");
        for e in ["e1", "e2", "g", "h"] {
            assert_eq!(heard(&mut w).await, election(e));
        }
        // A refused release (not the holder) says nothing: the next heard
        // is the one after it.
        acquire(&mut a, &req("e1", "a", "ia"), long).await;
        assert!(!b.release("e1", "ib").await.unwrap());
        assert!(a.release("e1", "ia").await.unwrap());
        assert_eq!(heard(&mut w).await, election("e1"));
        // The file takes the database's mode, so that whoever may write
        // the database (another user of its group) may append to it.
        use std::os::unix::fs::PermissionsExt;
        let file = db.url.trim_start_matches("sqlite://").to_owned();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o664)).unwrap();
        take_and_release(&mut a, "g").await;
        let mode = std::fs::metadata(wake_file(&db))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o664);
    }

    /// Where the waiter cannot tell what was released, it says so, and
    /// every election looks: the file rewritten whole (an older leaderd on
    /// the same host), a line it cannot read, the file started afresh.
    /// Then it goes on hearing names.
    #[tokio::test]
    async fn a_release_it_cannot_name_wakes_everyone() {
        let db = TempDb::sqlite();
        let path = wake_file(&db);
        let mut c = migrated(&db.url).await;
        // Past the size at which the next writer starts the file afresh,
        // before the waiter starts (it reads from the end).
        std::fs::write(&path, "65\n".repeat(100_000)).unwrap();
        let mut w = waiter(&db).await;
        // Started afresh: heard as unknown (perhaps after "f" itself).
        take_and_release(&mut c, "f").await;
        let mut got = heard(&mut w).await;
        if got == election("f") {
            got = heard(&mut w).await;
        }
        assert_eq!(got, Released::Unknown);
        assert!(
            std::fs::metadata(&path).unwrap().len() < 1024,
            "started afresh"
        );
        // Rewritten whole, by rename.
        let tmp = format!("{path}.old");
        std::fs::write(&tmp, "e").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(heard(&mut w).await, Released::Unknown);
        // A line that is not a name.
        append(&path, b"not hex\n");
        assert_eq!(heard(&mut w).await, Released::Unknown);
        // And names again.
        take_and_release(&mut c, "g").await;
        assert_eq!(heard(&mut w).await, election("g"));
        // Emptied in place (by hand, say): what was cut is not known.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(heard(&mut w).await, Released::Unknown);
        take_and_release(&mut c, "h").await;
        assert_eq!(heard(&mut w).await, election("h"));
    }

    /// A line read before its end was written is read whole with its end;
    /// one left unfinished (a writer that died half-way, an older
    /// leaderd's name) does not run into the next release's.
    #[tokio::test]
    async fn a_line_is_read_whole_and_an_unfinished_one_stays_apart() {
        let db = TempDb::sqlite();
        let path = wake_file(&db);
        let mut c = migrated(&db.url).await;
        let mut w = waiter(&db).await;
        // "e" is 65 in hex: its two halves apart.
        append(&path, b"6");
        append(&path, b"5\n");
        assert_eq!(heard(&mut w).await, election("e"));
        // "12" reads as hex too: left unfinished, then a release.
        append(&path, b"12");
        take_and_release(&mut c, "g").await;
        assert_eq!(heard(&mut w).await, election("\u{12}"));
        assert_eq!(heard(&mut w).await, election("g"));
    }

    /// Something other than a plain file where the wake file goes: a FIFO
    /// blocks neither the release nor the waiter, a symbolic link does not
    /// lead the appends elsewhere. Both are replaced by a plain file, heard
    /// as a release that cannot be named.
    #[tokio::test]
    async fn a_fifo_or_a_link_in_its_place_blocks_nothing_and_leads_nowhere() {
        let db = TempDb::sqlite();
        let path = wake_file(&db);
        let mut c = migrated(&db.url).await;
        let long = Duration::from_secs(3);
        let elsewhere = format!("{path}.elsewhere");
        std::fs::write(&elsewhere, "untouched").unwrap();
        let fifo = |p: &str| {
            let made = std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .unwrap();
            assert!(made.success());
        };
        let link = |p: &str| std::os::unix::fs::symlink(&elsewhere, p).unwrap();
        // A blocking open would stall this test's runtime, and no timeout
        // in it could fire: a thread opens the FIFO's other end after a
        // while, which ends any such open, and says so.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watchdog = {
            let (done, stalled, path) = (done.clone(), stalled.clone(), path.clone());
            std::thread::spawn(move || {
                let until = Instant::now() + Duration::from_secs(20);
                while !done.load(std::sync::atomic::Ordering::SeqCst) {
                    if Instant::now() > until {
                        stalled.store(true, std::sync::atomic::Ordering::SeqCst);
                        let _ = std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .open(&path);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        for (what, place) in [("a FIFO", &fifo as &dyn Fn(&str)), ("a link", &link)] {
            let _ = std::fs::remove_file(&path);
            place(&path);
            let mut w = waiter(&db).await;
            acquire(&mut c, &req("e", "a", "ia"), long).await;
            assert!(c.release("e", "ia").await.unwrap());
            assert!(
                !stalled.load(std::sync::atomic::Ordering::SeqCst),
                "blocked beside {what}"
            );
            assert_eq!(heard(&mut w).await, Released::Unknown, "{what}");
            assert!(std::fs::metadata(&path).unwrap().is_file(), "{what}");
            assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
            take_and_release(&mut c, "f").await;
            assert_eq!(heard(&mut w).await, election("f"), "{what}");
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        watchdog.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_connections_open_a_new_file_at_once() {
        for _ in 0..5 {
            let db = TempDb::sqlite();
            let opens: Vec<_> = (0..12)
                .map(|_| {
                    let url = db.url.clone();
                    tokio::spawn(async move { connect(&url).await.migrate().await })
                })
                .collect();
            for o in opens {
                o.await.unwrap().expect("open and migrate");
            }
        }
    }
}
