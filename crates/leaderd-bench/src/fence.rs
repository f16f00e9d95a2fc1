//! What fenced writes cost (README, "Fenced writes"): the same write
//! workload with and without `leaderd_fence` first in each transaction, and
//! the leader's renewal latency beside it. PostgreSQL (the backend that has
//! the fence).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leaderd_store::{Attempt, Connection, DatabaseUrl, LeaseRequest};
use leaderd_tests::TempDb;
use tokio_postgres::NoTls;

use crate::stats::{ms, Summary};
use crate::Size;

/// Long enough to outlast the gaps between runs; what a renewal costs does
/// not depend on it.
const TTL: Duration = Duration::from_secs(10);
/// The leader renews this often while measured (more often than the
/// daemon's 400 ms, for a denser sample).
const RENEW_EVERY: Duration = Duration::from_millis(50);

/// One run of the workload.
#[derive(Debug)]
struct Run {
    fenced: bool,
    per_s: f64,
    took: Summary,
    renewals: Summary,
    not_granted: usize,
}

fn request(token: Option<i64>) -> LeaseRequest<'static> {
    LeaseRequest {
        election: "e",
        holder: "bench",
        instance: "bench",
        ttl: TTL,
        held_token: token,
    }
}

/// `workers` sessions each committing small transactions (one row
/// updated, one inserted) for `for_`, fenced or not, while the leader
/// renews.
async fn run(url: &str, token: i64, fenced: bool, workers: usize, for_: Duration) -> Result<Run> {
    let until = Instant::now() + for_;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let (c, conn) = tokio_postgres::connect(&url, NoTls).await?;
            tokio::spawn(conn);
            let fence = c.prepare("SELECT leaderd_fence('e', $1)").await?;
            let update = c
                .prepare("UPDATE counters SET n = n + 1 WHERE id = $1")
                .await?;
            let insert = c
                .prepare("INSERT INTO work (token, worker) VALUES ($1, $2)")
                .await?;
            let id = i64::try_from(w).unwrap_or(0);
            let mut took = Vec::new();
            while Instant::now() < until {
                let started = Instant::now();
                c.batch_execute("BEGIN").await?;
                if fenced {
                    c.query_one(&fence, &[&token]).await?;
                }
                c.execute(&update, &[&id]).await?;
                c.execute(&insert, &[&token, &id]).await?;
                c.batch_execute("COMMIT").await?;
                took.push(started.elapsed());
            }
            Ok::<_, tokio_postgres::Error>(took)
        }));
    }
    let mut leader = Connection::connect(&DatabaseUrl::parse(url)?).await?;
    let (mut renewals, mut not_granted) = (Vec::new(), 0);
    while Instant::now() < until {
        let started = Instant::now();
        match leader.acquire_or_renew(&request(Some(token))).await {
            Ok(Attempt::Granted { token: t }) if t == token => {
                renewals.push(started.elapsed());
            }
            _ => not_granted += 1,
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await?.context("a worker failed")?);
    }
    Ok(Run {
        fenced,
        per_s: took.len() as f64 / for_.as_secs_f64(),
        took: Summary::of(took),
        renewals: Summary::of(renewals),
        not_granted,
    })
}

/// Prints the part's table.
pub async fn run_part(size: Size) -> Result<()> {
    let db = TempDb::postgres();
    let url = DatabaseUrl::parse(&db.url)?;
    Connection::connect(&url).await?.migrate().await?;
    let workers = size.pick(8, 2);
    db.exec(&[
        "CREATE TABLE counters (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
        "INSERT INTO counters SELECT g, 0 FROM generate_series(0, 63) g",
        "CREATE TABLE work (seq BIGSERIAL PRIMARY KEY, token BIGINT NOT NULL, worker BIGINT NOT NULL)",
    ]);
    let mut leader = Connection::connect(&url).await?;
    let token = loop {
        match leader.acquire_or_renew(&request(None)).await? {
            Attempt::Granted { token } => break token,
            Attempt::Created | Attempt::Refused(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let for_ = size.pick(Duration::from_secs(15), Duration::from_secs(1));
    let mut runs = Vec::new();
    for fenced in [false, true, false, true] {
        let r = run(&db.url, token, fenced, workers, for_).await?;
        eprintln!("fence: {r:?}");
        if r.not_granted > 0 {
            bail!("{} renewals not granted beside the workload", r.not_granted);
        }
        runs.push(r);
    }
    println!("## Fenced writes: what the fence costs (PostgreSQL)\n");
    println!(
        "{workers} sessions committing small transactions back to back (one row updated \
         among 64, one inserted), with and without `SELECT leaderd_fence('e', token)` \
         first (prepared), {} s per run, runs alternated; the leader renews every {} ms \
         beside them.\n",
        for_.as_secs(),
        RENEW_EVERY.as_millis(),
    );
    println!(
        "| fence | transactions/s | transaction p50 / p99 ms | renewal p50 / p99 / max ms | renewals not granted |"
    );
    println!("|---|---:|---|---|---:|");
    for r in &runs {
        println!(
            "| {} | {:.0} | {} / {} | {} / {} / {} | {} |",
            if r.fenced { "fenced" } else { "unfenced" },
            r.per_s,
            ms(r.took.p50),
            ms(r.took.p99),
            ms(r.renewals.p50),
            ms(r.renewals.p99),
            ms(r.renewals.max),
            r.not_granted
        );
    }
    println!();
    Ok(())
}
