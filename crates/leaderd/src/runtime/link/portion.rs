//! How much of the queue one batch takes. A renewal wave waits for the
//! batch ahead of it on the connection: at a cold start (thousands of
//! followers attempting at once, thousands of leases just taken renewed by
//! their own loops) or a spread's hand-over (thousands of releases; on
//! MySQL one statement each), one batch of everything took longer than a
//! lease, and every lease waiting behind it was lost, over and over. So a
//! batch carries at most [`ATTEMPTS_PER_BATCH`] of the loops' attempts,
//! renewals first, and [`RELEASES_PER_BATCH`] releases; the rest stay
//! queued, in order, for the batches after it. Never held back: the
//! daemon's own rows (presence, away notes), which others read to count
//! this replica in. A wake-up lock waits behind any release queued before
//! it (its row's may be among them: the lock is freed only once the row
//! is, so that the waiters it wakes find the row free).

use std::collections::VecDeque;

use leaderd_core::spread::PRESENCE_PREFIX;
use leaderd_core::AWAY_PREFIX;

use super::{Job, Request};

/// The loops' attempts one batch carries at most: as many as a renewal
/// wave's group (`leaderd_core::WAVE_GROUP`), whose statement cost
/// is known to fit well within a renewal interval.
pub(super) const ATTEMPTS_PER_BATCH: usize = leaderd_core::WAVE_GROUP;

/// The releases one batch carries at most: one statement on every
/// backend, but on MySQL a row locked elsewhere sends them one by one
/// (about 0.3 ms each here), and a batch of them is cut at 800 ms.
pub(super) const RELEASES_PER_BATCH: usize = 256;

/// Takes the next batch's jobs out of `pending` (see the module's docs).
pub(super) fn take(pending: &mut VecDeque<Job>) -> Vec<Job> {
    // An attempt its loop gave up on goes nowhere: counted, a backlog of
    // them would fill the batches.
    pending.retain(|job| !matches!(job, Job::Attempt { reply, .. } if reply.is_closed()));
    // Renewals go first, then attempts to take a row, the two within one
    // cap: at a cold start a daemon renews thousands of leases just taken
    // from their own loops (until a wave takes them up), and all of them
    // at once outlasted their leases as surely as the takes did. Takes
    // waiting keep half the cap: renewals queued batch after batch (a
    // survivor renewing the thousands it just took) would starve them, and
    // leave the rows nobody took leaderless.
    let (renewals, takes) = pending.iter().fold((0, 0), |(r, t), job| match job {
        Job::Attempt { req, .. } if own_row(req) => (r, t),
        Job::Attempt { req, .. } if renews(req) => (r + 1, t),
        Job::Attempt { .. } => (r, t + 1),
        _ => (r, t),
    });
    let mut renewals_room = ATTEMPTS_PER_BATCH - takes.min(ATTEMPTS_PER_BATCH / 2);
    let mut takes_room = ATTEMPTS_PER_BATCH - renewals.min(renewals_room);
    let mut releases_room = RELEASES_PER_BATCH;
    let mut release_left = false;
    let mut batch = Vec::new();
    let mut left = VecDeque::new();
    for job in pending.drain(..) {
        let room = match &job {
            Job::Attempt { req, .. } if own_row(req) => true,
            Job::Attempt { req, .. } if renews(req) => within(&mut renewals_room),
            Job::Attempt { .. } => within(&mut takes_room),
            Job::Release { .. } => {
                let fits = !release_left && within(&mut releases_room);
                release_left |= !fits;
                fits
            }
            Job::WakeLock { .. } => !release_left,
            Job::Read { .. } | Job::Decline { .. } => true,
        };
        if room {
            batch.push(job);
        } else {
            left.push_back(job);
        }
    }
    *pending = left;
    batch
}

/// Whether one more fits in `room`, counting it.
fn within(room: &mut usize) -> bool {
    let fits = *room > 0;
    *room = room.saturating_sub(1);
    fits
}

/// An attempt that renews a lease held.
fn renews(req: &Request) -> bool {
    req.held_token.is_some()
}

/// A row of the daemon's own (its presence, its away note): others read
/// it to count this replica in, and it is one or two rows.
fn own_row(req: &Request) -> bool {
    req.election.starts_with(PRESENCE_PREFIX) || req.election.starts_with(AWAY_PREFIX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leaderd_core::BootTime;
    use tokio::sync::oneshot;

    use super::*;

    fn attempt(i: usize) -> Job {
        attempt_of(&format!("e{i}"), None)
    }

    /// A reply whose loop still waits (its receiver kept for good).
    fn waited_for<T>() -> oneshot::Sender<T> {
        let (tx, rx) = oneshot::channel();
        std::mem::forget(rx);
        tx
    }

    fn attempt_of(election: &str, held_token: Option<i64>) -> Job {
        Job::Attempt {
            req: Request {
                election: election.into(),
                holder: "a".into(),
                instance: "ia".into(),
                ttl: Duration::from_millis(1200),
                held_token,
                daemon: None,
                address: None,
            },
            until: BootTime::from_since_boot(Duration::from_secs(1)),
            reply: waited_for(),
        }
    }

    fn release(i: usize) -> Job {
        Job::Release {
            election: format!("e{i}"),
            instance: "ia".into(),
            heir: None,
            reply: oneshot::channel().0,
        }
    }

    fn free_lock(i: usize) -> Job {
        Job::WakeLock {
            election: format!("e{i}"),
            free: Some(1),
            reply: oneshot::channel().0,
        }
    }

    fn read() -> Job {
        Job::Read {
            prefix: "e".into(),
            reply: oneshot::channel().0,
        }
    }

    /// What a job is about, to compare queues.
    fn name(job: &Job) -> String {
        match job {
            Job::Attempt { req, .. } => format!("attempt {}", req.election),
            Job::Release { election, .. } => format!("release {election}"),
            Job::Read { prefix, .. } => format!("read {prefix}"),
            Job::Decline { election, .. } => format!("decline {election}"),
            Job::WakeLock { election, .. } => format!("lock {election}"),
        }
    }

    #[test]
    fn a_small_queue_goes_whole() {
        let mut pending: VecDeque<Job> = [attempt(1), release(2), read(), attempt(3)].into();
        let batch: Vec<String> = take(&mut pending).iter().map(name).collect();
        assert_eq!(batch, ["attempt e1", "release e2", "read e", "attempt e3"]);
        assert!(pending.is_empty());
    }

    #[test]
    fn attempts_and_releases_past_their_caps_wait_in_order() {
        let extra = 3;
        let mut pending: VecDeque<Job> = (0..ATTEMPTS_PER_BATCH + extra)
            .map(attempt)
            .chain((0..RELEASES_PER_BATCH + extra).map(release))
            .chain([read()])
            .collect();
        let batch = take(&mut pending);
        let count =
            |jobs: &[&Job], what: &str| jobs.iter().filter(|j| name(j).starts_with(what)).count();
        let batch: Vec<&Job> = batch.iter().collect();
        assert_eq!(count(&batch, "attempt"), ATTEMPTS_PER_BATCH);
        assert_eq!(count(&batch, "release"), RELEASES_PER_BATCH);
        assert_eq!(count(&batch, "read"), 1);
        // The first ones went; the rest wait, in their order.
        assert_eq!(name(batch[0]), "attempt e0");
        let left: Vec<String> = pending.iter().map(name).collect();
        let mut expected: Vec<String> = (ATTEMPTS_PER_BATCH..ATTEMPTS_PER_BATCH + extra)
            .map(|i| format!("attempt e{i}"))
            .collect();
        expected.extend(
            (RELEASES_PER_BATCH..RELEASES_PER_BATCH + extra).map(|i| format!("release e{i}")),
        );
        assert_eq!(left, expected);
        // The next batch takes what was left.
        assert_eq!(take(&mut pending).len(), 2 * extra);
        assert!(pending.is_empty());
    }

    #[test]
    fn renewals_go_first_and_the_daemons_own_rows_never_wait() {
        let mut pending: VecDeque<Job> = (0..ATTEMPTS_PER_BATCH).map(attempt).collect();
        pending.push_back(attempt_of("e-held", Some(7)));
        pending.push_back(attempt_of(&format!("{PRESENCE_PREFIX}g/0"), Some(3)));
        pending.push_back(attempt_of(&format!("{AWAY_PREFIX}pod-a"), None));
        let batch: Vec<String> = take(&mut pending).iter().map(name).collect();
        assert_eq!(batch.len(), ATTEMPTS_PER_BATCH + 2);
        assert!(batch.contains(&"attempt e-held".to_owned()));
        assert!(batch.contains(&format!("attempt {PRESENCE_PREFIX}g/0")));
        assert!(batch.contains(&format!("attempt {AWAY_PREFIX}pod-a")));
        // The last take waits for the next batch.
        let left: Vec<String> = pending.iter().map(name).collect();
        assert_eq!(left, [format!("attempt e{}", ATTEMPTS_PER_BATCH - 1)]);
        // Renewals alone are capped too; with takes waiting, they leave
        // them half.
        let mut pending: VecDeque<Job> = (0..ATTEMPTS_PER_BATCH * 2)
            .map(|i| attempt_of(&format!("r{i}"), Some(1)))
            .chain((0..ATTEMPTS_PER_BATCH * 2).map(attempt))
            .collect();
        let batch: Vec<String> = take(&mut pending).iter().map(name).collect();
        let renewed = batch.iter().filter(|n| n.starts_with("attempt r")).count();
        assert_eq!(renewed, ATTEMPTS_PER_BATCH / 2);
        assert_eq!(batch.len(), ATTEMPTS_PER_BATCH);
        let mut pending: VecDeque<Job> = (0..ATTEMPTS_PER_BATCH + 1)
            .map(|i| attempt_of(&format!("e{i}"), Some(1)))
            .collect();
        assert_eq!(take(&mut pending).len(), ATTEMPTS_PER_BATCH);
        assert_eq!(pending.len(), 1);
    }

    /// A wake-up lock is freed only after its row's release: once a release
    /// waits for a later batch, so do the locks and releases behind it.
    #[test]
    fn a_lock_is_never_freed_ahead_of_a_release_queued_before_it() {
        let mut pending: VecDeque<Job> = (0..RELEASES_PER_BATCH + 1).map(release).collect();
        pending.push_back(free_lock(RELEASES_PER_BATCH));
        pending.push_back(read());
        pending.push_back(free_lock(0));
        let batch: Vec<String> = take(&mut pending).iter().map(name).collect();
        assert_eq!(batch.len(), RELEASES_PER_BATCH + 1);
        assert_eq!(batch.last().unwrap(), "read e");
        let left: Vec<String> = pending.iter().map(name).collect();
        let last = RELEASES_PER_BATCH;
        assert_eq!(
            left,
            [
                format!("release e{last}"),
                format!("lock e{last}"),
                "lock e0".to_owned()
            ]
        );
        let next: Vec<String> = take(&mut pending).iter().map(name).collect();
        assert_eq!(next, left);
    }

    /// An attempt its loop gave up on is dropped, not counted.
    #[test]
    fn attempts_given_up_on_take_no_room() {
        let mut pending: VecDeque<Job> = (0..ATTEMPTS_PER_BATCH).map(attempt).collect();
        let (tx, rx) = oneshot::channel();
        pending.push_back(Job::Attempt {
            req: match attempt(ATTEMPTS_PER_BATCH) {
                Job::Attempt { req, .. } => req,
                _ => unreachable!(),
            },
            until: BootTime::from_since_boot(Duration::from_secs(1)),
            reply: tx,
        });
        drop(rx);
        let batch = take(&mut pending);
        assert_eq!(batch.len(), ATTEMPTS_PER_BATCH);
        assert!(pending.is_empty(), "the abandoned attempt was kept");
    }
}
