//! Failover: real `leaderd` daemons, the leader killed (SIGKILL), stopped
//! (SIGTERM) or asked to step down (`leaderd release`) again and again, timed
//! until another replica answers 200; and the seed's polling behaviour beside
//! it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use leaderd_tests::{wait_single_leader, Daemon, Kind, Scratch, TempDb};
use rustix::process::Signal;

use crate::seed::Seed;
use crate::size::Size;
use crate::stats::{ms, Summary};

/// How the leader is made to go.
#[derive(Debug, Clone, Copy)]
enum How {
    Signal(Signal),
    /// `leaderd release --hold RELEASE_HOLD`.
    Release,
}

/// leaderd's default ttl, which the daemons here run with.
pub const DAEMON_TTL: Duration = Duration::from_millis(1200);

/// The releaser's hold: long enough that it cannot take the lead back first.
pub(crate) const RELEASE_HOLD: Duration = Duration::from_millis(500);

/// What daemon `id` advertises.
pub(crate) fn address_of(id: &str) -> String {
    format!("http://{id}.test:8080")
}

pub(crate) fn start(url: &str, id: &str, dir: &Scratch) -> Daemon {
    Daemon::start(url, id, dir, &["--advertise", &address_of(id)])
}

/// Makes the leader of three daemons go `rounds` times; the time from the
/// signal (or release request) until another daemon answers 200 on
/// `/leader`, and from then until the third names that daemon and its
/// address on its `/leader` (how stale a follower's view is after a change
/// of leader).
fn leaderd_failovers(url: &str, how: How, rounds: usize) -> (Vec<Duration>, Vec<Duration>) {
    let dir = Scratch::new();
    let mut ds: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| start(url, id, &dir))
        .collect();
    let (mut times, mut stale) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let refs: Vec<&Daemon> = ds.iter().collect();
        let leader = wait_single_leader(&refs, Duration::from_secs(10));
        let leader_id = ds[leader].id.clone();
        // Start from a steady state: every follower has seen the leader.
        leaderd_tests::wait_for(
            Duration::from_secs(5),
            "followers to see the leader",
            || {
                ds.iter()
                    .all(|d| {
                        d.leader()
                            .is_some_and(|(_, b)| b["leader"].as_str() == Some(leader_id.as_str()))
                    })
                    .then_some(())
            },
        );
        // Then a random moment, so the signal falls anywhere in the
        // followers' poll cycle and the leader's renewal cycle (and past the
        // last releaser's hold).
        std::thread::sleep(
            RELEASE_HOLD + Duration::from_micros(pseudo_random(round as u64) % 1_000_000),
        );
        let others: Vec<&Daemon> = ds
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .map(|(_, d)| d)
            .collect();
        let t0 = Instant::now();
        match how {
            How::Signal(signal) => ds[leader].signal(signal),
            How::Release => {
                let listen = format!("127.0.0.1:{}", ds[leader].port);
                let hold = format!("{}ms", RELEASE_HOLD.as_millis());
                let (code, _, err) =
                    leaderd_tests::run_cli(&["release", "--listen", &listen, "--hold", &hold], &[]);
                assert_eq!(code, 0, "release failed: {err}");
            }
        }
        let (new, took) = poll(t0, "no failover", || {
            others.iter().position(|d| d.is_leader())
        });
        times.push(took);
        let new_id = others[new].id.as_str();
        let new_address = address_of(new_id);
        let third = others[1 - new];
        let ((), took) = poll(Instant::now(), "the new leader never named", || {
            third
                .leader()
                .is_some_and(|(_, b)| {
                    b["leader"].as_str() == Some(new_id)
                        && b["leader_address"].as_str() == Some(new_address.as_str())
                })
                .then_some(())
        });
        stale.push(took);
        if let How::Signal(_) = how {
            ds[leader].wait_exit(Duration::from_secs(3));
            let id = format!("{}{round}", &ds[leader].id[..1]);
            ds[leader] = start(url, &id, &dir);
        }
    }
    (times, stale)
}

/// Asks `f` every 0.5 ms until it answers; what it answered, and how long
/// after `from`. Panics with `what` after 10 s.
pub(crate) fn poll<T>(
    from: Instant,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> (T, Duration) {
    loop {
        if let Some(found) = f() {
            return (found, from.elapsed());
        }
        assert!(from.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// A well-mixed number from `n` and the clock (splitmix64); no dependency
/// needed for picking moments.
pub(crate) fn pseudo_random(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let mut z = n.wrapping_add(nanos).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Per election: every grant, as (elector, when).
type Grants = Vec<Vec<(usize, Instant)>>;

/// The common recipe's behaviour: every replica tries once a second on its own
/// fixed grid, the holder refreshes on the same grid, a holder that dies (or
/// shuts down: there is no release) is replaced once `now > expiry` by some
/// follower's clock. `elections` independent elections of three run at once.
async fn seed_failovers(elections: usize) -> Result<Vec<Duration>> {
    let db = TempDb::postgres();
    Seed::setup(Kind::Postgres, &db.url, elections).await?;
    let pool: Arc<Vec<tokio::sync::Mutex<Seed>>> = Arc::new({
        let mut v = Vec::new();
        for _ in 0..elections.min(32) {
            v.push(tokio::sync::Mutex::new(
                Seed::connect(Kind::Postgres, &db.url).await?,
            ));
        }
        v
    });
    // Per election: the current holder, and every grant (elector, when).
    let holder: Arc<Mutex<Vec<Option<usize>>>> = Arc::new(Mutex::new(vec![None; elections]));
    let grants: Arc<Mutex<Grants>> = Arc::new(Mutex::new(vec![Vec::new(); elections]));
    let dead: Arc<Vec<AtomicBool>> =
        Arc::new((0..elections * 3).map(|_| AtomicBool::new(false)).collect());
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for e in 0..elections {
        for r in 0..3 {
            let (pool, holder, grants, dead) =
                (pool.clone(), holder.clone(), grants.clone(), dead.clone());
            let me = e * 3 + r;
            tasks.push(tokio::spawn(async move {
                let phase = Duration::from_secs_f64((me as f64 * 0.618_033_988_7) % 1.0);
                let mut tick = tokio::time::interval_at(start + phase, Duration::from_secs(1));
                let (name, owner) = (format!("e{e}"), format!("r{me}"));
                for _ in 0..8 {
                    tick.tick().await;
                    if dead[me].load(Ordering::SeqCst) {
                        return Ok::<_, anyhow::Error>(());
                    }
                    let conn = &pool[me % pool.len()];
                    if conn
                        .lock()
                        .await
                        .try_lock(Kind::Postgres, &name, &owner, 1200)
                        .await?
                    {
                        let mut h = holder.lock().expect("holder");
                        if h[e] != Some(me) {
                            h[e] = Some(me);
                            grants.lock().expect("grants")[e].push((me, Instant::now()));
                        }
                    }
                }
                Ok(())
            }));
        }
    }
    tokio::time::sleep_until(start + Duration::from_millis(3300)).await;
    let killed_at = Instant::now();
    let killed: Vec<Option<usize>> = holder.lock().expect("holder").clone();
    for k in killed.iter().flatten() {
        dead[*k].store(true, Ordering::SeqCst);
    }
    for t in tasks {
        t.await??;
    }
    let grants = grants.lock().expect("grants");
    Ok(killed
        .iter()
        .enumerate()
        .filter_map(|(e, k)| {
            let k = (*k)?;
            grants[e]
                .iter()
                .filter(|(who, at)| *who != k && *at > killed_at)
                .map(|(_, at)| *at - killed_at)
                .min()
        })
        .collect())
}

/// How a case's leader went, for the plot's colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Went {
    Kill,
    Term,
    Release,
    /// The seed: no release, so a stop is a kill.
    SeedStop,
    /// The handover part's reference: a ZooKeeper candidate's SIGTERM.
    ZooKeeperTerm,
    /// A ZooKeeper candidate giving its lead up, as `leaderd release`.
    ZooKeeperRelease,
}

/// One row of the failover table, with every time measured.
#[derive(Debug, Clone)]
pub struct Case {
    /// The table's name for it.
    pub what: &'static str,
    pub went: Went,
    pub times: Vec<Duration>,
}

fn row(what: &str, xs: &[Duration]) -> String {
    let s = Summary::of(xs.to_vec());
    format!(
        "| {what} | {} | {} | {} | {} |",
        s.n,
        ms(s.p50),
        ms(s.p99),
        ms(s.max)
    )
}

/// A follower's view after graceful handovers, per backend, on a quiet
/// machine and with every core busy: half SIGTERMs, half releases (the
/// handovers that name a successor, where a follower watches for its take).
/// `busy_only`: only with every core busy, and twice the rounds (the
/// `views-busy` part), for a p99 that is not the slowest round.
pub async fn views(size: Size, busy_only: bool) -> Result<()> {
    let half = size.pick(if busy_only { 50 } else { 25 }, 1);
    let loads: &[bool] = if busy_only { &[true] } else { &[false, true] };
    println!("## The third replica's view after a handover\n");
    println!(
        "Three daemons (default timing), {half} SIGTERMs and {half} releases of the leader per \
         backend, as in the failover part: from the new leader's first 200 until the third \
         daemon's `/leader` names it and its `leader_address` (polled every 0.5 ms); quiet, then \
         with a spinning thread on every core for the whole run.\n"
    );
    println!("| backend | cores | n | p50 ms | p99 ms | max ms | over 50 ms |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for &busy in loads {
        let hogs = busy.then(leaderd_tests::surroundings::CpuHogs::every_core);
        for (backend, db) in [
            ("PostgreSQL", TempDb::postgres()),
            ("MariaDB", TempDb::mysql()),
            ("SQLite", TempDb::sqlite()),
        ] {
            let url = db.url.clone();
            let stale = tokio::task::spawn_blocking(move || {
                let (_, mut stale) = leaderd_failovers(&url, How::Signal(Signal::TERM), half);
                stale.extend(leaderd_failovers(&url, How::Release, half).1);
                stale
            })
            .await?;
            let cores = if busy { "all busy" } else { "quiet" };
            let over = stale
                .iter()
                .filter(|t| **t > Duration::from_millis(50))
                .count();
            let s = Summary::of(stale);
            println!(
                "| {backend} | {cores} | {} | {} | {} | {} | {over} |",
                s.n,
                ms(s.p50),
                ms(s.p99),
                ms(s.max)
            );
        }
        drop(hogs);
    }
    println!();
    Ok(())
}

pub async fn run(size: Size) -> Result<Vec<Case>> {
    let rounds = size.pick(50, 2);
    let other_rounds = size.pick(50, 1);
    println!("## Failover\n");
    println!(
        "Three real `leaderd` daemons (default heartbeat 1 s, ttl 1.2 s); once every follower has \
         seen the leader, after 0.5 s and a random 0-1 s, the leader is signalled (or asked to \
         step down with `leaderd release --hold 500ms`) and the time runs until \
         another daemon answers 200 on `/leader` (polled every 0.5 ms). \
         The killed daemon is replaced by a new process before the next round. Seed: three \
         replicas per election polling once a second on their own grid, {} elections at once, \
         holders stopped without release (the seed has none, so SIGTERM = SIGKILL).\n",
        size.pick(50, 2)
    );
    println!("| case | n | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    let pg = TempDb::postgres();
    let my = TempDb::mysql();
    let lite = TempDb::sqlite();
    let (kill, term) = (How::Signal(Signal::KILL), How::Signal(Signal::TERM));
    let cases = [
        ("leaderd, PostgreSQL, SIGKILL", &pg, kill, rounds),
        ("leaderd, PostgreSQL, SIGTERM", &pg, term, rounds),
        ("leaderd, PostgreSQL, release", &pg, How::Release, rounds),
        ("leaderd, MariaDB, SIGKILL", &my, kill, other_rounds),
        ("leaderd, MariaDB, SIGTERM", &my, term, other_rounds),
        ("leaderd, MariaDB, release", &my, How::Release, other_rounds),
        ("leaderd, SQLite, SIGKILL", &lite, kill, other_rounds),
        ("leaderd, SQLite, SIGTERM", &lite, term, other_rounds),
        (
            "leaderd, SQLite, release",
            &lite,
            How::Release,
            other_rounds,
        ),
    ];
    let mut done = Vec::new();
    let mut stale_rows = Vec::new();
    for (what, db, how, n) in cases {
        let url = db.url.clone();
        let (times, stale) =
            tokio::task::spawn_blocking(move || leaderd_failovers(&url, how, n)).await?;
        println!("{}", row(what, &times));
        stale_rows.push(row(what, &stale));
        let went = match how {
            How::Signal(Signal::KILL) => Went::Kill,
            How::Signal(_) => Went::Term,
            How::Release => Went::Release,
        };
        done.push(Case { what, went, times });
    }
    let what = "seed polling, PostgreSQL, SIGKILL or SIGTERM";
    let times = seed_failovers(size.pick(50, 2)).await?;
    println!("{}", row(what, &times));
    println!();
    println!(
        "### The third replica's view\n\nThe same rounds: from the new leader's first 200 until \
         the third daemon's `/leader` names it (polled every 0.5 ms).\n"
    );
    println!("| case | n | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    for r in &stale_rows {
        println!("{r}");
    }
    println!();
    done.push(Case {
        what,
        went: Went::SeedStop,
        times,
    });
    Ok(done)
}
