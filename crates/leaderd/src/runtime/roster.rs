//! Who could lead next: the live replicas of this daemon's group as its
//! presence rows were last read, and the successor a release names. State and choices only: the presence task
//! (`presence`) reads the table and fills it in, a release (the election
//! loop) asks it, and the rule itself is `leaderd_core::successor`.
//!
//! Every daemon keeps a presence row, one election or many, spread on or
//! off: `leaderd-presence/<group>/slot-<n>`, held by this daemon's instance
//! ([`Roster::daemon`], which carries its priority), so its `acquired_at`
//! (the database's clock) says when the instance started. A replica that
//! drains (released with a hold, shutting down, or its app failing) keeps
//! none, so it is never named.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leaderd_core::spread::{present, share, PRESENCE_PREFIX};
use leaderd_core::successor::{self, choose, priority_of, Candidate};
use leaderd_core::{BootTime, Timing};
use leaderd_store::ElectionRow;

use crate::settings::Settings;

/// A successor named by a release, owned (see [`leaderd_store::Successor`]).
#[derive(Debug, Clone)]
pub struct Heir {
    /// The replica's id, for the logs.
    pub id: String,
    pub daemon: Arc<str>,
    pub window: Duration,
}

#[derive(Debug)]
pub struct Roster {
    /// This daemon's instance as presence rows and named successors carry
    /// it (`leaderd_core::successor::daemon_instance`).
    daemon: Arc<str>,
    /// The group's presence rows start with this.
    prefix: String,
    timing: Timing,
    /// How many elections shares are counted over: with the spread on and
    /// several elections; `None` otherwise (shares do not count).
    spread_over: Option<usize>,
    view: Mutex<View>,
    /// Held while a release reads the rows again, with when the last such
    /// read began: elections released together (a thousand at a shutdown)
    /// read once, not once each.
    rereads: tokio::sync::Mutex<Option<BootTime>>,
    /// Whether the presence task has had its first say: this replica's
    /// presence held, or none to keep (see [`Roster::joined`]).
    joined: tokio::sync::watch::Sender<bool>,
    /// Whether the release waiter listens (see [`Roster::joined`]).
    listening: tokio::sync::watch::Sender<bool>,
    /// The replica has joined (or the wait for it ran out): the election
    /// loops begin, and the replica may be ready (`/readyz`). Set once, by
    /// `presence::begin`.
    begun: std::sync::atomic::AtomicBool,
    /// Wakes the presence task when this replica begins to drain or its
    /// app starts to fail, so that it leaves its presence row at once, not
    /// at its next round (and at the ends of both, to take it again).
    nudge: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct View {
    peers: Vec<Peer>,
    /// When `peers` was read (the boot clock), if ever.
    read_at: Option<BootTime>,
    /// How many elections each other replica (by id) leads, as this
    /// daemon's loops last saw (filled in by the spread).
    leads: HashMap<String, usize>,
    /// Successors named lately, so that elections released together are
    /// shared out before the loops see who took them.
    named: Vec<(Arc<str>, BootTime)>,
    /// The read of `peers` for which a release said it had nobody to name
    /// (see [`Roster::alone_unsaid`]).
    alone_said: Option<BootTime>,
}

/// Another live replica, as its presence row showed it.
#[derive(Debug, Clone)]
struct Peer {
    id: String,
    instance: Arc<str>,
    priority: i32,
    /// How long it had held its presence row when it was read.
    started_ago: Duration,
}

impl Roster {
    pub fn new(settings: &Settings) -> Self {
        let uuid = uuid::Uuid::new_v4().to_string();
        Self {
            daemon: successor::daemon_instance(settings.priority, &uuid).into(),
            prefix: group_prefix(&settings.elections),
            timing: settings.timing,
            spread_over: (settings.spread && settings.elections.len() > 1)
                .then_some(settings.elections.len()),
            view: Mutex::new(View::default()),
            rereads: tokio::sync::Mutex::new(None),
            joined: tokio::sync::watch::Sender::new(false),
            begun: std::sync::atomic::AtomicBool::new(false),
            listening: tokio::sync::watch::Sender::new(false),
            nudge: tokio::sync::Notify::new(),
        }
    }

    /// The daemon's timing.
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// This replica begins or ends a drain, or its app starts or stops
    /// failing: its presence row goes (or comes back) now.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Resolves at a [`Roster::nudge`].
    pub async fn nudged(&self) {
        self.nudge.notified().await;
    }

    /// The presence task took this replica's presence row, or keeps none.
    pub fn set_joined(&self) {
        self.joined
            .send_if_modified(|j| !std::mem::replace(j, true));
    }

    /// The election loops may begin: past the wait for [`Roster::joined`]
    /// (see `presence::begin`, which then wakes them).
    pub fn set_begun(&self) {
        self.begun.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the loops may begin (see [`Roster::set_begun`]): a replica
    /// is ready only then, so that a rolling update that stops an old
    /// replica the moment a new one is ready names the new one.
    pub fn begun(&self) -> bool {
        self.begun.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The release waiter listens (or has nothing to listen to): a
    /// release that names this replica wakes it.
    pub fn set_listening(&self) {
        self.listening
            .send_if_modified(|l| !std::mem::replace(l, true));
    }

    /// Waits (at most `within`) until [`Roster::set_joined`] and
    /// [`Roster::set_listening`]: the daemon waits so before its election
    /// loops' first attempts, which make the replica ready (`/readyz`), so that a
    /// replica is a candidate to be named, and hears the release that
    /// names it, before it is ready: a rolling update may stop an old
    /// replica the moment a new one is, and a successor that missed the
    /// wake-up came at its next poll while the others were held off.
    pub async fn joined(&self, within: Duration) {
        let mut joined = self.joined.subscribe();
        let mut listening = self.listening.subscribe();
        let both = async {
            let _ = joined.wait_for(|j| *j).await;
            let _ = listening.wait_for(|l| *l).await;
        };
        let _ = tokio::time::timeout(within, both).await;
    }

    /// This daemon's instance: its presence row's, the one attempts carry
    /// and releases name.
    pub fn daemon(&self) -> &Arc<str> {
        &self.daemon
    }

    /// Where this daemon's group's presence rows are.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The turn to read the rows again for a release, holding when the
    /// last such read began (see [`Roster::rereads`]).
    pub async fn reread_turn(&self) -> tokio::sync::MutexGuard<'_, Option<BootTime>> {
        self.rereads.lock().await
    }

    /// The group's presence rows in `rows` whose replica counts as live
    /// (see [`present`]), with its id: the one rule the successor and the
    /// spread both count by.
    pub fn live<'a>(
        &self,
        rows: &'a [ElectionRow],
    ) -> impl Iterator<Item = (&'a str, &'a ElectionRow)> + use<'a, '_> {
        rows.iter()
            .filter(|row| row.name.starts_with(&self.prefix))
            .filter_map(|row| {
                let id = row.live_holder()?;
                let remaining = Duration::from_micros(row.remaining_us.unsigned_abs());
                present(remaining, self.timing).then_some((id, row))
            })
    }

    /// The group's presence rows, read at `now`: the live replicas other
    /// than this one, as candidates.
    pub fn see(&self, rows: &[ElectionRow], now: BootTime) {
        let peers = self
            .live(rows)
            .filter_map(|(id, row)| {
                let instance = row.instance.as_deref()?;
                if instance == &*self.daemon {
                    return None;
                }
                Some(Peer {
                    id: id.to_owned(),
                    priority: priority_of(instance)?,
                    instance: instance.into(),
                    started_ago: Duration::from_micros(row.held_us.unsigned_abs()),
                })
            })
            .collect();
        let mut view = self.view();
        view.peers = peers;
        view.read_at = Some(now);
    }

    /// How many other replicas compete (keep a presence row), as the rows
    /// read within a ttl of `now` show; `None` when they were not read
    /// since.
    pub fn others_competing(&self, now: BootTime) -> Option<usize> {
        let view = self.view();
        self.fresh(&view, now).map(|_| view.peers.len())
    }

    /// When the rows `view` holds were read, if within a ttl of `now`: an
    /// older read does not say who is live.
    fn fresh(&self, view: &View, now: BootTime) -> Option<BootTime> {
        view.read_at
            .filter(|at| now.saturating_since(*at) <= self.timing.ttl())
    }

    /// Whether a release at `now` has nobody to name because no other
    /// replica competes (as rows read within a ttl show), and that was not
    /// said yet for this read of the rows: the elections a shutdown releases
    /// together share a read, and would otherwise each say it (a thousand
    /// warnings for one fact).
    pub fn alone_unsaid(&self, now: BootTime) -> bool {
        let mut view = self.view();
        let read = self.fresh(&view, now);
        if read.is_none() || !view.peers.is_empty() || view.alone_said == read {
            return false;
        }
        view.alone_said = read;
        true
    }

    /// How many elections each other replica leads (see [`View::leads`]).
    pub fn count_leads(&self, leads: HashMap<String, usize>) {
        self.view().leads = leads;
    }

    /// The successor to name for one election released at `now`, if any
    /// replica is known to be live: `leaving` when this replica goes
    /// (shutting down, draining), so that shares count without it.
    pub fn successor(&self, now: BootTime, leaving: bool) -> Option<Heir> {
        let t = self.timing;
        let mut view = self.view();
        // Not heard from the table for a ttl: who is live is not known.
        let read_at = self.fresh(&view, now)?;
        let since_read = now.saturating_since(read_at);
        view.named
            .retain(|(_, at)| now.saturating_since(*at) < t.ttl());
        let candidates: Vec<Candidate<'_>> = view
            .peers
            .iter()
            .map(|p| Candidate {
                instance: &p.instance,
                priority: p.priority,
                started_ago: p.started_ago + since_read,
                leads: view.leads.get(&p.id).copied().unwrap_or(0)
                    + view.named.iter().filter(|(n, _)| *n == p.instance).count(),
            })
            .collect();
        let replicas = candidates.len() + usize::from(!leaving);
        let shares = self.spread_over.map(|e| share(e, replicas));
        let chosen: Arc<str> = choose(&candidates, shares, !leaving)?.into();
        let id = view
            .peers
            .iter()
            .find(|p| p.instance == chosen)
            .map(|p| p.id.clone())
            .unwrap_or_default();
        view.named.push((chosen.clone(), now));
        Some(Heir {
            id,
            daemon: chosen,
            window: successor::window(t),
        })
    }

    fn view(&self) -> MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The group's presence rows start with this: a hash of the set of
/// elections, so daemons that run different sets do not count one another.
pub fn group_prefix(elections: &[String]) -> String {
    let mut sorted: Vec<&str> = elections.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    format!(
        "{PRESENCE_PREFIX}{:016x}/",
        fnv1a(sorted.join("\n").as_bytes())
    )
}

/// A stable hash (FNV-1a, 64 bits): the same in every build and process,
/// unlike std's hasher.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(elections: &[&str], priority: i32) -> Settings {
        let mut argv = vec!["leaderd".to_owned(), "--id".to_owned(), "me".to_owned()];
        for e in elections {
            argv.extend(["--election".to_owned(), (*e).to_owned()]);
        }
        argv.extend(["--priority".to_owned(), priority.to_string()]);
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        Settings::load(&cli.config(), &crate::settings::ProcessEnv).unwrap()
    }

    fn row(name: &str, id: &str, instance: &str, remaining_ms: i64, held_s: i64) -> ElectionRow {
        ElectionRow {
            name: name.into(),
            holder: Some(id.into()),
            token: 1,
            remaining_us: remaining_ms * 1000,
            instance: Some(instance.into()),
            held_us: held_s * 1_000_000,
            address: None,
            successor: None,
        }
    }

    #[test]
    fn a_release_names_the_live_replica_that_started_last() {
        let r = Roster::new(&settings(&["jobs"], 0));
        let p = r.prefix().to_owned();
        let now = BootTime::from_since_boot(Duration::from_secs(10));
        assert!(r.successor(now, true).is_none(), "nothing read yet");
        r.see(
            &[
                row(&format!("{p}slot-0"), "old", "0/a", 1000, 3600),
                row(&format!("{p}slot-1"), "new", "0/b", 1000, 2),
                // Missed two renewals: likely dead.
                row(&format!("{p}slot-2"), "stuck", "0/c", 300, 1),
                // An older version's row, another group's, this daemon's.
                row(&format!("{p}slot-3"), "v1", "9f1e-uuid", 1000, 0),
                row(
                    "leaderd-presence/ffffffffffffffff/slot-0",
                    "x",
                    "0/x",
                    1000,
                    0,
                ),
                row(&format!("{p}slot-4"), "me", r.daemon(), 1000, 0),
            ],
            now,
        );
        let heir = r.successor(now, true).expect("a successor");
        assert_eq!(&*heir.daemon, "0/b");
        assert_eq!(heir.id, "new");
        assert_eq!(heir.window, Duration::from_secs(1));
        // A view older than a ttl names nobody.
        assert!(r
            .successor(now + Duration::from_millis(1201), true)
            .is_none());
    }

    #[test]
    fn elections_released_together_are_shared_out_by_the_spread_shares() {
        // Six elections; this replica leaves two of them to the others, who
        // lead two each (old) and none (new, started last).
        let names = ["a", "b", "c", "d", "e", "f"];
        let r = Roster::new(&settings(&names, 0));
        let p = r.prefix().to_owned();
        let now = BootTime::from_since_boot(Duration::from_secs(10));
        r.see(
            &[
                row(&format!("{p}slot-0"), "old", "0/old", 1000, 3600),
                row(&format!("{p}slot-1"), "new", "0/new", 1000, 2),
                row(&format!("{p}slot-2"), "newer", "0/newer", 1000, 1),
            ],
            now,
        );
        r.count_leads(HashMap::from([("old".into(), 2), ("new".into(), 1)]));
        // Leaving: share ceil(6 / 3) = 2; the newest has room for two.
        let named: Vec<String> = (0..3)
            .map(|_| r.successor(now, true).unwrap().daemon.to_string())
            .collect();
        assert_eq!(named, ["0/newer", "0/newer", "0/new"]);
    }

    #[test]
    fn a_replica_that_stays_names_room_before_priority() {
        // Six elections on three replicas (share 2): this one and b
        // (priority 1) lead three each, c (priority 0) none. A spread
        // hand-over naming b would leave 2/4/0, and b's would name this one
        // back, for ever; it names c. Leaving, the order is priority
        // first: b, full or not.
        let names = ["a", "b", "c", "d", "e", "f"];
        let r = Roster::new(&settings(&names, 1));
        let p = r.prefix().to_owned();
        let now = BootTime::from_since_boot(Duration::from_secs(10));
        r.see(
            &[
                row(&format!("{p}slot-0"), "b", "1/b", 1000, 5),
                row(&format!("{p}slot-1"), "c", "0/c", 1000, 9),
                row(&format!("{p}slot-2"), "me", r.daemon(), 1000, 20),
            ],
            now,
        );
        r.count_leads(HashMap::from([("b".into(), 3)]));
        assert_eq!(&*r.successor(now, false).unwrap().daemon, "0/c");
        assert_eq!(&*r.successor(now, true).unwrap().daemon, "1/b");
    }

    #[test]
    fn having_nobody_to_name_is_said_once_per_read_of_the_rows() {
        let r = Roster::new(&settings(&["jobs"], 0));
        let p = r.prefix().to_owned();
        let at = |ms| BootTime::from_since_boot(Duration::from_millis(ms));
        assert!(!r.alone_unsaid(at(0)), "nothing read: not known");
        r.see(&[], at(10));
        assert!(r.alone_unsaid(at(11)));
        // The other elections released with it: said already.
        assert!(!r.alone_unsaid(at(12)) && !r.alone_unsaid(at(13)));
        // A later read, still alone: said again.
        r.see(&[], at(500));
        assert!(r.alone_unsaid(at(501)));
        // Another replica competes: nothing to say.
        r.see(&[row(&format!("{p}slot-1"), "b", "0/b", 1000, 5)], at(900));
        assert!(!r.alone_unsaid(at(901)));
        // A read older than a ttl says nothing either.
        r.see(&[], at(1000));
        assert!(!r.alone_unsaid(at(5000)));
    }

    #[test]
    fn the_priority_rides_in_the_instance() {
        let r = Roster::new(&settings(&["jobs"], -7));
        assert!(r.daemon().starts_with("-7/"), "{}", r.daemon());
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
