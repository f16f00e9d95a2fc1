//! A release beside a leader's renewals: two daemons on PostgreSQL run the
//! same N elections without the spread (one leads them all, the other
//! follows), and elections are released one at a time, at moments spread
//! over the renew interval, so that some releases meet the leader's
//! renewal statement for all N. Measured per release: how long the
//! release takes to answer, and how long the election stays leaderless
//! (from the `POST /release` to the other daemon's
//! `/leader?election=NAME` answering 200).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use leaderd_tests::{wait_for, Scratch, TempDb};

use crate::elections::{names, start};
use crate::size::Size;
use crate::stats::{ms, Summary};

/// One measured size.
#[derive(Debug, Clone)]
pub struct Step {
    pub elections: usize,
    pub answered: Summary,
    pub leaderless: Summary,
}

/// Shorter than the pause between two releases, so that with one election
/// the replica that released it last is not still holding off.
const HOLD: &str = "100ms";

fn measure(n: usize, rounds: usize) -> Result<Step> {
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let a = start(&db, &dir, "a", n, &["--no-spread"]);
    wait_for(
        Duration::from_secs(180),
        "the first daemon leads all",
        || a.leading().filter(|l| l.len() == n).map(drop),
    );
    let b = start(&db, &dir, "b", n, &["--no-spread"]);
    let names = names(n);
    let last = format!("?election={}", names[n - 1]);
    wait_for(Duration::from_secs(60), "the second daemon follows", || {
        b.leader_of(&last).filter(|(s, _)| *s == 503).map(drop)
    });
    let mut answered = Vec::with_capacity(rounds);
    let mut leaderless = Vec::with_capacity(rounds);
    for k in 0..rounds {
        // 300 to 700 ms apart: every moment of a 400 ms renew interval.
        std::thread::sleep(Duration::from_millis(300 + (k as u64 * 137) % 400));
        let query = format!("?election={}", names[k % n]);
        let (from, to) = if a.token_held(&query).is_some() {
            (&a, &b)
        } else {
            (&b, &a)
        };
        let started = Instant::now();
        from.release(&format!("{query}&hold={HOLD}"));
        answered.push(started.elapsed());
        // Polled every millisecond (the harness's `wait_for` sleeps 5 ms).
        while to.token_held(&query).is_none() {
            if started.elapsed() > Duration::from_secs(5) {
                bail!("{query}: nobody took it over within 5 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        leaderless.push(started.elapsed());
    }
    Ok(Step {
        elections: n,
        answered: Summary::of(answered),
        leaderless: Summary::of(leaderless),
    })
}

/// Prints the part's table.
pub fn run(size: Size) -> Result<Vec<Step>> {
    let sizes = size.pick(vec![1, 1000, 6000], vec![10]);
    let rounds = size.pick(150, 3);
    let mut steps = Vec::new();
    for &n in &sizes {
        let step = measure(n, rounds)?;
        eprintln!("release: {step:?}");
        steps.push(step);
    }
    println!("## A release beside a leader's renewals\n");
    println!(
        "Two daemons on PostgreSQL, N elections, `--no-spread`: one leads all N and renews \
         them in one statement per renew interval; {rounds} releases \
         (`POST /release?election=…`) at moments spread over the interval. The election \
         is leaderless from the request until the other daemon's `/leader?election=…` \
         answers 200.\n"
    );
    println!(
        "| elections led (N) | release answered p50 ms | p99 ms | leaderless p50 ms | p90 ms | p99 ms | max ms |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for s in &steps {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            s.elections,
            ms(s.answered.p50),
            ms(s.answered.p99),
            ms(s.leaderless.p50),
            ms(s.leaderless.p90),
            ms(s.leaderless.p99),
            ms(s.leaderless.max),
        );
    }
    println!();
    Ok(steps)
}
