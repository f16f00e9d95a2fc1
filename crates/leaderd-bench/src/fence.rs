//! What fenced writes cost (README, "Fenced writes"): the same write
//! workload with and without `leaderd_fence` first in each transaction, and
//! the leader's renewal latency beside it, on PostgreSQL and on MariaDB
//! (SQLite's fence is the app's own recipe).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leaderd_store::{Attempt, Connection, DatabaseUrl, LeaseRequest};
use leaderd_tests::{Kind, TempDb};
use mysql_async::prelude::Queryable;
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
        daemon: None,
    }
}

/// What one worker does: its counter row, the token, whether it fences,
/// until when.
#[derive(Debug, Clone, Copy)]
struct Job {
    id: i64,
    token: i64,
    fenced: bool,
    until: Instant,
}

/// One PostgreSQL worker: its transactions' times.
async fn pg_worker(url: String, job: Job) -> Result<Vec<Duration>> {
    let Job { id, token, .. } = job;
    let (c, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(conn);
    let fence = c.prepare("SELECT leaderd_fence('e', $1)").await?;
    let update = c
        .prepare("UPDATE counters SET n = n + 1 WHERE id = $1")
        .await?;
    let insert = c
        .prepare("INSERT INTO work (token, worker) VALUES ($1, $2)")
        .await?;
    let mut took = Vec::new();
    while Instant::now() < job.until {
        let started = Instant::now();
        c.batch_execute("BEGIN").await?;
        if job.fenced {
            c.query_one(&fence, &[&token]).await?;
        }
        c.execute(&update, &[&id]).await?;
        c.execute(&insert, &[&token, &id]).await?;
        c.batch_execute("COMMIT").await?;
        took.push(started.elapsed());
    }
    Ok(took)
}

/// One MariaDB worker, as [`pg_worker`] (binary protocol: prepared
/// statements, cached by the driver).
async fn mysql_worker(url: String, job: Job) -> Result<Vec<Duration>> {
    let Job { id, token, .. } = job;
    let mut c = mysql_async::Conn::from_url(&url).await?;
    let mut took = Vec::new();
    while Instant::now() < job.until {
        let started = Instant::now();
        c.query_drop("START TRANSACTION").await?;
        if job.fenced {
            c.exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
                .await?;
        }
        c.exec_drop("UPDATE counters SET n = n + 1 WHERE id = ?", (id,))
            .await?;
        c.exec_drop(
            "INSERT INTO work (token, worker) VALUES (?, ?)",
            (token, id),
        )
        .await?;
        c.query_drop("COMMIT").await?;
        took.push(started.elapsed());
    }
    Ok(took)
}

/// `workers` sessions each committing small transactions (one row
/// updated, one inserted) for `for_`, fenced or not, while the leader
/// renews.
async fn run(db: &TempDb, token: i64, fenced: bool, workers: usize, for_: Duration) -> Result<Run> {
    let until = Instant::now() + for_;
    let url = db.url.as_str();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let job = Job {
            id: i64::try_from(w).unwrap_or(0),
            token,
            fenced,
            until,
        };
        tasks.push(match db.kind {
            Kind::Mysql => tokio::spawn(mysql_worker(url.to_owned(), job)),
            _ => tokio::spawn(pg_worker(url.to_owned(), job)),
        });
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

/// Prints the part's table, PostgreSQL then MariaDB.
pub async fn run_part(size: Size) -> Result<()> {
    for db in [TempDb::postgres(), TempDb::mysql()] {
        backend(&db, size).await?;
    }
    Ok(())
}

/// The workload's tables: 64 counters and a log.
fn tables(db: &TempDb) {
    let counters: String = (0..64)
        .map(|g| format!("({g}, 0)"))
        .collect::<Vec<_>>()
        .join(", ");
    let serial = match db.kind {
        Kind::Mysql => "BIGINT AUTO_INCREMENT",
        _ => "BIGSERIAL",
    };
    db.exec(&[
        "CREATE TABLE counters (id BIGINT PRIMARY KEY, n BIGINT NOT NULL)",
        &format!("INSERT INTO counters VALUES {counters}"),
        &format!(
            "CREATE TABLE work (seq {serial} PRIMARY KEY, token BIGINT NOT NULL, worker BIGINT NOT NULL)"
        ),
    ]);
}

/// One backend's four runs and its table.
async fn backend(db: &TempDb, size: Size) -> Result<()> {
    let url = DatabaseUrl::parse(&db.url)?;
    Connection::connect(&url).await?.migrate().await?;
    let workers = size.pick(8, 2);
    tables(db);
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
        let r = run(db, token, fenced, workers, for_).await?;
        eprintln!("fence: {r:?}");
        if r.not_granted > 0 {
            bail!("{} renewals not granted beside the workload", r.not_granted);
        }
        runs.push(r);
    }
    let (name, call) = match db.kind {
        Kind::Mysql => ("MariaDB", "CALL leaderd_fence('e', token, NULL)"),
        _ => ("PostgreSQL", "SELECT leaderd_fence('e', token)"),
    };
    println!("## Fenced writes: what the fence costs ({name})\n");
    println!(
        "{workers} sessions committing small transactions back to back (one row updated \
         among 64, one inserted), with and without `{call}` \
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
