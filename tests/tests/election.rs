//! Process-level elections: real `leaderd` daemons on one real database.

use std::time::{Duration, Instant};

use leaderd_tests::{serial, wait_for, wait_single_leader, Daemon, Scratch, TempDb, Value};

/// Default timing: heartbeat 1 s, ttl 1.2 s.
const HEARTBEAT: Duration = Duration::from_millis(1000);
const TTL: Duration = Duration::from_millis(1200);
/// Room on top of the expected failover for the machine, not for leaderd:
/// a commit stalled on a loaded CI machine (seen: a 1.53 s SIGKILL failover,
/// a 1.47 s handover). These bounds catch a broken mechanism (no failover, a
/// second ttl, a handover that waits for the next poll where it should not);
/// the precise figures are the bench's (`BENCHMARKS.md`), and the handover
/// tests check the wake-ups over eight rounds.
const SLACK: Duration = Duration::from_millis(1000);

/// What every `/leader` sample must satisfy, across all daemons and time:
/// a token is reported as leading by one id only, and leading tokens never go
/// backwards.
#[derive(Default)]
struct Checker {
    max_token: i64,
    owners: std::collections::HashMap<i64, String>,
}

impl Checker {
    fn sample(&mut self, daemons: &[&Daemon]) -> Vec<usize> {
        let mut leaders = Vec::new();
        for (i, d) in daemons.iter().enumerate() {
            if let Some((200, body)) = d.leader() {
                let token = body["token"].as_i64().expect("leader reports a token");
                assert_eq!(
                    body["leader"].as_str(),
                    Some(d.id.as_str()),
                    "a leader names itself"
                );
                assert!(
                    token >= self.max_token,
                    "token went back from {} to {token}",
                    self.max_token
                );
                self.max_token = token;
                let owner = self.owners.entry(token).or_insert_with(|| d.id.clone());
                assert_eq!(owner, &d.id, "token {token} reported by two replicas");
                leaders.push(i);
            }
        }
        leaders
    }

    /// Samples until one of `daemons` leads; returns its index.
    fn wait_leader(&mut self, daemons: &[&Daemon], within: Duration) -> usize {
        wait_for(within, "a leader", || {
            let leaders = self.sample(daemons);
            assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
            leaders.first().copied()
        })
    }
}

fn token(d: &Daemon) -> i64 {
    d.leader().expect("daemon answers").1["token"]
        .as_i64()
        .expect("token")
}

/// A scenario's daemons (running or not), the directory of their logs and
/// their database, for checks after it. Dropped in this order: the daemons
/// stop before their database goes.
struct Ran {
    daemons: Vec<Daemon>,
    _dir: Scratch,
    _db: TempDb,
}

fn start_three(db: &TempDb, dir: &Scratch) -> Vec<Daemon> {
    ["a", "b", "c"]
        .iter()
        .map(|id| Daemon::start(&db.url, id, dir, &[]))
        .collect()
}

fn three_daemons_elect_exactly_one_leader_and_stay_stable(db: TempDb) -> Ran {
    let _serial = serial();
    let dir = Scratch::new();
    let ds = start_three(&db, &dir);
    let refs: Vec<&Daemon> = ds.iter().collect();
    let leader = wait_single_leader(&refs, Duration::from_secs(10));
    let first_token = token(&ds[leader]);
    let mut checker = Checker::default();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert_eq!(
            checker.sample(&refs),
            vec![leader],
            "leadership moved or split"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        token(&ds[leader]),
        first_token,
        "a stable leader keeps its token"
    );
    for (i, d) in ds.iter().enumerate() {
        let (status, body) = d.leader().unwrap();
        assert_eq!(
            body["leader"].as_str(),
            Some(ds[leader].id.as_str()),
            "{} names the leader",
            d.id
        );
        assert_eq!(body["token"].as_i64(), Some(first_token));
        assert_eq!(status == 200, i == leader);
        assert_eq!(d.flag.exists(), i == leader, "flag file of {}", d.id);
    }
    let flag: Value = serde_json::from_slice(&std::fs::read(&ds[leader].flag).unwrap()).unwrap();
    assert_eq!(flag["token"].as_i64(), Some(first_token));
    assert_eq!(flag["id"].as_str(), Some(ds[leader].id.as_str()));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let expires = flag["expires_at_unix_ms"].as_i64().unwrap();
    assert!(
        expires > now_ms && expires <= now_ms + 1200,
        "flag expiry {expires} vs now {now_ms}"
    );
    Ran {
        daemons: ds,
        _dir: dir,
        _db: db,
    }
}

/// Kills the leader of `ds` with `kill`, measures the time until another
/// daemon answers 200, and checks the token grew.
fn failover(ds: &mut [Daemon], kill: impl FnOnce(&Daemon), within: Duration) -> (usize, Duration) {
    let refs: Vec<&Daemon> = ds.iter().collect();
    let mut checker = Checker::default();
    let old = checker.wait_leader(&refs, Duration::from_secs(10));
    let old_token = token(&ds[old]);
    let others: Vec<&Daemon> = ds
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != old)
        .map(|(_, d)| d)
        .collect();
    let started = Instant::now();
    kill(&ds[old]);
    let new = checker.wait_leader(&others, within + Duration::from_secs(2));
    let took = started.elapsed();
    assert!(token(others[new]) > old_token, "token did not grow");
    assert!(took <= within, "failover took {took:?}, limit {within:?}");
    eprintln!("failover took {took:?}");
    (old, took)
}

fn sigkill_of_the_leader_fails_over_within_ttl(db: TempDb) -> Ran {
    let _serial = serial();
    let dir = Scratch::new();
    let mut ds = start_three(&db, &dir);
    let (killed, _) = failover(&mut ds, Daemon::sigkill, TTL + SLACK);
    ds[killed]
        .wait_exit(Duration::from_secs(2))
        .expect("killed");
    Ran {
        daemons: ds,
        _dir: dir,
        _db: db,
    }
}

/// `within`: [`SLACK`] where release notifications wake the followers at
/// once, one heartbeat more through a pooler (no notifications: they poll).
fn sigterm_of_the_leader_hands_over_and_exits_cleanly(db: TempDb, within: Duration) -> Ran {
    let _serial = serial();
    let dir = Scratch::new();
    let mut ds = start_three(&db, &dir);
    let (stopped, _) = failover(&mut ds, Daemon::sigterm, within);
    let status = ds[stopped]
        .wait_exit(Duration::from_secs(2))
        .expect("exits within 2 s");
    assert_eq!(status.code(), Some(0));
    assert!(!ds[stopped].flag.exists(), "flag file left behind");
    let events = ds[stopped].log_events();
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "shutdown" && e["token"].is_i64()),
        "no shutdown transition logged: {}",
        ds[stopped].log_text()
    );
    Ran {
        daemons: ds,
        _dir: dir,
        _db: db,
    }
}

fn tokens_grow_at_every_change_of_leader(db: TempDb) {
    let _serial = serial();
    let dir = Scratch::new();
    let mut ds = start_three(&db, &dir);
    let mut tokens = Vec::new();
    for round in 0..4 {
        let refs: Vec<&Daemon> = ds.iter().collect();
        let leader = wait_single_leader(&refs, Duration::from_secs(10));
        tokens.push(token(&ds[leader]));
        ds[leader].sigterm();
        assert_eq!(
            ds[leader]
                .wait_exit(Duration::from_secs(2))
                .and_then(|s| s.code()),
            Some(0)
        );
        let id = format!("{}{round}", ds[leader].id);
        ds[leader] = Daemon::start(&db.url, &id, &dir, &[]);
    }
    assert!(tokens.windows(2).all(|w| w[1] > w[0]), "tokens: {tokens:?}");
}

#[test]
fn sigterm_is_bounded_when_the_database_is_unreachable() {
    let _serial = serial();
    let dir = Scratch::new();
    // Nothing listens on this port: every connect fails at once.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/none",
        leaderd_tests::free_port()
    );
    let mut d = Daemon::start(&url, "lonely", &dir, &[]);
    wait_for(
        Duration::from_secs(5),
        "a failed attempt to be logged",
        || {
            d.log_text()
                .contains("database attempt failed")
                .then_some(())
        },
    );
    let (status, _) = d.leader().unwrap();
    assert_eq!(status, 503);
    assert_eq!(leaderd_tests::http_get(d.port, "/readyz").unwrap().0, 503);
    assert_eq!(leaderd_tests::http_get(d.port, "/healthz").unwrap().0, 200);
    let started = Instant::now();
    d.sigterm();
    let code = d
        .wait_exit(Duration::from_secs(2))
        .expect("exits within 2 s")
        .code();
    assert_eq!(code, Some(0));
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// One daemon's wall clock is an hour off (libfaketime, wall clock only, as
/// NTP trouble would do): expiry is the database's business, so it neither
/// steals a live lease nor stalls the election.
fn a_skewed_wall_clock_changes_nothing(db: TempDb, shift: &str) {
    let _serial = serial();
    let Some(lib) = faketime_lib() else {
        panic!("libfaketime is missing: install Debian's `faketime` (scripts/test does)");
    };
    let dir = Scratch::new();
    let mut ds = vec![Daemon::start(&db.url, "a", &dir, &[])];
    let refs: Vec<&Daemon> = ds.iter().collect();
    wait_single_leader(&refs, Duration::from_secs(10));
    ds.push(
        Daemon::launch(&db.url, "skewed", &dir, "skewed", &[])
            .env("LD_PRELOAD", &lib)
            .env("FAKETIME", shift)
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .start(),
    );
    // Stable for several leases: the skewed daemon never leads while the
    // leader keeps its lease. (A sample may miss the leader's answer on a
    // loaded machine; a renewal stalled past the lease, a slow disk's, may
    // even end it, and then the skewed daemon may take over: not a theft.)
    let mut checker = Checker::default();
    let refs: Vec<&Daemon> = ds.iter().collect();
    let until = Instant::now() + TTL * 3;
    while Instant::now() < until {
        let leaders = checker.sample(&refs);
        assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
        if leaders == [1] {
            assert!(
                ds[0].log_text().contains("lost leadership"),
                "the skewed daemon took a live lease"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // And it takes over normally when the leader dies.
    ds[0].sigkill();
    let others: Vec<&Daemon> = ds[1..].iter().collect();
    checker.wait_leader(&others, TTL + SLACK + Duration::from_millis(200));
}

fn faketime_lib() -> Option<String> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .map(str::to_owned)
}

macro_rules! elections {
    ($backend:ident, $make:expr, $sigterm_within:expr) => {
        mod $backend {
            use super::*;

            #[test]
            fn three_daemons_elect_exactly_one_leader_and_stay_stable() {
                super::three_daemons_elect_exactly_one_leader_and_stay_stable($make);
            }
            #[test]
            fn sigkill_of_the_leader_fails_over_within_ttl() {
                super::sigkill_of_the_leader_fails_over_within_ttl($make);
            }
            #[test]
            fn sigterm_of_the_leader_hands_over_and_exits_cleanly() {
                super::sigterm_of_the_leader_hands_over_and_exits_cleanly($make, $sigterm_within);
            }
            #[test]
            fn tokens_grow_at_every_change_of_leader() {
                super::tokens_grow_at_every_change_of_leader($make);
            }
            #[test]
            fn a_wall_clock_an_hour_ahead_changes_nothing() {
                super::a_skewed_wall_clock_changes_nothing($make, "+1h");
            }
            #[test]
            fn a_wall_clock_an_hour_behind_changes_nothing() {
                super::a_skewed_wall_clock_changes_nothing($make, "-1h");
            }
        }
    };
}

elections!(postgres, TempDb::postgres(), SLACK);
elections!(mysql, TempDb::mysql(), SLACK);
elections!(sqlite, TempDb::sqlite(), SLACK);

/// The same scenarios through PgBouncer in transaction pooling with fewer
/// server connections (2) than daemons (3), with the plain URL: nothing
/// fails, nothing warns. Release notifications do not cross the pooler, so a
/// handover waits for the followers' next poll.
mod pgbouncer {
    use super::*;

    /// The table is created first, through the pooler, as a deployment's
    /// migration Job does: the replicas' own check is then a read.
    fn db() -> TempDb {
        let db = TempDb::postgres_through_pgbouncer(2);
        let (code, _, stderr) =
            leaderd_tests::run_cli(&["migrate", "--database-url", &db.url], &[]);
        assert_eq!(code, 0, "leaderd migrate through PgBouncer: {stderr}");
        db
    }

    /// No attempt failed (not even a retried one) and nothing was logged
    /// above info, by any daemon, but the start-up line that says the
    /// harness's superuser has more rights than a daemon needs; the live
    /// ones count no heartbeat error.
    fn quiet(ran: &Ran) {
        for d in &ran.daemons {
            let loud: Vec<String> = d
                .log_events()
                .iter()
                .filter(|e| e["level"] == "WARN" || e["level"] == "ERROR")
                .filter(|e| {
                    !e["message"].as_str().is_some_and(|m| {
                        m.starts_with("the daemon's database role has more rights")
                    })
                })
                .map(|e| e.to_string())
                .collect();
            assert!(loud.is_empty(), "{}: {loud:#?}", d.id);
            assert!(
                !d.log_text().contains("attempt failed"),
                "{}: {}",
                d.id,
                d.log_text()
            );
            if let Some((_, metrics)) = leaderd_tests::http_get(d.port, "/metrics") {
                let errors: f64 = metrics
                    .lines()
                    .filter(|l| l.starts_with("leaderd_heartbeat_errors_total"))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum();
                assert_eq!(errors, 0.0, "{}: {metrics}", d.id);
            }
        }
    }

    #[test]
    fn three_daemons_elect_exactly_one_leader_and_stay_stable() {
        quiet(&super::three_daemons_elect_exactly_one_leader_and_stay_stable(db()));
    }
    #[test]
    fn sigkill_of_the_leader_fails_over_within_ttl() {
        quiet(&super::sigkill_of_the_leader_fails_over_within_ttl(db()));
    }
    #[test]
    fn sigterm_of_the_leader_hands_over_and_exits_cleanly() {
        quiet(&super::sigterm_of_the_leader_hands_over_and_exits_cleanly(
            db(),
            HEARTBEAT + SLACK,
        ));
    }
}

#[test]
fn two_processes_with_the_same_id_never_both_lead() {
    let _serial = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let a = Daemon::start(&db.url, "twin", &dir, &[]);
    // Same id, another process: its own files.
    let b = Daemon::launch(&db.url, "twin", &dir, "twin-b", &[]).start();
    let refs = [&a, &b];
    let leader = wait_single_leader(&refs, Duration::from_secs(10));
    let follower = refs[1 - leader];
    wait_for(
        Duration::from_secs(3),
        "the duplicate to be reported",
        || {
            follower
                .log_text()
                .contains("under this replica's id")
                .then_some(())
        },
    );
    let until = Instant::now() + TTL * 2;
    while Instant::now() < until {
        let (status, body) = follower.leader().unwrap();
        assert_eq!(status, 503);
        assert!(
            body["leader"].is_null(),
            "names itself through the twin: {body}"
        );
        assert!(refs[leader].is_leader());
    }
    // The follower counts the election the twin holds under its id.
    let held = series_value(follower, "leaderd_duplicate_id_elections");
    assert_eq!(held, 1.0, "elections held by the twin");
    let errors = follower
        .log_events()
        .iter()
        .filter(|e| e["level"] == "ERROR")
        .count();
    assert_eq!(errors, 1, "logged once, not at every poll");
}

/// The value of the first series of `/metrics` named `name` (for a
/// histogram's `_count`, its sample count).
fn series_value(d: &Daemon, name: &str) -> f64 {
    let (_, metrics) = leaderd_tests::http_get(d.port, "/metrics").unwrap();
    metrics
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{name} missing: {metrics}"))
}

/// A leader's renewals are counted apart from the followers' polls (which
/// outnumber them with several elections): the leader's renewal histogram
/// grows at each renewal, the follower's stays empty while it polls.
#[test]
fn renewals_are_timed_apart_from_the_followers_polls() {
    let _serial = serial();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let a = Daemon::start(&db.url, "a", &dir, &[]);
    let b = Daemon::start(&db.url, "b", &dir, &[]);
    let refs = [&a, &b];
    let leader = refs[wait_single_leader(&refs, Duration::from_secs(10))];
    let follower = if leader.id == a.id { &b } else { &a };
    let renewals = |d: &Daemon| series_value(d, "leaderd_renewal_duration_seconds_count");
    let attempts = |d: &Daemon| series_value(d, "leaderd_heartbeat_duration_seconds_count");
    let (renewed, polled) = (renewals(leader), attempts(follower));
    // Three renew intervals (ttl / 3 each) and a heartbeat's poll.
    wait_for(TTL + SLACK, "renewals and polls to be counted", || {
        (renewals(leader) >= renewed + 3.0 && attempts(follower) > polled).then_some(())
    });
    assert!(leader.is_leader(), "the leader kept its lease meanwhile");
    assert_eq!(renewals(follower), 0.0, "a follower's poll is no renewal");
    assert!(renewals(leader) <= attempts(leader));
    // What they are measured against: min(heartbeat, ttl / 3).
    let interval = series_value(leader, "leaderd_renew_interval_seconds");
    assert!(
        (interval - TTL.as_secs_f64() / 3.0).abs() < 1e-9,
        "{interval}"
    );
    // And the budget the slow-renewal alert holds them against: ttl, less
    // the safety margin (50 ms here) and the renew interval.
    let budget = series_value(leader, "leaderd_renewal_budget_seconds");
    let want = TTL.as_secs_f64() - 0.05 - interval;
    assert!((budget - want).abs() < 1e-6, "{budget} != {want}");
}
