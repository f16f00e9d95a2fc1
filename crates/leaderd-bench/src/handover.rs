//! Graceful handover at its limit: three daemons on PostgreSQL (default
//! timing); the leader is SIGTERMed or released (`leaderd release`) 20
//! times a run, three runs each, timed from the signal (or request) until
//! another daemon answers 200 on `/leader`. Each handover is broken down
//! from the daemons' JSON logs (their wall-clock timestamps, the bench's
//! clock beside them): signal → the leader's local step-down (`lost
//! leadership`) → its release answered (`released the lease`) → the new
//! leader's take answered (`acquired leadership`: the wake-up and the
//! take's commit) → its `/leader` answering 200 (the bench polls every
//! 0.5 ms).

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use leaderd_tests::{wait_single_leader, Daemon, Scratch, TempDb};
use rustix::process::Signal;
use serde_json::Value;

use crate::failover::{poll, pseudo_random, start, RELEASE_HOLD};
use crate::size::Size;
use crate::stats::{ms, Summary};

/// One handover: the total, and its parts in order.
#[derive(Debug, Clone, Copy)]
struct Parts {
    total: Duration,
    step_down: Duration,
    release: Duration,
    take: Duration,
    answer: Duration,
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
    let dir = Scratch::new();
    let mut ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(url, id, &dir))
        .collect();
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
        let (signalled, t0) = (SystemTime::now(), Instant::now());
        if sigterm {
            ds[leader].signal(Signal::TERM);
        } else {
            let listen = format!("127.0.0.1:{}", ds[leader].port);
            let hold = format!("{}ms", RELEASE_HOLD.as_millis());
            let (code, _, err) =
                leaderd_tests::run_cli(&["release", "--listen", &listen, "--hold", &hold], &[]);
            anyhow::ensure!(code == 0, "release failed: {err}");
        }
        let (new, total) = poll(t0, "no handover", || {
            others.iter().copied().find(|&i| ds[i].is_leader())
        });
        let answered = signalled + total;
        if sigterm {
            ds[leader].wait_exit(Duration::from_secs(3));
        }
        // The log writers never hold the daemons up: their lines may come
        // a little after the answers.
        let (old, taker) = (&ds[leader], &ds[new]);
        let (stepped, released, took) =
            leaderd_tests::wait_for(Duration::from_secs(3), "the handover's log lines", || {
                Some((
                    logged_at(old, "lost leadership", signalled)?,
                    logged_at(old, "released the lease", signalled)?,
                    logged_at(taker, "acquired leadership", signalled)?,
                ))
            });
        let parts = Parts {
            total,
            step_down: between(signalled, stepped),
            release: between(stepped, released),
            take: between(released, took),
            answer: between(took, answered),
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

fn median(xs: Vec<Duration>) -> Duration {
    Summary::of(xs).p50
}

/// Prints the part's tables.
pub fn run(size: Size) -> Result<()> {
    let (runs, rounds) = size.pick((3, 20), (1, 2));
    let db = TempDb::postgres();
    println!("## Graceful handover, at its limit\n");
    println!(
        "Three daemons on PostgreSQL (default timing); per kind {runs} runs of {rounds} \
         handovers, from the signal (or release request) until another daemon answers 200 \
         on `/leader`. Each run's p50 / p90 / max, then the median of the runs' p50 and p90. \
         Target: p50 ≤ 5 ms.\n"
    );
    println!("| kind | runs: p50 / p90 / max ms | median p50 | median p90 |");
    println!("|---|---|---:|---:|");
    let mut parts_by_kind = Vec::new();
    for (kind, sigterm) in [("SIGTERM", true), ("leaderd release", false)] {
        let mut cells = Vec::new();
        let (mut p50s, mut p90s, mut all) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let parts = run_once(&db.url, sigterm, rounds)?;
            let s = Summary::of(parts.iter().map(|p| p.total).collect());
            cells.push(format!("{} / {} / {}", ms(s.p50), ms(s.p90), ms(s.max)));
            p50s.push(s.p50);
            p90s.push(s.p90);
            all.extend(parts);
        }
        println!(
            "| {kind} | {} | {} | {} |",
            cells.join("; "),
            ms(median(p50s)),
            ms(median(p90s))
        );
        parts_by_kind.push((kind, all));
    }
    println!(
        "\nWhere the time goes, the median of every handover above (ms): signal → the \
         leader's local step-down → its release answered → the new leader's take answered \
         (the wake-up, then the take's commit) → its `/leader` answering 200 (polled every \
         0.5 ms).\n"
    );
    println!("| kind | step-down | release | wake-up and take | `/leader` 200 | total |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (kind, all) in parts_by_kind {
        let m = |f: fn(&Parts) -> Duration| ms(median(all.iter().map(f).collect()));
        println!(
            "| {kind} | {} | {} | {} | {} | {} |",
            m(|p| p.step_down),
            m(|p| p.release),
            m(|p| p.take),
            m(|p| p.answer),
            m(|p| p.total)
        );
    }
    println!();
    Ok(())
}
