//! One database connection for every election of the daemon.
//!
//! Each election's loop still decides when to attempt and how long to wait
//! (see `election`); it hands its statement to the [`Link`], whose task
//! sends whatever is pending together, as a group commit does: every attempt
//! in one call ([`Connection::acquire_or_renew_many`], on PostgreSQL one
//! statement for all renewals), the releases in another, while the next
//! batch gathers behind it. When a batch carries a renewal, every other
//! election this daemon leads is asked to renew now ([`Shared::renew_soon`])
//! and waited for (a twentieth of the interval at most, see
//! `Timing::gather_renewals`): that brings their schedules into step, so a
//! leader of E elections sends one renewal statement per renew interval.
//!
//! On MySQL the leader's wake-up locks are held on this connection too (see
//! `wakeups::keep_presence`), taken and freed after the batch's releases,
//! one statement each way, so a daemon needs one more connection only for
//! its release waiter.
//!
//! Failures are handled as on a connection of one's own: a batch that fails,
//! or runs past the latest deadline among its attempts, drops the
//! connection (cancelling a statement still running) and fails every attempt
//! in it; the loops retry on a fresh one, opened outside the attempts by the
//! [`Connector`]. An attempt made while there is no connection fails at once
//! without being sent; a release, a read or a wake-up lock to take waits
//! for one (a wake-up lock to free went with the last one).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::{Attempt, BootTime};
use leaderd_store::{Connection, ElectionRow, LeaseRequest, StoreError};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::debug;

use crate::clock::boot_now;
use crate::runtime::connector::Connector;
use crate::runtime::shared::Shared;

/// The longest a batch of releases (or a read) may take: within the
/// loops' own release budget.
const RELEASE_CAP: Duration = Duration::from_millis(800);

/// The least time a cancel request gets to reach the server.
const CANCEL_BUDGET: Duration = Duration::from_millis(500);

/// An acquire-or-renew, owned, to travel to the link's task.
#[derive(Debug, Clone)]
pub struct Request {
    pub election: String,
    pub holder: String,
    pub instance: String,
    pub ttl: Duration,
    pub held_token: Option<i64>,
}

impl Request {
    fn borrowed(&self) -> LeaseRequest<'_> {
        LeaseRequest {
            election: &self.election,
            holder: &self.holder,
            instance: &self.instance,
            ttl: self.ttl,
            held_token: self.held_token,
        }
    }
}

/// An attempt that did not get an answer.
#[derive(Debug, Clone)]
pub struct Failure {
    pub reason: String,
    pub reached: Reached,
}

/// How far an unanswered attempt got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// No connection (or no link): it waited for nothing.
    Nothing,
    /// A batch, on a connection, but it timed out before it was sent.
    Queue,
    /// Its statement may have reached the database (and so may still
    /// commit).
    Database,
}

/// Whether the link holds a connection, and the last connect's failure.
/// Every finished connect modifies it, which is what wakes the loops.
#[derive(Debug, Clone, Default)]
pub struct State {
    pub connected: bool,
    pub error: Option<String>,
    /// How many connections were opened: what a session held (MySQL's
    /// named locks) went with the connection of its generation.
    pub generation: u64,
}

type AttemptReply = oneshot::Sender<Result<Attempt, Failure>>;
type ReleaseReply = oneshot::Sender<Result<bool, String>>;

enum Job {
    Attempt {
        req: Request,
        /// The attempt's deadline: the batch is cut at the latest of them.
        until: BootTime,
        reply: AttemptReply,
    },
    Release {
        election: String,
        instance: String,
        reply: ReleaseReply,
    },
    Read {
        prefix: String,
        reply: oneshot::Sender<Result<Vec<ElectionRow>, String>>,
    },
    /// Takes (`Some` generation: frees, if still that connection) an
    /// election's wake-up lock (MySQL; see `wakeups::keep_presence`).
    WakeLock {
        election: String,
        free: Option<u64>,
        reply: WakeLockReply,
    },
}

impl Job {
    /// A release, or the freeing of a wake-up lock taken on the connection
    /// of `generation` (what wakes MySQL's followers; one taken on an
    /// earlier connection went with it): a handover waits on it, so no
    /// batch lingers for it.
    fn hands_over(&self, generation: u64) -> bool {
        match self {
            Job::Release { .. } => true,
            Job::WakeLock { free, .. } => *free == Some(generation),
            Job::Attempt { .. } | Job::Read { .. } => false,
        }
    }
}

/// Whether the lock is held now, and on which connection.
type WakeLockReply = oneshot::Sender<Result<(bool, u64), String>>;

/// A handle on the daemon's connection; one per user (cheap to clone).
#[derive(Debug, Clone)]
pub struct Link {
    jobs: mpsc::UnboundedSender<Job>,
    state: watch::Receiver<State>,
    want: Arc<Notify>,
}

impl Link {
    /// Starts the link's task over `connector`; `elections` are the loops it
    /// may ask to renew early. The task ends when every handle is dropped.
    pub fn start(connector: Connector, elections: Vec<Arc<Shared>>) -> Link {
        let (jobs, rx) = mpsc::unbounded_channel();
        let (state_tx, state) = watch::channel(State::default());
        let want = Arc::new(Notify::new());
        let task = Task {
            rx,
            state: state_tx,
            want: want.clone(),
            wanted: false,
            connector,
            conn: None,
            pending: VecDeque::new(),
            slots: elections
                .iter()
                .enumerate()
                .map(|(i, s)| (s.election.clone(), i))
                .collect(),
            aligned_at: None,
            realign_after: elections
                .first()
                .map_or(Duration::ZERO, |s| s.timing.renew_every() / 2),
            gather_for: elections
                .first()
                .map_or(Duration::ZERO, |s| s.timing.gather_renewals()),
            elections,
        };
        tokio::spawn(task.run());
        Link { jobs, state, want }
    }

    /// Whether a connection is open now.
    pub fn connected(&self) -> bool {
        self.state.borrow().connected
    }

    /// Asks for a connection (opened in the background; see
    /// [`Link::changed`]).
    pub fn want_connection(&self) {
        self.want.notify_one();
    }

    /// Forgets the connects finished so far: [`Link::changed`] waits for
    /// the next one.
    pub fn mark_seen(&mut self) {
        self.state.borrow_and_update();
    }

    /// Resolves when a connect finished: `Err` with its reason when it
    /// failed and there is still no connection.
    pub async fn changed(&mut self) -> Result<(), String> {
        if self.state.changed().await.is_err() {
            return std::future::pending().await;
        }
        let state = self.state.borrow_and_update();
        match (&state.error, state.connected) {
            (Some(e), false) => Err(e.clone()),
            _ => Ok(()),
        }
    }

    /// One acquire-or-renew, sent with whatever else is pending.
    pub async fn attempt(&self, req: Request, until: BootTime) -> Result<Attempt, Failure> {
        let (reply, answer) = oneshot::channel();
        let stopped = || Failure {
            reason: "the database link has stopped".into(),
            reached: Reached::Nothing,
        };
        if self.jobs.send(Job::Attempt { req, until, reply }).is_err() {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Releases `election` if `instance` holds it; connects first if needed.
    pub async fn release(&self, election: &str, instance: &str) -> Result<bool, String> {
        self.ask(|reply| Job::Release {
            election: election.to_owned(),
            instance: instance.to_owned(),
            reply,
        })
        .await
    }

    /// Takes `election`'s wake-up lock on the connection (see
    /// [`leaderd_store::Connection::hold_wake_locks`]), connecting first if
    /// needed: whether it is held now, and the connection's generation.
    pub async fn hold_wake_lock(&self, election: &str) -> Result<(bool, u64), String> {
        self.ask(|reply| Job::WakeLock {
            election: election.to_owned(),
            free: None,
            reply,
        })
        .await
    }

    /// Frees `election`'s wake-up lock taken on connection `generation`
    /// (nothing to do once that connection is gone: the lock went with it).
    pub async fn free_wake_lock(&self, election: &str, generation: u64) -> Result<(), String> {
        self.ask(|reply| Job::WakeLock {
            election: election.to_owned(),
            free: Some(generation),
            reply,
        })
        .await
        .map(drop)
    }

    /// Sends the job `make` builds around its reply, and waits for that.
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Job,
    ) -> Result<T, String> {
        let stopped = || "the database link has stopped".to_owned();
        let (reply, answer) = oneshot::channel();
        self.jobs.send(make(reply)).map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// A receiver of the link's [`State`], to hear of connections dropped.
    pub fn state(&self) -> watch::Receiver<State> {
        self.state.clone()
    }

    /// The rows whose name starts with `prefix`.
    pub async fn read(&self, prefix: &str) -> Result<Vec<ElectionRow>, String> {
        self.ask(|reply| Job::Read {
            prefix: prefix.to_owned(),
            reply,
        })
        .await
    }
}

struct Task {
    rx: mpsc::UnboundedReceiver<Job>,
    state: watch::Sender<State>,
    want: Arc<Notify>,
    /// Someone asked for a connection and none is open yet.
    wanted: bool,
    connector: Connector,
    conn: Option<Connection>,
    pending: VecDeque<Job>,
    elections: Vec<Arc<Shared>>,
    /// Each election's index in `elections`.
    slots: HashMap<String, usize>,
    /// When the leaders were last asked to renew together (see `align`),
    /// and how long that holds: half a renew interval.
    aligned_at: Option<BootTime>,
    realign_after: Duration,
    /// How long a batch waits for the leaders asked to join it
    /// ([`leaderd_core::Timing::gather_renewals`]).
    gather_for: Duration,
}

impl Task {
    async fn run(mut self) {
        loop {
            if self.conn.is_some() && !self.pending.is_empty() {
                self.send_batch().await;
                continue;
            }
            self.answer_unconnected();
            let waiting = self.wanted || !self.pending.is_empty();
            if waiting && self.conn.is_none() {
                self.connector.start();
            }
            let next_connect = self
                .connector
                .next_start()
                .map(|at| at.saturating_since(boot_now()))
                .unwrap_or(Duration::from_millis(100));
            tokio::select! {
                job = self.rx.recv() => match job {
                    Some(job) => self.pending.push_back(job),
                    None => return,
                },
                () = self.want.notified() => self.wanted = self.conn.is_none(),
                opened = self.connector.finished() => self.opened(opened),
                () = tokio::time::sleep(next_connect), if waiting && self.conn.is_none() => {}
            }
        }
    }

    /// Without a connection: attempts fail at once, unsent (the loop retries
    /// once connected), and a wake-up lock to free is gone already;
    /// releases, reads and wake-up locks to take wait for the connect.
    fn answer_unconnected(&mut self) {
        if self.conn.is_some() {
            return;
        }
        let mut kept = VecDeque::new();
        for job in self.pending.drain(..) {
            match job {
                Job::Attempt { .. } => {
                    fail(job, "no connection", Reached::Nothing);
                    self.wanted = true;
                }
                Job::WakeLock {
                    free: Some(generation),
                    reply,
                    ..
                } => {
                    let _ = reply.send(Ok((false, generation)));
                }
                other => kept.push_back(other),
            }
        }
        self.pending = kept;
    }

    fn opened(&mut self, opened: Result<Connection, String>) {
        match opened {
            // One beside it may have been quicker; keep that one.
            Ok(conn) if self.conn.is_none() => {
                self.conn = Some(conn);
                self.wanted = false;
                self.state.send_modify(|s| {
                    s.connected = true;
                    s.error = None;
                    s.generation += 1;
                });
            }
            Ok(_) => {}
            Err(reason) if self.conn.is_none() => {
                // Waiting releases and reads fail with it.
                for job in std::mem::take(&mut self.pending) {
                    fail(job, &reason, Reached::Nothing);
                }
                self.state.send_modify(|s| s.error = Some(reason));
            }
            Err(_) => {}
        }
    }

    /// The connection can no longer be trusted (mid-exchange, or broken).
    fn drop_connection(&mut self, cancel_within: Option<Duration>) {
        let Some(conn) = self.conn.take() else { return };
        self.state.send_modify(|s| s.connected = false);
        if let (Some(within), Some(canceller)) = (cancel_within, conn.canceller()) {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(within.max(CANCEL_BUDGET), canceller.cancel()).await;
            });
        }
    }

    /// Gathers what is pending (and the renewals it asks for) and sends it.
    async fn send_batch(&mut self) {
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
                    reply,
                } => releases.push((election, instance, reply)),
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

    /// When a renewal is pending, asks every other election this daemon
    /// leads to renew now, and waits (briefly) for their attempts.
    async fn align(&mut self) {
        let now = boot_now();
        // Once per wave (waves come a renew interval apart): the leaders
        // asked are on their way, in this batch or the next few. Asking
        // again for each of those batches scanned every election each time
        // and had the leaders that had just renewed renew again.
        if self
            .aligned_at
            .is_some_and(|at| now.saturating_since(at) < self.realign_after)
        {
            return;
        }
        // A renewal of one of the elections (not of the spread's presence,
        // which keeps its own rhythm). Elections are found by index: with
        // thousands of them, comparing names pairwise cost a core.
        let mut queued = vec![false; self.elections.len()];
        let mut renewing = false;
        for job in &self.pending {
            if let Job::Attempt { req, .. } = job {
                if let Some(&i) = self.slots.get(&req.election) {
                    queued[i] = true;
                    renewing |= req.held_token.is_some();
                }
            }
        }
        if !renewing {
            return;
        }
        self.aligned_at = Some(now);
        let mut asked = vec![false; self.elections.len()];
        let mut missing = 0usize;
        for (i, shared) in self.elections.iter().enumerate() {
            if !queued[i] && shared.is_leader(now) {
                shared.renew_soon();
                asked[i] = true;
                missing += 1;
            }
        }
        // A leader that does not come (stopping, or releasing on purpose)
        // costs the wave the whole wait; a handover's job, pending or
        // arriving, ends it (the asked come in the next batch).
        // The queue is looked through once, then each job as it comes: a
        // look through it per arrival was quadratic in the wave.
        let generation = self.state.borrow().generation;
        let mut handing_over = self.pending.iter().any(|j| j.hands_over(generation));
        let until = tokio::time::Instant::now() + self.gather_for;
        while missing > 0 && !handing_over {
            let job = match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(job)) => job,
                Ok(None) | Err(_) => return,
            };
            handing_over = job.hands_over(generation);
            if let Job::Attempt { req, .. } = &job {
                let slot = self.slots.get(&req.election).copied();
                if slot.is_some_and(|i| std::mem::take(&mut asked[i])) {
                    missing -= 1;
                }
            }
            self.pending.push_back(job);
        }
    }

    async fn send_attempts(&mut self, attempts: Vec<(Request, BootTime, AttemptReply)>) {
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

    async fn send_releases(&mut self, releases: Vec<(String, String, ReleaseReply)>) {
        let conn = self.conn.as_mut().expect("sent on a connection");
        let items: Vec<(&str, &str)> = releases
            .iter()
            .map(|(e, i, _)| (e.as_str(), i.as_str()))
            .collect();
        let answer = tokio::time::timeout(RELEASE_CAP, conn.release_many(&items)).await;
        let answer = self.settle(answer, RELEASE_CAP, "release");
        for (i, (_, _, reply)) in releases.into_iter().enumerate() {
            let _ = reply.send(answer.as_ref().map(|r| r[i]).map_err(Clone::clone));
        }
    }

    async fn read(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, String> {
        let conn = self.conn.as_mut().ok_or("no connection")?;
        let answer = tokio::time::timeout(RELEASE_CAP, conn.elections(prefix)).await;
        self.settle(answer, RELEASE_CAP, "reading the table")
    }

    /// The batch's wake-up locks: the frees in one statement, then the
    /// takes in another (a batch holds at most one of each per election:
    /// its presence task waits for each answer). Any failure, even one the
    /// server answered, drops the connection and the locks with it: a lock
    /// left held by a replica that no longer leads would keep the next
    /// leader from taking it, and its releases would wake nobody.
    async fn wake_locks(&mut self, jobs: Vec<(String, Option<u64>, WakeLockReply)>) {
        let generation = self.state.borrow().generation;
        let mut frees = Vec::new();
        let mut takes = Vec::new();
        for (election, free, reply) in jobs {
            match free {
                // Gone with the connection it was taken on.
                Some(taken_on) if taken_on != generation => {
                    let _ = reply.send(Ok((false, generation)));
                }
                Some(_) => frees.push((election, reply)),
                None => takes.push((election, reply)),
            }
        }
        if !frees.is_empty() {
            let names: Vec<&str> = frees.iter().map(|(e, _)| e.as_str()).collect();
            let answer = match self.conn.as_mut() {
                Some(conn) => tokio::time::timeout(RELEASE_CAP, conn.free_wake_locks(&names)).await,
                None => Ok(Ok(())),
            };
            let answer = self.settle_wake_locks(answer, "freeing wake-up locks");
            for (_, reply) in frees {
                let _ = reply.send(answer.clone().map(|()| (false, generation)));
            }
        }
        if takes.is_empty() {
            return;
        }
        let Some(conn) = self.conn.as_mut() else {
            // The frees cost the connection: the takes wait for the next.
            for (election, reply) in takes {
                let job = Job::WakeLock {
                    election,
                    free: None,
                    reply,
                };
                self.pending.push_back(job);
            }
            return;
        };
        let names: Vec<&str> = takes.iter().map(|(e, _)| e.as_str()).collect();
        let answer = tokio::time::timeout(RELEASE_CAP, conn.hold_wake_locks(&names)).await;
        match self.settle_wake_locks(answer, "taking wake-up locks") {
            Ok(held) => {
                for ((_, reply), held) in takes.into_iter().zip(held) {
                    let _ = reply.send(Ok((held, generation)));
                }
            }
            Err(e) => {
                for (_, reply) in takes {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }

    fn settle_wake_locks<T>(
        &mut self,
        outcome: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
        what: &str,
    ) -> Result<T, String> {
        let settled = self.settle(outcome, RELEASE_CAP, what);
        if settled.is_err() {
            self.drop_connection(None);
        }
        settled
    }

    /// The outcome of one statement run under `limit`: a failure or a
    /// timeout drops the connection, cancelling what the server may still
    /// be running (not after an error it answered).
    fn settle<T>(
        &mut self,
        outcome: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
        limit: Duration,
        what: &str,
    ) -> Result<T, String> {
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                self.drop_connection((!e.answered()).then_some(limit));
                Err(e.to_string())
            }
            Err(_) => {
                self.drop_connection(Some(limit));
                Err(format!("{what} timed out after {limit:?}"))
            }
        }
    }
}

fn fail(job: Job, reason: &str, reached: Reached) {
    match job {
        Job::Attempt { reply, .. } => {
            let _ = reply.send(Err(Failure {
                reason: reason.to_owned(),
                reached,
            }));
        }
        Job::Release { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
        Job::Read { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
        Job::WakeLock { reply, .. } => {
            let _ = reply.send(Err(reason.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(generation: u64) -> Job {
        Job::WakeLock {
            election: "jobs".into(),
            free: Some(generation),
            reply: oneshot::channel().0,
        }
    }

    #[test]
    fn only_a_release_or_a_live_lock_free_ends_the_gathering() {
        let release = Job::Release {
            election: "jobs".into(),
            instance: "i".into(),
            reply: oneshot::channel().0,
        };
        assert!(release.hands_over(3));
        assert!(free(3).hands_over(3));
        // Taken on a connection since dropped: freeing it wakes nobody.
        assert!(!free(2).hands_over(3));
        let take = Job::WakeLock {
            election: "jobs".into(),
            free: None,
            reply: oneshot::channel().0,
        };
        assert!(!take.hands_over(3));
    }
}
