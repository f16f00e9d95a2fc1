//! The renewal budget under load (docs/design.md, the renewal budget): three daemons
//! beside a saturating write load (`pgbench`, 32 clients, TPC-B) on the same
//! PostgreSQL, at ttl 100, 150 and 300 ms (heartbeat ttl / 3), each for five
//! minutes. Counted per ttl: changes of holder (new tokens), local
//! step-downs (the leader losing its lease by its own deadline or a failed
//! renewal), and the leaders' renewal p99 (from `/metrics`, over the load)
//! against the budget, `ttl - safety margin - renew interval`. A ttl that
//! finds no single leader within 30 s before the load (a disk whose fsync
//! cannot keep within it) is marked in the table, not an error: it is what
//! the part measures.

use std::time::Duration;

use anyhow::Result;
use leaderd_core::Timing;
use leaderd_tests::{single_leader, Daemon, Scratch, TempDb};

use crate::busy::{pgbench, pgbench_figures, pgbench_init, transitions};
use crate::size::Size;

const TTLS_MS: [u64; 3] = [100, 150, 300];

/// The renewal histogram of `daemons`, summed: (upper bound, cumulative
/// count) per bucket, `+Inf` last.
fn renewals(daemons: &[Daemon]) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for d in daemons {
        let Some((200, text)) = leaderd_tests::http_get(d.port, "/metrics") else {
            continue;
        };
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("leaderd_renewal_duration_seconds_bucket{") else {
                continue;
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let le = labels
                .split(',')
                .find_map(|l| l.strip_prefix("le=\""))
                .map(|v| v.trim_end_matches('"'));
            let bound = match le {
                Some("+Inf") => f64::INFINITY,
                Some(v) => v.parse().unwrap_or(f64::NAN),
                None => continue,
            };
            let count: f64 = value.trim().parse().unwrap_or(0.0);
            match buckets.iter_mut().find(|(b, _)| *b == bound) {
                Some((_, c)) => *c += count,
                None => buckets.push((bound, count)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// The `q` quantile of the renewals between two looks, interpolated within
/// its bucket as Prometheus's `histogram_quantile` does; `None` without
/// renewals.
fn quantile(q: f64, before: &[(f64, f64)], after: &[(f64, f64)]) -> Option<Duration> {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|&(bound, c)| {
            let was = before
                .iter()
                .find(|(b, _)| *b == bound)
                .map_or(0.0, |&(_, c)| c);
            (bound, c - was)
        })
        .collect();
    let total = counts.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, c) in &counts {
        if c >= rank {
            if bound.is_infinite() {
                return Some(Duration::from_secs_f64(lower.0));
            }
            let within = if c > lower.1 {
                (rank - lower.1) / (c - lower.1)
            } else {
                1.0
            };
            return Some(Duration::from_secs_f64(
                lower.0 + (bound - lower.0) * within,
            ));
        }
        lower = (bound, c);
    }
    None
}

/// Prints the part's table.
pub fn run(size: Size) -> Result<()> {
    let load = size.pick(300, 3);
    let mut rows = Vec::new();
    for ttl_ms in TTLS_MS {
        let (ttl, heartbeat) = (
            Duration::from_millis(ttl_ms),
            Duration::from_millis(ttl_ms / 3),
        );
        let budget = Timing::new(heartbeat, ttl)?.renewal_budget();
        let db = TempDb::postgres();
        pgbench_init(&db.url)?;
        let dir = Scratch::new();
        let timing = [
            "--ttl".to_owned(),
            format!("{ttl_ms}ms"),
            "--heartbeat".to_owned(),
            format!("{}ms", ttl_ms / 3),
        ];
        let timing: Vec<&str> = timing.iter().map(String::as_str).collect();
        let daemons: Vec<Daemon> = ["a", "b", "c"]
            .iter()
            .map(|id| Daemon::start(&db.url, id, &dir, &timing))
            .collect();
        let settled =
            leaderd_tests::try_wait_for(Duration::from_secs(30), || single_leader(&daemons))
                .is_some();
        let (tokens, lost) = transitions(&daemons);
        let histogram = renewals(&daemons);
        let (tps, latency) = pgbench_figures(pgbench(&db.url, load)?)?;
        let (tokens_after, lost_after) = transitions(&daemons);
        let p99 = quantile(0.99, &histogram, &renewals(&daemons));
        rows.push((
            if settled {
                ttl_ms.to_string()
            } else {
                format!("{ttl_ms} (no single leader within 30 s before the load)")
            },
            budget,
            tps,
            latency,
            tokens_after.len() - tokens.len(),
            lost_after - lost,
            p99,
        ));
    }
    println!(
        "## The renewal budget under load
"
    );
    println!(
        "Three daemons per row (heartbeat ttl / 3) on one PostgreSQL that `pgbench -c 32 -j 2` \
         (TPC-B) saturates with writes for {load} s. The budget is how long a renewal may \
         take for the leader to keep its lease (`ttl - safety margin - renew interval`).\n"
    );
    println!(
        "| ttl ms | budget ms | pgbench tps | pgbench latency ms | changes of holder | \
         local step-downs | renewal p99 ms | p99 / budget |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (ttl, budget, tps, latency, changes, step_downs, p99) in rows {
        let (p99, share) = match p99 {
            Some(p) => (
                format!("{:.1}", p.as_secs_f64() * 1e3),
                format!("{:.2}", p.as_secs_f64() / budget.as_secs_f64()),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {ttl} | {:.1} | {tps} | {latency} | {changes} | {step_downs} | {p99} | {share} |",
            budget.as_secs_f64() * 1e3
        );
    }
    println!();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quantile_interpolates_within_its_bucket() {
        let before = [(0.01, 0.0), (0.02, 0.0), (f64::INFINITY, 0.0)];
        // 50 under 10 ms, 50 between 10 and 20 ms.
        let after = [(0.01, 50.0), (0.02, 100.0), (f64::INFINITY, 100.0)];
        let p99 = quantile(0.99, &before, &after).unwrap();
        assert!((p99.as_secs_f64() - 0.0198).abs() < 1e-9, "{p99:?}");
        let p50 = quantile(0.5, &before, &after).unwrap();
        assert!((p50.as_secs_f64() - 0.01).abs() < 1e-9, "{p50:?}");
        assert_eq!(quantile(0.99, &after, &after), None);
    }
}
