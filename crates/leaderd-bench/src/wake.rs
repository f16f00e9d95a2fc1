//! Two releases close together on one SQLite file: three daemons run the
//! same two elections without the spread, each election led by a
//! different daemon, and the two leaders release a few milliseconds
//! apart. Measured: how long the second election stays leaderless. A
//! follower woken for the other election's release spends the wake-up
//! the engine allows it each 50 ms on a refusal, and takes its own
//! election's release at its next turn: the wake-ups must name the
//! election released (on SQLite they once named only the last release on
//! the host, and woke every follower of every election).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use leaderd_tests::{wait_for, Daemon, Scratch, TempDb};

use crate::elections::{names, start};
use crate::size::Size;
use crate::stats::{ms, Summary};

/// Shorter than the pause between rounds, so that no replica still holds
/// off when it is named the successor of a later release.
const HOLD: &str = "100ms";

/// Between the first release's answer and the second release.
const APART: Duration = Duration::from_millis(3);

/// The daemon leading `query`'s election now, by index.
fn leader(daemons: &[Daemon], query: &str) -> Option<usize> {
    daemons.iter().position(|d| d.token_held(query).is_some())
}

/// Waits until a daemon other than `not` leads `query`'s election, polled
/// every millisecond; the time since `started`.
fn taken(daemons: &[Daemon], query: &str, not: usize, started: Instant) -> Result<Duration> {
    loop {
        let others = daemons.iter().enumerate().filter(|(i, _)| *i != not);
        if others
            .into_iter()
            .any(|(_, d)| d.token_held(query).is_some())
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(5) {
            bail!("{query}: nobody else took it within 5 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The second election's leaderless times, one per round.
fn measure(rounds: usize) -> Result<Summary> {
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let daemons: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(&db, &dir, id, 2, &["--no-spread"]))
        .collect();
    let [first, second] = [0, 1].map(|i| format!("?election={}", names(2)[i]));
    let mut leaderless = Vec::with_capacity(rounds);
    while leaderless.len() < rounds {
        std::thread::sleep(Duration::from_millis(300));
        let (x, y) = wait_for(Duration::from_secs(30), "both elections led", || {
            Some((leader(&daemons, &first)?, leader(&daemons, &second)?))
        });
        if x == y {
            // One daemon leads both: move the second elsewhere first.
            let started = Instant::now();
            daemons[y].release(&format!("{second}&hold={HOLD}"));
            taken(&daemons, &second, y, started)?;
            continue;
        }
        daemons[x].release(&format!("{first}&hold={HOLD}"));
        std::thread::sleep(APART);
        let started = Instant::now();
        daemons[y].release(&format!("{second}&hold={HOLD}"));
        leaderless.push(taken(&daemons, &second, y, started)?);
    }
    Ok(Summary::of(leaderless))
}

/// Prints the part's table.
pub fn run(size: Size) -> Result<Summary> {
    let rounds = size.pick(50, 3);
    let s = measure(rounds)?;
    eprintln!("wake: {s:?}");
    println!("## Two releases close together on SQLite\n");
    println!(
        "Three daemons on one SQLite file, two elections, `--no-spread`, each election led \
         by a different daemon; {rounds} rounds of `POST /release` of the first, then {} ms \
         after its answer of the second. The second election is leaderless from its request \
         until another daemon's `/leader?election=…` answers 200.\n",
        APART.as_millis()
    );
    println!("| leaderless p50 ms | p90 ms | p99 ms | max ms |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {} | {} | {} | {} |\n",
        ms(s.p50),
        ms(s.p90),
        ms(s.p99),
        ms(s.max)
    );
    Ok(s)
}
