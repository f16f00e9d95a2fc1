//! Named successors with real daemons.
//!
//! - A short rolling update, Deployment-style: a new replica starts and is
//!   ready on `/readyz`, then the oldest old one gets SIGTERM; three times.
//!   One election (PostgreSQL): it changes leader exactly once, from the
//!   first old pod to a new one. Six elections with the spread (MariaDB):
//!   each changes leader at most once in the whole update, and the update
//!   ends 2/2/2 on the new pods. Never two leaders, tokens never back (the
//!   transition logs, per election).
//! - The one-election update again in bad surroundings: every replica
//!   100 ms from the database, and both cores busy with other work; still
//!   one change, leaderless for less than the window.
//! - One election on SQLite, with every replica's stderr stalled and a
//!   slow disk, judged from the flag files and the token (the logs are
//!   lost).
//! - A successor SIGKILLed as it is named: nobody else takes the row until
//!   the window is over, then another does, within window + ttl.
//! - A successor held off the election it is named for (it leads others):
//!   it gives its turn up, and another replica takes the row well within
//!   the window; 100 ms from the database, still within it.

use std::time::{Duration, Instant};

use leaderd_tests::checker::{check, intervals_of, Interval};
use leaderd_tests::proxy::{upstream, Fault, FaultProxy};
use leaderd_tests::sse::boot_us;
use leaderd_tests::surroundings::{CpuHogs, SlowFsync};
use leaderd_tests::{
    http_get, print_logs, serial, wait_counts, wait_for, Daemon, Kind, Scratch, TempDb,
};

const ELECTIONS: [&str; 6] = ["jobs", "mailer", "reports", "billing", "search", "cleanup"];
const TTL: Duration = Duration::from_millis(1200);
const WINDOW: Duration = Duration::from_millis(1000);

fn start(db: &TempDb, dir: &Scratch, id: &str, elections: &[&str]) -> Daemon {
    Daemon::launch(&db.url, id, dir, id, &[])
        .elections(elections)
        .start()
}

/// Waits until the daemon's `/readyz` answers 200.
fn wait_ready(d: &Daemon) {
    wait_for(Duration::from_secs(10), &format!("{} ready", d.id), || {
        http_get(d.port, "/readyz")
            .filter(|(status, _)| *status == 200)
            .map(|_| ())
    });
}

/// Waits until `n` replicas hold a presence row (live by the database's
/// clock): the replicas all known, as they are once a deployment has run
/// for a while.
fn wait_present(db: &TempDb, n: usize) {
    wait_for(Duration::from_secs(10), &format!("{n} presences"), || {
        let live = match db.kind {
            Kind::Postgres => "expires_at > now()".to_owned(),
            Kind::Mysql => "expires_at > UTC_TIMESTAMP(6)".to_owned(),
            // SQLite's expiries are µs on the boot clock.
            Kind::Sqlite => format!("expires_at > {}", boot_us()),
        };
        let sql = format!(
            "SELECT count(*) FROM service_leader_lock \
             WHERE name LIKE 'leaderd-presence/%' AND holder IS NOT NULL AND {live}"
        );
        (db.scalar(&sql) == n.to_string()).then_some(())
    });
}

/// Per election, its leadership intervals on every daemon, checked (no
/// overlap, tokens never back), by start.
fn intervals(ds: &[&Daemon], election: &str) -> Vec<Interval> {
    let mut all: Vec<Interval> = ds.iter().flat_map(|d| intervals_of(d, election)).collect();
    check(&mut all);
    all.sort_by_key(|i| i.start);
    all
}

/// The rolling update: `old` replaced by new replicas (made by `spawn`
/// from a name) one by one, oldest first. Returns the new replicas and the
/// boot-clock µs the update began.
fn roll(old: &mut [Daemon], spawn: &dyn Fn(&str) -> Daemon) -> (Vec<Daemon>, u64) {
    let began = boot_us();
    let mut new = Vec::new();
    for (i, o) in old.iter_mut().enumerate() {
        let n = spawn(&format!("new-{i}"));
        wait_ready(&n);
        new.push(n);
        o.sigterm();
        assert!(
            o.wait_exit(Duration::from_secs(3)).is_some(),
            "{} exits",
            o.id
        );
    }
    (new, began)
}

/// One election on three replicas made by `spawn`, rolled: it must change
/// leader exactly once, from the first old replica to a new one, and be
/// leaderless for less than `bound`. `what` names the case in the output.
fn one_election_moves_once(
    db: &TempDb,
    spawn: &dyn Fn(&str) -> Daemon,
    what: &str,
    bound: Duration,
) {
    let mut old = vec![spawn("old-0")];
    wait_for(Duration::from_secs(10), "old-0 to lead", || {
        old[0].is_leader().then_some(())
    });
    for i in 1..3 {
        old.push(spawn(&format!("old-{i}")));
    }
    wait_present(db, 3);
    let (new, began) = roll(&mut old, spawn);
    wait_for(Duration::from_secs(5), "a new replica to lead", || {
        new.iter().any(Daemon::is_leader).then_some(())
    });
    let all: Vec<&Daemon> = old.iter().chain(&new).collect();
    let during: Vec<Interval> = intervals(&all, "jobs")
        .into_iter()
        .filter(|i| i.end > began)
        .collect();
    let leaders: Vec<&str> = during.iter().map(|i| i.id.as_str()).collect();
    eprintln!("{what}: leaders during the update: {leaders:?}");
    let moved_once = leaders.len() == 2 && leaders[0] == "old-0" && leaders[1].starts_with("new-");
    let gap = (leaders.len() == 2)
        .then(|| Duration::from_micros(during[1].start.saturating_sub(during[0].end)));
    eprintln!("{what}: leaderless for {gap:?}");
    if !moved_once || gap.is_none_or(|g| g >= bound) {
        // A leader that stepped down on its own deadline (a renewal that
        // did not come back in time: the machine stalled) hands over
        // nothing; that is the renewal's story, not the update's.
        let stalled = all
            .iter()
            .any(|d| d.log_text().contains(r#""reason":"deadline""#));
        print_logs(all.iter().copied());
        if stalled && leaders.first() == Some(&"old-0") {
            eprintln!("{what}: a leader lost a renewal on its deadline: not counted");
            return;
        }
        panic!("{what}: one change of leader, to a new replica, within {bound:?}: {leaders:?}, leaderless {gap:?}");
    }
}

#[test]
fn a_rolling_update_moves_one_election_once() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let spawn = |id: &str| start(&db, &dir, id, &["jobs"]);
    one_election_moves_once(&db, &spawn, "one election", Duration::from_millis(200));
}

/// Bad surroundings: every replica 100 ms (a round trip) from the
/// database, each behind its own link. The release, the presence read
/// before it and the successor's take each pay a round trip; a named
/// successor that missed its window would show as a spell of a heartbeat
/// or more.
#[test]
fn a_rolling_update_100ms_from_the_database_moves_once() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let proxies = std::sync::Mutex::new(Vec::new());
    let spawn = |id: &str| {
        let proxy = FaultProxy::start(upstream(&db.url));
        proxy.set(Fault::Distance(Duration::from_millis(50)));
        let d = Daemon::launch(&proxy.url(&db.url), id, &dir, id, &[])
            .elections(&["jobs"])
            .start();
        proxies.lock().unwrap().push(proxy);
        d
    };
    one_election_moves_once(&db, &spawn, "100 ms away", WINDOW);
}

/// Bad surroundings: both cores spinning with other work through the
/// whole update (the daemons, PostgreSQL and the test share what is left).
#[test]
fn a_rolling_update_with_every_core_busy_moves_once() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let spawn = |id: &str| start(&db, &dir, id, &["jobs"]);
    let _hogs = CpuHogs::every_core();
    one_election_moves_once(&db, &spawn, "cores busy", WINDOW);
}

/// SQLite (one host, the replicas sharing the database file), in bad
/// surroundings: every replica's stderr on a pipe nobody reads, full
/// before the replica takes part (every log write blocks from then on),
/// and every flush of the disk 1 ms slower (SQLite flushes at each commit:
/// every take, renewal and release). The logs are lost, so the update is
/// judged from outside: the flag files (read every 2 ms) say who leads,
/// the token says how often the holder changed.
#[test]
fn a_rolling_update_on_sqlite_with_stderr_stalled_and_a_slow_disk_moves_once() {
    let _s = serial();
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let slow = SlowFsync::new(&dir.path(""));
    let spawn = |id: &str| {
        let d = Daemon::launch(&db.url, id, &dir, id, &[])
            .envs(&slow.env())
            .elections(&["jobs"])
            .stderr_undrained()
            .start();
        d.fill_stderr();
        d
    };
    let mut old = vec![spawn("old-0")];
    let first = wait_for(Duration::from_secs(10), "old-0 to lead", || {
        old[0].token_held("")
    });
    for i in 1..3 {
        old.push(spawn(&format!("old-{i}")));
    }
    wait_present(&db, 3);
    slow.assert_used();
    let flags = FlagWatch::start(&dir);
    let (new, _) = roll(&mut old, &spawn);
    let last = wait_for(Duration::from_secs(5), "a new replica to lead", || {
        new.iter()
            .find_map(|n| n.token_held("").map(|t| (n.id.clone(), t)))
    });
    let (holders, leaderless) = flags.stop();
    eprintln!("SQLite, stalled stderr, slow disk: flag files {holders:?}, leaderless for {leaderless:?}; token {first} then {last:?}");
    assert_eq!(
        last.1,
        first + 1,
        "one change of holder: tokens {first} then {last:?}"
    );
    assert_eq!(
        holders,
        [("old-0".to_owned(), first), last],
        "the flag files' leaders"
    );
    assert!(leaderless < WINDOW, "leaderless for {leaderless:?}");
}

/// Who leads, by the `*-jobs.flag` files of the daemons in a directory (a
/// file with a future `expires_at_unix_ms`, as docs/integrating.md tells a reader),
/// sampled every 2 ms on a thread of its own.
struct FlagWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<(String, i64)>, Duration)>,
}

impl FlagWatch {
    fn start(dir: &Scratch) -> FlagWatch {
        let dir = dir.0.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            // The leaders in the order they were seen, and the longest
            // spell with none.
            let mut holders: Vec<(String, i64)> = Vec::new();
            let mut none_since: Option<Instant> = None;
            let mut longest = Duration::ZERO;
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                let leading: Vec<(String, i64)> = std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with("-jobs.flag"))
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .filter(|v| v["expires_at_unix_ms"].as_i64() > Some(now_ms))
                    .filter_map(|v| Some((v["id"].as_str()?.to_owned(), v["token"].as_i64()?)))
                    .collect();
                for h in &leading {
                    if !holders.contains(h) {
                        holders.push(h.clone());
                    }
                }
                match (leading.is_empty(), none_since) {
                    (true, None) => none_since = Some(Instant::now()),
                    (false, Some(since)) => {
                        longest = longest.max(since.elapsed());
                        none_since = None;
                    }
                    _ => {}
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (holders, longest)
        });
        FlagWatch { stop, thread }
    }

    /// The leaders seen, in order, and the longest spell without one.
    fn stop(self) -> (Vec<(String, i64)>, Duration) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the flag watch")
    }
}

#[test]
fn a_rolling_update_moves_each_of_six_elections_at_most_once() {
    let _s = serial();
    let db = TempDb::mysql();
    let dir = Scratch::new();
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(start(&db, &dir, &format!("old-{i}"), &ELECTIONS));
        let ds: Vec<&Daemon> = old.iter().collect();
        let counts: Vec<usize> = vec![6 / old.len(); old.len()];
        wait_counts(
            &ds,
            &counts,
            ELECTIONS.len(),
            Duration::from_secs(20),
            "balanced before the update",
        );
    }
    wait_present(&db, 3);
    let spawn = |id: &str| start(&db, &dir, id, &ELECTIONS);
    let (new, began) = roll(&mut old, &spawn);
    let ended = Instant::now();
    let ds: Vec<&Daemon> = new.iter().collect();
    wait_counts(
        &ds,
        &[2, 2, 2],
        ELECTIONS.len(),
        Duration::from_secs(20),
        "2/2/2 on the new replicas",
    );
    let balanced_in = ended.elapsed();
    let all: Vec<&Daemon> = old.iter().chain(&new).collect();
    let mut moves = Vec::new();
    for e in ELECTIONS {
        let during: Vec<Interval> = intervals(&all, e)
            .into_iter()
            .filter(|i| i.end > began)
            .collect();
        let leaders: Vec<&str> = during.iter().map(|i| i.id.as_str()).collect();
        eprintln!("{e}: {leaders:?}");
        moves.push(during.len() - 1);
    }
    eprintln!("six elections: changes of leader {moves:?}; 2/2/2 {balanced_in:?} after the last old replica left");
    assert!(
        moves.iter().all(|&m| m == 1),
        "changes of leader per election: {moves:?}"
    );
}

#[test]
fn a_successor_killed_as_it_is_named_costs_at_most_its_window() {
    let _s = serial();
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let mut a = start(&db, &dir, "a", &["jobs"]);
    wait_for(Duration::from_secs(10), "a to lead", || {
        a.is_leader().then_some(())
    });
    // c starts once b's presence row is there: "started last" is when a
    // replica took its presence row, and two processes started together
    // may take theirs in either order (seen: b's row 10 ms after c's).
    let presence = "FROM service_leader_lock WHERE name LIKE 'leaderd-presence/%'";
    let b = start(&db, &dir, "b", &["jobs"]);
    wait_for(Duration::from_secs(5), "b's presence", || {
        (db.scalar(&format!("SELECT count(*) {presence} AND holder = 'b'")) == "1").then_some(())
    });
    let c = start(&db, &dir, "c", &["jobs"]);
    // c, started last, is the one a names; its presence row shows it.
    let c_instance = wait_for(Duration::from_secs(5), "c's presence", || {
        let i = db.scalar(&format!(
            "SELECT COALESCE(MAX(instance), '') {presence} AND holder = 'c'"
        ));
        (!i.is_empty()).then_some(i)
    });
    c.sigkill();
    a.sigterm();
    assert!(a.wait_exit(Duration::from_secs(3)).is_some());
    let named = a.logged("naming the successor");
    // Logged by the replica's id, with its instance beside it.
    if named.len() != 1
        || named[0]["successor"] != "c"
        || named[0]["instance"] != c_instance.as_str()
    {
        print_logs([&a, &b, &c]);
        panic!("a named {named:?}, not c ({c_instance})");
    }
    wait_for(WINDOW + TTL * 2, "b to lead", || {
        b.is_leader().then_some(())
    });
    let all = intervals(&[&a, &b], "jobs");
    let (last_a, first_b) = (&all[all.len() - 2], &all[all.len() - 1]);
    assert_eq!((last_a.id.as_str(), first_b.id.as_str()), ("a", "b"));
    assert!(first_b.token > last_a.token);
    let gap = Duration::from_micros(first_b.start.saturating_sub(last_a.end));
    eprintln!("successor killed: b led {gap:?} after a's release");
    // Held off for the window (b was woken by the release at once), then
    // taken within the window and a ttl.
    assert!(gap >= WINDOW / 2, "b took the row {gap:?} after a named c");
    assert!(gap <= WINDOW + TTL, "leaderless for {gap:?}");
}

/// What a named successor that does not take the row logs as it opens it
/// to the others.
const OPENED: &str =
    "named successor of an election this replica does not take now; opened it to the others";

/// Whether `d` leads `election` now (`/elections`).
fn leads(d: &Daemon, election: &str) -> Option<()> {
    d.leading()?.iter().any(|e| e == election).then_some(())
}

#[test]
fn a_successor_held_off_the_election_gives_its_turn_up() {
    let _s = serial();
    held_successor_gives_its_turn_up(&TempDb::postgres(), None);
}

#[test]
fn a_successor_held_off_the_election_gives_its_turn_up_on_mariadb() {
    let _s = serial();
    held_successor_gives_its_turn_up(&TempDb::mysql(), None);
}

#[test]
fn a_successor_held_off_the_election_gives_its_turn_up_on_sqlite() {
    let _s = serial();
    held_successor_gives_its_turn_up(&TempDb::sqlite(), None);
}

/// Bad surroundings: every replica 100 ms from the database. The release's
/// notice, the held replica's look, its giving up and the take each pay a
/// round trip, each behind the replicas' other statements on their one
/// connection, and the election is still taken before the window ends.
#[test]
fn a_successor_held_off_the_election_100ms_from_the_database_gives_its_turn_up() {
    let _s = serial();
    let distance = Duration::from_millis(50);
    held_successor_gives_its_turn_up(&TempDb::postgres(), Some(distance));
}

/// How long after its release by the previous term the last term of
/// `jobs` began, in µs, by the database's clock (the record of terms).
fn taken_after_release_us(db: &TempDb) -> i64 {
    let term = |column: &str, offset: u32| {
        format!(
            "(SELECT {column} FROM service_leader_history WHERE name = 'jobs' \
             ORDER BY token DESC LIMIT 1 OFFSET {offset})"
        )
    };
    let (began, ended) = (term("began_at", 0), term("ended_at", 1));
    let sql = match db.kind {
        Kind::Postgres => format!("(EXTRACT(EPOCH FROM {began} - {ended}) * 1000000)::bigint"),
        Kind::Mysql => format!("TIMESTAMPDIFF(MICROSECOND, {ended}, {began})"),
        // The boot clock's µs.
        Kind::Sqlite => format!("{began} - {ended}"),
    };
    let us = db.scalar(&sql);
    us.parse()
        .unwrap_or_else(|_| panic!("the record of terms: {us:?}"))
}

/// Three replicas of two elections each (each behind a proxy `distance`
/// away each way, if any): a named successor held off one election gives
/// its turn up, and another takes it before the window ends by the
/// database's clock; near the database, within half the window.
fn held_successor_gives_its_turn_up(db: &TempDb, distance: Option<Duration>) {
    let dir = Scratch::new();
    let proxies = std::sync::Mutex::new(Vec::new());
    // Two elections each, so that a hold of one keeps the replica's
    // presence (and so its candidacy) for the other.
    let launch = |id: &str, extra: &[&str]| {
        let mut args = vec!["--no-spread"];
        args.extend(extra);
        let url = match distance {
            Some(d) => {
                let proxy = FaultProxy::start(upstream(&db.url));
                proxy.set(Fault::Distance(d));
                let url = proxy.url(&db.url);
                proxies.lock().unwrap().push(proxy);
                url
            }
            None => db.url.clone(),
        };
        Daemon::launch(&url, id, &dir, id, &args)
            .elections(&["jobs", "mailer"])
            .start()
    };
    let a = launch("a", &[]);
    wait_for(Duration::from_secs(10), "a to lead jobs", || {
        leads(&a, "jobs")
    });
    let b = launch("b", &[]);
    wait_present(db, 2);
    let c = launch("c", &["--priority", "10"]);
    wait_present(db, 3);
    wait_ready(&b);
    wait_ready(&c);
    // c, of the highest priority, is named.
    a.release("?election=jobs");
    wait_for(Duration::from_secs(5), "c to lead jobs", || {
        leads(&c, "jobs")
    });
    // c holds off jobs for a minute; b, started after a, is named.
    c.release("?election=jobs&hold=60s");
    wait_for(Duration::from_secs(5), "b to lead jobs", || {
        leads(&b, "jobs")
    });
    wait_for(Duration::from_secs(5), "a's own hold to end", || {
        let (_, body) = a.leader_of("?election=jobs")?;
        body["hold_remaining_ms"].is_null().then_some(())
    });
    // b names c (its priority), which holds off jobs: a takes it at once.
    b.release("?election=jobs");
    wait_for(WINDOW + TTL * 2, "a to lead jobs", || leads(&a, "jobs"));
    let named = b.logged("naming the successor");
    // Logs are written behind the daemon's work: waited for.
    let opened = wait_for(
        Duration::from_secs(5),
        "c's log of the turn given up",
        || {
            let opened = c.logged(OPENED);
            (!opened.is_empty()).then_some(opened)
        },
    );
    if named.last().map(|n| n["successor"] != "c").unwrap_or(true)
        || opened.len() != 1
        || opened[0]["not_competing"] != "held"
    {
        print_logs([&a, &b, &c]);
        panic!("b named {named:?}; c opened jobs {opened:?}");
    }
    let all = intervals(&[&a, &b, &c], "jobs");
    let (last_b, first_a) = (&all[all.len() - 2], &all[all.len() - 1]);
    assert_eq!((last_b.id.as_str(), first_a.id.as_str()), ("b", "a"));
    let gap = Duration::from_micros(first_a.start.saturating_sub(last_b.end));
    eprintln!(
        "{:?}, {distance:?} away: a named successor held off the election: a led {gap:?} after b's release",
        db.kind
    );
    // The window runs from the release's commit by the database's clock:
    // a take after it shows so in the record of terms, however far away
    // the replicas are.
    let taken = Duration::from_micros(taken_after_release_us(db).unsigned_abs());
    eprintln!(
        "{:?}: taken {taken:?} after the release, by the database's clock",
        db.kind
    );
    assert!(
        taken < WINDOW,
        "taken {taken:?} after the release: the held successor's window was waited out"
    );
    if distance.is_none() {
        assert!(
            gap < WINDOW / 2,
            "leaderless for {gap:?}: the held successor's window was waited out"
        );
    }
}
