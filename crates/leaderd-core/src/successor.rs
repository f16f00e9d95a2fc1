//! Naming the replica that should lead next at a graceful handover, from plain values.
//!
//! A release (SIGTERM, `POST /release`, `leaderd release`, a spread
//! hand-over) names a daemon instance in the row; for one heartbeat
//! ([`window`]) only that instance may take the row, by the database's
//! clock, then anyone may. So a rolling update, whose new pods start last,
//! moves each election once: from an old pod straight to a new one, not to
//! another old pod that is terminated next.
//!
//! The candidates are the live replicas that keep a presence row (a
//! draining replica keeps none); this module only orders them.

use std::cmp::Reverse;
use std::time::Duration;

use crate::time::Timing;

/// How long only the named successor may take a released row: one
/// heartbeat. A successor woken by the release takes it
/// within milliseconds; one that died costs the others this much, once.
pub fn window(timing: Timing) -> Duration {
    timing.heartbeat()
}

/// The most an exiting daemon waits in [`exit_linger`]: within the
/// shutdown's budget (2 s in all) whatever the heartbeat.
pub const LINGER_CAP: Duration = Duration::from_millis(50);

/// How long a daemon that is exiting keeps its database sessions open
/// after its elections' releases: a twentieth of the heartbeat, at most
/// [`LINGER_CAP`] (50 ms by default), when it released a row
/// (`released`), else nothing. The successor's takeover follows a release
/// within a round trip or two, and the end of the releaser's sessions, a
/// few milliseconds of the database server's work (and of the host's,
/// with the process's exit, where the replicas share one), competed with
/// it: the take of a SIGTERM handover on a 2-core host, median, 2.5–3.9 ms
/// without the wait and 1.3–1.6 ms with it (BENCHMARKS.md).
pub fn exit_linger(timing: Timing, released: bool) -> Duration {
    if released {
        (timing.heartbeat() / 20).min(LINGER_CAP)
    } else {
        Duration::ZERO
    }
}

/// A daemon's instance as its presence row and a row released to it carry
/// it: `{priority}/{uuid}`. The priority travels with the instance, so
/// naming a successor needs no column beyond the one that holds its name.
pub fn daemon_instance(priority: i32, uuid: &str) -> String {
    format!("{priority}/{uuid}")
}

/// The priority a daemon instance carries; `None` for an instance that is
/// not a daemon's (an older version's presence row): never a successor.
pub fn priority_of(instance: &str) -> Option<i32> {
    let (priority, rest) = instance.split_once('/')?;
    if rest.is_empty() {
        return None;
    }
    priority.parse().ok()
}

/// A live replica that could lead next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// Its daemon instance ([`daemon_instance`]).
    pub instance: &'a str,
    pub priority: i32,
    /// How long ago it started (its presence row is that old), by the
    /// database's clock: the least started last.
    pub started_ago: Duration,
    /// How many elections it leads, as this daemon last saw (and named it
    /// for since).
    pub leads: usize,
}

/// The successor among `candidates` (live, not draining, not this replica),
/// or `None` when there is none (release as before: anyone may take it).
///
/// The highest priority first. Among equals, with the spread on (`share`:
/// the most elections a replica should hold), a replica below its share,
/// so that a replica that leaves hands its elections to the ones with
/// room and the spread has nothing left to move; then the one that started
/// last (in a rolling update, a new pod); then the instance, so that every
/// replica orders the same view alike.
///
/// `staying`: the releasing replica stays (a spread hand-over, one
/// election of several released): with the spread, room then comes before
/// priority. A full replica named there would owe the election on by the
/// share rule at once, and two full replicas of a higher priority would
/// hand elections to each other for ever while one below its share got
/// none (the one exception: priority yields to the spread's shares).
pub fn choose<'a>(
    candidates: &[Candidate<'a>],
    share: Option<usize>,
    staying: bool,
) -> Option<&'a str> {
    candidates
        .iter()
        .min_by_key(|c| {
            let full = share.is_some_and(|s| c.leads >= s);
            (
                staying && full,
                Reverse(c.priority),
                full,
                c.started_ago,
                c.instance,
            )
        })
        .map(|c| c.instance)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exiting_daemon_lingers_only_after_a_release() {
        let default = Timing::new(Duration::from_secs(1), Duration::from_millis(1200)).unwrap();
        assert_eq!(exit_linger(default, true), Duration::from_millis(50));
        assert_eq!(exit_linger(default, false), Duration::ZERO);
        let fast = Timing::new(Duration::from_millis(200), Duration::from_millis(600)).unwrap();
        assert_eq!(exit_linger(fast, true), Duration::from_millis(10));
        let slow = Timing::new(Duration::from_secs(30), Duration::from_secs(36)).unwrap();
        assert_eq!(exit_linger(slow, true), LINGER_CAP);
    }

    fn cand(instance: &str, priority: i32, started_ago_s: u64, leads: usize) -> Candidate<'_> {
        Candidate {
            instance,
            priority,
            started_ago: Duration::from_secs(started_ago_s),
            leads,
        }
    }

    #[test]
    fn the_instance_carries_its_priority() {
        let i = daemon_instance(-3, "5f0c6a8e-0000-4000-8000-000000000000");
        assert_eq!(i, "-3/5f0c6a8e-0000-4000-8000-000000000000");
        assert!(i.len() <= 64, "fits the instance column");
        assert_eq!(priority_of(&i), Some(-3));
        assert_eq!(
            priority_of(&daemon_instance(1_000_000, "u")),
            Some(1_000_000)
        );
        // An older version's presence row: a bare UUID.
        assert_eq!(priority_of("5f0c6a8e-0000-4000-8000-000000000000"), None);
        assert_eq!(priority_of("x/u"), None);
        assert_eq!(priority_of("3/"), None);
    }

    #[test]
    fn nobody_to_name_names_nobody() {
        assert_eq!(choose(&[], None, false), None);
        assert_eq!(choose(&[], Some(2), false), None);
    }

    #[test]
    fn the_replica_that_started_last_is_named() {
        // A rolling update: two old pods, one new.
        let c = [
            cand("old-a", 0, 3600, 0),
            cand("new", 0, 2, 0),
            cand("old-b", 0, 1800, 0),
        ];
        assert_eq!(choose(&c, None, false), Some("new"));
        assert_eq!(choose(&c, Some(1), false), Some("new"));
    }

    #[test]
    fn a_higher_priority_comes_before_a_younger_one() {
        let c = [
            cand("young", 0, 1, 0),
            cand("preferred", 5, 9000, 0),
            cand("low", -1, 0, 0),
        ];
        assert_eq!(choose(&c, None, false), Some("preferred"));
    }

    #[test]
    fn with_the_spread_a_replica_below_its_share_comes_first() {
        // Six elections on three replicas (share 2): the youngest already
        // holds its two, so the next with room is named.
        let c = [
            cand("new-full", 0, 1, 2),
            cand("new-room", 0, 5, 1),
            cand("old", 0, 900, 2),
        ];
        assert_eq!(choose(&c, Some(2), false), Some("new-room"));
        // Without the spread, shares do not count.
        assert_eq!(choose(&c, None, false), Some("new-full"));
        // Everyone full: the order as without shares.
        let c = [cand("a", 0, 10, 2), cand("b", 0, 3, 2)];
        assert_eq!(choose(&c, Some(2), false), Some("b"));
        // Priority before room (the highest priority first);
        // room orders the replicas of one priority.
        let c = [
            cand("hi-full", 9, 1, 2),
            cand("lo", 0, 10, 0),
            cand("hi", 9, 20, 1),
        ];
        assert_eq!(choose(&c, Some(2), false), Some("hi"));
        let c = [cand("hi-full", 9, 1, 2), cand("lo", 0, 10, 0)];
        assert_eq!(choose(&c, Some(2), false), Some("hi-full"));
    }

    #[test]
    fn a_replica_that_stays_hands_over_to_room_before_priority() {
        // Six elections, three replicas (share 2): A and B (priority 1)
        // hold three each, C (priority 0) none. A spread hand-over by A
        // that named B (priority first) would leave 2/4/0, and B's would
        // name A back: the two would swap elections for ever.
        let from_a = [cand("b", 1, 5, 3), cand("c", 0, 9, 0)];
        assert_eq!(choose(&from_a, Some(2), true), Some("c"));
        let from_b = [cand("a", 1, 5, 3), cand("c", 0, 9, 0)];
        assert_eq!(choose(&from_b, Some(2), true), Some("c"));
        // Among those with room, priority still leads, then the youngest.
        let c = [
            cand("full", 9, 1, 2),
            cand("room-lo", 0, 1, 1),
            cand("room-hi", 3, 50, 0),
        ];
        assert_eq!(choose(&c, Some(2), true), Some("room-hi"));
        // Nobody with room: the order of a replica that leaves.
        let c = [cand("hi", 9, 50, 2), cand("lo", 0, 1, 2)];
        assert_eq!(choose(&c, Some(2), true), Some("hi"));
        // Without the spread, staying changes nothing.
        let c = [cand("hi", 9, 50, 5), cand("lo", 0, 1, 0)];
        assert_eq!(choose(&c, None, true), Some("hi"));
    }

    #[test]
    fn equal_candidates_are_ordered_alike_everywhere() {
        let a = [cand("b", 0, 4, 0), cand("a", 0, 4, 0)];
        let b = [cand("a", 0, 4, 0), cand("b", 0, 4, 0)];
        assert_eq!(choose(&a, None, false), Some("a"));
        assert_eq!(choose(&b, None, false), Some("a"));
    }

    #[test]
    fn the_window_is_one_heartbeat() {
        let t = Timing::new(Duration::from_millis(1000), Duration::from_millis(1200)).unwrap();
        assert_eq!(window(t), Duration::from_millis(1000));
    }
}
