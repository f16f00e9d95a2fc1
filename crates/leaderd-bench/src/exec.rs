//! `leaderd exec`: the gap between one command's end and the next one's
//! start on another replica, when the leading leaderd gets SIGTERM (the
//! command is stopped, the row released, the others woken) or SIGKILL (the
//! command dies with it; the others wait out the lease), and how long after
//! the daemon logs a gain a `/leader/watch` client hears of it.

use std::time::Duration;

use anyhow::Result;
use leaderd_tests::replicas::Replicas;
use leaderd_tests::sse::{boot_us, Watcher};
use leaderd_tests::{wait_for, Daemon, TempDb, Value};
use rustix::process::Signal;

use crate::size::Size;
use crate::stats::{ms, Summary};

/// The command each replica runs while leading.
const COMMAND: &[&str] = &["/bin/sleep", "3600"];

/// The boot-clock times (µs) a daemon logged `message` at.
fn logged(d: &Daemon, message: &str) -> Vec<u64> {
    d.logged(message)
        .iter()
        .filter_map(|e| e["at_us"].as_u64())
        .collect()
}

/// Three replicas `x0`, `x1`, `x2`, each running [`COMMAND`] under
/// `leaderd exec`.
fn replicas(url: &str) -> Replicas {
    Replicas::direct(url, 3, "x", |launch| launch.exec(COMMAND))
}

/// The leader, once its command runs.
fn steady(r: &Replicas) -> usize {
    wait_for(
        Duration::from_secs(10),
        "a leader running its command",
        || {
            let leaders: Vec<usize> = (0..3).filter(|&i| r.daemons[i].is_leader()).collect();
            let &[l] = leaders.as_slice() else {
                return None;
            };
            // One read of the log per look: it shares the cores being timed.
            let events = r.daemons[l].log_events();
            let count = |m: &str| events.iter().filter(|e| e["message"] == m).count();
            (count("started the command") > count("the command exited")).then_some(l)
        },
    )
}

/// `rounds` handovers by `signal`; per round the gap from the old command's
/// end (its reaping, or the SIGKILL of its leaderd, which takes the command
/// with it) to the next command's start, both on the boot clock.
fn gaps(url: &str, signal: Signal, rounds: usize) -> Vec<Duration> {
    let mut r = replicas(url);
    let mut gaps = Vec::new();
    for round in 0..rounds {
        let l = steady(&r);
        // A moment anywhere in the renewal and poll cycles.
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 137) % 700));
        let before: Vec<usize> = (0..3)
            .map(|i| logged(&r.daemons[i], "started the command").len())
            .collect();
        let signalled = boot_us();
        r.daemons[l].signal(signal);
        r.daemons[l]
            .wait_exit(Duration::from_secs(5))
            .expect("leaderd exits");
        let end = if signal == Signal::KILL {
            signalled
        } else {
            *logged(&r.daemons[l], "the command exited")
                .last()
                .expect("reaped")
        };
        let next = wait_for(Duration::from_secs(5), "the next command", || {
            (0..3).filter(|&i| i != l).find_map(|i| {
                logged(&r.daemons[i], "started the command")
                    .get(before[i])
                    .copied()
            })
        });
        gaps.push(Duration::from_micros(next.saturating_sub(end)));
        r.restart_same(l);
    }
    gaps
}

/// Handovers by `POST /release`; per round the time from the new leader's
/// logged gain to its watcher hearing `is_leader: true`.
fn watch_lags(url: &str, rounds: usize) -> Vec<Duration> {
    let r = replicas(url);
    let mut lags = Vec::new();
    for _ in 0..rounds {
        let l = steady(&r);
        let watchers: Vec<Watcher> = r
            .daemons
            .iter()
            .map(|d| Watcher::open(d.port).expect("watch"))
            .collect();
        for w in &watchers {
            w.next(Duration::from_secs(1)).expect("event at connect");
        }
        r.daemons[l].release("?hold=3s");
        let (i, at, token) = wait_for(Duration::from_secs(5), "a gain on a stream", || {
            (0..3).filter(|&i| i != l).find_map(|i| {
                let (at, v) = watchers[i]
                    .until(Duration::from_millis(2), |v: &Value| v["is_leader"] == true)?;
                Some((i, at, v["token"].clone()))
            })
        });
        let acquired = wait_for(Duration::from_secs(2), "the logged gain", || {
            r.daemons[i].log_events().into_iter().find_map(|e| {
                (e["message"] == "acquired leadership" && e["token"] == token)
                    .then(|| e["at_us"].as_u64())?
            })
        });
        lags.push(Duration::from_micros(at.saturating_sub(acquired)));
    }
    lags
}

fn row(what: &str, xs: Vec<Duration>) -> String {
    let s = Summary::of(xs);
    format!("| {what} | {} | {} | {} |", s.n, ms(s.p50), ms(s.max))
}

pub fn run(size: Size) -> Result<()> {
    let rounds = size.pick(20, 1);
    println!("## exec: one command's end to the next one's start\n");
    println!(
        "Three `leaderd exec -- sleep 3600` replicas (heartbeat 1 s, ttl 1.2 s). The leading \
         leaderd gets SIGTERM (it stops the command, releases the row, wakes the others) or \
         SIGKILL (the command dies with it by its parent-death signal; the others wait out the \
         lease). The gap runs from the old command's end (its reaping as logged; for SIGKILL, the \
         signal) to the next command's start as logged, both on the boot clock. Watch lag: after \
         `POST /release`, from the new leader's logged gain to a `/leader/watch` client hearing \
         `is_leader: true`.\n"
    );
    println!("| case | n | p50 ms | max ms |");
    println!("|---|---:|---:|---:|");
    let dbs = if size.smoke {
        vec![("PostgreSQL", TempDb::postgres())]
    } else {
        vec![
            ("PostgreSQL", TempDb::postgres()),
            ("MariaDB", TempDb::mysql()),
            ("SQLite", TempDb::sqlite()),
        ]
    };
    for (name, db) in &dbs {
        println!(
            "{}",
            row(
                &format!("{name}, SIGTERM"),
                gaps(&db.url, Signal::TERM, rounds)
            )
        );
        println!(
            "{}",
            row(
                &format!("{name}, SIGKILL"),
                gaps(&db.url, Signal::KILL, rounds)
            )
        );
    }
    let (_, pg) = &dbs[0];
    println!(
        "{}",
        row(
            "watch lag after a gain, PostgreSQL",
            watch_lags(&pg.url, rounds)
        )
    );
    println!();
    Ok(())
}
