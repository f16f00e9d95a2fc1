//! Several elections per daemon: three daemons on one PostgreSQL (or, with
//! `LEADERD_BENCH_BACKEND=mysql`, the local MariaDB), each running the same
//! N elections (spread across them), for N = 1, 10, 100, 1,000 and on to
//! 30,000 (past where the attempts' p99 passes 50 ms). Measured once the
//! elections are spread, over a window: statements the database commits
//! per second, the CPU the server spends on the daemons' sessions, the p99
//! of the daemons' attempts and of their renewals alone (from their
//! `/metrics` histograms), and each daemon's RSS (one daemon's memory per
//! election alone: `memory`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use leaderd_tests::{
    cpu_ticks, http_get, pid_of, status_kib, thread_cpu_ticks, Daemon, Scratch, TempDb,
};

use crate::size::Size;

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Step {
    pub elections: usize,
    pub statements_per_s: f64,
    pub db_cpu_percent: f64,
    pub p99_ms: f64,
    /// The share of attempts answered within 50 ms.
    pub within_50ms: f64,
    /// The p99 of the leaders' renewals alone.
    pub renewal_p99_ms: f64,
    pub daemon_rss_mib: f64,
    pub daemon_cpu_percent: f64,
}

pub fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("job-{i:05}")).collect()
}

/// A daemon running the N elections of [`names`], with `extra` flags.
pub fn start(db: &TempDb, dir: &Scratch, id: &str, n: usize, extra: &[&str]) -> Daemon {
    // A file: 20,000 names are more than one environment variable may hold.
    let config = dir.path(&format!("{id}.toml"));
    let list: Vec<String> = names(n).iter().map(|e| format!("\"{e}\"")).collect();
    std::fs::write(&config, format!("elections = [{}]\n", list.join(",")))
        .expect("write the elections' config file");
    let config = config.to_string_lossy().into_owned();
    let args: Vec<&str> = ["--config", config.as_str()]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    Daemon::launch(&db.url, id, dir, id, &args)
        .without_flag_file()
        // The default level, as deployed: the harness's debug level logs
        // every renewal (2,500 lines/s at 1,000 elections), which is the
        // logger's cost, not the elections'.
        .env("RUST_LOG", "info")
        .start()
}

/// How many elections each daemon leads now.
fn counts(daemons: &[Daemon]) -> Option<Vec<usize>> {
    daemons
        .iter()
        .map(|d| d.leading().map(|l| l.len()))
        .collect()
}

/// The attempts (`leaderd_heartbeat_duration_seconds`), every one.
const ATTEMPTS: &str = "leaderd_heartbeat_duration_seconds_bucket{";
/// The leaders' renewals among them.
const RENEWALS: &str = "leaderd_renewal_duration_seconds_bucket{";

/// The daemons' histogram `series` (a `…_bucket{` prefix), summed over
/// elections: (upper bound in seconds, cumulative count) per bucket.
fn histogram(daemons: &[Daemon], series: &str) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for d in daemons {
        let Some((200, text)) = http_get(d.port, "/metrics") else {
            continue;
        };
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(series) else {
                continue;
            };
            let Some(le) = rest.split("le=\"").nth(1).and_then(|s| s.split('"').next()) else {
                continue;
            };
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            let count: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0.0);
            match buckets.iter_mut().find(|(b, _)| *b == bound) {
                Some(b) => b.1 += count,
                None => buckets.push((bound, count)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// What was observed between two histograms: its p99 in ms, interpolated
/// within the bucket it falls in (as Prometheus's `histogram_quantile`
/// does), and the share of attempts within 50 ms.
fn p99_between(before: &[(f64, f64)], after: &[(f64, f64)]) -> (f64, f64) {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(b, c)| {
            let was = before.iter().find(|(x, _)| x == b).map_or(0.0, |x| x.1);
            (*b, c - was)
        })
        .collect();
    let total = delta.last().map_or(0.0, |x| x.1);
    let within_50ms = delta
        .iter()
        .find(|(b, _)| *b >= 0.05)
        .map_or(f64::NAN, |(_, c)| c / total);
    let rank = total * 0.99;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in &delta {
        if count >= rank {
            if bound.is_infinite() {
                return (lower.0 * 1000.0, within_50ms);
            }
            let part = if count > lower.1 {
                (rank - lower.1) / (count - lower.1)
            } else {
                1.0
            };
            return ((lower.0 + (bound - lower.0) * part) * 1000.0, within_50ms);
        }
        lower = (bound, count);
    }
    (f64::NAN, within_50ms)
}

/// Which server the part runs on (`LEADERD_BENCH_BACKEND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    Postgres,
    Mariadb,
}

impl Server {
    fn from_env() -> Result<Self> {
        match std::env::var("LEADERD_BENCH_BACKEND").as_deref() {
            Err(_) | Ok("postgres") => Ok(Self::Postgres),
            Ok("mysql") => Ok(Self::Mariadb),
            Ok(other) => anyhow::bail!("LEADERD_BENCH_BACKEND: postgres or mysql, not {other:?}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Mariadb => "MariaDB",
        }
    }

    fn database(self) -> TempDb {
        match self {
            Self::Postgres => TempDb::postgres(),
            Self::Mariadb => TempDb::mysql(),
        }
    }

    /// The CPU ticks of what serves the daemons' sessions, as a closure
    /// over the sessions open now: PostgreSQL's backend processes, or
    /// MariaDB's threads (one per connection; the server's own purging and
    /// flushing are not the daemons').
    fn sessions_cpu(self, db: &TempDb) -> Box<dyn Fn() -> u64> {
        match self {
            Self::Postgres => {
                let pids: Vec<i32> = list(&db.scalar(
                    "SELECT coalesce(string_agg(pid::text, ','), '') FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = 'leaderd'",
                ));
                Box::new(move || pids.iter().filter_map(|&p| cpu_ticks(p)).sum())
            }
            Self::Mariadb => {
                let tids: Vec<i32> = list(&db.scalar(
                    "SELECT COALESCE(GROUP_CONCAT(TID), '') FROM information_schema.PROCESSLIST \
                     WHERE DB = DATABASE() AND ID <> CONNECTION_ID()",
                ));
                let server = pid_of("mariadbd").or_else(|| pid_of("mysqld"));
                Box::new(move || {
                    server.map_or(0, |server| {
                        tids.iter()
                            .filter_map(|&t| thread_cpu_ticks(server, t))
                            .sum()
                    })
                })
            }
        }
    }

    /// Statements so far: PostgreSQL's transactions committed in this
    /// database; MariaDB's statements received by the whole server (its
    /// `Questions`: nothing else runs beside the bench).
    fn statements(self, db: &TempDb) -> u64 {
        let sql = match self {
            Self::Postgres => {
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            }
            Self::Mariadb => {
                "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'QUESTIONS'"
            }
        };
        db.scalar(sql).parse().unwrap_or(0)
    }
}

/// Numbers separated by commas.
fn list(text: &str) -> Vec<i32> {
    text.split(',').filter_map(|p| p.parse().ok()).collect()
}

/// The step for `n` elections, or `None` when they did not spread within a
/// minute (the daemons cannot keep up).
fn measure(server: Server, n: usize, window: Duration) -> Result<Option<Step>> {
    let db = server.database();
    let dir = Scratch::new();
    let daemons: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(&db, &dir, id, n, &[]))
        .collect();
    let share = n.div_ceil(3);
    let spread = || {
        counts(&daemons)
            .is_some_and(|c| c.iter().sum::<usize>() == n && c.iter().all(|&x| x <= share))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !spread() {
        if Instant::now() > deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let ticks_per_s = rustix::param::clock_ticks_per_second() as f64;
    let sessions = server.sessions_cpu(&db);
    let cpu = |pids: &[i32]| pids.iter().filter_map(|&p| cpu_ticks(p)).sum::<u64>();
    let own = {
        let a = server.statements(&db);
        server.statements(&db) - a
    };
    let (db0, d0, c0, h0) = (
        sessions(),
        cpu(&daemons.iter().map(Daemon::pid).collect::<Vec<_>>()),
        server.statements(&db),
        (histogram(&daemons, ATTEMPTS), histogram(&daemons, RENEWALS)),
    );
    let t0 = Instant::now();
    std::thread::sleep(window);
    let (db1, d1, c1, h1) = (
        sessions(),
        cpu(&daemons.iter().map(Daemon::pid).collect::<Vec<_>>()),
        server.statements(&db),
        (histogram(&daemons, ATTEMPTS), histogram(&daemons, RENEWALS)),
    );
    let secs = t0.elapsed().as_secs_f64();
    let (p99_ms, within_50ms) = p99_between(&h0.0, &h1.0);
    let (renewal_p99_ms, _) = p99_between(&h0.1, &h1.1);
    let rss = daemons
        .iter()
        .filter_map(|d| status_kib(d.pid(), "VmRSS:"))
        .max()
        .unwrap_or(0);
    Ok(Some(Step {
        elections: n,
        statements_per_s: (c1 - c0).saturating_sub(own) as f64 / secs,
        db_cpu_percent: (db1 - db0) as f64 / ticks_per_s / secs * 100.0,
        p99_ms,
        within_50ms,
        renewal_p99_ms,
        daemon_rss_mib: rss as f64 / 1024.0,
        daemon_cpu_percent: (d1 - d0) as f64 / ticks_per_s / secs * 100.0 / 3.0,
    }))
}

/// Prints the part's table; returns its rows for the plot.
pub fn run(size: Size) -> Result<Vec<Step>> {
    // `LEADERD_BENCH_ELECTIONS=20000,30000` runs those steps alone.
    let ns: Vec<usize> = match std::env::var("LEADERD_BENCH_ELECTIONS") {
        Ok(list) => list
            .split(',')
            .map(|n| n.trim().parse())
            .collect::<Result<_, _>>()
            .context("LEADERD_BENCH_ELECTIONS: a comma-separated list of numbers")?,
        Err(_) => size.pick(
            vec![1, 10, 100, 1000, 3000, 5000, 10_000, 20_000, 30_000],
            vec![1, 4],
        ),
    };
    let server = Server::from_env()?;
    let window = size.pick(Duration::from_secs(20), Duration::from_secs(2));
    let mut steps = Vec::new();
    let mut unsettled = None;
    for n in ns {
        match measure(server, n, window)? {
            Some(step) => {
                eprintln!("elections {n}: {step:?}");
                steps.push(step);
            }
            None => {
                unsettled = Some(n);
                break;
            }
        }
    }
    let (heading, statements, sessions) = match server {
        Server::Postgres => (
            String::new(),
            "transactions the database committed per second (each renewal batch, follower \
             attempt and spread read is one)",
            "the backends serving the daemons",
        ),
        Server::Mariadb => (
            format!(" ({})", server.name()),
            "statements the server received per second (its `Questions`)",
            "the server threads serving the daemons' sessions",
        ),
    };
    println!("## Several elections per daemon{heading}\n");
    println!(
        "Three daemons on one {}, each running the same N elections (default timing, \
         spread on: each leads about N/3), measured over {} s once spread. Statements: \
         {statements}. DB CPU: {sessions}, % of one core. p99: the daemons' attempts (renewals and followers' attempts, from the \
         statement's send to its answer reaching the election's loop), from their \
         histograms, interpolated within the bucket as Prometheus's histogram_quantile \
         does; beside it the share answered within 50 ms, and the p99 of the leaders' \
         renewals alone (leaderd_renewal_duration_seconds). RSS: the largest of the three.\n",
        server.name(),
        window.as_secs()
    );
    println!("| elections per daemon | statements/s | DB CPU % | attempt p99 ms | within 50 ms % | renewal p99 ms | daemon RSS MiB | daemon CPU % |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for s in &steps {
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            s.elections,
            s.statements_per_s,
            s.db_cpu_percent,
            s.p99_ms,
            s.within_50ms * 100.0,
            s.renewal_p99_ms,
            s.daemon_rss_mib,
            s.daemon_cpu_percent
        );
    }
    if let Some(n) = unsettled {
        println!("| {n} | did not spread within 60 s | | | | | | |");
    }
    println!("\nOne daemon's memory per election: the `memory` part.\n");
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_interpolated_within_its_bucket() {
        let after = [
            (0.01, 50.0),
            (0.05, 99.5),
            (0.1, 100.0),
            (f64::INFINITY, 100.0),
        ];
        let (p99, within) = p99_between(&[], &after);
        // 99 of 100 falls 49/49.5 of the way from 10 ms to 50 ms.
        assert!((p99 - (10.0 + 40.0 * 49.0 / 49.5)).abs() < 1e-9, "{p99}");
        assert!((within - 0.995).abs() < 1e-9);
        // Only what happened between the two counts.
        let before = [
            (0.01, 50.0),
            (0.05, 50.0),
            (0.1, 50.0),
            (f64::INFINITY, 50.0),
        ];
        let (p99, _) = p99_between(&before, &after);
        // 50 new, 49.5 of them within 50 ms and none within 10 ms.
        assert!((p99 - 50.0).abs() < 1e-9, "{p99}");
        // Beyond the last bound: that bound, as histogram_quantile says.
        let (p99, _) = p99_between(&[], &[(0.1, 1.0), (f64::INFINITY, 100.0)]);
        assert_eq!(p99, 100.0);
    }
}
