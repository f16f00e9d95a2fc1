//! `/leader` serving on loopback, and one idle daemon's footprint.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leaderd_tests::{leaderd_bin, wait_for, Daemon, Scratch, TempDb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::size::Size;
use crate::stats::{ms, Summary};

/// One keep-alive connection sending `GET /leader` back to back.
async fn client(port: u16, until: Instant) -> Result<Vec<Duration>> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.set_nodelay(true)?;
    let req = b"GET /leader HTTP/1.1\r\nHost: localhost\r\n\r\n";
    let mut buf = vec![0u8; 4096];
    let mut lat = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        s.write_all(req).await?;
        // Read the head, then as much body as Content-Length says.
        let mut have = 0;
        let (head_end, body_len) = loop {
            let n = s.read(&mut buf[have..]).await?;
            if n == 0 {
                bail!("connection closed");
            }
            have += n;
            if let Some(pos) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..pos])?;
                if !head.starts_with("HTTP/1.1 200") {
                    bail!("not leading: {head}");
                }
                let len = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .context("no content-length")?
                    .parse::<usize>()?;
                break (pos + 4, len);
            }
        };
        while have < head_end + body_len {
            let n = s.read(&mut buf[have..]).await?;
            if n == 0 {
                bail!("connection closed");
            }
            have += n;
        }
        lat.push(t.elapsed());
    }
    Ok(lat)
}

/// The `/leader` run: its rate and every request's latency, sorted.
#[derive(Debug, Clone)]
pub struct Served {
    pub rate: f64,
    pub sorted: Vec<Duration>,
}

pub async fn leader_endpoint(size: Size) -> Result<Served> {
    let secs = size.pick(5.0, 0.5);
    let connections = 16;
    let db = TempDb::sqlite();
    let dir = Scratch::new();
    let url = db.url.clone();
    let d = tokio::task::spawn_blocking(move || {
        let d = Daemon::start(&url, "bench", &dir, &[]);
        wait_for(Duration::from_secs(5), "leadership", || {
            d.is_leader().then_some(())
        });
        (d, dir)
    })
    .await?;
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(client(d.0.port, until)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let rate = all.len() as f64 / secs;
    all.sort_unstable();
    let s = Summary::of(all.clone());
    println!("## `/leader` serving\n");
    println!(
        "In-bench client: {connections} keep-alive connections on loopback sending `GET /leader` back \
         to back for {secs} s to one leading daemon (release build, SQLite); the client shares \
         the 2 cores with the daemon. Targets: p99 < 1 ms, ≥ 30,000 requests/s.\n"
    );
    println!("| requests/s | p50 ms | p99 ms | max ms |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {rate:.0} | {} | {} | {} |\n",
        ms(s.p50),
        ms(s.p99),
        ms(s.max)
    );
    Ok(Served { rate, sorted: all })
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: i32) -> Result<u64> {
    leaderd_tests::cpu_ticks(pid).context("reading /proc/<pid>/stat")
}

fn status_kib(pid: i32, key: &str) -> Result<u64> {
    leaderd_tests::status_kib(pid, key).with_context(|| format!("no {key} in /proc/<pid>/status"))
}

pub fn footprint(size: Size) -> Result<()> {
    let secs = size.pick(60, 2);
    println!("## Footprint\n");
    println!(
        "One daemon leading on PostgreSQL (renewing every 400 ms, the busiest idle state), \
         measured over {secs} s from /proc: over TLS (`sslmode=prefer`, the default, which \
         the local server accepts) and in plain text. Targets: RSS < 10 MiB (over TLS too), \
         CPU ≤ 0.5 % of a core.\n"
    );
    println!("| connection | RSS MiB | peak RSS MiB | CPU % of one core | release binary MiB |");
    println!("|---|---:|---:|---:|---:|");
    let ticks_per_s = rustix::param::clock_ticks_per_second() as f64;
    let bin = std::fs::metadata(leaderd_bin())?.len();
    for (name, params) in [
        ("TLS (sslmode=prefer)", ""),
        ("plain (sslmode=disable)", "sslmode=disable"),
    ] {
        let db = TempDb::postgres_with(params);
        let dir = Scratch::new();
        let d = Daemon::start(&db.url, "idle", &dir, &[]);
        wait_for(Duration::from_secs(5), "leadership", || {
            d.is_leader().then_some(())
        });
        let pid = d.pid();
        let (c0, t0) = (cpu_ticks(pid)?, Instant::now());
        std::thread::sleep(Duration::from_secs(secs));
        let (c1, elapsed) = (cpu_ticks(pid)?, t0.elapsed());
        let cpu = (c1 - c0) as f64 / ticks_per_s / elapsed.as_secs_f64() * 100.0;
        let rss = status_kib(pid, "VmRSS:")?;
        let hwm = status_kib(pid, "VmHWM:")?;
        println!(
            "| {name} | {:.1} | {:.1} | {cpu:.2} | {:.1} |",
            rss as f64 / 1024.0,
            hwm as f64 / 1024.0,
            bin as f64 / 1024.0 / 1024.0
        );
    }
    println!();
    Ok(())
}
