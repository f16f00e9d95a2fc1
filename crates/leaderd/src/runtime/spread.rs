//! The spread adapter: counts what each live replica leads from the
//! election loops' own last answers, and carries out
//! [`leaderd_core::spread::plan`] through the loops (a yield, or a release
//! with a hold). The rule itself is in `leaderd-core`; who is live comes
//! from the presence rows the `presence` task reads and hands to
//! [`Spread::act`]. It runs with several elections and `spread = true`.
//!
//! Nothing here can make two leaders: a yield only delays attempts, and a
//! hand-over is the ordinary release (which names the successor: the
//! replica below its share that started last, see `roster`). A daemon that
//! cannot read the table stops yielding, so balance never costs an
//! election its leader.

use std::collections::HashMap;
use std::sync::Arc;

use leaderd_core::spread::{plan, set_settled, settled};
use leaderd_core::BootTime;
use leaderd_store::ElectionRow;
use tracing::info;

use crate::clock::boot_now;
use crate::runtime::daemon::Daemon;
use crate::runtime::shared::Control;
use crate::settings::Settings;

pub struct Spread {
    daemon: Arc<Daemon>,
    settings: Settings,
    /// What each election's loop was last told.
    yielding: Vec<bool>,
    last_hand_over: Option<BootTime>,
    /// Per election, the token this daemon leads it under and since when
    /// (as first seen here, within a renew interval).
    led_since: Vec<Option<(i64, BootTime)>>,
    /// The other live replicas as last seen, and when one last joined: no
    /// hand-over while replicas join (see
    /// `leaderd_core::spread::set_settled`).
    live: Vec<String>,
    joined_at: BootTime,
}

impl Spread {
    pub fn new(daemon: Arc<Daemon>, settings: Settings) -> Self {
        let n = daemon.all().len();
        Self {
            daemon,
            settings,
            yielding: vec![false; n],
            last_hand_over: None,
            led_since: vec![None; n],
            live: Vec::new(),
            joined_at: boot_now(),
        }
    }

    /// Plans on the group's presence rows and on what the loops last saw,
    /// and tells the loops; answers how many elections each other replica
    /// (by id) leads, as the loops saw.
    pub async fn act(&mut self, presence: &[ElectionRow]) -> HashMap<String, usize> {
        let now = boot_now();
        let (leading, leads) = self.look(now);
        let id = self.settings.id.as_str();
        let mut live: Vec<&str> = self
            .daemon
            .roster()
            .live(presence)
            .map(|(holder, _)| holder)
            .filter(|&holder| holder != id)
            .collect();
        // A replica may show in two slots for up to a ttl (one it lost, one
        // it took since): it is one replica.
        live.sort_unstable();
        live.dedup();
        if live
            .iter()
            .any(|l| !self.live.iter().any(|known| known == l))
        {
            self.joined_at = now;
        }
        self.live = live.iter().map(|&l| l.to_owned()).collect();
        let peers: Vec<(&str, usize)> = live
            .into_iter()
            .map(|peer| (peer, leads.get(peer).copied().unwrap_or(0)))
            .collect();
        let p = plan(self.settings.elections.len(), id, leading.len(), &peers);
        let peer_counts: Vec<usize> = peers.iter().map(|&(_, n)| n).collect();
        self.set_yielding(p.yield_free).await;
        let t = self.settings.timing;
        // Not while replicas join (a rolling update): an old one about to
        // leave raises everyone's share, and what was handed over to the
        // newcomer would have moved for nothing.
        let cooled = self
            .last_hand_over
            .is_none_or(|at| settled(now.saturating_since(at), t))
            && set_settled(now.saturating_since(self.joined_at), t);
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
            return leads;
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
        leads
    }

    /// One pass over the elections: the ones this daemon leads at `now`
    /// (by index, noting since when each has been led under its current
    /// token), and how many each other replica leads as this daemon's loops
    /// last saw (a sighting counts until a heartbeat past its lease: a
    /// follower attempts every heartbeat). Counted here rather than read from the table: a read of
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
    pub async fn set_yielding(&mut self, yielding: bool) {
        for (i, shared) in self.daemon.all().iter().enumerate() {
            if self.yielding[i] != yielding && shared.control(Control::Yield(yielding)) {
                self.yielding[i] = yielding;
            }
        }
    }
}
