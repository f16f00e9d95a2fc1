//! The presence task: keeps this daemon's presence row, reads the group's
//! rows every renew interval, tells the roster who is live (for naming
//! successors, see `roster`) and, with the spread on, has the spread act on
//! the same look. Every daemon runs it, one election or many.
//!
//! Presence is a row of the lock table named
//! `leaderd-presence/<group>/slot-<n>`, leased like an election (so judged
//! by the database's clock, and held by this daemon's instance only),
//! renewed every renew interval and released at shutdown. A daemon takes a
//! low slot no live replica holds: pod names change at every rollout, and a
//! row per name would stay in the table for good (earlier versions named
//! the row after the replica; such rows count as presence for the spread
//! all the same, but are never named successors). A daemon whose app fails
//! its health check, or that drains, keeps no presence: it is not waiting
//! for anything, and must be neither named nor given an election.
//!
//! On a Galera node the row's address holds the node the daemon is
//! connected to, and the group's rows are read every few seconds to see
//! where the replicas are (see `nodes`).
//!
//! (Not the wake-up presence of `wakeups`, MySQL's named lock that a
//! leader holds.)

use std::sync::Arc;
use std::time::Duration;

use leaderd_core::Attempt;
use leaderd_store::ElectionRow;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::clock::boot_now;
use crate::runtime::away::Away;
use crate::runtime::daemon::Daemon;
use crate::runtime::link::{Link, Request};
use crate::runtime::nodes::Nodes;
use crate::runtime::roster::{Heir, Roster};
use crate::runtime::slots::{free_slot, spare_slot};
use crate::runtime::spread::Spread;
use crate::settings::Settings;

/// How often (in rounds) a daemon that reads the group's rows only to see
/// the replicas' Galera nodes reads them: a few seconds, since a spread
/// over nodes is worth a warning, not a hurry, and each read costs the
/// node a range of rows.
const NODES_EVERY: u64 = 10;

/// How long shutdown gives the presence release: with the loops' own
/// budgets, shutdown stays within its 2 s.
const RELEASE_BUDGET: Duration = Duration::from_millis(300);

/// How long a release may spend reading the presence rows again before it
/// names a successor (waiting for another release's read included): half of the release's own budget (800 ms), so the
/// release statement keeps the other half. A database a 100 ms round trip
/// away answers the read in two (it waits behind a renewal on the one
/// connection): 150 ms timed out there, and the release named a replica
/// from a look older than the new pod, which was stopped next (measured,
/// `tests/tests/successor.rs`). A near database answers in milliseconds
/// whatever this is.
const READ_BUDGET: Duration = Duration::from_millis(400);

/// The successor a release names now: the group's rows read again first
/// (within [`READ_BUDGET`]), so that a replica that joined since the last
/// round is known, else as last read. One read, once answered, serves
/// every release asked before it began; one that failed or was cut off
/// serves nobody. `leaving`: this replica goes (see
/// [`Roster::successor`]).
///
/// The budget counts from when the release asked, the wait for another
/// release's read included: elections released together at shutdown each
/// ask a moment apart, and on a database slow enough to time a read out,
/// a second full read after the first would leave their releases no time.
pub async fn successor(roster: &Roster, link: &Link, leaving: bool) -> Option<Heir> {
    let asked = boot_now();
    let reread = async {
        let mut last = roster.reread_turn().await;
        if last.is_none_or(|began| began < asked) {
            let began = boot_now();
            match link.read(roster.prefix()).await {
                Ok(rows) => {
                    roster.see(&rows, boot_now());
                    *last = Some(began);
                }
                Err(e) => {
                    info!(error = %e, "could not read the presence rows; naming from the last look")
                }
            }
        }
    };
    if tokio::time::timeout(READ_BUDGET, reread).await.is_err() {
        info!("reading the presence rows timed out; naming from the last look");
    }
    roster.successor(boot_now(), leaving)
}

/// Waits until this replica is a candidate to be named (see
/// [`Roster::joined`]), before the election loops' first attempt, which
/// makes it ready: a heartbeat at most once `link` is seen connected, as
/// no presence round can run before, and [`JOIN_CAP`] heartbeats at most in
/// all. Counted from the start, the heartbeat ran out on a database 100 ms
/// away with both cores busy (the connect took it all): the replica was
/// ready with no presence row, and the old leader stopped next named
/// another old one (measured, `tests/tests/successor.rs`).
async fn joined(roster: &Roster, link: &Link, heartbeat: Duration) {
    let mut link = link.clone();
    let waited = async {
        // The presence task asks for the connection.
        while !link.connected() {
            let _ = link.changed().await;
        }
        roster.joined(heartbeat).await;
    };
    let _ = tokio::time::timeout(heartbeat * JOIN_CAP, waited).await;
}

/// Waits for [`joined`] (or `shutdown`), then lets the election loops
/// begin ([`Roster::set_begun`], and each loop woken). Once for the daemon,
/// in a task of its own: a wait in each loop, boxed so as not to widen the
/// loop's future, left the allocator a free chunk of 720 bytes between each
/// election's live ones (0.67 MB at 1,000 elections, `malloc_info`). Should
/// it fail (a panic), `shutdown` is cancelled: no election would begin
/// otherwise.
pub async fn begin(
    daemon: Arc<Daemon>,
    link: Link,
    heartbeat: Duration,
    shutdown: CancellationToken,
) {
    let stop = shutdown.clone().drop_guard();
    let roster = daemon.roster();
    tokio::select! {
        () = joined(roster, &link, heartbeat) => {
            roster.set_begun();
            for election in daemon.all() {
                election.begin();
            }
        }
        () = shutdown.cancelled() => {}
    }
    stop.disarm();
}

/// In heartbeats, how long [`joined`] may hold the loops back in all: a
/// database that cannot be reached must not keep them from their loop
/// (`/healthz` counts from the daemon's start, five heartbeats and a
/// second at least).
const JOIN_CAP: u32 = 3;

/// Runs until `shutdown`, then lets the presence row go.
pub async fn run(daemon: Arc<Daemon>, settings: Settings, link: Link, shutdown: CancellationToken) {
    let spreading = settings.spread && settings.elections.len() > 1;
    let mut spread = spreading.then(|| Spread::new(daemon.clone(), settings.clone()));
    let mut keeper = Keeper {
        reads: spreading,
        presence_name: None,
        held_token: None,
        rounds: 0,
        away: Away::default(),
        link,
        daemon,
        settings,
    };
    // At a fixed rate, not a pause after each round: the others count this
    // replica out when its presence misses two renewals (see
    // `leaderd_core::spread::present`), and a slow round must not look so.
    let mut nodes = Nodes::default();
    let mut every = tokio::time::interval(keeper.settings.timing.renew_every());
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Without a connection, the round comes as soon as one is open: a
        // replica just started is a candidate from its first connect on,
        // not a renew interval later (a rolling update may stop an old
        // replica the moment this one is ready).
        let waiting = !keeper.link.connected();
        let roster = keeper.daemon.roster().clone();
        let nudged = tokio::select! {
            () = shutdown.cancelled() => break,
            _ = every.tick() => false,
            _ = keeper.link.changed(), if waiting => false,
            // A drain, or the app's health, changed: the presence row
            // goes (or comes back) at once.
            () = roster.nudged() => true,
        };
        let round = keeper.round(nudged).await;
        // Joined: it holds its row, or keeps none (its app fails, or it
        // drains), and the loops need not wait for one.
        let keeps_none = !keeper.daemon.first().app_healthy() || keeper.daemon.draining(boot_now());
        if keeper.held_token.is_some() || keeps_none {
            keeper.daemon.roster().set_joined();
        }
        match round {
            Ok(Some(rows)) => {
                let own = keeper.link.galera_node();
                nodes.see(own.as_deref(), roster.live(&rows).map(|(_, row)| row));
                if let Some(spread) = &mut spread {
                    let leads = spread.act(&rows).await;
                    keeper.daemon.roster().count_leads(leads);
                }
            }
            Ok(None) => {}
            Err(e) => {
                debug!(error = %e, "presence: cannot read the table; not yielding");
                keeper.held_token = None;
                if let Some(spread) = &mut spread {
                    spread.set_yielding(false).await;
                }
            }
        }
    }
    keeper.leave().await;
    let away = keeper.away.leave(&keeper.link, &keeper.daemon);
    let _ = tokio::time::timeout(RELEASE_BUDGET, away).await;
}

struct Keeper {
    /// Read the group's rows every round (the spread plans on them);
    /// without the spread only a release needs them, and reads them then.
    reads: bool,
    daemon: Arc<Daemon>,
    settings: Settings,
    /// The presence slot held or to take next; none before the first read.
    presence_name: Option<String>,
    /// The presence row's token while this instance holds it.
    held_token: Option<i64>,
    /// Rounds so far (see [`Keeper::nodes_round`]).
    rounds: u64,
    /// The row kept while the replica competes in no election.
    away: Away,
    /// The daemon's connection: the presence renewal and the read go over
    /// it, with whatever the loops have pending.
    link: Link,
}

impl Keeper {
    /// One look at the table: renew the presence and read the group's rows
    /// (`None` while draining, or when only a release reads them).
    /// `nudged`: a drain (or the app's failing) began or ended just now;
    /// the away row, which only `leaderd status` reads, waits for the next
    /// round. A drain's
    /// releases (`leaderd release --hold`) are under way on the same
    /// connection, and its read and two attempts went ahead of them:
    /// 2.5 ms of such a handover's 7.5 (BENCHMARKS.md).
    async fn round(&mut self, nudged: bool) -> Result<Option<Vec<ElectionRow>>, String> {
        if !self.link.connected() {
            self.link.want_connection();
            return Err("no connection".into());
        }
        if !nudged {
            if let Err(e) = self
                .away
                .round(&self.link, &self.daemon, &self.settings)
                .await
            {
                debug!(error = %e, "away row: not kept this round");
            }
        }
        // A replica drained by a release with a hold (or whose app fails)
        // counts as absent: it is named for nothing and given no election
        // until it competes again.
        let draining = self.daemon.draining(boot_now());
        let healthy = self.daemon.first().app_healthy() && !draining;
        // A slot is chosen from a fresh look and taken in this same round,
        // so that replicas starting together are counted within a round or
        // two; the same look then serves the plan.
        let mut presence = None;
        if healthy {
            if self.held_token.is_none() {
                let roster = self.daemon.roster();
                let fresh = self.link.read(roster.prefix()).await?;
                self.presence_name = Some(free_slot(roster.prefix(), &fresh, roster.daemon()));
                presence = Some(fresh);
            }
            self.renew_presence().await?;
            if let (Some(rows), Some(_)) = (&presence, self.held_token) {
                self.make_spare(rows).await?;
            }
        } else {
            if self.held_token.is_some() {
                // Not waiting for anything: others must not hand over to us.
                self.leave().await;
            }
            if draining {
                return Ok(None);
            }
        }
        let presence = match presence {
            Some(rows) => rows,
            None if self.reads || self.nodes_round() => {
                self.link.read(self.daemon.roster().prefix()).await?
            }
            None => return Ok(None),
        };
        self.daemon.roster().see(&presence, boot_now());
        Ok(Some(presence))
    }

    /// Whether this round reads the group's rows to see on which Galera
    /// nodes the replicas are: every [`NODES_EVERY`] rounds, on Galera.
    fn nodes_round(&mut self) -> bool {
        self.rounds = self.rounds.wrapping_add(1);
        self.link.galera_node().is_some() && self.rounds % NODES_EVERY == 1
    }

    /// Takes or renews the presence slot; a slot row made just now (the
    /// attempt creates it free) is taken at once.
    async fn renew_presence(&mut self) -> Result<(), String> {
        let Some(name) = self.presence_name.clone() else {
            return Ok(());
        };
        for _ in 0..2 {
            let answer = self.attempt_slot(&name, self.held_token).await?;
            self.held_token = match answer {
                Attempt::Granted { token } => Some(token),
                Attempt::Refused(_) => None,
                Attempt::Created => continue,
            };
            break;
        }
        Ok(())
    }

    /// Makes a spare slot row if the group has none that a newcomer could
    /// take at once (see [`spare_slot`]). Made free and blocked for a ttl;
    /// one found made meanwhile and taken by this attempt is let go.
    async fn make_spare(&mut self, rows: &[ElectionRow]) -> Result<(), String> {
        let mine = self.presence_name.as_deref().unwrap_or_default();
        let Some(spare) = spare_slot(self.daemon.roster().prefix(), rows, mine) else {
            return Ok(());
        };
        if let Attempt::Granted { .. } = self.attempt_slot(&spare, None).await? {
            let daemon = self.daemon.roster().daemon().clone();
            self.link.release(&spare, &daemon, None).await?;
        }
        Ok(())
    }

    /// One attempt on the slot row `name`, as this daemon's instance
    /// (holding it under `held_token`, if so); within a heartbeat.
    async fn attempt_slot(&self, name: &str, held_token: Option<i64>) -> Result<Attempt, String> {
        let req = Request {
            election: name.into(),
            holder: self.settings.id.as_str().into(),
            instance: self.daemon.roster().daemon().clone(),
            ttl: self.settings.timing.ttl(),
            held_token,
            daemon: None,
            // A presence row's address is its daemon's Galera node.
            address: self.link.galera_node(),
        };
        let until = boot_now() + self.settings.timing.heartbeat();
        self.link.attempt(req, until).await.map_err(|f| f.reason)
    }

    /// Frees the presence slot (within [`RELEASE_BUDGET`]) so the others
    /// count this daemon out at once. A failed round forgets the token, not
    /// the slot: the release frees it only if this instance still holds it.
    async fn leave(&mut self) {
        self.held_token = None;
        let Some(name) = &self.presence_name else {
            return;
        };
        let instance = self.daemon.roster().daemon().clone();
        let released =
            tokio::time::timeout(RELEASE_BUDGET, self.link.release(name, &instance, None)).await;
        debug!(released = ?released, "presence let go");
    }
}
