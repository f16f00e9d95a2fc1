//! Sending: a batch's attempts (and a renewal wave, when one is due) in
//! one call, then its releases and reads, each under its bound.

use leaderd_core::BootTime;
use leaderd_store::{ElectionRow, LeaseRequest, Release, Successor};
use tracing::{debug, warn};

use crate::clock::boot_now;

use super::portion;
use super::settle::fail;
use crate::runtime::roster::Heir;

use super::wave::Renewal;
use super::{AttemptReply, Failure, Job, Reached, ReleaseReply, Request, Task, RELEASE_CAP};

/// Where an attempt's answer goes: to the loop that sent it, or to the
/// engine of a lease the wave renewed.
pub(super) enum Answer {
    Loop(AttemptReply),
    Wave(Renewal),
}

impl Answer {
    fn send(
        self,
        elections: &[std::sync::Arc<crate::runtime::shared::Shared>],
        result: Result<leaderd_core::Attempt, String>,
    ) {
        match self {
            Answer::Loop(reply) => {
                let _ = reply.send(result.map_err(|reason| Failure {
                    reason,
                    reached: Reached::Database,
                }));
            }
            Answer::Wave(renewal) => renewal.answer(elections, result),
        }
    }
}

impl Task {
    /// Gathers what is pending (and the renewal wave, when due) and sends
    /// it.
    pub(super) async fn send_batch(&mut self) {
        tokio::task::yield_now().await;
        while let Ok(job) = self.rx.try_recv() {
            self.pending.push_back(job);
        }
        let jobs = portion::take(&mut self.pending);
        let mut attempts = Vec::new();
        let mut rest = Vec::new();
        let now = boot_now();
        let mut queued = vec![false; self.elections.len()];
        for job in jobs {
            match job {
                // An attempt its loop gave up on is not sent.
                Job::Attempt { reply, .. } if reply.is_closed() => {}
                // Nor one whose deadline passed while it waited: it would
                // cut the whole batch at once.
                Job::Attempt { until, .. } if until <= now => {
                    fail(job, "timed out before it was sent", Reached::Queue);
                }
                Job::Attempt { req, until, reply } => {
                    // Elections are found by index: with thousands of
                    // them, comparing names pairwise cost a core.
                    if let Some(&slot) = self.slots.get(&req.election) {
                        queued[slot] = true;
                    }
                    attempts.push((req, until, Answer::Loop(reply)));
                }
                other => rest.push(other),
            }
        }
        // The wave's clock is read last, just before the batch goes: the
        // leases count from here. An election whose loop sent an attempt
        // of its own is renewed by that one (one row per election in a
        // statement).
        let sent_at = boot_now();
        if self.wave_due(sent_at) {
            let until = sent_at + self.local_lease;
            for (req, renewal) in self.wave(sent_at, &queued) {
                attempts.push((req, until, Answer::Wave(renewal)));
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
            // Ahead of what this batch left queued, as they were.
            for job in rest.into_iter().rev() {
                self.pending.push_front(job);
            }
            return;
        }
        let mut releases = Vec::new();
        let mut reads = Vec::new();
        let mut declines = Vec::new();
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
                Job::Decline {
                    election,
                    daemon,
                    token,
                    reply,
                } => declines.push((election, daemon, token, reply)),
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
        for (election, daemon, token, reply) in declines {
            let answer = self.decline(&election, &daemon, token).await;
            let _ = reply.send(answer);
        }
    }

    pub(super) async fn send_attempts(&mut self, attempts: Vec<(Request, BootTime, Answer)>) {
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
                for ((_, _, answer), result) in attempts.into_iter().zip(results) {
                    answer.send(&self.elections, result.map_err(|e| e.to_string()));
                }
            }
            Err(reason) => {
                debug!(error = %reason, batch = attempts.len(), "batch failed; dropping the connection");
                let renewals = attempts
                    .iter()
                    .filter(|(_, _, a)| matches!(a, Answer::Wave(_)))
                    .count();
                // Once for the wave, not once per lease: each election
                // retries its own renewal at once, and logs it if that
                // fails too.
                if renewals > 0 {
                    warn!(error = %reason, leases = renewals, "renewing the leases this replica holds failed; each election retries on its own");
                }
                for (_, _, answer) in attempts {
                    answer.send(&self.elections, Err(reason.clone()));
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
            let one = match &answer {
                Ok(each) => each[i].as_ref().map(|r| *r).map_err(ToString::to_string),
                Err(e) => Err(e.clone()),
            };
            let _ = reply.send(one);
        }
    }

    pub(super) async fn read(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, String> {
        let conn = self.conn.as_mut().ok_or("no connection")?;
        let answer = tokio::time::timeout(RELEASE_CAP, conn.elections(prefix)).await;
        self.settle(answer, RELEASE_CAP, "reading the table")
    }

    /// Gives up a named successor's turn (`Link::decline`). The statement
    /// is optional: an error the server answered (a row locked elsewhere,
    /// a serialization failure) leaves the window to end on its own and
    /// keeps the connection the renewals use; only one that got no answer
    /// in time drops it, cancelling what the server may still run.
    async fn decline(&mut self, election: &str, daemon: &str, token: i64) -> Result<bool, String> {
        let conn = self.conn.as_mut().ok_or("no connection")?;
        let answer = tokio::time::timeout(RELEASE_CAP, conn.decline(election, daemon, token)).await;
        match answer {
            Ok(Err(e)) if e.answered() => {
                self.reach.answered(boot_now());
                Err(e.to_string())
            }
            answer => self.settle(answer, RELEASE_CAP, "giving up a named successor's turn"),
        }
    }
}
