//! A replica's account of itself when it does not compete: readiness and
//! `leaderd_db_up` tell of the database link only, so on-call is sent to
//! the database only when the database is the cause.

use std::time::{Duration, Instant};

use leaderd_store::{Connection, LeaseRequest, Release, Successor};
use leaderd_tests::app::App;
use leaderd_tests::sse::Watcher;
use leaderd_tests::store::{acquire, migrated};
use leaderd_tests::{block_on, http_get, run_cli, serial, wait_for, Daemon, Scratch, TempDb};

/// `/readyz`'s status and `leaderd_db_up`'s value, or `None` when either
/// does not answer.
fn readiness(d: &Daemon) -> Option<(u16, String)> {
    let (ready, _) = http_get(d.port, "/readyz")?;
    let (_, metrics) = http_get(d.port, "/metrics")?;
    let db_up = metrics
        .lines()
        .find(|l| l.starts_with("leaderd_db_up"))?
        .rsplit(' ')
        .next()?
        .to_owned();
    Some((ready, db_up))
}

/// Ready and `leaderd_db_up 1` within 3 s, then every 100 ms for `for_`,
/// while `d` never leads.
fn ready_throughout(d: &Daemon, for_: Duration, what: &str) {
    wait_for(Duration::from_secs(3), "readiness", || {
        (readiness(d) == Some((200, "1".into()))).then_some(())
    });
    let until = Instant::now() + for_;
    while Instant::now() < until {
        assert_eq!(
            readiness(d),
            Some((200, "1".into())),
            "{what}: /readyz and leaderd_db_up say the database is down"
        );
        assert!(!d.is_leader(), "{what}: it leads");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An app that fails its health check from the start: the replica never
/// competes, yet the database answers it, and it says so.
#[test]
fn an_app_that_never_passes_leaves_readiness_to_the_database() {
    let _s = serial();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let app = App::start(false);
    let d = Daemon::start(&db.url, "a", &dir, &["--app-health", &app.url()]);
    ready_throughout(&d, Duration::from_secs(5), "app failing");
    let body = d.leader().unwrap().1;
    assert_eq!(body["competing"], false, "{body}");
    assert_eq!(body["not_competing"], "app_unhealthy", "{body}");
    assert!(metric(&d, "leaderd_competing").starts_with('0'));
}

/// The value of the first series of `name` on `d`'s `/metrics`.
fn metric(d: &Daemon, name: &str) -> String {
    let (_, text) = http_get(d.port, "/metrics").expect("/metrics");
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
        .to_owned()
}

/// The only replica is released for an hour: `leaderd release` warns
/// that nobody competes now, the daemon logs that it names no successor,
/// and the hold shows everywhere (`/leader`, the watch stream, the
/// metrics). `leaderd resume` ends the hold at once: it leads again. A
/// second resume has nothing to end (exit 3).
#[test]
fn a_hold_is_told_and_resume_ends_it() {
    let _s = serial();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let d = Daemon::start(&db.url, "a", &dir, &[]);
    wait_for(Duration::from_secs(10), "a leads", || {
        d.is_leader().then_some(())
    });
    let body = d.leader().unwrap().1;
    assert_eq!(body["competing"], true, "{body}");
    assert_eq!(body["not_competing"], serde_json::Value::Null, "{body}");
    let watcher = Watcher::open(d.port).expect("a watcher");
    let listen = format!("127.0.0.1:{}", d.port);
    // The last competing replica: released all the same, with a warning.
    let (code, out, err) = run_cli(&["release", "--listen", &listen, "--hold", "1h"], &[]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        err.contains("warning: no other replica competes") && err.contains("leaderd resume"),
        "{err}"
    );
    let log = d.log_text();
    assert!(log.contains("releasing with no successor to name"), "{log}");
    let (_, event) = watcher
        .until(Duration::from_secs(3), |e| e["not_competing"] == "held")
        .expect("the watch stream tells of the hold");
    assert_eq!(event["competing"], false, "{event}");
    let body = d.leader().unwrap().1;
    assert_eq!(body["not_competing"], "held", "{body}");
    let left = body["hold_remaining_ms"].as_u64().unwrap();
    assert!((3_590_000..=3_600_000).contains(&left), "{body}");
    let seconds: f64 = metric(&d, "leaderd_hold_remaining_seconds")
        .parse()
        .unwrap();
    assert!((3590.0..=3600.0).contains(&seconds), "{seconds}");
    assert_eq!(metric(&d, "leaderd_competing"), "0");
    let (code, out, err) = run_cli(&["resume", "--listen", &listen], &[]);
    assert_eq!(code, 0, "{out} {err}");
    wait_for(Duration::from_secs(3), "a leads again", || {
        d.is_leader().then_some(())
    });
    let body = d.leader().unwrap().1;
    assert_eq!(body["competing"], true, "{body}");
    assert_eq!(body["hold_remaining_ms"], serde_json::Value::Null, "{body}");
    let (code, _, err) = run_cli(&["resume", "--listen", &listen], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("nothing to resume"), "{err}");
}

/// A leader released with an hour's hold does not compete for that hour;
/// the database still answers it, and it says so. On PostgreSQL, where
/// the look-out goes through the daemon's one connection too.
#[test]
fn a_held_replica_stays_ready_while_the_database_answers() {
    let _s = serial();
    for db in [TempDb::sqlite(), TempDb::postgres()] {
        let dir = Scratch::new();
        let d = Daemon::start(&db.url, "a", &dir, &[]);
        wait_for(Duration::from_secs(10), "a leads", || {
            d.is_leader().then_some(())
        });
        d.release("?hold=1h");
        ready_throughout(&d, Duration::from_secs(5), "held");
    }
}

/// Nobody leads, and `leaderd status` run anywhere says why: one replica's
/// app fails its health check, the other was released for an hour. Each
/// is listed with its reason (and what is left of the hold) from the rows
/// they keep, in the summary beside the table and with `--replicas`; once
/// resumed, the held one competes (and leads) again, and says so. On each
/// backend (the note rides in the row's address, which each writes).
#[test]
fn status_lists_every_replica_and_why_it_does_not_compete() {
    let _s = serial();
    for db in [TempDb::sqlite(), TempDb::postgres(), TempDb::mysql()] {
        let dir = Scratch::new();
        let app = App::start(false);
        let a = Daemon::start(&db.url, "a", &dir, &["--app-health", &app.url()]);
        let b = Daemon::start(&db.url, "b", &dir, &[]);
        wait_for(Duration::from_secs(10), "b leads", || {
            b.is_leader().then_some(())
        });
        b.release("?hold=1h");
        let replicas = || {
            let (code, out, err) = run_cli(
                &["status", "--replicas", "--json", "--database-url", &db.url],
                &[],
            );
            assert_eq!(code, 0, "{out} {err}");
            serde_json::from_str::<serde_json::Value>(&out).expect("JSON")
        };
        let list = wait_for(Duration::from_secs(5), "both away", || {
            let list = replicas();
            (list[0]["not_competing"] == "app_unhealthy" && list[1]["not_competing"] == "held")
                .then_some(list)
        });
        assert_eq!(list[0]["replica"], "a", "{list}");
        assert_eq!(list[1]["replica"], "b", "{list}");
        assert_eq!(list[1]["competing"], false, "{list}");
        let left = list[1]["hold_remaining_ms"].as_u64().unwrap();
        assert!((3_500_000..=3_600_000).contains(&left), "{list}");
        let (code, out, err) = run_cli(&["status", "--database-url", &db.url], &[]);
        assert_eq!(code, 0, "{out} {err}");
        assert!(
            err.contains("replicas: a app_unhealthy; b held, 59 min left"),
            "{err}"
        );
        let listen = format!("127.0.0.1:{}", b.port);
        let (code, out, err) = run_cli(&["resume", "--listen", &listen], &[]);
        assert_eq!(code, 0, "{out} {err}");
        wait_for(Duration::from_secs(5), "b competes again", || {
            let list = replicas();
            (list[1]["competing"] == true && b.is_leader()).then_some(())
        });
        assert!(!a.is_leader());
    }
}

/// A row held by `instance` (id `holder`) for a minute: made, taken, then
/// renewed (a row made now is blocked for its first ttl, so a short one).
async fn hold_for_a_minute(conn: &mut Connection, election: &str, holder: &str, instance: &str) {
    let mut req = LeaseRequest {
        election,
        holder,
        instance,
        ttl: Duration::from_millis(200),
        held_token: None,
        daemon: None,
        address: None,
    };
    let token = acquire(conn, &req, Duration::from_secs(5)).await;
    req.held_token = Some(token);
    req.ttl = Duration::from_secs(60);
    acquire(conn, &req, Duration::from_secs(5)).await;
}

/// A released row waits for the successor its release named, and nobody
/// else may take it meanwhile: `leaderd status` says whose turn it is and
/// how long it lasts, or that the named replica has gone (it keeps no live
/// row), rather than `(free)`. On each backend.
#[test]
fn status_names_whose_turn_a_released_row_waits_for() {
    let _s = serial();
    for db in [TempDb::sqlite(), TempDb::postgres(), TempDb::mysql()] {
        let url = db.url.clone();
        block_on(async move {
            let mut conn = migrated(&url).await;
            hold_for_a_minute(
                &mut conn,
                "leaderd-presence/0123456789abcdef/slot-0",
                "b",
                "0/b",
            )
            .await;
            for (election, named) in [("jobs", "0/b"), ("mailer", "0/gone")] {
                hold_for_a_minute(&mut conn, election, "a", "ia").await;
                let release = Release {
                    election,
                    instance: "ia",
                    successor: Some(Successor {
                        daemon: named,
                        window: Duration::from_secs(60),
                    }),
                };
                assert!(conn.release_one(&release).await.unwrap());
            }
        });
        let (code, out, err) = run_cli(&["status", "--database-url", &db.url], &[]);
        assert_eq!(code, 0, "{out} {err}");
        let line = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(name));
            line.unwrap_or_else(|| panic!("no {name} in {out}"))
                .to_owned()
        };
        let jobs = line("jobs ");
        assert!(jobs.contains("(free, next: b)"), "{out}");
        let left: u64 = jobs
            .split_whitespace()
            .find_map(|w| w.strip_suffix("ms")?.parse().ok())
            .unwrap_or_else(|| panic!("no turn left in {jobs}"));
        assert!((1..=60_000).contains(&left), "{out}");
        assert!(
            line("mailer ").contains("(free, next: a replica not live)"),
            "{out}"
        );
        let (code, out, err) = run_cli(&["status", "--json", "--database-url", &db.url], &[]);
        assert_eq!(code, 0, "{out} {err}");
        let list: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let of = |name: &str| {
            list.as_array()
                .unwrap()
                .iter()
                .find(|e| e["election"] == name)
                .unwrap_or_else(|| panic!("no {name} in {list}"))
                .clone()
        };
        let jobs = of("jobs");
        assert_eq!(jobs["holder"], serde_json::Value::Null, "{jobs}");
        assert_eq!(jobs["successor"]["replica"], "b", "{jobs}");
        let left = jobs["successor"]["turn_remaining_ms"].as_u64().unwrap();
        assert!((1..=60_000).contains(&left), "{jobs}");
        let mailer = of("mailer");
        assert_eq!(mailer["successor"]["replica"], serde_json::Value::Null);
        assert!(mailer["successor"]["turn_remaining_ms"].as_u64().unwrap() > 0);
    }
}
