//! Slot rows: a group keeps its replicas' rows in numbered slots
//! (`<prefix>slot-<n>`), not one row per replica, since pod names change at
//! every rollout and a row per name would stay in the table for good. The
//! presence rows (`presence`) and the away rows (`away`) both choose theirs
//! here.

use std::collections::HashSet;

use leaderd_store::ElectionRow;

use crate::runtime::roster::fnv1a;

/// The presence slot to take: this instance's own while it still holds
/// it (a failed round forgot the token, not the slot: its `acquired_at`,
/// which says when this replica started, stays); else one that no live
/// replica holds in `rows` (free, expired or not there yet), among the
/// lowest `live + 1` slots, so a group never has more presence rows than it
/// ever had live replicas at once (and a spare), whatever the replicas were
/// called. A row that can be taken now comes first (a row made just now is
/// blocked for a ttl). Which one is picked by `instance`, so that replicas
/// starting together mostly pick different ones (the loser of a tie is
/// refused and picks again next round).
pub fn free_slot(prefix: &str, rows: &[ElectionRow], instance: &str) -> String {
    let slot = |r: &ElectionRow| -> Option<u64> {
        r.name
            .strip_prefix(prefix)?
            .strip_prefix("slot-")?
            .parse()
            .ok()
    };
    if let Some(own) = rows
        .iter()
        .find(|r| r.live_holder().is_some() && r.instance.as_deref() == Some(instance))
        .filter(|r| slot(r).is_some())
    {
        return own.name.clone();
    }
    let taken: HashSet<u64> = rows
        .iter()
        .filter(|r| r.live_holder().is_some())
        .filter_map(slot)
        .collect();
    let open: HashSet<u64> = rows
        .iter()
        .filter(|r| r.remaining_us <= 0)
        .filter_map(slot)
        .collect();
    let free: Vec<u64> = (0..=taken.len() as u64)
        .filter(|n| !taken.contains(n))
        .collect();
    let open_now: Vec<u64> = free.iter().copied().filter(|n| open.contains(n)).collect();
    // Never empty: `taken.len() + 1` slots cannot all be taken.
    let pick = if open_now.is_empty() {
        &free
    } else {
        &open_now
    };
    let n = pick[usize::try_from(fnv1a(instance.as_bytes()) % pick.len() as u64).unwrap_or(0)];
    format!("{prefix}slot-{n}")
}

/// The slot row to make as a spare, when every row of the group is held:
/// a row made is blocked for a ttl, and a replica that started during a
/// rolling update would stay unknown that long to the release that should
/// name it. The lowest slot that has no row and is not `mine` (the slot
/// this replica has just taken, perhaps made by it after `rows` were read).
pub fn spare_slot(prefix: &str, rows: &[ElectionRow], mine: &str) -> Option<String> {
    let group: Vec<&ElectionRow> = rows
        .iter()
        .filter(|r| r.name.starts_with(prefix) && r.name != mine)
        .collect();
    if group.iter().any(|r| r.live_holder().is_none()) {
        return None;
    }
    let mut named: HashSet<&str> = group.iter().map(|r| r.name.as_str()).collect();
    named.insert(mine);
    (0..)
        .map(|n| format!("{prefix}slot-{n}"))
        .find(|name| !named.contains(name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::row;

    #[test]
    fn a_replica_takes_a_low_slot_no_live_replica_holds() {
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
    fn a_replica_keeps_its_own_slot_and_prefers_one_it_can_take_now() {
        let p = "leaderd-presence/0123456789abcdef/";
        // Its own live slot, though a lower one is free: kept (its
        // acquired_at says when it started).
        let rows = [
            row(&format!("{p}slot-0"), None, -5),
            row(&format!("{p}slot-1"), Some("me"), 900_000),
        ];
        assert_eq!(free_slot(p, &rows, "0/me"), format!("{p}slot-1"));
        // Slot 1 made just now (blocked), slot 2 released: 2 first, for
        // every newcomer.
        let rows = [
            row(&format!("{p}slot-0"), Some("a"), 900_000),
            row(&format!("{p}slot-1"), None, 1_100_000),
            row(&format!("{p}slot-2"), None, -1),
            row(&format!("{p}slot-3"), Some("b"), 900_000),
        ];
        for i in 0..20 {
            assert_eq!(
                free_slot(p, &rows, &format!("0/new-{i}")),
                format!("{p}slot-2")
            );
        }
    }

    #[test]
    fn a_spare_is_made_only_when_no_row_can_be_taken_now() {
        let p = "leaderd-presence/0123456789abcdef/";
        let held = [
            row(&format!("{p}slot-0"), Some("a"), 900_000),
            row(&format!("{p}slot-2"), Some("b"), 900_000),
            row("leaderd-presence/ffffffffffffffff/slot-1", None, -1),
        ];
        let mine = format!("{p}slot-3");
        assert_eq!(spare_slot(p, &held, &mine), Some(format!("{p}slot-1")));
        let mut with_free = held.to_vec();
        with_free.push(row(&format!("{p}slot-7"), None, -1));
        assert_eq!(spare_slot(p, &with_free, &mine), None);
        // A spare made just now (blocked) is a spare all the same.
        let mut blocked = held.to_vec();
        blocked.push(row(&format!("{p}slot-1"), None, 1_000_000));
        assert_eq!(spare_slot(p, &blocked, &mine), None);
        // The slot just taken is never the spare, whether `rows` (read
        // before it was taken) show it free, or not at all.
        let read_before = [held[0].clone(), held[1].clone()];
        assert_eq!(
            spare_slot(p, &read_before, &format!("{p}slot-1")),
            Some(format!("{p}slot-3"))
        );
        let free_before = [held[0].clone(), row(&format!("{p}slot-1"), None, -1)];
        assert_eq!(
            spare_slot(p, &free_before, &format!("{p}slot-1")),
            Some(format!("{p}slot-2"))
        );
    }
}
