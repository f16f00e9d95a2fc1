//! Heartbeat cost (leaderd's store against the seed algorithm) and scale (how
//! many replicas at 1 Hz one PostgreSQL serves).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use diesel::sql_types::Text;
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl};
use leaderd_store::{Attempt, Connection, DatabaseUrl, LeaseRequest};
use leaderd_tests::{Kind, TempDb};
use tokio::sync::Mutex;

use crate::seed::{self, Seed};
use crate::size::Size;
use crate::stats::{ms, Summary};

/// Connections shared by the electors, as behind a pooler: PostgreSQL allows
/// 100 connections by default, MariaDB 151.
const POOL: usize = 64;
/// Long enough that no lease lapses during a run.
const TTL: Duration = Duration::from_secs(60);

fn temp_db(kind: Kind) -> TempDb {
    match kind {
        Kind::Postgres => TempDb::postgres(),
        _ => TempDb::mysql(),
    }
}

pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Postgres => "PostgreSQL 15",
        Kind::Mysql => "MariaDB 10.11",
        Kind::Sqlite => "SQLite",
    }
}

/// Creates the lock table with `n` free rows `e0…`, as if every replica had
/// started long ago (so no run pays the blocked-row wait).
async fn leaderd_rows(db: &TempDb, n: usize) -> Result<()> {
    let url = DatabaseUrl::parse(&db.url)?;
    Connection::connect(&url).await?.migrate().await?;
    let expired = match db.kind {
        Kind::Postgres => "now() - interval '1 second'",
        _ => "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND",
    };
    for chunk in (0..n).collect::<Vec<_>>().chunks(4000) {
        let values: Vec<String> = chunk
            .iter()
            .map(|i| format!("('e{i}', 1, {expired})"))
            .collect();
        db.exec(&[&format!(
            "INSERT INTO service_leader_lock (name, token, expires_at) VALUES {}",
            values.join(",")
        )]);
    }
    Ok(())
}

async fn leaderd_pool(db: &TempDb, size: usize) -> Result<Arc<Vec<Mutex<Connection>>>> {
    connections(&db.url, None, size).await
}

/// `size` connections to `url`; with `named`, PostgreSQL's named prepared
/// statements or unnamed ones as it says (whatever the connection was found
/// to be).
async fn connections(
    url: &str,
    named: Option<bool>,
    size: usize,
) -> Result<Arc<Vec<Mutex<Connection>>>> {
    let url = DatabaseUrl::parse(url)?;
    let mut conns = Vec::new();
    for _ in 0..size {
        let mut c = Connection::connect(&url).await?;
        if let Some(named) = named {
            c.set_named_statements(named);
        }
        conns.push(Mutex::new(c));
    }
    Ok(Arc::new(conns))
}

/// Elector `i` (id `r{i}`) asks for election `e{i}`: taking it when
/// `held` is `None`, renewing it as a leader does every `renew_every`
/// otherwise. Returns the token granted.
async fn heartbeat(conn: &Mutex<Connection>, i: usize, held: Option<i64>) -> Result<i64> {
    let (name, id) = (format!("e{i}"), format!("r{i}"));
    let req = LeaseRequest {
        election: &name,
        holder: &id,
        instance: &id,
        ttl: TTL,
        held_token: held,
        daemon: None,
        address: None,
    };
    match conn.lock().await.acquire_or_renew(&req).await? {
        Attempt::Granted { token } => Ok(token),
        other => anyhow::bail!("e{i} not granted: {other:?}"),
    }
}

/// One closed-loop run of one algorithm.
#[derive(Debug, Clone)]
pub struct Run {
    /// Heartbeats per second.
    pub rate: f64,
    pub lat: Summary,
    /// Statements per heartbeat, where the server counts them (MariaDB).
    pub round_trips: Option<f64>,
}

/// One row of the heartbeat table: leaderd and the seed, same backend and
/// number of electors.
#[derive(Debug, Clone)]
pub struct CostRow {
    pub kind: Kind,
    pub electors: usize,
    pub leaderd: Run,
    pub seed: Run,
}

/// One step of the scale table.
#[derive(Debug, Clone)]
pub struct ScaleStep {
    pub replicas: usize,
    /// Renewals per second achieved (the offered rate is `replicas`).
    pub rate: f64,
    pub lat: Summary,
}

#[derive(QueryableByName)]
struct Status {
    #[diesel(sql_type = Text, column_name = "Value")]
    value: String,
}

/// MariaDB's count of statements received from clients.
async fn questions(url: &str) -> Result<u64> {
    let mut c = AsyncMysqlConnection::establish(url).await?;
    let rows: Vec<Status> = diesel::sql_query("SHOW GLOBAL STATUS LIKE 'Questions'")
        .load(&mut c)
        .await?;
    Ok(rows
        .into_iter()
        .next()
        .context("no Questions status")?
        .value
        .parse()?)
}

/// Makes elector `i` of `n` lead election `e{i}`; their tokens.
async fn lead_all(pool: &[Mutex<Connection>], n: usize) -> Result<Vec<i64>> {
    let mut tokens = Vec::new();
    for i in 0..n {
        tokens.push(heartbeat(&pool[i % pool.len()], i, None).await?);
    }
    Ok(tokens)
}

/// Every elector renews back to back for `secs`; each renewal's latency.
async fn renew_all(
    pool: Arc<Vec<Mutex<Connection>>>,
    tokens: Vec<i64>,
    secs: f64,
) -> Result<Vec<Duration>> {
    let tokens = Arc::new(tokens);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    hammer(tokens.len(), deadline, move |i| {
        let (pool, tokens) = (pool.clone(), tokens.clone());
        async move {
            heartbeat(&pool[i % pool.len()], i, Some(tokens[i]))
                .await
                .map(drop)
        }
    })
    .await
}

/// Runs `op(i)` for electors `0..n` back to back until `deadline`; the
/// latency of every call.
async fn hammer<F, Fut>(n: usize, deadline: Instant, op: F) -> Result<Vec<Duration>>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    op(i).await?;
                    lat.push(t.elapsed());
                }
                Ok::<_, anyhow::Error>(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// Closed loop: `n` electors heartbeat as fast as the pool lets them.
async fn closed_loop(kind: Kind, leaderd: bool, n: usize, secs: f64) -> Result<Run> {
    let db = temp_db(kind);
    let pool_size = n.min(POOL);
    let statements = || async {
        match kind {
            Kind::Mysql => questions(&db.url).await.map(Some),
            _ => Ok(None),
        }
    };
    let (before, lat) = if leaderd {
        leaderd_rows(&db, n).await?;
        let pool = leaderd_pool(&db, pool_size).await?;
        let tokens = lead_all(&pool, n).await?;
        let before = statements().await?;
        let lat = renew_all(pool, tokens, secs).await?;
        (before, lat)
    } else {
        Seed::setup(kind, &db.url, n).await?;
        let mut conns = Vec::new();
        for _ in 0..pool_size {
            conns.push(Mutex::new(Seed::connect(kind, &db.url).await?));
        }
        let pool = Arc::new(conns);
        let before = statements().await?;
        let deadline = Instant::now() + Duration::from_secs_f64(secs);
        let lat = hammer(n, deadline, move |i| {
            let pool = pool.clone();
            async move {
                let (name, owner) = (format!("e{i}"), format!("r{i}"));
                let mut conn = pool[i % pool.len()].lock().await;
                anyhow::ensure!(
                    conn.try_lock(kind, &name, &owner, 60_000).await?,
                    "seed lost e{i}"
                );
                Ok(())
            }
        })
        .await?;
        (before, lat)
    };
    let count = lat.len();
    let round_trips = match (before, statements().await?) {
        // Minus the counting query itself.
        (Some(b), Some(a)) => Some((a - b).saturating_sub(1) as f64 / count as f64),
        _ => None,
    };
    Ok(Run {
        rate: count as f64 / secs,
        lat: Summary::of(lat),
        round_trips,
    })
}

/// Heartbeats per second, latency and round trips, leaderd against the seed.
pub async fn cost(size: Size) -> Result<Vec<CostRow>> {
    let secs = size.pick(5.0, 0.5);
    let electors: &[usize] = size.pick(&[1, 32, 256], &[1, 4]);
    println!("## Heartbeat cost\n");
    println!(
        "Closed loop, {secs} s per cell: each elector renews its own election as fast as it can, \
         through a pool of at most {POOL} connections. leaderd = `leaderd-store`'s renewal as a \
         leader sends it; seed = `BEGIN; SELECT … FOR UPDATE; UPDATE; COMMIT` with the app's clock. \
         Round trips: measured from MariaDB's `Questions` counter; on PostgreSQL by construction \
         (leaderd 1, seed {}).\n",
        seed::ROUND_TRIPS
    );
    println!("| backend | electors | leaderd hb/s | seed hb/s | ratio | leaderd p50 / p99 ms | seed p50 / p99 ms | round trips leaderd / seed |");
    println!("|---|---:|---:|---:|---:|---|---|---|");
    let mut rows = Vec::new();
    for kind in [Kind::Postgres, Kind::Mysql] {
        for &n in electors {
            let ours = closed_loop(kind, true, n, secs).await?;
            let base = closed_loop(kind, false, n, secs).await?;
            let rt = |r: &Run, constr: u64| {
                r.round_trips
                    .map_or(format!("{constr}"), |x| format!("{x:.2}"))
            };
            println!(
                "| {} | {n} | {:.0} | {:.0} | {:.2}× | {} / {} | {} / {} | {} / {} |",
                kind_name(kind),
                ours.rate,
                base.rate,
                ours.rate / base.rate,
                ms(ours.lat.p50),
                ms(ours.lat.p99),
                ms(base.lat.p50),
                ms(base.lat.p99),
                rt(&ours, 1),
                rt(&base, seed::ROUND_TRIPS),
            );
            rows.push(CostRow {
                kind,
                electors: n,
                leaderd: ours,
                seed: base,
            });
        }
    }
    println!();
    Ok(rows)
}

/// One way of reaching PostgreSQL.
struct Route {
    name: &'static str,
    /// URL parameters.
    params: &'static str,
    /// Named prepared statements (direct connections only).
    named: bool,
    /// Through a PgBouncer in transaction pooling.
    bouncer: bool,
}

const ROUTES: &[Route] = &[
    Route {
        name: "direct, plain, unnamed statements",
        params: "sslmode=disable",
        named: false,
        bouncer: false,
    },
    Route {
        name: "direct, plain, named prepared statements (the default when direct)",
        params: "sslmode=disable",
        named: true,
        bouncer: false,
    },
    Route {
        name: "direct, TLS (`sslmode=require`), unnamed",
        params: "sslmode=require",
        named: false,
        bouncer: false,
    },
    Route {
        name: "direct, TLS, named",
        params: "sslmode=require",
        named: true,
        bouncer: false,
    },
    Route {
        name: "PgBouncer 1.18 (transaction pooling), plain, unnamed (the default there)",
        params: "sslmode=disable",
        named: false,
        bouncer: true,
    },
];

/// Server connections PgBouncer may open per database in the bench.
const BOUNCER_POOL: u32 = 20;

/// Closed loop of leaderd renewals over one route.
async fn route_loop(route: &Route, n: usize, secs: f64) -> Result<Run> {
    let db = if route.bouncer {
        TempDb::postgres_through_pgbouncer(BOUNCER_POOL)
    } else {
        TempDb::postgres()
    };
    leaderd_rows(&db, n).await?;
    let url = format!("{}?{}", db.url, route.params);
    let pool = connections(&url, Some(route.named), n.min(POOL)).await?;
    let tokens = lead_all(&pool, n).await?;
    let lat = renew_all(pool, tokens, secs).await?;
    Ok(Run {
        rate: lat.len() as f64 / secs,
        lat: Summary::of(lat),
        round_trips: None,
    })
}

/// PostgreSQL renewals by connection route: unnamed against named
/// statements, plain against TLS, direct against PgBouncer, in one run.
pub async fn routes(size: Size) -> Result<()> {
    let secs = size.pick(5.0, 0.5);
    let electors: &[usize] = size.pick(&[1, 32], &[1]);
    println!("## Heartbeat cost by connection route (PostgreSQL 15)\n");
    println!(
        "Closed loop, {secs} s per cell, as above: leaderd's renewal (one round trip), each \
         elector renewing its own election through a pool of at most {POOL} connections; \
         PgBouncer with {BOUNCER_POOL} server connections. Relative: to the first row's rate.\n"
    );
    println!("| route | electors | hb/s | relative | p50 / p99 ms |");
    println!("|---|---:|---:|---:|---|");
    for &n in electors {
        let mut first = None;
        for route in ROUTES {
            let run = route_loop(route, n, secs).await?;
            let base = *first.get_or_insert(run.rate);
            println!(
                "| {} | {n} | {:.0} | {:.2}× | {} / {} |",
                route.name,
                run.rate,
                run.rate / base,
                ms(run.lat.p50),
                ms(run.lat.p99),
            );
        }
    }
    println!();
    Ok(())
}

/// Open loop on PostgreSQL: `n` leaders renewing once a second each, spread
/// over many elections and sharing a small pool (as behind PgBouncer).
async fn open_loop(n: usize, secs: f64, pool_size: usize) -> Result<(f64, Summary)> {
    let db = TempDb::postgres();
    leaderd_rows(&db, n).await?;
    let pool = leaderd_pool(&db, pool_size).await?;
    let mut tokens = Vec::with_capacity(n);
    for i in 0..n {
        tokens.push(heartbeat(&pool[i % pool_size], i, None).await?);
    }
    let start = tokio::time::Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (i, token) in tokens.into_iter().enumerate() {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            // Spread the phases evenly over the second.
            let phase = Duration::from_secs_f64((i as f64 * 0.618_033_988_7) % 1.0);
            let mut tick = tokio::time::interval_at(start + phase, Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut lat = Vec::new();
            loop {
                let at = tick.tick().await;
                if at >= deadline {
                    break;
                }
                // From the scheduled time: waiting for a pooled connection counts.
                heartbeat(&pool[i % pool.len()], i, Some(token)).await?;
                lat.push(at.elapsed());
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let rate = all.len() as f64 / secs;
    Ok((rate, Summary::of(all)))
}

/// How many replicas at 1 Hz one PostgreSQL serves with p99 under 50 ms.
pub async fn scale(size: Size) -> Result<Vec<ScaleStep>> {
    let secs = size.pick(10.0, 1.0);
    let pool = 32;
    let steps: &[usize] = size.pick(&[1000, 2000, 4000, 8000, 12000, 16000, 24000], &[50]);
    println!("## Scale (PostgreSQL)\n");
    println!(
        "Open loop, {secs} s per step: N leaders each renew once a second (phases spread evenly), \
         N elections, sharing a pool of {pool} connections. Latency counts from the scheduled \
         time, so waiting for a pooled connection is included. Target: p99 < 50 ms.\n"
    );
    println!("| replicas | renewals/s | p50 ms | p99 ms | max ms |");
    println!("|---:|---:|---:|---:|---:|");
    let mut done = Vec::new();
    for &n in steps {
        let (rate, lat) = open_loop(n, secs, pool).await?;
        println!(
            "| {n} | {rate:.0} | {} | {} | {} |",
            ms(lat.p50),
            ms(lat.p99),
            ms(lat.max)
        );
        done.push(ScaleStep {
            replicas: n,
            rate,
            lat,
        });
        if lat.p99 > Duration::from_millis(50) {
            break;
        }
    }
    println!();
    Ok(done)
}
