//! How much of the queue one batch takes: every job, but at most
//! [`ATTEMPTS_PER_BATCH`] of the loops' attempts and
//! [`RELEASES_PER_BATCH`] releases; the rest stay queued, in order, for
//! the batches after it. A renewal wave waits for the batch ahead of it on
//! the connection: at a cold start (thousands of followers attempting at
//! once) or a spread's hand-over (thousands of releases; on MySQL one
//! statement each), one batch of everything took longer than a lease, and
//! every lease waiting behind it was lost, over and over.

use std::collections::VecDeque;

use super::Job;

/// The loops' attempts one batch carries at most: as many as a renewal
/// wave's group (`leaderd_core::WAVE_GROUP`), whose statement cost is known
/// to fit well within a renewal interval.
pub(super) const ATTEMPTS_PER_BATCH: usize = leaderd_core::WAVE_GROUP;

/// The releases one batch carries at most: on MySQL each is a statement
/// of its own (about 0.3 ms here), and a batch of them is cut at 800 ms.
pub(super) const RELEASES_PER_BATCH: usize = 256;

/// Takes the next batch's jobs out of `pending` (see the module's docs).
pub(super) fn take(pending: &mut VecDeque<Job>) -> Vec<Job> {
    let (mut attempts, mut releases) = (0, 0);
    let mut batch = Vec::new();
    let mut left = VecDeque::new();
    for job in pending.drain(..) {
        let room = match &job {
            Job::Attempt { .. } => {
                attempts += 1;
                attempts <= ATTEMPTS_PER_BATCH
            }
            Job::Release { .. } => {
                releases += 1;
                releases <= RELEASES_PER_BATCH
            }
            Job::Read { .. } | Job::WakeLock { .. } => true,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use leaderd_core::BootTime;
    use tokio::sync::oneshot;

    use super::*;
    use crate::runtime::link::Request;

    fn attempt(i: usize) -> Job {
        Job::Attempt {
            req: Request {
                election: format!("e{i}"),
                holder: "a".into(),
                instance: "ia".into(),
                ttl: Duration::from_millis(1200),
                held_token: None,
                daemon: None,
                address: None,
            },
            until: BootTime::from_since_boot(Duration::from_secs(1)),
            reply: oneshot::channel().0,
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
}
