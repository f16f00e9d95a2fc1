//! Graceful handover at its limit: three daemons on PostgreSQL (default
//! timing); the leader is SIGTERMed or released (`leaderd release`) 20
//! times a run, three runs each, timed from the signal (or the release
//! command's start; its own exit is not waited for) until
//! another daemon's flag file exists (woken by the kernel as it appears,
//! see `flags`), as the ZooKeeper candidates beside each run are (see
//! `zookeeper`), the reference its p90 is held to; and
//! until that daemon answers 200 on `/leader`, asked only once its file
//! is there (polling every daemon's HTTP server every 0.5 ms would load
//! the very processes being timed). Each handover is broken down from the
//! daemons' JSON logs (their wall-clock timestamps, the bench's clock
//! beside them): signal → the leader's local step-down (`lost
//! leadership`) → its successor named, read from the presence rows once
//! the flag file is gone (`naming the successor`) → its release answered
//! (`released the lease`) → the new
//! leader's take answered (`acquired leadership`: the wake-up and the
//! take's commit) → its flag file → its
//! `/leader` answering 200.
//!
//! `LEADERD_BENCH_HANDOVER_RUNS` (default 3) and
//! `LEADERD_BENCH_HANDOVER_KINDS` (`sigterm,release`) make a quicker check.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use leaderd_tests::{wait_single_leader, Daemon, Scratch, TempDb};
use rustix::process::Signal;
use serde_json::Value;

use crate::failover::{poll, pseudo_random, start, Case, Went, RELEASE_HOLD};
use crate::flags::FlagWatch;
use crate::size::Size;
use crate::stats::{ms, Summary};
use crate::zookeeper;

/// One handover: until the flag file, and its parts in order; then
/// until `/leader` answered 200 (the same start).
#[derive(Debug, Clone, Copy)]
struct Parts {
    total: Duration,
    step_down: Duration,
    /// The flag file removed, the presence row let go and the successor
    /// read.
    named: Duration,
    /// The release's round trip and commit.
    release: Duration,
    take: Duration,
    flag: Duration,
    answered: Duration,
}

/// `leaderd release --listen listen --hold hold`, started.
fn release_command(listen: &str, hold: &str) -> Result<std::process::Child> {
    let mut cmd = std::process::Command::new(leaderd_tests::leaderd_bin());
    leaderd_tests::scrub_env(&mut cmd);
    Ok(cmd
        .args(["release", "--listen", listen, "--hold", hold])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?)
}

/// When the first line of `message` at or after `since` was logged.
fn logged_at(d: &Daemon, message: &str, since: SystemTime) -> Option<SystemTime> {
    d.logged(message).iter().find_map(|e: &Value| {
        let at = humantime::parse_rfc3339(e["timestamp"].as_str()?).ok()?;
        (at >= since).then_some(at)
    })
}

fn between(from: SystemTime, to: SystemTime) -> Duration {
    to.duration_since(from).unwrap_or_default()
}

/// `rounds` handovers of the leader of three daemons, by SIGTERM or by
/// `leaderd release`.
fn run_once(url: &str, sigterm: bool, rounds: usize) -> Result<Vec<Parts>> {
    // Flag files in memory, as the shipped manifests keep them.
    let dir = Scratch::in_memory();
    let mut ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(url, id, &dir))
        .collect();
    let flags = FlagWatch::new(&dir.path(""))?;
    let mut out = Vec::new();
    for round in 0..rounds {
        let refs: Vec<&Daemon> = ds.iter().collect();
        let leader = wait_single_leader(&refs, Duration::from_secs(10));
        // A random moment in the renew and poll cycles, past the last
        // releaser's hold.
        std::thread::sleep(
            RELEASE_HOLD + Duration::from_micros(pseudo_random(round as u64) % 1_000_000),
        );
        let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        let listen = format!("127.0.0.1:{}", ds[leader].port);
        let hold = format!("{}ms", RELEASE_HOLD.as_millis());
        let (signalled, t0) = (SystemTime::now(), Instant::now());
        // The release command runs while the files are watched, as the
        // signal's handover goes on after `kill` returns: its own exit is
        // not part of the handover.
        let releasing = if sigterm {
            ds[leader].signal(Signal::TERM);
            None
        } else {
            Some(release_command(&listen, &hold)?)
        };
        let (new, total) = flags.wait(t0, "no handover", || {
            others.iter().copied().find(|&i| ds[i].flag.exists())
        });
        if let Some(releasing) = releasing {
            let out = releasing.wait_with_output()?;
            anyhow::ensure!(
                out.status.success(),
                "release failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let ((), answered) = poll(t0, "a flag file without `/leader`", || {
            ds[new].is_leader().then_some(())
        });
        let flagged = signalled + total;
        if sigterm {
            ds[leader].wait_exit(Duration::from_secs(3));
        }
        // The log writers never hold the daemons up: their lines may come
        // a little after the answers.
        let (old, taker) = (&ds[leader], &ds[new]);
        let (stepped, named, released, took) =
            leaderd_tests::wait_for(Duration::from_secs(3), "the handover's log lines", || {
                Some((
                    logged_at(old, "lost leadership", signalled)?,
                    logged_at(old, "naming the successor", signalled)?,
                    logged_at(old, "released the lease", signalled)?,
                    logged_at(taker, "acquired leadership", signalled)?,
                ))
            });
        let parts = Parts {
            total,
            step_down: between(signalled, stepped),
            named: between(stepped, named),
            release: between(named, released),
            take: between(released, took),
            flag: between(took, flagged),
            answered,
        };
        eprintln!(
            "handover {} round {round}: {} to {}: {parts:?}",
            if sigterm { "SIGTERM" } else { "release" },
            old.id,
            taker.id
        );
        out.push(parts);
        if sigterm {
            let id = format!("{}{round}", &ds[leader].id[..1]);
            ds[leader] = start(url, &id, &dir);
        }
    }
    Ok(out)
}

/// `rounds` handovers among three ZooKeeper candidates (see `zookeeper`),
/// by SIGTERM or by giving the lead up (SIGUSR1), from the signal until
/// another candidate's flag file exists.
fn zookeeper_once(
    server: &zookeeper::Server,
    sigterm: bool,
    rounds: usize,
    run: usize,
) -> Result<Vec<Duration>> {
    let dir = Scratch::in_memory();
    let path = format!(
        "/leaderd-bench/{}-{run}",
        if sigterm { "term" } else { "release" }
    );
    let mut cs = ["a", "b", "c"]
        .iter()
        .map(|id| zookeeper::Candidate::start(server, &dir, &path, id))
        .collect::<Result<Vec<_>>>()?;
    let flags = FlagWatch::new(&dir.path(""))?;
    let mut out = Vec::new();
    for round in 0..rounds {
        let leader =
            leaderd_tests::wait_for(Duration::from_secs(10), "one ZooKeeper leader", || {
                let leading: Vec<usize> = (0..3).filter(|&i| cs[i].leads()).collect();
                (leading.len() == 1).then(|| leading[0])
            });
        std::thread::sleep(
            RELEASE_HOLD + Duration::from_micros(pseudo_random(round as u64) % 1_000_000),
        );
        let t0 = Instant::now();
        cs[leader].signal(if sigterm { Signal::TERM } else { Signal::USR1 });
        let (_, took) = flags.wait(t0, "no ZooKeeper handover", || {
            (0..3).find(|&i| i != leader && cs[i].leads())
        });
        out.push(took);
        if sigterm {
            cs[leader].wait_exit();
            let id = format!("{}{round}", &cs[leader].id[..1]);
            cs[leader] = zookeeper::Candidate::start(server, &dir, &path, &id)?;
        }
    }
    Ok(out)
}

fn median(xs: Vec<Duration>) -> Duration {
    Summary::of(xs).p50
}

/// One row of the handover table: each run's p50 / p90 / max, and the
/// median of the runs' p50 and p90.
struct Row {
    cells: Vec<String>,
    p50s: Vec<Duration>,
    p90s: Vec<Duration>,
    all: Vec<Duration>,
}

impl Row {
    fn new() -> Row {
        Row {
            cells: Vec::new(),
            p50s: Vec::new(),
            p90s: Vec::new(),
            all: Vec::new(),
        }
    }

    fn add(&mut self, times: Vec<Duration>) {
        let s = Summary::of(times.clone());
        self.cells
            .push(format!("{} / {} / {}", ms(s.p50), ms(s.p90), ms(s.max)));
        self.p50s.push(s.p50);
        self.p90s.push(s.p90);
        self.all.extend(times);
    }

    fn print(&self, what: &str) {
        println!(
            "| {what} | {} | {} | {} |",
            self.cells.join("; "),
            ms(median(self.p50s.clone())),
            ms(median(self.p90s.clone()))
        );
    }
}

/// The kinds of handover to run (`LEADERD_BENCH_HANDOVER_KINDS`, default
/// both): `true` for SIGTERM, `false` for `leaderd release`.
fn kinds() -> Result<Vec<bool>> {
    let Ok(list) = std::env::var("LEADERD_BENCH_HANDOVER_KINDS") else {
        return Ok(vec![true, false]);
    };
    list.split(',')
        .map(|k| match k.trim() {
            "sigterm" => Ok(true),
            "release" => Ok(false),
            other => anyhow::bail!(
                "LEADERD_BENCH_HANDOVER_KINDS: {other:?} is neither sigterm nor release"
            ),
        })
        .collect()
}

/// Prints the part's tables; returns every handover, for the plot.
pub fn run(size: Size) -> Result<Vec<Case>> {
    let (mut runs, rounds) = size.pick((3, 20), (1, 2));
    if let Ok(n) = std::env::var("LEADERD_BENCH_HANDOVER_RUNS") {
        runs = n
            .parse()
            .map_err(|e| anyhow::anyhow!("LEADERD_BENCH_HANDOVER_RUNS={n:?}: {e}"))?;
    }
    let kinds = kinds()?;
    let db = TempDb::postgres();
    let zk_dir = Scratch::new();
    let missing = zookeeper::missing();
    let server = match &missing {
        None => Some(zookeeper::Server::start(&zk_dir)?),
        Some(_) => None,
    };
    println!("## Graceful handover, at its limit\n");
    println!(
        "Three daemons on PostgreSQL (default timing); per kind {runs} runs of {rounds} \
         handovers, from the signal (or release request) until another daemon's flag file \
         exists (seen by inotify as it appears). Beside each run, the same with three ZooKeeper 3.8 \
         candidates (kazoo's lock recipe, a standalone server on this host), until another \
         candidate's flag file exists; SIGUSR1 gives its lead up and asks again after \
         500 ms, as the release does. Each run's p50 / p90 / max, then the median of the \
         runs' p50 and p90. Target: p50 ≤ 5 ms, p90 no worse than ZooKeeper's. Then, \
         from the same start, until the new leader's `/leader` answered 200 (asked once \
         its flag file was there).\n"
    );
    if let Some(why) = &missing {
        println!("ZooKeeper not run: {why}.\n");
    }
    println!("| kind | runs: p50 / p90 / max ms | median p50 | median p90 |");
    println!("|---|---|---:|---:|");
    let mut parts_by_kind = Vec::new();
    let mut cases = Vec::new();
    for sigterm in kinds {
        let kind = if sigterm {
            "SIGTERM"
        } else {
            "leaderd release"
        };
        let (mut ours, mut answered, mut theirs) = (Row::new(), Row::new(), Row::new());
        let mut all = Vec::new();
        // Interleaved, so that both meet the machine as it is.
        for run in 0..runs {
            let parts = run_once(&db.url, sigterm, rounds)?;
            ours.add(parts.iter().map(|p| p.total).collect());
            answered.add(parts.iter().map(|p| p.answered).collect());
            all.extend(parts);
            if let Some(server) = &server {
                theirs.add(zookeeper_once(server, sigterm, rounds, run)?);
            }
        }
        ours.print(kind);
        let (went, zk_went, zk_kind) = if sigterm {
            (Went::Term, Went::ZooKeeperTerm, "ZooKeeper, SIGTERM")
        } else {
            (
                Went::Release,
                Went::ZooKeeperRelease,
                "ZooKeeper, lead given up",
            )
        };
        cases.push(Case {
            what: if sigterm {
                "leaderd, SIGTERM"
            } else {
                "leaderd release"
            },
            went,
            times: ours.all.clone(),
        });
        if server.is_some() {
            theirs.print(zk_kind);
            cases.push(Case {
                what: zk_kind,
                went: zk_went,
                times: theirs.all.clone(),
            });
        }
        answered.print(&format!("{kind}, until `/leader` answered 200"));
        parts_by_kind.push((kind, all));
    }
    println!(
        "\nWhere the time goes, the median of every handover above (ms): signal → the \
         leader's local step-down → its successor named (the flag file removed, the \
         presence row let go, the presence rows read) → its release answered → the new \
         leader's take answered \
         (the wake-up, then the take's commit) → its flag file; and from the signal until \
         its `/leader` answered 200.\n"
    );
    println!(
        "| kind | step-down | successor named | release | wake-up and take | flag file | total \
         | `/leader` 200 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (kind, all) in parts_by_kind {
        let m = |f: fn(&Parts) -> Duration| ms(median(all.iter().map(f).collect()));
        println!(
            "| {kind} | {} | {} | {} | {} | {} | {} | {} |",
            m(|p| p.step_down),
            m(|p| p.named),
            m(|p| p.release),
            m(|p| p.take),
            m(|p| p.flag),
            m(|p| p.total),
            m(|p| p.answered)
        );
    }
    println!();
    Ok(cases)
}
