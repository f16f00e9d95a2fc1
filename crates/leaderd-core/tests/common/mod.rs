//! What the simulations share: a seeded generator, clocks that drift, and
//! the lock table as docs/design.md describes its operations, on the database's
//! clock, one row per election.

#![allow(dead_code)] // each simulation uses its own part

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use leaderd_core::{Attempt, BootTime, Observed, Timing};

/// True time, in microseconds since the simulation began.
pub type Us = i64;

pub const TTL: Us = 1_200_000;
pub const HEARTBEAT: Us = 1_000_000;

pub fn timing() -> Timing {
    Timing::new(
        Duration::from_micros(HEARTBEAT as u64),
        Duration::from_micros(TTL as u64),
    )
    .unwrap()
}

/// splitmix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn range(&mut self, lo: Us, hi: Us) -> Us {
        lo + i64::try_from(self.below(u64::try_from(hi - lo).unwrap_or(0) + 1)).unwrap_or(0)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A clock running at `1 + ppm / 10⁶` of true time from `offset`.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub offset: Us,
    pub ppm: i64,
}

impl Clock {
    /// Within ±500 ppm of true time: far more than real drift, far less
    /// than the safety margin over one ttl.
    pub fn random(rng: &mut Rng) -> Clock {
        Clock {
            offset: rng.range(0, 1 << 40),
            ppm: rng.range(-500, 500),
        }
    }
    pub fn at(&self, t: Us) -> Us {
        self.offset + t + t * self.ppm / 1_000_000
    }
    /// The true time at which this clock reads `local` (the inverse).
    pub fn true_at(&self, local: Us) -> Us {
        let d = local - self.offset;
        d - d * self.ppm / (1_000_000 + self.ppm)
    }
    pub fn boot(&self, t: Us) -> BootTime {
        BootTime::from_since_boot(Duration::from_micros(
            u64::try_from(self.at(t)).unwrap_or(0),
        ))
    }
}

pub fn local_us(b: BootTime) -> Us {
    i64::try_from(b.since_boot().as_micros()).unwrap_or(i64::MAX)
}

/// One lock row.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub holder: Option<String>,
    pub instance: Option<String>,
    pub token: i64,
    pub expires: Us,
    /// The daemon a release named to lead next:
    /// while the row is free, it may take it before expiry.
    pub successor: Option<String>,
}

/// The lock table, on the database clock (times passed in are its).
#[derive(Debug, Default)]
pub struct Db {
    pub rows: BTreeMap<String, Row>,
    /// Seeds a re-created row's token; the database clock in µs in reality.
    next_seed: i64,
    /// Rows a named successor took before they expired.
    pub heir_takes: u64,
}

impl Db {
    /// `daemon`: the requesting daemon, as a release may name it.
    pub fn acquire_or_renew(
        &mut self,
        now: Us,
        name: &str,
        id: &str,
        inst: &str,
        held: Option<i64>,
        daemon: Option<&str>,
    ) -> Attempt {
        let Some(row) = self.rows.get_mut(name) else {
            self.next_seed += 1_000_000;
            let row = Row {
                token: self.next_seed,
                expires: now + TTL,
                ..Row::default()
            };
            self.rows.insert(name.to_owned(), row);
            return Attempt::Created;
        };
        let mine_live = row.instance.as_deref() == Some(inst) && row.expires > now;
        if let Some(h) = held {
            // The leader's fast path requires its token.
            if mine_live && row.token == h {
                row.expires = row.expires.max(now + TTL);
                return Attempt::Granted { token: row.token };
            }
        }
        let heir = row.instance.is_none() && daemon.is_some() && row.successor.as_deref() == daemon;
        if mine_live || row.expires <= now || heir {
            if !mine_live {
                row.token += 1;
            }
            if heir && row.expires > now {
                self.heir_takes += 1;
            }
            row.holder = Some(id.to_owned());
            row.instance = Some(inst.to_owned());
            row.successor = None;
            row.expires = row.expires.max(now + TTL);
            self.next_seed = self.next_seed.max(row.token);
            return Attempt::Granted { token: row.token };
        }
        Attempt::Refused(Observed {
            holder: row.holder.clone(),
            instance: row.instance.clone(),
            token: row.token,
            remaining_us: row.expires - now,
            address: None,
        })
    }

    /// The row as a read that takes nothing sees it (a follower's look).
    pub fn observe(&self, now: Us, name: &str) -> Option<Observed> {
        self.rows.get(name).map(|row| Observed {
            holder: row.holder.clone(),
            instance: row.instance.clone(),
            token: row.token,
            remaining_us: row.expires - now,
            address: None,
        })
    }

    /// Whether the row was released (only by its holding instance),
    /// naming `successor` (a daemon, and its window) if given.
    pub fn release(
        &mut self,
        now: Us,
        name: &str,
        inst: &str,
        successor: Option<(&str, Us)>,
    ) -> bool {
        match self.rows.get_mut(name) {
            Some(row) if row.instance.as_deref() == Some(inst) => {
                row.holder = None;
                row.instance = None;
                row.successor = successor.map(|(d, _)| d.to_owned());
                row.expires = now + successor.map_or(0, |(_, window)| window);
                true
            }
            _ => false,
        }
    }
}

/// The simulation's events by true time; those of one instant in the order
/// they were pushed.
#[derive(Debug)]
pub struct Queue<W: Ord> {
    heap: BinaryHeap<Reverse<(Us, u64, W)>>,
    seq: u64,
}

impl<W: Ord> Default for Queue<W> {
    fn default() -> Self {
        Queue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<W: Ord> Queue<W> {
    /// `what` at `at`, or at `now` if `at` has passed.
    pub fn push(&mut self, now: Us, at: Us, what: W) {
        self.seq += 1;
        self.heap.push(Reverse((at.max(now), self.seq, what)));
    }
    pub fn pop(&mut self) -> Option<(Us, W)> {
        self.heap.pop().map(|Reverse((at, _, what))| (at, what))
    }
}

/// Each grant of one election as it happens: tokens never go back, and no
/// token is held by two instances.
#[derive(Debug)]
pub struct Tokens {
    max: i64,
    owner: BTreeMap<i64, String>,
}

impl Default for Tokens {
    fn default() -> Self {
        Tokens {
            max: i64::MIN,
            owner: BTreeMap::new(),
        }
    }
}

impl Tokens {
    /// `what` names the election in a failure.
    pub fn granted(&mut self, what: &str, token: i64, instance: &str, now: Us) {
        assert!(
            token >= self.max,
            "{what}: token went back from {} to {token} at {now}",
            self.max
        );
        self.max = token;
        let owner = self
            .owner
            .entry(token)
            .or_insert_with(|| instance.to_owned());
        assert_eq!(
            owner, instance,
            "{what}: token {token} held by two instances"
        );
    }
}

/// No two of `leaders` (the instances leading one election now).
pub fn one_leader(what: &str, leaders: &[&str], now: Us) {
    assert!(
        leaders.len() <= 1,
        "{what}: two leaders at {now}: {leaders:?}"
    );
}

/// Runs a seed's simulation; if it fails, says how to run it again
/// (`context` describes the simulation at that point).
pub fn reproducible<S>(
    sim: &mut S,
    seed: u64,
    steps: u64,
    run: impl FnOnce(&mut S),
    context: impl FnOnce(&S) -> String,
) {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(sim)));
    if let Err(e) = result {
        eprintln!(
            "simulation failed ({}): reproduce with SIM_SEED={seed} SIM_STEPS={steps}",
            context(sim)
        );
        std::panic::resume_unwind(e);
    }
}

/// A number from the environment (`SIM_SEED`, `SIM_STEPS`, `SIM_RUNS`).
pub fn env(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.parse().ok())
}
