//! Memory per election: one daemon on PostgreSQL leading N elections,
//! idle, its RSS once all are led and it has settled, against the same
//! daemon leading one; then once more after one `/metrics` scrape (a scrape
//! builds every series at once, and the allocator keeps some of what it
//! freed). Its CPU over the settling is beside it: an idle leader's cost,
//! the renewal waves'. The busiest of three daemons sharing N elections is
//! in the `elections` part.

use std::time::Duration;

use anyhow::{Context, Result};
use leaderd_tests::{cpu_ticks, http_get, status_kib, wait_for, Scratch, TempDb};

use crate::elections;
use crate::size::Size;

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Footprint {
    pub elections: usize,
    pub rss_mib: f64,
    /// Of it, anonymous memory (the heap, stacks, what the loader wrote):
    /// the rest maps files, mostly the binary, and how much of it is
    /// resident changes from run to run by a few hundred KiB with the code
    /// each run happened to touch.
    pub anon_mib: f64,
    /// RSS after one scrape of `/metrics`.
    pub scraped_mib: f64,
    /// The daemon's CPU (user and system) over the settling, % of a core.
    pub cpu_percent: f64,
}

/// The target: at most this much RSS per election beyond one election's.
pub const TARGET_KIB_PER_ELECTION: f64 = 2.0;

fn measure(n: usize, settle: Duration) -> Result<Footprint> {
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let d = elections::start(&db, &dir, "alone", n, &[]);
    // `/elections`, not `/metrics`: the measurement should not scrape.
    wait_for(Duration::from_secs(120), "all elections led", || {
        (d.leading()?.len() == n).then_some(())
    });
    let ticks = || cpu_ticks(d.pid()).context("reading /proc/<pid>/stat");
    let (before, started) = (ticks()?, std::time::Instant::now());
    std::thread::sleep(settle);
    let spent = (ticks()? - before) as f64 / rustix::param::clock_ticks_per_second() as f64;
    let cpu_percent = 100.0 * spent / started.elapsed().as_secs_f64();
    let rss = status_kib(d.pid(), "VmRSS:").context("VmRSS")?;
    let anon = status_kib(d.pid(), "RssAnon:").context("RssAnon")?;
    let scraped = http_get(d.port, "/metrics");
    anyhow::ensure!(
        matches!(scraped, Some((200, _))),
        "/metrics did not answer 200"
    );
    std::thread::sleep(Duration::from_secs(1));
    let after = status_kib(d.pid(), "VmRSS:").context("VmRSS")?;
    Ok(Footprint {
        elections: n,
        rss_mib: rss as f64 / 1024.0,
        anon_mib: anon as f64 / 1024.0,
        scraped_mib: after as f64 / 1024.0,
        cpu_percent,
    })
}

/// Prints the part's table; returns its rows for the plot.
pub fn run(size: Size) -> Result<Vec<Footprint>> {
    let ns = size.pick(vec![1, 100, 1000, 3000, 10_000], vec![1, 4]);
    let settle = size.pick(Duration::from_secs(10), Duration::from_secs(1));
    let rows = ns
        .into_iter()
        .map(|n| {
            let row = measure(n, settle)?;
            eprintln!("memory {n}: {row:?}");
            Ok(row)
        })
        .collect::<Result<Vec<_>>>()?;
    let (base, base_anon) = rows.first().map_or((0.0, 0.0), |r| (r.rss_mib, r.anon_mib));
    println!("## Memory per election\n");
    println!(
        "One daemon on PostgreSQL (default timing) leading N elections, idle: its RSS {} s \
         after all are led, the same after one `/metrics` scrape, and the RSS beyond the \
         daemon leading one, per election; the same for its anonymous memory alone \
         (the files it maps, mostly the binary, are resident by a few hundred KiB more \
         or less from run to run); its CPU over those {} s. Target: at most \
         {TARGET_KIB_PER_ELECTION} KiB an election.\n",
        settle.as_secs(),
        settle.as_secs()
    );
    println!(
        "| elections | RSS MiB | after a scrape MiB | KiB an election beyond one | \
         anonymous MiB | anonymous KiB an election beyond one | CPU % |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let per = |mib: f64, base: f64| {
            if r.elections > 1 {
                format!("{:.1}", (mib - base) * 1024.0 / (r.elections - 1) as f64)
            } else {
                "–".to_owned()
            }
        };
        println!(
            "| {} | {:.1} | {:.1} | {} | {:.1} | {} | {:.2} |",
            r.elections,
            r.rss_mib,
            r.scraped_mib,
            per(r.rss_mib, base),
            r.anon_mib,
            per(r.anon_mib, base_anon),
            r.cpu_percent
        );
    }
    println!();
    Ok(rows)
}
