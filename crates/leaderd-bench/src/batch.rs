//! The floor under the several-elections latency: how long the one renewal
//! statement of a leader holding N leases takes (what it sends each renew
//! interval), on an otherwise idle database with 3 N rows (three leaders'
//! share), against N. Every renewal of that leader waits at least this long,
//! whatever the daemon does around it. Beside it, a follower's takeover of
//! N expired leases in one call (a leader of N elections died), which the
//! store sends in statements of at most 512 takeovers.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use leaderd_store::{Attempt, Connection, DatabaseUrl, LeaseRequest};
use leaderd_tests::{Kind, TempDb};

use crate::size::Size;
use crate::stats::{ms, Summary};

/// One measured size.
#[derive(Debug, Clone)]
pub struct Step {
    pub kind: Kind,
    pub leases: usize,
    pub took: Summary,
    /// Taking N expired leases in one call.
    pub takeover: Summary,
}

const TTL: Duration = Duration::from_secs(600);

/// Takes every row of `names` for `instance` (created first), returning
/// their tokens in order.
async fn take_all(conn: &mut Connection, names: &[String], instance: &str) -> Result<Vec<i64>> {
    // Created blocked for a millisecond, then taken for ten minutes.
    create(conn, names).await?;
    take(conn, names, instance, TTL).await
}

/// Makes the rows of `names` (blocked for a millisecond, as a missing
/// row is made for that ttl), and waits until they may be taken.
async fn create(conn: &mut Connection, names: &[String]) -> Result<()> {
    conn.acquire_or_renew_many(&requests(names, "nobody", Duration::from_millis(1)))
        .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

fn requests<'a>(names: &'a [String], instance: &'a str, ttl: Duration) -> Vec<LeaseRequest<'a>> {
    names
        .iter()
        .map(|n| LeaseRequest {
            election: n,
            holder: instance,
            instance,
            ttl,
            held_token: None,
            daemon: None,
            address: None,
        })
        .collect()
}

/// One call asking for every row of `names` for `instance`, for `ttl`:
/// their tokens in order, or an error naming the first not granted.
async fn take(
    conn: &mut Connection,
    names: &[String],
    instance: &str,
    ttl: Duration,
) -> Result<Vec<i64>> {
    let answers = conn
        .acquire_or_renew_many(&requests(names, instance, ttl))
        .await?;
    answers
        .into_iter()
        .map(|a| match a {
            Ok(Attempt::Granted { token }) => Ok(token),
            other => bail!("not granted: {other:?}"),
        })
        .collect()
}

async fn measure(kind: Kind, leases: usize, rounds: usize) -> Result<Step> {
    let db = match kind {
        Kind::Postgres => TempDb::postgres(),
        _ => TempDb::mysql(),
    };
    let url = DatabaseUrl::parse(&db.url)?;
    Connection::connect(&url).await?.migrate().await?;
    let mut conn = Connection::connect(&url).await?;
    conn.prepare_batches().await?;
    let names: Vec<String> = (0..3 * leases).map(|i| format!("job-{i:06}")).collect();
    let (mine, others) = names.split_at(leases);
    let tokens = take_all(&mut conn, mine, "mine").await?;
    take_all(&mut conn, others, "others").await?;
    let renewals: Vec<LeaseRequest<'_>> = mine
        .iter()
        .zip(&tokens)
        .map(|(n, &token)| LeaseRequest {
            election: n,
            holder: "mine",
            instance: "mine",
            ttl: TTL,
            held_token: Some(token),
            daemon: None,
            address: None,
        })
        .collect();
    let mut took = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let answers = conn.acquire_or_renew_many(&renewals).await?;
        took.push(started.elapsed());
        if !answers
            .iter()
            .all(|a| matches!(a, Ok(Attempt::Granted { .. })))
        {
            bail!("a renewal was not granted");
        }
    }
    // A leader of N elections died: N leases, taken for 5 ms and left to
    // expire, then taken by another instance in one call (fresh names each
    // round: a takeover happens once per lease).
    let mut takeover = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let dead: Vec<String> = (0..leases)
            .map(|i| format!("dead-{round}-{i:06}"))
            .collect();
        create(&mut conn, &dead).await?;
        take(&mut conn, &dead, "dead", Duration::from_millis(5)).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
        let started = Instant::now();
        take(&mut conn, &dead, "heir", TTL).await?;
        takeover.push(started.elapsed());
    }
    Ok(Step {
        kind,
        leases,
        took: Summary::of(took),
        takeover: Summary::of(takeover),
    })
}

/// Prints the part's table.
pub async fn run(size: Size) -> Result<Vec<Step>> {
    let sizes = size.pick(vec![1, 100, 1000, 3334, 6667, 10_000], vec![1, 10]);
    let rounds = size.pick(9, 2);
    let mut steps = Vec::new();
    for kind in [Kind::Postgres, Kind::Mysql] {
        for &n in &sizes {
            let step = measure(kind, n, rounds).await?;
            eprintln!("batch: {step:?}");
            steps.push(step);
        }
    }
    println!("## One leader's renewal statement\n");
    println!(
        "One connection renewing N leases in one call (`acquire_or_renew_many`, as the \
         daemon's link sends a leader's renewals each renew interval), among 3 N rows, \
         on an otherwise idle database; {rounds} calls per size, client-side time \
         (round trip included). Takeover: N expired leases taken by another instance \
         in one call (statements of at most 512 takeovers each).\n"
    );
    println!("| database | leases (N) | renewal p50 ms | max ms | takeover p50 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for s in &steps {
        let db = match s.kind {
            Kind::Postgres => "PostgreSQL 15",
            _ => "MariaDB 10.11",
        };
        println!(
            "| {db} | {} | {} | {} | {} | {} |",
            s.leases,
            ms(s.took.p50),
            ms(s.took.max),
            ms(s.takeover.p50),
            ms(s.takeover.max)
        );
    }
    println!();
    Ok(steps)
}
