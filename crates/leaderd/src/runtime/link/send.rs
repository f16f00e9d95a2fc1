//! Sending: a batch's attempts in one call, then its releases and reads,
//! each under its bound.

use leaderd_core::BootTime;
use leaderd_store::{ElectionRow, LeaseRequest, Release, Successor};
use tracing::debug;

use crate::clock::boot_now;

use super::settle::fail;
use crate::runtime::roster::Heir;

use super::{AttemptReply, Failure, Job, Reached, ReleaseReply, Request, Task, RELEASE_CAP};

impl Task {
    /// Gathers what is pending (and the renewals it asks for) and sends it.
    pub(super) async fn send_batch(&mut self) {
        tokio::task::yield_now().await;
        while let Ok(job) = self.rx.try_recv() {
            self.pending.push_back(job);
        }
        self.align().await;
        let jobs: Vec<Job> = self.pending.drain(..).collect();
        let mut attempts = Vec::new();
        let mut rest = Vec::new();
        let now = boot_now();
        for job in jobs {
            match job {
                // An attempt its loop gave up on is not sent.
                Job::Attempt { reply, .. } if reply.is_closed() => {}
                // Nor one whose deadline passed while it waited: it would
                // cut the whole batch at once.
                Job::Attempt { until, .. } if until <= now => {
                    fail(job, "timed out before it was sent", Reached::Queue);
                }
                Job::Attempt { req, until, reply } => attempts.push((req, until, reply)),
                other => rest.push(other),
            }
        }
        // The attempts before the releases: a release that stalls (a row
        // locked elsewhere; on MySQL a statement per release, far away)
        // and is cut drops the connection. Sent first, it would cost every
        // renewal of its batch its lease; sent after them, it delays the
        // next wave only, whose leases were just renewed. (Releases first
        // gained at most half a release's leaderless p90 at 6,000
        // elections, 22 against 28-42 ms: not worth that; BENCHMARKS.md.)
        if !attempts.is_empty() {
            self.send_attempts(attempts).await;
        }
        // The attempts may have cost the connection: what is left waits for
        // the next one (as a release or read without one always does).
        if self.conn.is_none() {
            self.pending.extend(rest);
            return;
        }
        let mut releases = Vec::new();
        let mut reads = Vec::new();
        let mut wake_locks = Vec::new();
        for job in rest {
            match job {
                Job::Release {
                    election,
                    instance,
                    heir,
                    reply,
                } => releases.push((election, instance, heir, reply)),
                Job::Read { prefix, reply } => reads.push((prefix, reply)),
                Job::WakeLock {
                    election,
                    free,
                    reply,
                } => wake_locks.push((election, free, reply)),
                Job::Attempt { .. } => unreachable!("attempts were taken above"),
            }
        }
        if !releases.is_empty() {
            self.send_releases(releases).await;
        }
        // After the releases: a wake-up lock is freed only once the row
        // is, so that the waiters it wakes find the row free.
        if !wake_locks.is_empty() {
            self.wake_locks(wake_locks).await;
        }
        for (prefix, reply) in reads {
            let answer = self.read(&prefix).await;
            let _ = reply.send(answer);
        }
    }

    pub(super) async fn send_attempts(&mut self, attempts: Vec<(Request, BootTime, AttemptReply)>) {
        // Cut at the latest deadline among them, not the earliest: a
        // renewal has the whole local lease (a statement cut early loses
        // its place in the server's queue, see `Engine::attempt_timeout`),
        // whatever a follower's poll beside it was given. An attempt whose
        // own deadline passes first is failed by its loop meanwhile.
        let now = boot_now();
        let limit = attempts
            .iter()
            .map(|(_, until, _)| until.saturating_since(now))
            .max()
            .unwrap_or_default();
        let conn = self.conn.as_mut().expect("sent on a connection");
        let reqs: Vec<LeaseRequest<'_>> = attempts.iter().map(|(r, _, _)| r.borrowed()).collect();
        let answer = tokio::time::timeout(limit, conn.acquire_or_renew_many(&reqs)).await;
        match self.settle(answer, limit, "attempt") {
            Ok(results) => {
                for ((_, _, reply), result) in attempts.into_iter().zip(results) {
                    let _ = reply.send(result.map_err(|e| Failure {
                        reason: e.to_string(),
                        reached: Reached::Database,
                    }));
                }
            }
            Err(reason) => {
                debug!(error = %reason, batch = attempts.len(), "batch failed; dropping the connection");
                for (_, _, reply) in attempts {
                    let _ = reply.send(Err(Failure {
                        reason: reason.clone(),
                        reached: Reached::Database,
                    }));
                }
            }
        }
    }

    pub(super) async fn send_releases(
        &mut self,
        releases: Vec<(String, String, Option<Heir>, ReleaseReply)>,
    ) {
        let conn = self.conn.as_mut().expect("sent on a connection");
        let items: Vec<Release<'_>> = releases
            .iter()
            .map(|(election, instance, heir, _)| Release {
                election,
                instance,
                successor: heir.as_ref().map(|h| Successor {
                    daemon: &h.daemon,
                    window: h.window,
                }),
            })
            .collect();
        let answer = tokio::time::timeout(RELEASE_CAP, conn.release_many(&items)).await;
        let answer = self.settle(answer, RELEASE_CAP, "release");
        for (i, (_, _, _, reply)) in releases.into_iter().enumerate() {
            let _ = reply.send(answer.as_ref().map(|r| r[i]).map_err(Clone::clone));
        }
    }

    pub(super) async fn read(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, String> {
        let conn = self.conn.as_mut().ok_or("no connection")?;
        let answer = tokio::time::timeout(RELEASE_CAP, conn.elections(prefix)).await;
        self.settle(answer, RELEASE_CAP, "reading the table")
    }
}
