//! A short lease beside a busy database: three daemons with `--ttl 100ms
//! --heartbeat 33ms` on a PostgreSQL that `pgbench` saturates with writes
//! (32 clients, TPC-B). A renewal that waits its turn in the database's
//! queue must not cost the lease: counted are the changes of holder (new
//! tokens) and the leader's step-downs while the load runs, which should
//! both be 0; then the leader is SIGKILLed again and again under the same
//! load, timed until another daemon answers 200. A round in which no
//! single leader shows within 10 s, or nobody takes over within 10 s, is
//! counted in the table rather than ending the run: on a disk whose fsync
//! falls behind the load, a 100 ms lease cannot be held, and that is the
//! figure (docs/design.md, the renewal budget).
//!
//! `--smoke` runs the same steps with the default lease: a smoke run checks
//! that the part runs, not the machine's fsync latency (CI's machine, just
//! after a cold build and the whole suite, once found no leader with
//! 100 ms within 10 s, and once no single leader in a round).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leaderd_tests::{single_leader, Daemon, Scratch, TempDb};

use crate::size::Size;
use crate::stats::{ms, Summary};

const TIMING: [&str; 4] = ["--ttl", "100ms", "--heartbeat", "33ms"];
const SMOKE_TIMING: [&str; 4] = ["--ttl", "1200ms", "--heartbeat", "1s"];

/// `pgbench` on `url`, for `secs`: 32 clients, the default TPC-B writes.
pub fn pgbench(url: &str, secs: u64) -> Result<Child> {
    Command::new("pgbench")
        .args(["-n", "-c", "32", "-j", "2", "-T", &secs.to_string(), url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("pgbench (Debian's postgresql-client)")
}

/// Fills `url` with pgbench's tables (scale 10).
pub fn pgbench_init(url: &str) -> Result<()> {
    let init = Command::new("pgbench")
        .args(["-i", "-q", "-s", "10", url])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("pgbench -i")?;
    if !init.success() {
        bail!("pgbench -i failed: {init}");
    }
    Ok(())
}

/// Waits for `pgbench` and reads its summary: (tps, average latency ms).
pub fn pgbench_figures(bench: Child) -> Result<(String, String)> {
    let out = bench.wait_with_output().context("pgbench")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // `tps = 1438.6 (…)`, `latency average = 22.2 ms`.
    let figure = |line: &str, word: usize| {
        text.lines()
            .find(|l| l.starts_with(line))
            .and_then(|l| l.split_whitespace().nth(word))
            .unwrap_or("?")
            .to_owned()
    };
    Ok((figure("tps =", 2), figure("latency average", 3)))
}

/// The daemons' transitions in their logs: (acquired tokens, losses).
pub fn transitions(daemons: &[Daemon]) -> (Vec<i64>, usize) {
    let mut tokens = Vec::new();
    let mut lost = 0;
    for d in daemons {
        for e in d.log_events() {
            match e["message"].as_str() {
                Some("acquired leadership") => tokens.extend(e["token"].as_i64()),
                Some("lost leadership") if e["reason"] != "shutdown" => lost += 1,
                _ => {}
            }
        }
    }
    tokens.sort_unstable();
    tokens.dedup();
    (tokens, lost)
}

/// Prints the part's table.
pub fn run(size: Size) -> Result<()> {
    let load = size.pick(600, 3);
    let rounds = size.pick(50, 2);
    let timing = size.pick(TIMING, SMOKE_TIMING);
    let db = TempDb::postgres();
    pgbench_init(&db.url)?;
    let dir = Scratch::new();
    let mut daemons: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| Daemon::start(&db.url, id, &dir, &timing))
        .collect();
    // A 100 ms lease just after pgbench's initial load (and the checkpoint
    // it brings) may step down and change hands for a while: wait longer
    // than for a default lease, and show the logs if it never settles.
    if leaderd_tests::try_wait_for(Duration::from_secs(30), || single_leader(&daemons)).is_none() {
        leaderd_tests::print_logs(&daemons);
        bail!("no single leader among the three within 30 s, before any load");
    }
    let (before, lost_before) = transitions(&daemons);

    // Steady leadership under the load.
    let (tps, latency) = pgbench_figures(pgbench(&db.url, load)?)?;
    let (after, lost_after) = transitions(&daemons);
    let new_terms = after.len() - before.len();
    let step_downs = lost_after - lost_before;

    // SIGKILL failovers under the same load.
    let mut bench = pgbench(&db.url, 3600)?;
    let mut times = Vec::new();
    let (mut no_leader, mut no_takeover) = (0, 0);
    for round in 0..rounds {
        let found =
            leaderd_tests::try_wait_for(Duration::from_secs(10), || single_leader(&daemons));
        let Some(leader) = found else {
            no_leader += 1;
            continue;
        };
        // Past the restarted daemon's start, and anywhere in the renew cycle.
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 37) % 100));
        let t0 = Instant::now();
        daemons[leader].sigkill();
        loop {
            let others = (0..daemons.len()).filter(|&i| i != leader);
            if others.into_iter().any(|i| daemons[i].is_leader()) {
                times.push(t0.elapsed());
                break;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                no_takeover += 1;
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        daemons[leader].wait_exit(Duration::from_secs(3));
        let id = format!("{}{round}", &daemons[leader].id[..1]);
        daemons[leader] = Daemon::start(&db.url, &id, &dir, &timing);
    }
    let _ = bench.kill();
    let _ = bench.wait();
    let s = Summary::of(times);

    println!("## A short lease on a busy database\n");
    println!(
        "Three daemons (`{}`) on one PostgreSQL that `pgbench -c 32 -j 2` \
         (TPC-B) saturates with writes: {tps} tps at {latency} ms average latency over {load} s.",
        timing.join(" ")
    );
    println!("Then the leader SIGKILLed {rounds} times under the same load.\n");
    println!("| what | value |");
    println!("|---|---:|");
    println!("| changes of holder (new tokens) during the load | {new_terms} |");
    println!("| leader step-downs during the load | {step_downs} |");
    println!("| SIGKILL failover p50 ms | {} |", ms(s.p50));
    println!("| SIGKILL failover p99 ms | {} |", ms(s.p99));
    println!("| SIGKILL failover max ms | {} |", ms(s.max));
    println!("| rounds with no single leader within 10 s | {no_leader} |");
    println!("| rounds with no takeover within 10 s | {no_takeover} |");
    println!();
    Ok(())
}
