//! Fenced writes end to end (docs/integrating.md, "Fenced writes"): three real replicas
//! of leaderd, and beside each a worker (`fenced-writer`) that appends
//! `(token, seq)` rows while its daemon says it leads, each row in its own
//! transaction fenced by that token. The faults are the ones an app meets:
//! the whole replica paused past the lease (worker and daemon SIGSTOPped,
//! as a stalled node or a long GC pause), the worker paused while its daemon
//! hands over (`POST /release`), the daemon SIGKILLed or SIGTERMed and
//! started again.
//!
//! Checked after the run: in commit order (a counter row that every write
//! updates and holds until it commits) tokens never go back, and the
//! workers kept writing. The same run with the fence off must find a write
//! out of order, or this test could not fail.
//!
//! The long soak is `#[ignore]`d:
//! `FENCE_SOAK_FAULTS=300 cargo test -p leaderd-tests --test fenced_workers -- --ignored --nocapture`
//! (both backends; `FENCE_SOAK_BACKEND=postgres` or `mysql` for one).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leaderd_tests::replicas::Replicas;
use leaderd_tests::{block_on, serial, wait_for, Kind, TempDb};
use rustix::process::Signal;

const WRITER: &str = env!("CARGO_BIN_EXE_fenced-writer");

const TTL: Duration = Duration::from_millis(1200);
/// Room for a loaded machine (see `faults.rs`).
const SLACK: Duration = Duration::from_millis(1000);

/// One row of `fence_writes`: commit number, token, writer, its sequence.
type Write = (i64, i64, String, i64);

/// The workers' tables.
fn tables(db: &TempDb) {
    let text = match db.kind {
        Kind::Mysql => "VARCHAR(40)",
        _ => "TEXT",
    };
    db.exec(&[
        "CREATE TABLE fence_ledger (id INT PRIMARY KEY, n BIGINT NOT NULL)",
        "INSERT INTO fence_ledger VALUES (1, 0)",
        &format!(
            "CREATE TABLE fence_writes (n BIGINT PRIMARY KEY, token BIGINT NOT NULL, \
             writer {text} NOT NULL, seq BIGINT NOT NULL)"
        ),
    ]);
}

/// Every write, in commit order.
fn writes(db: &TempDb) -> Vec<Write> {
    let (kind, url) = (db.kind, db.url.clone());
    let sql = "SELECT n, token, writer, seq FROM fence_writes ORDER BY n";
    block_on(async move {
        match kind {
            Kind::Postgres => {
                let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(conn);
                let rows = c.query(sql, &[]).await.expect("read the writes");
                rows.iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                    .collect()
            }
            _ => {
                use mysql_async::prelude::Queryable;
                let mut c = mysql_async::Conn::from_url(&url).await.expect("connect");
                c.query(sql).await.expect("read the writes")
            }
        }
    })
}

/// The highest token written so far (0 for none).
fn newest_token(db: &TempDb) -> i64 {
    db.scalar("SELECT COALESCE(MAX(token), 0) FROM fence_writes")
        .parse()
        .expect("a number")
}

/// Writes whose token is below one already committed before them.
fn out_of_order(writes: &[Write]) -> Vec<(Write, i64)> {
    let mut highest = i64::MIN;
    let mut late = Vec::new();
    for w in writes {
        if w.1 < highest {
            late.push((w.clone(), highest));
        }
        highest = highest.max(w.1);
    }
    late
}

/// The replicas and a worker beside each.
struct Site {
    db: TempDb,
    replicas: Replicas,
    workers: Vec<Child>,
    /// Where each worker finds its daemon's port (rewritten at a restart).
    ports: Vec<PathBuf>,
    logs: Vec<PathBuf>,
}

impl Site {
    fn new(db: TempDb, fenced: bool) -> Site {
        tables(&db);
        let replicas = Replicas::direct(&db.url, 3, "r", |launch| launch);
        let mut site = Site {
            db,
            replicas,
            workers: Vec::new(),
            ports: Vec::new(),
            logs: Vec::new(),
        };
        for i in 0..3 {
            let port = site.replicas.dir.path(&format!("w{i}.port"));
            let log = site.replicas.dir.path(&format!("w{i}.log"));
            site.ports.push(port);
            site.logs.push(log);
            site.publish_port(i);
            let child = Command::new(WRITER)
                .args([
                    site.ports[i].to_str().expect("utf-8"),
                    &site.db.url,
                    &format!("w{i}"),
                    if fenced { "on" } else { "off" },
                    site.logs[i].to_str().expect("utf-8"),
                ])
                .stdin(Stdio::null())
                .spawn()
                .expect("start fenced-writer");
            site.workers.push(child);
        }
        site
    }

    /// Tells worker `i` where its daemon listens now.
    fn publish_port(&self, i: usize) {
        let tmp = self.ports[i].with_extension("new");
        std::fs::write(&tmp, self.replicas.daemons[i].port.to_string()).expect("port file");
        std::fs::rename(&tmp, &self.ports[i]).expect("port file");
    }

    fn signal_worker(&self, i: usize, sig: Signal) {
        let pid = rustix::process::Pid::from_raw(self.workers[i].id() as i32).expect("pid");
        rustix::process::kill_process(pid, sig).expect("signal the worker");
    }

    /// Waits until a write under a token above `token` has committed; false
    /// if none came within `within`.
    fn written_after(&self, token: i64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if newest_token(&self.db) > token {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// How often the workers' fences refused, from their logs.
    fn refusals(&self) -> usize {
        self.logs
            .iter()
            .map(|p| {
                std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.starts_with("refused"))
                    .count()
            })
            .sum()
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.kill();
            let _ = w.wait();
        }
        if std::thread::panicking() {
            for (i, p) in self.logs.iter().enumerate() {
                let text = std::fs::read_to_string(p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                eprintln!("----- worker w{i} (last lines, newest first) -----\n{tail:#?}");
            }
        }
    }
}

/// The faults, in turn.
const KINDS: [&str; 4] = [
    "pause_replica",
    "pause_worker_release",
    "sigkill",
    "sigterm",
];

/// What a run saw.
#[derive(Debug, Default)]
struct Seen {
    writes: usize,
    late: usize,
    refusals: usize,
    faults: BTreeMap<&'static str, usize>,
    /// Per fault, the longest wait for the next leader's worker to write.
    slowest: BTreeMap<&'static str, Duration>,
    /// Faults after which no newer token was written in time (fence off
    /// only: a worker paused inside its transaction holds the counter row).
    stuck: usize,
}

/// `faults` faults of `kinds` (in turn) on a site; the writes checked.
fn run(db: TempDb, fenced: bool, faults: usize, kinds: &[&'static str]) -> Seen {
    let mut site = Site::new(db, fenced);
    let mut seen = Seen::default();
    let first = site.replicas.leader(Duration::from_secs(10));
    let token = site.replicas.token(first).unwrap_or(0);
    assert!(
        site.written_after(token - 1, Duration::from_secs(10)),
        "the first leader's worker never wrote"
    );
    let mut generation = 0;
    for n in 0..faults {
        let kind = kinds[n % kinds.len()];
        *seen.faults.entry(kind).or_default() += 1;
        let leader = site.replicas.leader(Duration::from_secs(10));
        let token = wait_for(Duration::from_secs(5), "the leader's token", || {
            site.replicas.token(leader)
        });
        // The leader's worker is at work (in the middle of a unit).
        let c = &site.replicas;
        wait_for(
            Duration::from_secs(5),
            "the leader's worker to write",
            || (newest_token(&site.db) == token).then_some(()),
        );
        std::thread::sleep(Duration::from_millis(30 + 37 * (n as u64 % 5)));
        let injected = Instant::now();
        match kind {
            "pause_replica" => {
                site.signal_worker(leader, Signal::STOP);
                c.daemons[leader].signal(Signal::STOP);
            }
            "pause_worker_release" => {
                site.signal_worker(leader, Signal::STOP);
                // A hold keeps it from taking the row straight back.
                c.daemons[leader].release("?hold=3s");
            }
            "sigkill" => c.daemons[leader].sigkill(),
            _ => c.daemons[leader].sigterm(),
        }
        c.new_leader(leader, 2 * TTL + SLACK);
        // The next leader's worker writes (with the fence on: once any
        // fenced transaction of the old token is over).
        let wrote = site.written_after(token, 4 * TTL + SLACK);
        let took = injected.elapsed();
        if wrote {
            let e = seen.slowest.entry(kind).or_default();
            *e = (*e).max(took);
        } else {
            assert!(
                !fenced,
                "{kind}: no write under a newer token than {token} within {took:?}"
            );
            seen.stuck += 1;
        }
        match kind {
            "pause_replica" => {
                // The worker wakes first, in the middle of its unit of
                // work, with the token it was given.
                site.signal_worker(leader, Signal::CONT);
                site.replicas.daemons[leader].signal(Signal::CONT);
            }
            "pause_worker_release" => site.signal_worker(leader, Signal::CONT),
            _ => {
                generation += 1;
                let id = format!("r{leader}-{generation}");
                site.replicas.restart(leader, &id);
                site.publish_port(leader);
            }
        }
    }
    // The woken workers' last units are over.
    std::thread::sleep(Duration::from_millis(500));
    for w in &mut site.workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let all = writes(&site.db);
    let late = out_of_order(&all);
    for (w, above) in late.iter().take(5) {
        eprintln!("out of order: {w:?} committed after token {above}");
    }
    seen.writes = all.len();
    seen.late = late.len();
    seen.refusals = site.refusals();
    seen
}

fn report(label: &str, seen: &Seen) {
    eprintln!(
        "{label}: {} faults {:?}; {} writes, {} out of order, {} fences refused; \
         slowest next write per fault {:?}; {} faults with no newer write in time",
        seen.faults.values().sum::<usize>(),
        seen.faults,
        seen.writes,
        seen.late,
        seen.refusals,
        seen.slowest,
        seen.stuck
    );
}

fn fenced_run(db: TempDb, faults: usize) {
    let kind = db.kind;
    let seen = run(db, true, faults, &KINDS);
    report(&format!("{kind:?}, fence on"), &seen);
    assert_eq!(seen.late, 0, "writes out of order with the fence on");
    // Every fault was followed by a newer token's write (checked in
    // `run`); this is the rest of the work.
    assert!(
        seen.writes > 5 * faults,
        "the workers hardly wrote: {seen:?}"
    );
    // The pauses put a worker to work on a token that no longer leads:
    // the fence must have said no.
    assert!(seen.refusals > 0, "no fence ever refused: {seen:?}");
}

#[test]
fn postgres_fenced_workers_never_commit_out_of_order() {
    let _s = serial();
    fenced_run(TempDb::postgres(), 12);
}

#[test]
fn mariadb_fenced_workers_never_commit_out_of_order() {
    let _s = serial();
    fenced_run(TempDb::mysql(), 12);
}

/// The same workers with the fence off: a worker woken from a pause writes
/// under its old token after the next leader's worker did.
#[test]
fn without_the_fence_a_paused_worker_commits_out_of_order() {
    let _s = serial();
    let seen = run(
        TempDb::postgres(),
        false,
        4,
        &["pause_replica", "pause_worker_release"],
    );
    report("Postgres, fence off", &seen);
    assert!(
        seen.late > 0,
        "no write out of order without the fence: {seen:?}"
    );
}

/// Hundreds of faults per backend (module docs).
#[test]
#[ignore = "long: run with --ignored (see the module docs)"]
fn soak() {
    let _s = serial();
    let faults: usize = std::env::var("FENCE_SOAK_FAULTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let backends: Vec<fn() -> TempDb> = match std::env::var("FENCE_SOAK_BACKEND").as_deref() {
        Ok("postgres") => vec![TempDb::postgres],
        Ok("mysql") => vec![TempDb::mysql],
        Err(_) => vec![TempDb::postgres, TempDb::mysql],
        Ok(other) => panic!("FENCE_SOAK_BACKEND={other}: expected postgres or mysql"),
    };
    for db in backends {
        fenced_run(db(), faults);
    }
}
