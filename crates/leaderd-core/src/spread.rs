//! Spreading several elections across the live replicas: with E elections and R live replicas, no
//! replica holds more than ceil(E / R) once things are stable.
//!
//! [`plan`] is the whole rule, from plain counts: what this replica leads,
//! and what each other live replica leads (as the daemon last saw: its
//! followers' attempts answer who holds each election). Two levers carry it out, neither of which can make two leaders:
//! - **yield**: a replica at or above its share, while another live replica
//!   is below its own, attempts a free election one heartbeat late, so the
//!   one below takes it first (and it still takes it if nobody does: an
//!   election is never left leaderless for balance);
//! - **hand over**: a replica above its share, while one below is waiting,
//!   releases its surplus (the ordinary release: step down locally, free the
//!   row, wake the others), and holds off for a while so that the waiting
//!   one, not itself, takes them.
//!
//! Who is live comes from the database: every spreading daemon keeps a
//! presence row in the lock table, named [`PRESENCE_PREFIX`] + group +
//! its id, leased and judged by the database's clock like any election.

use std::time::Duration;

use crate::time::Timing;

/// Lock-table names that start with this are presence rows, not elections;
/// no election may be named so.
pub const PRESENCE_PREFIX: &str = "leaderd-presence/";

/// Whether a presence row with `remaining` of its lease (by the database's
/// clock) counts its replica as live. A live replica renews it every renew
/// interval, so it has more than `ttl - 2 × renew interval` left; one that
/// missed two renewals is counted out before its lease runs out (likely
/// dead: yielding to it, or handing it elections, left them leaderless up
/// to a heartbeat).
pub fn present(remaining: Duration, timing: Timing) -> bool {
    remaining > timing.ttl().saturating_sub(timing.renew_every() * 2)
}

/// Whether an election this replica has led for `led_for` may be handed
/// over: not before a cool-down of `ttl + heartbeat` (one just received may
/// come from a replica still holding off from it; two replicas that counted
/// a dead peer differently handed one back and forth into a 2 s gap). The
/// same cool-down separates one replica's hand-overs.
pub fn settled(led_for: Duration, timing: Timing) -> bool {
    led_for >= timing.ttl() + timing.heartbeat()
}

/// Whether the set of live replicas, no replica having joined for
/// `stable_for`, has settled enough for a hand-over: two cool-downs (see
/// [`settled`]). In a rolling update a replica joins and an old one leaves
/// every few seconds; a hand-over to the newcomer while an old replica is
/// about to leave (raising every share) moves an election for nothing, and
/// a second time later. A release names its successor by the shares
/// anyway, so the update itself keeps things balanced; the spread only
/// mends what is left once replicas stop joining. A replica that left
/// (killed) starts no wait: the survivors' shares only grow.
pub fn set_settled(stable_for: Duration, timing: Timing) -> bool {
    stable_for >= (timing.ttl() + timing.heartbeat()) * 2
}

/// What the spread asks of one replica now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Plan {
    /// The most elections this replica should hold: ceil(E / R).
    pub share: usize,
    /// Attempt free elections a heartbeat late, to let another replica that
    /// is below its share take them first.
    pub yield_free: bool,
    /// How many of the elections this replica leads to release now.
    pub hand_over: usize,
}

/// ceil(elections / replicas); every election's share with no replica.
pub fn share(elections: usize, replicas: usize) -> usize {
    elections.div_ceil(replicas.max(1))
}

/// The plan for the replica `me` that leads `mine` of `elections`, while
/// the other live replicas lead `peers` (id and count each).
///
/// Replicas above their share give, in a fixed order (most first, then by
/// id), only what the replicas below are missing, so that every replica
/// that plans on the same counts agrees who gives what: two above the share
/// never both give away what one below can take (it would only come back).
pub fn plan(elections: usize, me: &str, mine: usize, peers: &[(&str, usize)]) -> Plan {
    let share = share(elections, peers.len() + 1);
    let missing: usize = peers.iter().map(|&(_, p)| share.saturating_sub(p)).sum();
    let ahead = |&&(id, p): &&(&str, usize)| p > mine || (p == mine && id < me);
    let given_before_me: usize = peers
        .iter()
        .filter(|&&(_, p)| p > share)
        .filter(ahead)
        .map(|&(_, p)| p - share)
        .sum();
    let hand_over = mine
        .saturating_sub(share)
        .min(missing.saturating_sub(given_before_me));
    Plan {
        share,
        yield_free: missing > 0 && mine >= share,
        hand_over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presence_that_missed_two_renewals_is_counted_out() {
        // Defaults: ttl 1.2 s, renewed every 400 ms: a live replica's row
        // has 800 ms or more left; below 400 ms it missed two renewals.
        let t = Timing::new(Duration::from_millis(1000), Duration::from_millis(1200)).unwrap();
        assert!(present(Duration::from_millis(800), t));
        assert!(present(Duration::from_millis(401), t));
        assert!(!present(Duration::from_millis(400), t));
        assert!(!present(Duration::ZERO, t));
    }

    #[test]
    fn an_election_is_handed_over_only_once_led_for_a_cool_down() {
        let t = Timing::new(Duration::from_millis(1000), Duration::from_millis(1200)).unwrap();
        assert!(!settled(Duration::ZERO, t));
        assert!(!settled(Duration::from_millis(2199), t));
        assert!(settled(Duration::from_millis(2200), t));
    }

    #[test]
    fn hand_overs_wait_for_the_replica_set_to_hold_still_for_two_cool_downs() {
        let t = Timing::new(Duration::from_millis(1000), Duration::from_millis(1200)).unwrap();
        assert!(!set_settled(Duration::ZERO, t));
        assert!(!set_settled(Duration::from_millis(4399), t));
        assert!(set_settled(Duration::from_millis(4400), t));
    }

    #[test]
    fn share_is_the_ceiling() {
        assert_eq!(share(6, 1), 6);
        assert_eq!(share(6, 2), 3);
        assert_eq!(share(6, 4), 2);
        assert_eq!(share(7, 3), 3);
        assert_eq!(share(1, 3), 1);
        assert_eq!(share(6, 0), 6);
    }

    #[test]
    fn alone_it_takes_everything_without_yielding() {
        let p = plan(6, "a", 0, &[]);
        assert_eq!(
            p,
            Plan {
                share: 6,
                yield_free: false,
                hand_over: 0
            }
        );
        assert_eq!(plan(6, "a", 6, &[]).hand_over, 0);
    }

    #[test]
    fn a_second_replica_gets_half() {
        // The first took all six; the second has none.
        let first = plan(6, "a", 6, &[("b", 0)]);
        assert_eq!(
            first,
            Plan {
                share: 3,
                yield_free: true,
                hand_over: 3
            }
        );
        let second = plan(6, "b", 0, &[("a", 6)]);
        assert_eq!(
            second,
            Plan {
                share: 3,
                yield_free: false,
                hand_over: 0
            }
        );
    }

    #[test]
    fn a_third_replica_gets_a_third_from_both() {
        assert_eq!(plan(6, "a", 3, &[("b", 3), ("c", 0)]).hand_over, 1);
        assert_eq!(plan(6, "b", 3, &[("a", 3), ("c", 0)]).hand_over, 1);
        assert!(!plan(6, "c", 0, &[("a", 3), ("b", 3)]).yield_free);
        assert!(plan(6, "a", 3, &[("b", 3), ("c", 0)]).yield_free);
    }

    #[test]
    fn stable_and_balanced_means_no_action() {
        for (mine, peers) in [
            (2, vec![2, 2]),
            (3, vec![3]),
            (3, vec![3, 1]),
            (2, vec![3, 2]),
        ] {
            let named: Vec<_> = peers.iter().map(|&n| ("x", n)).collect();
            let p = plan(7, "a", mine, &named);
            if peers.iter().all(|&n| n >= p.share) {
                assert!(!p.yield_free, "{mine} {peers:?}");
            }
            assert_eq!(p.hand_over, 0, "{mine} {peers:?}");
        }
    }

    #[test]
    fn a_dead_peer_that_held_its_share_does_not_slow_anyone() {
        // 2/2/2 and one is killed: until its presence expires it still
        // counts with its two; nobody is below, so nobody yields.
        let p = plan(6, "a", 2, &[("b", 2), ("c", 2)]);
        assert!(!p.yield_free);
        assert_eq!(p.hand_over, 0);
    }

    #[test]
    fn two_above_the_share_give_no_more_than_is_missing() {
        // Share 2, one replica missing one: of the two above, the one with
        // more gives, the other keeps.
        let (a, b) = (("a", 4), ("b", 3));
        assert_eq!(plan(7, "a", 4, &[b, ("c", 1)]).share, 3);
        assert_eq!(plan(7, "a", 4, &[b, ("c", 0)]).hand_over, 1);
        assert_eq!(plan(7, "b", 3, &[a, ("c", 0)]).hand_over, 0);
        // Equal counts: the smaller id gives first.
        assert_eq!(
            plan(6, "a", 3, &[("b", 3), ("c", 1), ("d", 0)]).hand_over,
            1
        );
        assert_eq!(
            plan(6, "b", 3, &[("a", 3), ("c", 1), ("d", 0)]).hand_over,
            1
        );
        assert_eq!(
            plan(8, "a", 3, &[("b", 3), ("c", 1), ("d", 1)]).hand_over,
            1
        );
        assert_eq!(
            plan(8, "b", 3, &[("a", 3), ("c", 1), ("d", 1)]).hand_over,
            1
        );
    }

    #[test]
    fn below_the_share_never_yields_nor_hands_over() {
        for peers in [vec![0], vec![5, 0], vec![1, 1, 1]] {
            let named: Vec<_> = peers.iter().map(|&n| ("x", n)).collect();
            let p = plan(6, "a", 0, &named);
            assert!(!p.yield_free && p.hand_over == 0, "{peers:?}");
        }
    }

    #[test]
    fn on_one_view_the_givers_give_exactly_what_is_missing_or_all_they_have() {
        // Every replica plans on the same view of the counts: the total
        // handed over stays close to what is missing.
        for e in 1..=12usize {
            for r in 1..=4usize {
                for counts in counts_of(e, r) {
                    let missing: usize = {
                        let s = share(e, r);
                        counts.iter().map(|&c| s.saturating_sub(c)).sum()
                    };
                    let s = share(e, r);
                    let surplus: usize = counts.iter().map(|&c| c.saturating_sub(s)).sum();
                    let ids: Vec<String> = (0..r).map(|i| format!("r{i}")).collect();
                    let given: usize = (0..r)
                        .map(|i| {
                            let peers: Vec<(&str, usize)> = (0..r)
                                .filter(|&j| j != i)
                                .map(|j| (ids[j].as_str(), counts[j]))
                                .collect();
                            plan(e, &ids[i], counts[i], &peers).hand_over
                        })
                        .sum();
                    assert_eq!(given, missing.min(surplus), "{e} {counts:?}");
                }
            }
        }
    }

    /// Every way of holding at most `e` elections among `r` replicas.
    fn counts_of(e: usize, r: usize) -> Vec<Vec<usize>> {
        if r == 0 {
            return vec![Vec::new()];
        }
        let mut out = Vec::new();
        for first in 0..=e {
            for mut rest in counts_of(e - first, r - 1) {
                rest.insert(0, first);
                out.push(rest);
            }
        }
        out
    }
}
