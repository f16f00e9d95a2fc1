//! A rolling update as a Kubernetes Deployment does it (`maxSurge: 1`,
//! `maxUnavailable: 0`): a new pod starts, is ready on `/readyz` (and, in
//! the cases that say so, 1.5 s more), then one old pod gets SIGTERM and is
//! gone; again until no old pod is left. Every pod's `/elections` is
//! sampled every 5 ms throughout. Per election and update: how often its
//! leader changed (at least once: it has to leave the old pods), the
//! longest spell with no pod leading it; per update, the spread's
//! hand-overs and how the elections ended up over the new pods. The
//! daemons' logs are checked for two leaders at once.
//!
//! A rolling update as a user runs one, measured: this part gives
//! its figures before and after. `ROLLING_RUNS=N` sets the updates per
//! case, `ROLLING_CASES=3x1,3x6s` picks cases (replicas x elections, `s`:
//! the spread on; `5x6/random/nowait` one subcase of a case, order
//! `oldest` or `random`, `wait` or `nowait`); `ROLLING_KEEP=DIR` keeps the daemons' logs of every
//! update with an election leaderless longer than [`LONG_SPELL`], to find
//! out why.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use leaderd_tests::checker::{check, intervals_of};
use leaderd_tests::{led_in, wait_for, Daemon, Scratch, TempDb};

use crate::keepalive::KeepAlive;
use crate::size::Size;
use crate::stats::ms;

/// How often every pod is asked.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// After the last old pod has gone, how long the update is still watched
/// (the spread hands over one batch per cool-down, ttl + heartbeat).
const SETTLE: Duration = Duration::from_secs(8);
/// The bound on a leaderless spell during an update that the part checks.
const LONG_SPELL: Duration = Duration::from_millis(100);

/// Which old pod goes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    OldestFirst,
    Random,
}

/// One kind of update.
#[derive(Debug, Clone, Copy)]
struct Case {
    replicas: usize,
    elections: usize,
    spread: bool,
    order: Order,
    /// 1.5 s between the new pod's readiness and the old pod's SIGTERM.
    wait: bool,
}

/// Who leads what, as one sweep over the pods saw it: per election, the
/// pods (by index) that said they lead it.
struct Sample {
    at: Instant,
    leaders: Vec<Vec<usize>>,
}

/// What one update did.
#[derive(Debug, Default, Clone)]
struct Outcome {
    /// Per election: changes of leader.
    changes: Vec<usize>,
    /// Per election: the longest spell with no leader.
    leaderless: Vec<Duration>,
    /// Sweeps in which two pods said they led one election (sweeps are
    /// not atomic: the logs' check is the real one).
    double_sweeps: usize,
    hand_overs: usize,
    /// Elections per new pod at the end.
    split: Vec<usize>,
    /// From the last old pod's exit to the split being final.
    balanced_after: Option<Duration>,
}

fn names(n: usize) -> Vec<String> {
    if n == 1 {
        vec!["default".to_owned()]
    } else {
        (0..n).map(|i| format!("job-{i}")).collect()
    }
}

fn launch(db: &TempDb, dir: &Scratch, id: &str, case: Case) -> Daemon {
    let names = names(case.elections);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let extra: &[&str] = if case.spread { &[] } else { &["--no-spread"] };
    let mut launch = Daemon::launch(&db.url, id, dir, id, extra).without_flag_file();
    if case.elections > 1 {
        launch = launch.elections(&refs);
    }
    launch.start()
}

/// The elections a pod leads, by its `/elections` (`Daemon::leading` on a
/// kept connection).
fn leading(conn: &mut KeepAlive) -> Option<Vec<String>> {
    let (200, body) = conn.get("/elections")? else {
        return None;
    };
    led_in(&body)
}

/// Every pod's view, every [`SAMPLE_EVERY`], until `stop`.
fn sample(
    pods: Arc<Mutex<Vec<u16>>>,
    elections: Vec<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Vec<Sample>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        // One kept connection per pod (see `keepalive`), in the pods' order.
        let mut conns: Vec<KeepAlive> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let at = Instant::now();
            let ports = pods.lock().expect("pods").clone();
            conns.extend(ports[conns.len()..].iter().map(|&p| KeepAlive::new(p)));
            let mut leaders = vec![Vec::new(); elections.len()];
            for (i, conn) in conns.iter_mut().enumerate() {
                for led in leading(conn).unwrap_or_default() {
                    if let Some(e) = elections.iter().position(|e| *e == led) {
                        leaders[e].push(i);
                    }
                }
            }
            out.push(Sample { at, leaders });
            std::thread::sleep(SAMPLE_EVERY.saturating_sub(at.elapsed()));
        }
        out
    })
}

/// A small deterministic shuffle (no `rand` dependency): the order old
/// pods go in for update `seed`.
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, usize::try_from(x % (i as u64 + 1)).unwrap_or(0));
    }
    order
}

/// How many elections the spread has handed over so far, by the logs.
fn hand_overs(daemons: &[Daemon]) -> usize {
    let n: u64 = daemons
        .iter()
        .flat_map(|d| d.logged("handing elections over to a replica below its share"))
        .filter_map(|v| v["hand_over"].as_u64())
        .sum();
    usize::try_from(n).unwrap_or(0)
}

/// One rolling update of `case`; `seed` picks the random order.
fn update(case: Case, seed: u64) -> Outcome {
    let db = TempDb::postgres();
    let dir = Scratch::new();
    let elections = names(case.elections);
    let mut daemons: Vec<Daemon> = (0..case.replicas)
        .map(|i| launch(&db, &dir, &format!("old{i}"), case))
        .collect();
    // Settled before the update: every election led, and spread (no pod
    // above its share), as a deployment that has run for a while.
    let share = if case.spread {
        case.elections.div_ceil(case.replicas)
    } else {
        case.elections
    };
    // Asked every 5 ms too: on kept connections (see `keepalive`).
    let mut olds: Vec<KeepAlive> = daemons.iter().map(|d| KeepAlive::new(d.port)).collect();
    wait_for(
        Duration::from_secs(30),
        "the old pods to lead everything, spread",
        || {
            let leading: Vec<usize> = olds
                .iter_mut()
                .map(|c| leading(c).map(|l| l.len()))
                .collect::<Option<_>>()?;
            let led: usize = leading.iter().sum();
            (led == case.elections && leading.iter().all(|&n| n <= share)).then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(3));
    // The spread's hand-overs before the update (the old pods balancing)
    // are not the update's.
    let handed_before = hand_overs(&daemons);
    let pods = Arc::new(Mutex::new(
        daemons.iter().map(|d| d.port).collect::<Vec<_>>(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(pods.clone(), elections.clone(), stop.clone());
    let order = match case.order {
        Order::OldestFirst => (0..case.replicas).collect(),
        Order::Random => shuffled(case.replicas, seed),
    };
    let mut last_exit = Instant::now();
    for (k, &old) in order.iter().enumerate() {
        let new = launch(&db, &dir, &format!("new{k}"), case);
        let mut ready = KeepAlive::new(new.port);
        wait_for(Duration::from_secs(10), "the new pod to be ready", || {
            matches!(ready.get("/readyz"), Some((200, _))).then_some(())
        });
        pods.lock().expect("pods").push(new.port);
        daemons.push(new);
        if case.wait {
            std::thread::sleep(Duration::from_millis(1500));
        }
        daemons[old].sigterm();
        daemons[old].wait_exit(Duration::from_secs(5));
        last_exit = Instant::now();
    }
    std::thread::sleep(SETTLE);
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("the sampler");
    // Two leaders at once, from the logs (boot clock, every process).
    for e in &elections {
        let mut all: Vec<_> = daemons.iter().flat_map(|d| intervals_of(d, e)).collect();
        check(&mut all);
    }
    let mut o = Outcome {
        hand_overs: hand_overs(&daemons).saturating_sub(handed_before),
        ..Outcome::default()
    };
    for e in 0..elections.len() {
        let (mut changes, mut longest) = (0, Duration::ZERO);
        let mut current: Option<usize> = None;
        let mut since_led: Option<Instant> = None;
        for s in &samples {
            match s.leaders[e].as_slice() {
                [] => {
                    if let Some(t) = since_led {
                        longest = longest.max(s.at - t);
                    }
                }
                [one] => {
                    if current.is_some_and(|c| c != *one) {
                        changes += 1;
                    }
                    current = Some(*one);
                    since_led = Some(s.at);
                }
                _ => o.double_sweeps += 1,
            }
        }
        o.changes.push(changes);
        o.leaderless.push(longest);
    }
    // The split over the new pods, and since when it has been that.
    let last = samples
        .last()
        .map(|s| s.leaders.clone())
        .unwrap_or_default();
    o.split = (case.replicas..2 * case.replicas)
        .map(|p| last.iter().filter(|l| l.as_slice() == [p]).count())
        .collect();
    let final_since = samples
        .iter()
        .rev()
        .take_while(|s| s.leaders == last)
        .last()
        .map(|s| s.at);
    o.balanced_after = final_since.map(|t| t.saturating_duration_since(last_exit));
    if let Ok(keep) = std::env::var("ROLLING_KEEP") {
        if o.leaderless.iter().any(|&l| l > LONG_SPELL) {
            keep_logs(&keep, case, seed, &daemons, &o.leaderless);
        }
    }
    o
}

/// Copies the daemons' logs of one update to `DIR/<case>-<seed>/`, with
/// each election's longest leaderless spell.
fn keep_logs(dir: &str, case: Case, seed: u64, daemons: &[Daemon], leaderless: &[Duration]) {
    let to = std::path::Path::new(dir).join(format!(
        "{}x{}{}-{:?}-{}-{seed}",
        case.replicas,
        case.elections,
        if case.spread { "s" } else { "" },
        case.order,
        if case.wait { "wait" } else { "nowait" },
    ));
    let kept = std::fs::create_dir_all(&to).and_then(|()| {
        for d in daemons {
            std::fs::write(to.join(format!("{}.log", d.id)), d.log_text())?;
        }
        std::fs::write(to.join("leaderless.txt"), format!("{leaderless:?}\n"))
    });
    match kept {
        Ok(()) => eprintln!("rolling: logs of a long spell kept in {}", to.display()),
        Err(e) => eprintln!("rolling: could not keep the logs in {}: {e}", to.display()),
    }
}

/// One case's changes of leader, for the plot: its label, and how many
/// election-updates changed leader once, twice, and three times or more.
#[derive(Debug, Clone)]
pub struct Changes {
    pub label: String,
    pub counts: [usize; 3],
}

/// Prints the part's table: `runs` updates per case; returns each case's
/// changes of leader.
pub fn run(size: Size) -> Result<Vec<Changes>> {
    let runs = std::env::var("ROLLING_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(size.pick(20, 1));
    let mut cases = Vec::new();
    for replicas in size.pick(vec![3, 5], vec![3]) {
        for (elections, spread) in [(1, false), (6, true), (6, false)] {
            for order in [Order::OldestFirst, Order::Random] {
                for wait in [true, false] {
                    cases.push(Case {
                        replicas,
                        elections,
                        spread,
                        order,
                        wait,
                    });
                }
            }
        }
    }
    if size.smoke {
        // One update of one case: enough that the part cannot rot.
        cases.retain(|c| c.elections == 6 && c.spread && c.order == Order::Random && !c.wait);
    }
    if let Ok(only) = std::env::var("ROLLING_CASES") {
        // e.g. "3x1,3x6s,5x6/random/nowait": replicas x elections, `s` for
        // the spread; a whole case, or one of its four subcases.
        let wanted: Vec<&str> = only.split(',').collect();
        cases.retain(|c| {
            let label = format!(
                "{}x{}{}",
                c.replicas,
                c.elections,
                if c.spread { "s" } else { "" }
            );
            let sub = format!(
                "{label}/{}/{}",
                match c.order {
                    Order::OldestFirst => "oldest",
                    Order::Random => "random",
                },
                if c.wait { "wait" } else { "nowait" }
            );
            wanted.contains(&label.as_str()) || wanted.contains(&sub.as_str())
        });
        if cases.is_empty() {
            anyhow::bail!(
                "ROLLING_CASES={only:?} names no case: use e.g. 3x1, 3x6s, 5x6 or 5x6/random/nowait"
            );
        }
    }
    println!("## A rolling update\n");
    println!(
        "PostgreSQL, default timing; one new pod at a time, ready on `/readyz` (then 1.5 s \
         more where it says wait), then one old pod SIGTERMed; every pod's `/elections` \
         sampled every {} ms; {runs} updates per case. Changes: of leader, per election \
         and update (the least is 1). Hand-overs: the spread's, per update. End split: \
         elections per new pod after the last update, and how long after the last old \
         pod left it was reached (p50).\n",
        SAMPLE_EVERY.as_millis()
    );
    println!(
        "| replicas | elections | spread | order | wait | changes mean / worst | election-updates with > 1 change | longest leaderless ms | hand-overs per update | end split (most common) | balanced after p50 ms |"
    );
    println!("|---:|---:|---|---|---|---|---|---:|---:|---|---:|");
    let mut plotted = Vec::new();
    for case in cases {
        let outcomes: Vec<Outcome> = (0..runs).map(|r| update(case, r as u64 + 1)).collect();
        let changes: Vec<usize> = outcomes.iter().flat_map(|o| o.changes.clone()).collect();
        let mean = changes.iter().sum::<usize>() as f64 / changes.len().max(1) as f64;
        let worst = changes.iter().copied().max().unwrap_or(0);
        let many = changes.iter().filter(|&&c| c > 1).count();
        let leaderless = outcomes
            .iter()
            .flat_map(|o| o.leaderless.clone())
            .max()
            .unwrap_or_default();
        let hand_overs = outcomes.iter().map(|o| o.hand_overs).sum::<usize>() as f64 / runs as f64;
        let mut splits = BTreeMap::<String, usize>::new();
        for o in &outcomes {
            let mut s = o.split.clone();
            s.sort_unstable_by(|a, b| b.cmp(a));
            let s: Vec<String> = s.iter().map(ToString::to_string).collect();
            *splits.entry(s.join("/")).or_default() += 1;
        }
        let (split, seen) = splits
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(s, n)| (s.clone(), *n))
            .unwrap_or_default();
        let mut balanced: Vec<Duration> =
            outcomes.iter().filter_map(|o| o.balanced_after).collect();
        balanced.sort_unstable();
        // One election has no split to settle.
        let p50 = match (case.elections, balanced.get(balanced.len() / 2)) {
            (1, _) | (_, None) => "-".to_owned(),
            (_, Some(d)) => ms(*d),
        };
        let mut counts = [0; 3];
        for &c in &changes {
            counts[c.clamp(1, 3) - 1] += 1;
        }
        plotted.push(Changes {
            label: format!(
                "{}×{}{} {}{}",
                case.replicas,
                case.elections,
                if case.spread { " spread" } else { "" },
                match case.order {
                    Order::OldestFirst => "oldest first",
                    Order::Random => "random",
                },
                if case.wait { ", wait" } else { "" },
            ),
            counts,
        });
        let doubles: usize = outcomes.iter().map(|o| o.double_sweeps).sum();
        eprintln!("rolling {case:?}: splits {splits:?}; sweeps with two leaders {doubles}");
        println!(
            "| {} | {} | {} | {} | {} | {mean:.2} / {worst} | {many} of {} | {} | {hand_overs:.1} | {split} ({seen} of {runs}) | {} |",
            case.replicas,
            case.elections,
            if case.elections == 1 { "-" } else if case.spread { "on" } else { "off" },
            match case.order {
                Order::OldestFirst => "oldest first",
                Order::Random => "random",
            },
            if case.wait { "1.5 s" } else { "no" },
            changes.len(),
            ms(leaderless),
            p50,
        );
    }
    println!();
    Ok(plotted)
}
