//! A deterministic simulation of several elections spread across replicas: every replica runs one real
//! [`Engine`] per election and the real [`spread::plan`] on what its last
//! read of the simulated table showed (late, as reads are), over a network
//! that delays and loses messages, with replicas that join late, crash and
//! come back as new instances, pause past their ttl, and are cut off from
//! the database for a while (partitions) — hand-overs included, since
//! every rebalancing is one.
//!
//! Checked after every step: no election has two leaders at one instant of
//! true time; per election, tokens never go back and no token is held by two
//! instances. Once the faults stop, every election has a leader and no
//! replica leads more than its share, ceil(E / R), within a bound, and it
//! stays so.
//!
//! Seeded: `SIM_SEED=… cargo test -p leaderd-core --test spread_simulation`.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{env, local_us, one_leader, reproducible, Clock, Db, Queue, Rng, Tokens, Us};
use common::{HEARTBEAT, TTL};
use leaderd_core::spread::plan;
use leaderd_core::{Attempt, BootTime, Engine, Event, Timing};

/// The spread looks at the table every renew interval, as the daemon does.
const SPREAD_EVERY: Us = TTL / 3;

/// One election of one replica: its engine and its attempt in flight.
struct Lane {
    engine: Engine,
    /// Flight id and local send time.
    flight: Option<(u64, BootTime)>,
}

struct Replica {
    id: String,
    clock: Clock,
    lanes: Vec<Lane>,
    crashed: bool,
    /// Not started yet (joins later), or SIGSTOPped, until this true time.
    paused_until: Us,
    /// Every message to or from the database is lost until this true time.
    cut_until: Us,
    generation: u32,
    /// Local time of the last hand-over.
    last_hand_over: Option<Us>,
    /// When the next `Wake` is due; earlier ones pushed before it are
    /// stale and skipped, so wake-ups do not pile up in the queue.
    wake_at: Us,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum What {
    Wake {
        r: usize,
    },
    Arrive {
        r: usize,
        e: usize,
        flight: u64,
        reply_delay: Us,
    },
    Reply {
        r: usize,
        e: usize,
        flight: u64,
    },
    Timeout {
        r: usize,
        e: usize,
        flight: u64,
    },
    Release {
        e: usize,
        instance: String,
    },
    Notice {
        r: usize,
        e: usize,
    },
    /// The spread's tick of one run of the replica (a restart begins a new
    /// one).
    Spread {
        r: usize,
        generation: u32,
    },
    SpreadArrive {
        r: usize,
        reply_delay: Us,
    },
    SpreadReply {
        r: usize,
        read: u64,
    },
}

/// What a spread read shows: the replicas present (what each leads is
/// counted from the reader's own elections, as the daemon does).
struct Snapshot {
    present: Vec<String>,
}

struct Sim {
    rng: Rng,
    now: Us,
    db: Db,
    db_clock: Clock,
    /// Presence rows: replica id → expiry on the database clock.
    presence: BTreeMap<String, Us>,
    elections: Vec<String>,
    replicas: Vec<Replica>,
    queue: Queue<What>,
    requests: BTreeMap<u64, (String, String, Option<i64>)>,
    answers: BTreeMap<u64, Attempt>,
    reads: BTreeMap<u64, Snapshot>,
    next_flight: u64,
    timing: Timing,
    faults_until: Us,
    /// Per election.
    tokens: Vec<Tokens>,
    steps: u64,
    /// Elections handed over by the spread, to show it was exercised.
    hand_overs: u64,
}

impl Sim {
    fn new(seed: u64, faults_until: Us) -> Sim {
        let mut rng = Rng(seed);
        let elections: Vec<String> = (0..2 + rng.below(6)).map(|i| format!("e{i}")).collect();
        let replicas = 2 + usize::try_from(rng.below(3)).unwrap_or(0);
        let db_clock = Clock::random(&mut rng);
        let mut sim = Sim {
            rng,
            now: 0,
            db: Db::default(),
            db_clock,
            presence: BTreeMap::new(),
            tokens: elections.iter().map(|_| Tokens::default()).collect(),
            elections,
            replicas: Vec::new(),
            queue: Queue::default(),
            requests: BTreeMap::new(),
            answers: BTreeMap::new(),
            reads: BTreeMap::new(),
            next_flight: 0,
            timing: common::timing(),
            faults_until,
            steps: 0,
            hand_overs: 0,
        };
        for r in 0..replicas {
            let clock = Clock::random(&mut sim.rng);
            // The first starts at once; the others join over ten seconds.
            let joins = if r == 0 {
                0
            } else {
                sim.rng.range(0, 10_000_000)
            };
            sim.replicas.push(Replica {
                id: format!("r{r}"),
                clock,
                lanes: Vec::new(),
                crashed: true,
                paused_until: 0,
                cut_until: 0,
                generation: 0,
                last_hand_over: None,
                wake_at: Us::MAX,
            });
            sim.wake_at(r, joins);
        }
        sim
    }

    /// Makes replica `r` wake at `at` (and not at any later time asked
    /// before).
    fn wake_at(&mut self, r: usize, at: Us) {
        let at = at.max(self.now);
        let rep = &mut self.replicas[r];
        if at < rep.wake_at || rep.wake_at < self.now {
            rep.wake_at = at;
            self.push(at, What::Wake { r });
        }
    }

    fn push(&mut self, at: Us, what: What) {
        self.queue.push(self.now, at, what);
    }

    fn faulty(&self) -> bool {
        self.now < self.faults_until
    }

    /// A message's delay, or `None` when it is lost.
    fn delay(&mut self, r: usize) -> Option<Us> {
        if self.now < self.replicas[r].cut_until {
            return None;
        }
        if !self.faulty() {
            return Some(self.rng.range(100, 2_000));
        }
        if self.rng.chance(3) {
            return None;
        }
        let hi = if self.rng.chance(10) { 2 * TTL } else { 5_000 };
        Some(self.rng.range(100, hi))
    }

    fn local(&self, r: usize) -> BootTime {
        self.replicas[r].clock.boot(self.now)
    }

    /// Whether replica `r` runs now (not crashed, not paused).
    fn running(&self, r: usize) -> bool {
        !self.replicas[r].crashed && self.now >= self.replicas[r].paused_until
    }

    fn step(&mut self) -> bool {
        let Some((at, what)) = self.queue.pop() else {
            return false;
        };
        self.now = at;
        self.steps += 1;
        match what {
            What::Wake { r } => {
                if self.now != self.replicas[r].wake_at {
                    return true;
                }
                self.replicas[r].wake_at = Us::MAX;
                self.wake(r);
            }
            What::Arrive {
                r,
                e,
                flight,
                reply_delay,
            } => {
                let (id, inst, held) = self.requests.remove(&flight).expect("recorded");
                let db_now = self.db_clock.at(self.now);
                let name = self.elections[e].clone();
                let answer = self
                    .db
                    .acquire_or_renew(db_now, &name, &id, &inst, held, None);
                if self.now >= self.replicas[r].cut_until {
                    self.answers.insert(flight, answer);
                    self.push(self.now + reply_delay, What::Reply { r, e, flight });
                }
            }
            What::Reply { r, e, flight } => {
                let Some(answer) = self.answers.remove(&flight) else {
                    return true;
                };
                let current = self.replicas[r].lanes.get(e).and_then(|l| l.flight);
                // A reply to a paused process waits for it; that one is
                // simply lost here (its timeout handles it).
                if !self.running(r) || current.map(|f| f.0) != Some(flight) {
                    return true;
                }
                let sent = current.expect("checked").1;
                let received = self.local(r);
                let lane = &mut self.replicas[r].lanes[e];
                lane.flight = None;
                let events = lane.engine.on_attempt(sent, received, answer);
                self.events(r, e, events);
                self.schedule(r);
            }
            What::Timeout { r, e, flight } => {
                let current = self.replicas[r].lanes.get(e).and_then(|l| l.flight);
                if self.replicas[r].crashed || current.map(|f| f.0) != Some(flight) {
                    return true;
                }
                let now = self.local(r);
                let lane = &mut self.replicas[r].lanes[e];
                lane.flight = None;
                let event = lane.engine.on_failure(now);
                self.events(r, e, event.into_iter().collect());
                self.schedule(r);
            }
            What::Release { e, instance } => {
                let db_now = self.db_clock.at(self.now);
                let name = self.elections[e].clone();
                if self.db.release(db_now, &name, &instance, None) {
                    for r in 0..self.replicas.len() {
                        if let Some(d) = self.delay(r) {
                            self.push(self.now + d, What::Notice { r, e });
                        }
                    }
                }
            }
            What::Notice { r, e } => {
                if self.running(r) {
                    let now = self.local(r);
                    if let Some(lane) = self.replicas[r].lanes.get_mut(e) {
                        lane.engine.on_release_notice(now);
                    }
                    self.schedule(r);
                }
            }
            What::Spread { r, generation } => {
                if generation == self.replicas[r].generation {
                    self.spread_tick(r);
                }
            }
            What::SpreadArrive { r, reply_delay } => {
                let db_now = self.db_clock.at(self.now);
                let id = self.replicas[r].id.clone();
                let expires = self.presence.entry(id).or_insert(db_now);
                *expires = (*expires).max(db_now + TTL);
                let snapshot = Snapshot {
                    present: self
                        .presence
                        .iter()
                        .filter(|(_, &until)| until > db_now)
                        .map(|(id, _)| id.clone())
                        .collect(),
                };
                if self.now >= self.replicas[r].cut_until {
                    self.next_flight += 1;
                    let read = self.next_flight;
                    self.reads.insert(read, snapshot);
                    self.push(self.now + reply_delay, What::SpreadReply { r, read });
                }
            }
            What::SpreadReply { r, read } => {
                let snapshot = self.reads.remove(&read).expect("recorded");
                if self.running(r) {
                    self.rebalance(r, &snapshot);
                }
            }
        }
        self.check();
        true
    }

    fn wake(&mut self, r: usize) {
        if self.replicas[r].crashed {
            self.restart(r);
            return;
        }
        if self.now < self.replicas[r].paused_until {
            return;
        }
        if self.faulty() && self.rng.chance(2) {
            self.fault(r);
            if !self.running(r) {
                return;
            }
        }
        let now = self.local(r);
        for e in 0..self.elections.len() {
            let lane = &mut self.replicas[r].lanes[e];
            // An attempt past its timeout (the replica was paused) failed.
            if let Some((_, sent)) = lane.flight {
                if now >= sent + lane.engine.attempt_timeout(sent) {
                    lane.flight = None;
                    let event = lane.engine.on_failure(now);
                    self.events(r, e, event.into_iter().collect());
                }
            }
            let lane = &mut self.replicas[r].lanes[e];
            let event = lane.engine.poll(now);
            self.events(r, e, event.into_iter().collect());
            let lane = &self.replicas[r].lanes[e];
            if lane.flight.is_none() && lane.engine.attempt_due(now) {
                self.send(r, e);
            }
            // A look reads the row at once (it decides nothing safety
            // rests on).
            if self.replicas[r].lanes[e].engine.look_due(now) {
                let seen = self
                    .db
                    .observe(self.db_clock.at(self.now), &self.elections[e]);
                self.replicas[r].lanes[e].engine.on_look(now, seen);
            }
        }
        self.schedule(r);
    }

    fn send(&mut self, r: usize, e: usize) {
        let sent = self.local(r);
        self.next_flight += 1;
        let flight = self.next_flight;
        let rep = &mut self.replicas[r];
        let lane = &mut rep.lanes[e];
        lane.flight = Some((flight, sent));
        let held = lane.engine.lease(sent).map(|(t, _)| t);
        let request = (rep.id.clone(), lane.engine.instance().to_owned(), held);
        let timeout = lane.engine.attempt_timeout(sent);
        let limit = rep.clock.true_at(local_us(sent + timeout));
        if let (Some(there), Some(back)) = (self.delay(r), self.delay(r)) {
            self.requests.insert(flight, request);
            let arrive = What::Arrive {
                r,
                e,
                flight,
                reply_delay: back,
            };
            self.push(self.now + there, arrive);
        }
        self.push(limit, What::Timeout { r, e, flight });
    }

    fn schedule(&mut self, r: usize) {
        let rep = &self.replicas[r];
        let now = rep.clock.boot(self.now);
        // A lane with an attempt in flight is driven by its reply or
        // timeout; it still wakes at its deadline, to step down on time.
        let next = rep
            .lanes
            .iter()
            .filter_map(|l| match l.flight {
                None => Some(l.engine.next_wakeup()),
                Some(_) => l.engine.lease(now).map(|(_, deadline)| deadline),
            })
            .map(|at| rep.clock.true_at(local_us(at)))
            .min()
            .unwrap_or(self.now + HEARTBEAT);
        self.wake_at(r, next.max(self.now + 1));
    }

    /// Renews the presence and reads the table, as the daemon's spread does.
    fn spread_tick(&mut self, r: usize) {
        if self.replicas[r].crashed {
            return;
        }
        if self.running(r) {
            if let (Some(there), Some(back)) = (self.delay(r), self.delay(r)) {
                let arrive = What::SpreadArrive {
                    r,
                    reply_delay: back,
                };
                self.push(self.now + there, arrive);
            }
        }
        let next = self.now + SPREAD_EVERY;
        let generation = self.replicas[r].generation;
        self.push(next, What::Spread { r, generation });
    }

    /// The daemon's spread, on one read: yield, or hand over the surplus.
    fn rebalance(&mut self, r: usize, seen: &Snapshot) {
        let now = self.local(r);
        let id = self.replicas[r].id.clone();
        let peers: Vec<(&str, usize)> = seen
            .present
            .iter()
            .filter(|p| **p != id)
            .map(|p| {
                // From this replica's own elections' last answers, at most a
                // heartbeat old, as the daemon counts.
                let leads = self.replicas[r]
                    .lanes
                    .iter()
                    .filter(|l| l.engine.other_holder(now) == Some(p.as_str()))
                    .count();
                (p.as_str(), leads)
            })
            .collect();
        let leading: Vec<usize> = (0..self.elections.len())
            .filter(|&e| self.replicas[r].lanes[e].engine.is_leader(now))
            .collect();
        let p = plan(self.elections.len(), &id, leading.len(), &peers);
        for lane in &mut self.replicas[r].lanes {
            lane.engine.set_yielding(now, p.yield_free);
        }
        let local_now = local_us(now);
        let cooled = self.replicas[r]
            .last_hand_over
            .is_none_or(|at| local_now - at >= TTL + HEARTBEAT);
        if std::env::var_os("SIM_TRACE").is_some() {
            eprintln!(
                "{:>10} {id} leads {leading:?} sees {peers:?} plan {p:?} cooled {cooled}",
                self.now
            );
        }
        if p.hand_over > 0 && cooled {
            self.replicas[r].last_hand_over = Some(local_now);
            // As the daemon's loop does: a release request waits for the
            // attempt in flight (a grant to the old instance landing after
            // the release would lead on a freed row).
            let idle: Vec<usize> = leading
                .iter()
                .rev()
                .copied()
                .filter(|&e| self.replicas[r].lanes[e].flight.is_none())
                .take(p.hand_over)
                .collect();
            for e in idle {
                let rep = &mut self.replicas[r];
                let fresh = format!("{}-{}-{e}-{}", rep.id, rep.generation, self.steps);
                let hold = Duration::from_micros(2 * HEARTBEAT as u64);
                if let Some(step_down) = rep.lanes[e].engine.release(now, hold, fresh) {
                    self.hand_overs += 1;
                    self.events(r, e, vec![step_down.event]);
                    if let Some(d) = self.delay(r) {
                        let instance = step_down.released_instance;
                        self.push(self.now + d, What::Release { e, instance });
                    }
                }
            }
        }
        self.schedule(r);
    }

    fn events(&mut self, r: usize, e: usize, events: Vec<Event>) {
        for event in events {
            if let Event::Acquired { token } = event {
                let inst = self.replicas[r].lanes[e].engine.instance();
                self.tokens[e].granted(&self.elections[e], token, inst, self.now);
            }
        }
    }

    /// No election has two leaders at this instant of true time.
    fn check(&self) {
        for e in 0..self.elections.len() {
            let leaders: Vec<&str> = self
                .replicas
                .iter()
                .filter(|r| !r.crashed)
                .filter(|r| r.lanes[e].engine.is_leader(r.clock.boot(self.now)))
                .map(|r| r.lanes[e].engine.instance())
                .collect();
            one_leader(&self.elections[e], &leaders, self.now);
        }
    }

    fn fault(&mut self, r: usize) {
        match self.rng.below(3) {
            0 => {
                // SIGSTOP for up to three ttls.
                let until = self.now + self.rng.range(1, 3 * TTL);
                self.replicas[r].paused_until = until;
                self.replicas[r].wake_at = Us::MAX;
                self.wake_at(r, until);
            }
            1 => {
                // SIGKILL; back later as new instances.
                self.replicas[r].crashed = true;
                let at = self.now + self.rng.range(1, 3 * TTL);
                self.replicas[r].wake_at = Us::MAX;
                self.wake_at(r, at);
            }
            _ => {
                // Cut off from the database for up to three ttls.
                self.replicas[r].cut_until = self.now + self.rng.range(1, 3 * TTL);
            }
        }
    }

    fn restart(&mut self, r: usize) {
        let now = self.local(r);
        let n = self.elections.len();
        let rep = &mut self.replicas[r];
        rep.generation += 1;
        rep.crashed = false;
        rep.paused_until = 0;
        rep.last_hand_over = None;
        rep.lanes = (0..n)
            .map(|e| Lane {
                engine: Engine::new(
                    self.timing,
                    rep.id.clone(),
                    format!("{}-{}-{e}", rep.id, rep.generation),
                    now,
                ),
                flight: None,
            })
            .collect();
        self.replicas[r].wake_at = Us::MAX;
        self.wake_at(r, self.now);
        let generation = self.replicas[r].generation;
        self.push(self.now, What::Spread { r, generation });
    }

    /// Every election led, nobody above its share, at this instant.
    fn balanced(&self) -> bool {
        let live = self.replicas.iter().filter(|r| !r.crashed).count();
        let share = self.elections.len().div_ceil(live.max(1));
        let counts: Vec<usize> = self
            .replicas
            .iter()
            .filter(|r| !r.crashed)
            .map(|r| {
                let now = r.clock.boot(self.now);
                r.lanes.iter().filter(|l| l.engine.is_leader(now)).count()
            })
            .collect();
        counts.iter().sum::<usize>() == self.elections.len() && counts.iter().all(|&c| c <= share)
    }

    fn run(&mut self, max_steps: u64) {
        while self.now < self.faults_until && self.steps < max_steps && self.step() {}
        self.faults_until = self.now;
        for r in 0..self.replicas.len() {
            self.replicas[r].cut_until = 0;
            if self.replicas[r].crashed {
                self.restart(r);
            } else if self.replicas[r].paused_until > self.now {
                self.replicas[r].paused_until = self.now;
                self.replicas[r].wake_at = Us::MAX;
                self.wake_at(r, self.now);
            }
        }
        // Slow messages of the faulty phase (≤ 2 ttl each way) still land
        // and may cost a lease: let them.
        let quiet = self.now;
        while self.now < quiet + 4 * TTL {
            assert!(self.step(), "the simulation ran dry");
        }
        // Then presences of the crashed expire, holds and cool-downs end,
        // and a few rounds of hand-overs run.
        let drained = self.now;
        let bound = 15_000_000;
        while !self.balanced() {
            assert!(
                self.now < drained + bound,
                "not balanced {bound} µs after the faults' last messages"
            );
            assert!(self.step(), "the simulation ran dry");
        }
        // Balanced stays balanced (a leader renews; nothing moves).
        let settled = self.now + 2 * TTL;
        while self.now < settled {
            assert!(self.step(), "the simulation ran dry");
        }
        let stable_until = self.now + 5 * TTL;
        while self.now < stable_until {
            assert!(
                self.balanced(),
                "balance lost at {} with no fault",
                self.now
            );
            assert!(self.step(), "the simulation ran dry");
        }
    }
}

/// Runs one seed; its steps and hand-overs.
fn simulate(seed: u64, steps: u64) -> (u64, u64) {
    // Faults for the first 20 s of simulated time.
    let mut sim = Sim::new(seed, 20_000_000);
    reproducible(
        &mut sim,
        seed,
        steps,
        |sim| sim.run(steps),
        |sim| {
            format!(
                "spread, after {} steps, {} elections, {} replicas",
                sim.steps,
                sim.elections.len(),
                sim.replicas.len()
            )
        },
    );
    (sim.steps, sim.hand_overs)
}

#[test]
fn spread_elections_never_have_two_leaders_and_settle_balanced() {
    if let Some(seed) = env("SIM_SEED") {
        simulate(seed, env("SIM_STEPS").unwrap_or(200_000));
        return;
    }
    let (mut steps, mut hand_overs) = (0, 0);
    for seed in 0..200 {
        let (s, h) = simulate(seed, 200_000);
        steps += s;
        hand_overs += h;
    }
    eprintln!("{steps} steps, {hand_overs} hand-overs");
    assert!(steps > 200 * 1_000, "ran {steps} steps");
    assert!(
        hand_overs > 200,
        "the spread hardly moved anything: {hand_overs}"
    );
}

#[test]
#[ignore = "long: SIM_RUNS=5000 cargo test --release -p leaderd-core --test spread_simulation -- --ignored --nocapture"]
fn long_sweep() {
    let runs = env("SIM_RUNS").unwrap_or(5_000);
    let (mut steps, mut hand_overs) = (0, 0);
    for seed in 1_000..1_000 + runs {
        let (s, h) = simulate(seed, 1_000_000);
        steps += s;
        hand_overs += h;
    }
    eprintln!("{runs} runs: {steps} steps, {hand_overs} hand-overs");
}
