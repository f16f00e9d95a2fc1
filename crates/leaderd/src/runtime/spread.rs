//! The spread adapter: keeps this daemon's presence row, reads who else is
//! live (the group's presence rows only), counts what each leads from the
//! election loops' own last answers, and carries out [`leaderd_core::spread::plan`]
//! through the election loops (a yield, or a release with a hold). The rule
//! itself is in `leaderd-core`; this is only the I/O around it.
//!
//! Presence is a row of the lock table named
//! `leaderd-presence/<group>/slot-<n>`, leased like an election (so judged
//! by the database's clock, and held by this process instance only), renewed
//! every renew interval and released at shutdown. `<group>` is a hash of the
//! set of elections, so daemons that run different sets do not count one
//! another. A daemon takes a low slot no live replica holds: pod names
//! change at every rollout, and a row per name would stay in the table for
//! good (earlier versions named the row after the replica; such rows count
//! as presence all the same). A daemon whose app fails its health check
//! keeps no presence (it is not waiting for anything). With one election,
//! or `spread = false`, nothing of this runs.
//!
//! Nothing here can make two leaders: a yield only delays attempts, and a
//! hand-over is the ordinary release. A daemon that cannot read the table
//! stops yielding, so balance never costs an election its leader.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::spread::{plan, present, settled, PRESENCE_PREFIX};
use leaderd_core::{Attempt, BootTime};
use leaderd_store::ElectionRow;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::clock::boot_now;
use crate::runtime::daemon::Daemon;
use crate::runtime::link::{Link, Request};
use crate::runtime::shared::Control;
use crate::settings::Settings;

/// How long shutdown gives the presence release: with the loops' own
/// budgets, shutdown stays within the spec's 2 s.
const RELEASE_BUDGET: Duration = Duration::from_millis(300);

/// The group's presence rows start with this.
fn group_prefix(elections: &[String]) -> String {
    let mut sorted: Vec<&str> = elections.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    format!(
        "{PRESENCE_PREFIX}{:016x}/",
        fnv1a(sorted.join("\n").as_bytes())
    )
}

/// A stable hash (FNV-1a, 64 bits): the same in every build and process,
/// unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Runs until `shutdown`; returns at once when there is nothing to spread.
pub async fn run(daemon: Arc<Daemon>, settings: Settings, link: Link, shutdown: CancellationToken) {
    if !settings.spread || settings.elections.len() < 2 {
        return;
    }
    let prefix = group_prefix(&settings.elections);
    let mut spread = Spread {
        presence_name: None,
        prefix,
        instance: uuid::Uuid::new_v4().to_string(),
        held_token: None,
        link,
        yielding: vec![false; daemon.all().len()],
        led_since: vec![None; daemon.all().len()],
        last_hand_over: None,
        daemon,
        settings,
    };
    // At a fixed rate, not a pause after each round: the others count this
    // replica out when its presence misses two renewals (see
    // `leaderd_core::spread::present`), and a slow round must not look so.
    let mut every = tokio::time::interval(spread.settings.timing.renew_every());
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = every.tick() => {}
        }
        if let Err(e) = spread.round().await {
            debug!(error = %e, "spread: cannot read the table; not yielding");
            spread.held_token = None;
            spread.set_yielding(false).await;
        }
    }
    spread.leave().await;
}

struct Spread {
    daemon: Arc<Daemon>,
    settings: Settings,
    prefix: String,
    /// The presence slot held or to take next; none before the first read.
    presence_name: Option<String>,
    instance: String,
    /// The presence row's token while this instance holds it.
    held_token: Option<i64>,
    /// The daemon's connection: the presence renewal and the read go over
    /// it, with whatever the loops have pending.
    link: Link,
    /// What each election's loop was last told.
    yielding: Vec<bool>,
    last_hand_over: Option<BootTime>,
    /// Per election, the token this daemon leads it under and since when
    /// (as first seen here, within a renew interval).
    led_since: Vec<Option<(i64, BootTime)>>,
}

impl Spread {
    /// One look at the table: renew the presence, plan, act.
    async fn round(&mut self) -> Result<(), String> {
        if !self.link.connected() {
            self.link.want_connection();
            return Err("no connection".into());
        }
        // A replica drained by a release with a hold (or whose app fails)
        // counts as absent: it is given no election and is not in the
        // shares until it competes again.
        let draining = self.daemon.draining(boot_now());
        let healthy = self.daemon.first().app_healthy() && !draining;
        // A slot is chosen from a fresh look and taken in this same round,
        // so that replicas starting together are counted within a round or
        // two; the same look then serves the plan.
        let mut presence = None;
        if healthy {
            if self.held_token.is_none() {
                let fresh = self.link.read(&self.prefix).await?;
                self.presence_name = Some(free_slot(&self.prefix, &fresh, &self.instance));
                presence = Some(fresh);
            }
            self.renew_presence().await?;
        } else {
            if self.held_token.is_some() {
                // Not waiting for anything: others must not hand over to us.
                self.leave().await;
            }
            if draining {
                return Ok(());
            }
        }
        let presence = match presence {
            Some(rows) => rows,
            None => self.link.read(&self.prefix).await?,
        };
        self.act(&presence).await;
        Ok(())
    }

    /// Takes or renews the presence slot; a slot row made just now (the
    /// attempt creates it free) is taken at once.
    async fn renew_presence(&mut self) -> Result<(), String> {
        let Some(name) = self.presence_name.clone() else {
            return Ok(());
        };
        for _ in 0..2 {
            let req = Request {
                election: name.clone(),
                holder: self.settings.id.clone(),
                instance: self.instance.clone(),
                ttl: self.settings.timing.ttl(),
                held_token: self.held_token,
            };
            let until = boot_now() + self.settings.timing.heartbeat();
            let answer = self.link.attempt(req, until).await.map_err(|f| f.reason)?;
            self.held_token = match answer {
                Attempt::Granted { token } => Some(token),
                Attempt::Refused(_) => None,
                Attempt::Created => continue,
            };
            break;
        }
        Ok(())
    }

    /// Plans on the group's presence rows and on what the loops last saw,
    /// and tells the loops.
    async fn act(&mut self, presence: &[ElectionRow]) {
        let now = boot_now();
        let (leading, leads) = self.look(now);
        let id = self.settings.id.as_str();
        let mut live: Vec<&str> = presence
            .iter()
            .filter(|row| row.name.starts_with(&self.prefix))
            .filter_map(|row| {
                let holder = row.live_holder()?;
                let remaining = Duration::from_micros(row.remaining_us.unsigned_abs());
                (holder != id && present(remaining, self.settings.timing)).then_some(holder)
            })
            .collect();
        // A replica may show in two slots for up to a ttl (one it lost, one
        // it took since): it is one replica.
        live.sort_unstable();
        live.dedup();
        let peers: Vec<(&str, usize)> = live
            .into_iter()
            .map(|peer| (peer, leads.get(peer).copied().unwrap_or(0)))
            .collect();
        let p = plan(self.settings.elections.len(), id, leading.len(), &peers);
        let peer_counts: Vec<usize> = peers.iter().map(|&(_, n)| n).collect();
        self.set_yielding(p.yield_free).await;
        let t = self.settings.timing;
        let cooled = self
            .last_hand_over
            .is_none_or(|at| settled(now.saturating_since(at), t));
        // The last ones led, in the configured order, but only ones led
        // for a while (see `settled`). Each loop releases its own row and
        // holds off, so the replica below takes it.
        let handed: Vec<usize> = leading
            .iter()
            .rev()
            .copied()
            .filter(|&i| {
                self.led_since[i].is_some_and(|(_, at)| settled(now.saturating_since(at), t))
            })
            .take(p.hand_over)
            .collect();
        if handed.is_empty() || !cooled {
            return;
        }
        self.last_hand_over = Some(now);
        info!(
            leading = leading.len(),
            share = p.share,
            peers = ?peer_counts,
            hand_over = handed.len(),
            "handing elections over to a replica below its share"
        );
        let hold = t.heartbeat() * 2;
        for i in handed {
            let shared = self.daemon.all()[i].clone();
            tokio::spawn(async move { shared.release(hold, false).await });
        }
    }

    /// One pass over the elections: the ones this daemon leads at `now`
    /// (by index, noting since when each has been led under its current
    /// token), and how many each other replica leads as this daemon's loops
    /// last saw (at most a heartbeat old: a follower attempts every
    /// heartbeat). Counted here rather than read from the table: a read of
    /// every row each round (thousands, 2.5 times a second) cost the
    /// database and this daemon for what the loops already knew.
    fn look(&mut self, now: BootTime) -> (Vec<usize>, HashMap<String, usize>) {
        let mut leading = Vec::new();
        let mut leads: HashMap<String, usize> = HashMap::new();
        for (i, shared) in self.daemon.all().iter().enumerate() {
            let token = shared.holder_at(now, |held| match held {
                Ok(token) => Some(token),
                Err(other) => {
                    if let Some(other) = other {
                        match leads.get_mut(other) {
                            Some(n) => *n += 1,
                            None => {
                                leads.insert(other.to_owned(), 1);
                            }
                        }
                    }
                    None
                }
            });
            if token != self.led_since[i].map(|(t, _)| t) {
                self.led_since[i] = token.map(|t| (t, now));
            }
            if token.is_some() {
                leading.push(i);
            }
        }
        (leading, leads)
    }

    /// Tells every loop whether to yield, when that changed.
    async fn set_yielding(&mut self, yielding: bool) {
        for (i, shared) in self.daemon.all().iter().enumerate() {
            if self.yielding[i] != yielding && shared.control(Control::Yield(yielding)) {
                self.yielding[i] = yielding;
            }
        }
    }

    /// Frees the presence slot (within [`RELEASE_BUDGET`]) so the others
    /// count this daemon out at once. A failed round forgets the token, not
    /// the slot: the release frees it only if this instance still holds it.
    async fn leave(&mut self) {
        self.held_token = None;
        let Some(name) = &self.presence_name else {
            return;
        };
        let released =
            tokio::time::timeout(RELEASE_BUDGET, self.link.release(name, &self.instance)).await;
        debug!(released = ?released, "spread: presence let go");
    }
}

/// The presence slot to take: one that no live replica holds in `rows`
/// (free, expired or not there yet), among the lowest `live + 1` slots, so
/// a group never has more presence rows than it ever had live replicas at
/// once, whatever the replicas were called. Which free one is picked by
/// `instance`, so that replicas starting together mostly pick different
/// ones (the loser of a tie is refused and picks again next round).
fn free_slot(prefix: &str, rows: &[ElectionRow], instance: &str) -> String {
    let taken: HashSet<u64> = rows
        .iter()
        .filter(|r| r.live_holder().is_some())
        .filter_map(|r| {
            r.name
                .strip_prefix(prefix)?
                .strip_prefix("slot-")?
                .parse()
                .ok()
        })
        .collect();
    let free: Vec<u64> = (0..=taken.len() as u64)
        .filter(|n| !taken.contains(n))
        .collect();
    // Never empty: `taken.len() + 1` slots cannot all be taken.
    let n = free[usize::try_from(fnv1a(instance.as_bytes()) % free.len() as u64).unwrap_or(0)];
    format!("{prefix}slot-{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_takes_a_low_slot_no_live_replica_holds() {
        let row = |name: &str, holder: Option<&str>, remaining_us: i64| ElectionRow {
            name: name.into(),
            holder: holder.map(Into::into),
            token: 1,
            remaining_us,
        };
        let p = "leaderd-presence/0123456789abcdef/";
        assert_eq!(free_slot(p, &[], "i"), format!("{p}slot-0"));
        let rows = [
            row(&format!("{p}slot-0"), Some("a"), 900_000),
            // Expired (a replica killed): its slot is free again.
            row(&format!("{p}slot-1"), Some("gone"), -5),
            row(&format!("{p}slot-2"), Some("b"), 1),
            // Another group's slot, an older version's row, an election.
            row(
                "leaderd-presence/ffffffffffffffff/slot-1",
                Some("x"),
                900_000,
            ),
            row(&format!("{p}00000000deadbeef"), Some("old"), 900_000),
            row("slot-1", Some("c"), 900_000),
        ];
        assert_eq!(free_slot(p, &rows, "i"), format!("{p}slot-1"));
        // Two live slots (0 and 5): the free ones among the lowest three,
        // 1 and 2, each picked by some newcomers.
        let rows = [
            row(&format!("{p}slot-0"), Some("a"), 900_000),
            row(&format!("{p}slot-5"), Some("b"), 900_000),
        ];
        let picks: HashSet<String> = (0..40)
            .map(|i| free_slot(p, &rows, &format!("instance-{i}")))
            .collect();
        let want: HashSet<String> = [1, 2].map(|n| format!("{p}slot-{n}")).into();
        assert_eq!(picks, want, "newcomers spread over the free slots");
        let rows = [
            row(&format!("{p}slot-0"), Some("a"), 900_000),
            row(&format!("{p}slot-1"), Some("b"), 900_000),
            row(&format!("{p}slot-2"), None, 0),
        ];
        assert_eq!(free_slot(p, &rows, "i"), format!("{p}slot-2"));
    }

    #[test]
    fn the_group_is_the_set_of_elections_whatever_the_order() {
        let a = group_prefix(&["mailer".into(), "reports".into()]);
        let b = group_prefix(&["reports".into(), "mailer".into()]);
        let c = group_prefix(&["mailer".into()]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with(PRESENCE_PREFIX) && a.len() <= 40, "{a}");
        // Fixed across builds: daemons of different versions must agree.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
