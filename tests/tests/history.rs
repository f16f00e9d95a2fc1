//! The record of terms (`leaderd history`) with real daemons, on each
//! backend: a first term; a release to nobody (the replica held) and a
//! takeover of the free row; a SIGTERM that names a successor; a SIGKILL,
//! and a takeover written as a daemon of an earlier version writes it
//! (holder, instance and token only). Each term is listed with its token,
//! holder and how it began and ended, renewals add nothing, and an
//! election keeps its last 100 terms.

use std::time::Duration;

use leaderd_tests::sse::boot_us;
use leaderd_tests::{
    http_get, print_logs, run_cli, serial, wait_for, Daemon, Kind, Scratch, TempDb,
};
use serde_json::Value;

const ELECTION: &str = "jobs";

fn start(db: &TempDb, dir: &Scratch, id: &str) -> Daemon {
    Daemon::launch(&db.url, id, dir, id, &[])
        .elections(&[ELECTION])
        .start()
}

/// The database's "now" in the lock table's terms.
fn now_sql(db: &TempDb) -> String {
    match db.kind {
        Kind::Postgres => "now()".to_owned(),
        Kind::Mysql => "UTC_TIMESTAMP(6)".to_owned(),
        // SQLite's times are µs on the boot clock.
        Kind::Sqlite => boot_us().to_string(),
    }
}

/// Waits until `n` replicas keep a live presence row (so that a release
/// can name one as successor).
fn wait_present(db: &TempDb, n: usize) {
    wait_for(Duration::from_secs(10), &format!("{n} presences"), || {
        let sql = format!(
            "SELECT count(*) FROM service_leader_lock WHERE name LIKE 'leaderd-presence/%' \
             AND holder IS NOT NULL AND expires_at > {}",
            now_sql(db)
        );
        (db.scalar(&sql) == n.to_string()).then_some(())
    });
}

fn leads(d: &Daemon) -> bool {
    d.leading().is_some_and(|l| l.iter().any(|e| e == ELECTION))
}

/// `leaderd history --json` for the election: oldest first.
fn history(db: &TempDb, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["history", "--json", "--database-url", &db.url];
    args.extend_from_slice(extra);
    let (code, out, err) = run_cli(&args, &[]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<Vec<Value>>(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Token, holder, how it began, earlier version, how it ended.
fn summary(terms: &[Value]) -> Vec<(i64, String, String, bool, Option<String>)> {
    terms
        .iter()
        .map(|t| {
            (
                t["token"].as_i64().unwrap(),
                t["holder"].as_str().unwrap_or("-").to_owned(),
                t["began_how"].as_str().unwrap().to_owned(),
                t["earlier_version"].as_bool().unwrap(),
                t["ended_how"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn record_of_terms(db: TempDb) {
    let _s = serial();
    let dir = Scratch::new();
    let a = start(&db, &dir, "a");
    wait_for(Duration::from_secs(10), "a to lead", || {
        leads(&a).then_some(())
    });
    // Renewals for a few heartbeats: none may add a term.
    wait_for(Duration::from_secs(10), "a few renewals", || {
        let renewed = format!(
            "SELECT count(*) FROM service_leader_lock WHERE name = '{ELECTION}' \
             AND renewed_at > acquired_at"
        );
        (db.scalar(&renewed) == "1").then_some(())
    });
    assert_eq!(history(&db, &[]).len(), 1, "renewals recorded nothing");

    // Released to nobody (a alone, and held off after), taken by b.
    a.release("?hold=10m");
    let b = start(&db, &dir, "b");
    wait_for(Duration::from_secs(10), "b to lead", || {
        leads(&b).then_some(())
    });

    // SIGTERM names the other live replica (c; a is held) as successor.
    let mut c = start(&db, &dir, "c");
    wait_present(&db, 3);
    wait_for(Duration::from_secs(10), "c ready", || {
        http_get(c.port, "/readyz").filter(|(s, _)| *s == 200)
    });
    b.sigterm();
    wait_for(Duration::from_secs(10), "c to lead", || {
        leads(&c).then_some(())
    });

    // SIGKILL: the lease runs out; a daemon of an earlier version takes
    // the row as it did, writing holder, instance and token alone.
    c.sigkill();
    c.wait_exit(Duration::from_secs(5));
    wait_for(Duration::from_secs(10), "c's lease to run out", || {
        let expired = format!(
            "SELECT count(*) FROM service_leader_lock WHERE name = '{ELECTION}' \
             AND expires_at <= {}",
            now_sql(&db)
        );
        (db.scalar(&expired) == "1").then_some(())
    });
    let (now, hour) = match db.kind {
        Kind::Sqlite => (
            boot_us().to_string(),
            format!("{}", boot_us() + 3_600_000_000),
        ),
        Kind::Postgres => ("now()".to_owned(), "now() + interval '1 hour'".to_owned()),
        Kind::Mysql => (
            "UTC_TIMESTAMP(6)".to_owned(),
            "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR".to_owned(),
        ),
    };
    db.exec(&[&format!(
        "UPDATE service_leader_lock SET holder = 'old', instance = 'i-old', token = token + 1, \
         acquired_at = {now}, renewed_at = {now}, expires_at = {hour} WHERE name = '{ELECTION}'"
    )]);

    let terms = history(&db, &["--election", ELECTION]);
    print_logs([&a, &b, &c]);
    let seen = summary(&terms);
    let first = seen[0].0;
    let want = |token: i64, holder: &str, how: &str, earlier: bool, end: Option<&str>| {
        (
            token,
            holder.to_owned(),
            how.to_owned(),
            earlier,
            end.map(str::to_owned),
        )
    };
    assert_eq!(
        seen,
        [
            want(first, "a", "first", false, Some("released")),
            want(first + 1, "b", "released", false, Some("released")),
            want(first + 2, "c", "successor", false, Some("expired")),
            want(first + 3, "old", "expired", true, None),
        ],
        "{terms:#?}"
    );
    // Times by the database's clock, in order; c's term ends at its
    // lease's end, which comes after it began.
    for t in &terms[..3] {
        let (began, ended) = (
            t["began_at"].as_str().unwrap(),
            t["ended_at"].as_str().unwrap(),
        );
        assert!(began < ended, "{t}");
        assert!(t["instance"].as_str().is_some_and(|i| !i.is_empty()), "{t}");
    }
    assert!(terms[0]["began_at"].as_str() < terms[1]["began_at"].as_str());
    assert_eq!(terms[3]["instance"], "i-old");

    // The text form says the same, one line per term.
    let (code, out, err) = run_cli(&["history", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 5, "{out}");
    assert!(out.contains("expired (earlier version)"), "{out}");
    assert!(out.lines().nth(3).unwrap().contains("successor"), "{out}");

    // Bounded: 120 more takeovers, 100 kept (the newest).
    let takeovers: Vec<String> = (0..120)
        .map(|i| {
            format!(
                "UPDATE service_leader_lock SET holder = 'x{i}', instance = 'i{i}', \
                 token = token + 1 WHERE name = '{ELECTION}'"
            )
        })
        .collect();
    let refs: Vec<&str> = takeovers.iter().map(String::as_str).collect();
    db.exec(&refs);
    let kept = history(&db, &["--limit", "1000"]);
    assert_eq!(kept.len(), 100);
    assert_eq!(kept[99]["token"].as_i64(), Some(first + 3 + 120));
    assert_eq!(kept[99]["holder"], "x119");

    // Released naming a successor whose window has passed, then taken by
    // an earlier version's daemon that writes no time of its own: taken
    // after a release, beginning when it was taken (not at the previous
    // term's start).
    let now = now_sql(&db);
    db.exec(&[&format!(
        "UPDATE service_leader_lock SET holder = NULL, instance = NULL, successor = 'zz', \
         expires_at = {now} WHERE name = '{ELECTION}'"
    )]);
    db.exec(&[&format!(
        "UPDATE service_leader_lock SET holder = 'old2', instance = 'i-old2', token = token + 1 \
         WHERE name = '{ELECTION}'"
    )]);
    let last = history(&db, &["--limit", "2"]);
    assert_eq!(last[0]["ended_how"], "released", "{last:#?}");
    assert_eq!(
        (
            &last[1]["holder"],
            &last[1]["began_how"],
            &last[1]["earlier_version"]
        ),
        (
            &Value::from("old2"),
            &Value::from("released"),
            &Value::from(true)
        ),
        "{last:#?}"
    );
    assert!(
        last[1]["began_at"].as_str() >= last[0]["ended_at"].as_str(),
        "{last:#?}"
    );
    // The row deleted: its last term's end is unknown, not "holding".
    db.exec(&[&format!(
        "DELETE FROM service_leader_lock WHERE name = '{ELECTION}'"
    )]);
    let last = history(&db, &["--limit", "1"]);
    assert_eq!(last[0]["ended_how"], "unknown", "{last:#?}");
}

#[test]
fn record_of_terms_sqlite() {
    record_of_terms(TempDb::sqlite());
}

#[test]
fn record_of_terms_postgres() {
    record_of_terms(TempDb::postgres());
}

#[test]
fn record_of_terms_mysql() {
    record_of_terms(TempDb::mysql());
}

/// Without the record installed, `leaderd history` says so and how to
/// install it, and exits 1.
#[test]
fn history_names_a_missing_record() {
    let _s = serial();
    let db = TempDb::sqlite();
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    db.exec(&["DROP TABLE service_leader_history"]);
    let (code, _, err) = run_cli(&["history", "--database-url", &db.url], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("leaderd migrate"), "{err}");
}
