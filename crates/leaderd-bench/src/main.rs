//! `leaderd-bench`: the numbers users pick a leader-election sidecar on, side
//! by side with the common lock-row recipe, in one run.
//!
//! ```text
//! cargo run --release -p leaderd-bench -- [--smoke] [--plots DIR] [heartbeat|scale|failover|views|views-busy|busy|budget|exec|serve|footprint|elections|memory|handover|batch|release|wake|fence|rolling]...
//! ```
//!
//! With no part named, all run but `rolling` (hours: name it). `--smoke` shrinks every part to seconds so
//! the test run can exercise the bench without measuring anything. Output is
//! Markdown, ready for `BENCHMARKS.md`; with `--plots DIR` every part but
//! `footprint`, `batch`, `views`, `release`, `wake`, `fence`, `rolling` and `budget` also draws an SVG plot into `DIR`
//! (see `plot.rs`) and links it under its table. It uses the local
//! PostgreSQL and MariaDB (see the test harness for the URLs) and the
//! `leaderd` binary built beside it.

mod batch;
mod budget;
mod busy;
mod elections;
mod exec;
mod failover;
mod fence;
mod flags;
mod handover;
mod heartbeat;
mod keepalive;
mod memory;
mod plot;
mod release;
mod rolling;
mod seed;
mod serve;
mod size;
mod stats;
mod wake;
mod zookeeper;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use size::Size;

const PARTS: &[&str] = &[
    "heartbeat",
    "scale",
    "failover",
    "views",
    "views-busy",
    "busy",
    "budget",
    "exec",
    "serve",
    "footprint",
    "elections",
    "memory",
    "handover",
    "batch",
    "release",
    "wake",
    "fence",
    "rolling",
];

fn main() -> Result<()> {
    let mut smoke = false;
    let mut plots: Option<PathBuf> = None;
    let mut parts = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--smoke" => smoke = true,
            "--plots" => plots = Some(args.next().context("--plots needs a directory")?.into()),
            "--help" | "-h" => {
                println!(
                    "usage: leaderd-bench [--smoke] [--plots DIR] [{}]...",
                    PARTS.join("|")
                );
                return Ok(());
            }
            p if PARTS.contains(&p) => parts.push(p.to_owned()),
            other => bail!("unknown argument {other:?}; parts are {}", PARTS.join(", ")),
        }
    }
    if parts.is_empty() {
        // `rolling` takes hours at full size: named only (the smoke run
        // names it).
        parts = PARTS
            .iter()
            .filter(|p| in_default_run(p, smoke))
            .map(|s| s.to_string())
            .collect();
    }
    if let Some(dir) = &plots {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let size = Size { smoke };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "# leaderd benchmark run{}\n",
        if smoke {
            " (smoke: numbers mean nothing)"
        } else {
            ""
        }
    );
    println!("{}\n", machine());
    // Each part prints its table; with --plots its plot follows.
    let plot = |file: &str, alt: &str, draw: &dyn Fn(&Path) -> Result<()>| -> Result<()> {
        if let Some(dir) = &plots {
            let path = dir.join(file);
            draw(&path).with_context(|| format!("plotting {}", path.display()))?;
            println!("![{alt}]({})\n", path.display());
        }
        Ok(())
    };
    for part in &parts {
        match part.as_str() {
            "heartbeat" => {
                let rows = rt.block_on(heartbeat::cost(size))?;
                plot(
                    plot::HEARTBEAT,
                    "Heartbeat throughput and p99 latency against electors, leaderd and the seed per backend",
                    &|p| plot::heartbeat(p, &rows),
                )?;
                rt.block_on(heartbeat::routes(size))?;
            }
            "scale" => {
                let steps = rt.block_on(heartbeat::scale(size))?;
                plot(
                    plot::SCALE,
                    "Renewal latency and renewals served against replicas on one PostgreSQL",
                    &|p| plot::scale(p, &steps),
                )?;
            }
            "views" => rt.block_on(failover::views(size, false))?,
            "views-busy" => rt.block_on(failover::views(size, true))?,
            "failover" => {
                let cases = rt.block_on(failover::run(size))?;
                plot(
                    plot::FAILOVER,
                    "Every failover time per backend and kind (SIGKILL, SIGTERM, release, seed)",
                    &|p| plot::failover(p, &cases, failover::DAEMON_TTL),
                )?;
            }
            "busy" => busy::run(size)?,
            "budget" => budget::run(size)?,
            "exec" => exec::run(size)?,
            "serve" => {
                let served = rt.block_on(serve::leader_endpoint(size))?;
                plot(plot::SERVE, "GET /leader latency by percentile", &|p| {
                    plot::serve(p, &served)
                })?;
            }
            "footprint" => serve::footprint(size)?,
            "elections" => {
                let steps = elections::run(size)?;
                plot(
                    plot::ELECTIONS,
                    "Statements/s, database CPU, attempt and renewal p99 against elections per daemon",
                    &|p| plot::elections(p, &steps),
                )?;
            }
            "memory" => {
                let rows = memory::run(size)?;
                plot(
                    plot::MEMORY,
                    "One daemon's RSS against the elections it leads, idle",
                    &|p| plot::memory(p, &rows),
                )?;
            }
            "handover" => {
                let cases = handover::run(size)?;
                plot(
                    plot::HANDOVER,
                    "Every graceful handover time, leaderd (SIGTERM, release) beside ZooKeeper",
                    &|p| plot::handover(p, &cases),
                )?;
            }
            "batch" => {
                rt.block_on(batch::run(size))?;
            }
            "release" => {
                release::run(size)?;
            }
            "wake" => {
                wake::run(size)?;
            }
            "fence" => rt.block_on(fence::run_part(size))?,
            "rolling" => {
                let changes = rolling::run(size)?;
                plot(
                    plot::ROLLING,
                    "Share of election-updates that changed leader once, twice, three times or more, per case",
                    &|p| plot::rolling(p, &changes),
                )?;
            }
            _ => unreachable!(),
        }
    }
    Ok(())
}

/// Whether `part` runs when none is named.
fn in_default_run(part: &str, smoke: bool) -> bool {
    smoke || part != "rolling"
}

/// A line describing the machine the figures come from.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024 / 1024);
    format!(
        "Machine: {cores} cores ({cpu}), {mem} GiB RAM; PostgreSQL and MariaDB on the same host."
    )
}

/// Sleeps in small steps until `f` holds or `within` passes.
pub async fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    f()
}
