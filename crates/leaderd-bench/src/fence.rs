//! What fenced writes cost (docs/integrating.md, "Fenced writes"): the same write
//! workload with `leaderd_fence` first in each transaction, without it, and
//! with a bare `SELECT 1` in its place (the floor: the fence is a statement
//! of its own, so it costs at least one round trip), and the leader's renewal
//! latency beside each, on PostgreSQL and on MariaDB, the variants
//! alternated (SQLite's fence is the app's own recipe).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leaderd_store::{Attempt, Connection, DatabaseUrl, LeaseRequest};
use leaderd_tests::{Kind, TempDb};
use mysql_async::prelude::Queryable;
use tokio_postgres::NoTls;

use crate::size::Size;
use crate::stats::{ms, Summary};

/// Long enough to outlast the gaps between runs; what a renewal costs does
/// not depend on it.
const TTL: Duration = Duration::from_secs(10);
/// The leader renews this often while measured (more often than the
/// daemon's 400 ms, for a denser sample).
const RENEW_EVERY: Duration = Duration::from_millis(50);

/// What each transaction sends before its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// Nothing.
    Unfenced,
    /// `SELECT 1`: the round trip alone.
    Floor,
    /// `leaderd_fence`.
    Fenced,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Unfenced => "unfenced",
            Variant::Floor => "`SELECT 1`",
            Variant::Fenced => "fenced",
        }
    }
}

/// One run of the workload.
#[derive(Debug)]
struct Run {
    variant: Variant,
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
        address: None,
    }
}

/// What one worker does: its counter row, the token, what it sends first,
/// until when.
#[derive(Debug, Clone, Copy)]
struct Job {
    id: i64,
    token: i64,
    variant: Variant,
    until: Instant,
}

/// One PostgreSQL worker: its transactions' times.
async fn pg_worker(url: String, job: Job) -> Result<Vec<Duration>> {
    let Job { id, token, .. } = job;
    let (c, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(conn);
    let fence = c.prepare("SELECT leaderd_fence('e', $1)").await?;
    let floor = c.prepare("SELECT 1").await?;
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
        match job.variant {
            Variant::Fenced => drop(c.query_one(&fence, &[&token]).await?),
            Variant::Floor => drop(c.query_one(&floor, &[]).await?),
            Variant::Unfenced => {}
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
        match job.variant {
            Variant::Fenced => {
                c.exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
                    .await?;
            }
            Variant::Floor => c.exec_drop("SELECT 1", ()).await?,
            Variant::Unfenced => {}
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
/// updated, one inserted) for `for_`, with `variant` first, while the
/// leader renews.
async fn run(
    db: &TempDb,
    token: i64,
    variant: Variant,
    workers: usize,
    for_: Duration,
) -> Result<Run> {
    let until = Instant::now() + for_;
    let url = db.url.as_str();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let job = Job {
            id: i64::try_from(w).unwrap_or(0),
            token,
            variant,
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
        variant,
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

/// One backend's rounds (each runs every variant) and its table.
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
    let for_ = size.pick(Duration::from_secs(10), Duration::from_secs(1));
    let rounds = size.pick(3, 1);
    let mut runs = Vec::new();
    for round in 0..rounds {
        // Each round in another order, so that no variant always runs on
        // the tables' state after the same one.
        let mut order = [Variant::Unfenced, Variant::Floor, Variant::Fenced];
        order.rotate_left(round % 3);
        for variant in order {
            let r = run(db, token, variant, workers, for_).await?;
            eprintln!("fence: {r:?}");
            if r.not_granted > 0 {
                bail!("{} renewals not granted beside the workload", r.not_granted);
            }
            runs.push(r);
        }
    }
    let (name, call) = match db.kind {
        Kind::Mysql => ("MariaDB", "CALL leaderd_fence('e', token, NULL)"),
        _ => ("PostgreSQL", "SELECT leaderd_fence('e', token)"),
    };
    println!("## Fenced writes: what the fence costs ({name})\n");
    println!(
        "{workers} sessions committing small transactions back to back (one row updated \
         among 64, one inserted), with `{call}` first, without it, and with `SELECT 1` in \
         its place (prepared), {} s per run, {rounds} rounds of the three, alternated; the \
         leader renews every {} ms beside them.\n",
        for_.as_secs(),
        RENEW_EVERY.as_millis(),
    );
    println!(
        "| first statement | transactions/s | transaction p50 / p99 ms | renewal p50 / p99 / max ms | renewals not granted |"
    );
    println!("|---|---:|---|---|---:|");
    for r in &runs {
        println!(
            "| {} | {:.0} | {} / {} | {} / {} / {} | {} |",
            r.variant.label(),
            r.per_s,
            ms(r.took.p50),
            ms(r.took.p99),
            ms(r.renewals.p50),
            ms(r.renewals.p99),
            ms(r.renewals.max),
            r.not_granted
        );
    }
    let median = |v: Variant, of: &dyn Fn(&Run) -> f64| {
        let mut xs: Vec<f64> = runs.iter().filter(|r| r.variant == v).map(of).collect();
        xs.sort_by(f64::total_cmp);
        xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let per_s = |r: &Run| r.per_s;
    let p99 = |r: &Run| r.renewals.p99.as_secs_f64();
    let fenced = median(Variant::Fenced, &per_s);
    println!(
        "\nMedians: fenced {:.0} tx/s, {:.0} % of unfenced ({:.0}) and {:.0} % of `SELECT 1` \
         ({:.0}); renewal p99 fenced {:.2} ms against unfenced {:.2} ms ({:.2}×).\n",
        fenced,
        100.0 * fenced / median(Variant::Unfenced, &per_s),
        median(Variant::Unfenced, &per_s),
        100.0 * fenced / median(Variant::Floor, &per_s),
        median(Variant::Floor, &per_s),
        1000.0 * median(Variant::Fenced, &p99),
        1000.0 * median(Variant::Unfenced, &p99),
        median(Variant::Fenced, &p99) / median(Variant::Unfenced, &p99),
    );
    Ok(())
}
