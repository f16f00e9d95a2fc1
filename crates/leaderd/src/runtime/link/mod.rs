//! One database connection for every election of the daemon.
//!
//! Each election's loop still decides when to attempt and how long to wait
//! (see `election`); it hands its statement to the [`Link`], whose task
//! sends whatever is pending together, as a group commit does: every attempt
//! in one call ([`Connection::acquire_or_renew_many`], on PostgreSQL one
//! statement for all renewals), the releases in another, while the next
//! batch gathers behind it. Once a renew interval the task renews every
//! lease the daemon holds itself, a group of elections at a time (see
//! `wave`), so a leader sends one renewal statement per renew interval for
//! each group, and its elections' loops are not woken for it.
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
//!
//! Every statement answered without error is recorded in the daemon's
//! [`Reach`] (`/readyz`; a connect is not: a database that accepts
//! connections but fails every statement, its table dropped or a right
//! revoked, is not up); when
//! nothing was answered for a heartbeat (no election asks: none competes,
//! or all are held), the task reads the first election's row itself, and
//! connects first if it must, so that readiness tells of the database
//! whether this replica competes or not.
//!
//! This file holds the handle ([`Link`]) and the task's life (connects and
//! drops); the task's batches are in `wave` (the renewals it sends itself),
//! `portion` (how much of the queue a batch takes), `send` (a batch's
//! statements), `wake_locks` (MySQL's locks) and
//! `settle` (what an outcome does to the connection).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::{Attempt, BootTime};
use leaderd_store::{Connection, ElectionRow, LeaseRequest, WakeLock, MAX_ADDRESS_CHARS};
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::clock::boot_now;
use crate::runtime::connector::Connector;
use crate::runtime::reach::Reach;
use crate::runtime::roster::Heir;
use crate::runtime::shared::Shared;

mod portion;
mod send;
mod settle;
mod wake_locks;
mod wave;

use settle::fail;

/// The longest a batch of releases (or a read) may take: within the
/// loops' own release budget.
const RELEASE_CAP: Duration = Duration::from_millis(800);

/// The least time a cancel request gets to reach the server.
const CANCEL_BUDGET: Duration = Duration::from_millis(500);

/// An acquire-or-renew, owned, to travel to the link's task.
#[derive(Debug, Clone)]
pub struct Request {
    /// Shared, not copied: a request is made per attempt and per renewal,
    /// thousands a second with thousands of elections.
    pub election: Arc<str>,
    pub holder: Arc<str>,
    pub instance: Arc<str>,
    pub ttl: Duration,
    pub held_token: Option<i64>,
    /// The daemon's instance, as releases name successors.
    pub daemon: Option<Arc<str>>,
    /// `advertise`, written to the row with a takeover.
    pub address: Option<Arc<str>>,
}

impl Request {
    /// `shared`'s attempt at `at`, from its engine (locked by the caller):
    /// the token held then, if any, renews it.
    pub fn new(shared: &Shared, engine: &leaderd_core::Engine, at: BootTime) -> Request {
        Request {
            election: shared.election.clone(),
            holder: shared.id.clone(),
            instance: engine.instance_shared().clone(),
            ttl: shared.timing().ttl(),
            held_token: engine.lease(at).map(|(token, _)| token),
            // A draining replica is nobody's successor: a row released to
            // it (named from a look just before it drained) waits out its
            // window for the others.
            daemon: (!engine.draining(at)).then(|| shared.roster.daemon().clone()),
            address: engine.address().cloned(),
        }
    }

    fn borrowed(&self) -> LeaseRequest<'_> {
        LeaseRequest {
            election: &self.election,
            holder: &self.holder,
            instance: &self.instance,
            ttl: self.ttl,
            held_token: self.held_token,
            daemon: self.daemon.as_deref(),
            address: self.address.as_deref(),
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
    /// The Galera node the connection is on, when the database is one
    /// (see `nodes`).
    pub node: Option<Arc<str>>,
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
        heir: Option<Heir>,
        reply: ReleaseReply,
    },
    Read {
        prefix: String,
        reply: oneshot::Sender<Result<Vec<ElectionRow>, String>>,
    },
    /// Gives up being `election`'s named successor (see `Link::decline`).
    Decline {
        election: String,
        daemon: Arc<str>,
        token: i64,
        reply: ReleaseReply,
    },
    /// Takes (`Some` generation: frees, if still that connection) an
    /// election's wake-up lock (MySQL; see `wakeups::keep_presence`).
    WakeLock {
        election: String,
        free: Option<u64>,
        reply: WakeLockReply,
    },
}

/// Whether the lock is held now, and on which connection.
type WakeLockReply = oneshot::Sender<Result<(WakeLock, u64), String>>;

/// A handle on the daemon's connection; one per user (cheap to clone).
#[derive(Debug, Clone)]
pub struct Link {
    jobs: mpsc::UnboundedSender<Job>,
    state: watch::Receiver<State>,
    want: Arc<Notify>,
    /// A look is being read (see [`Link::look_turn`]).
    looking: Arc<std::sync::atomic::AtomicBool>,
}

/// The daemon's one look in flight; the next may go once it drops.
#[derive(Debug)]
pub struct LookTurn(Arc<std::sync::atomic::AtomicBool>);

impl Drop for LookTurn {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

impl Link {
    /// Starts the link's task over `connector`; `elections` are the loops it
    /// may ask to renew early, `reach` where it records its answers. The
    /// task ends when every handle is dropped.
    pub fn start(connector: Connector, elections: Vec<Arc<Shared>>, reach: Arc<Reach>) -> Link {
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
            waves: {
                let groups = leaderd_core::Timing::wave_groups(elections.len());
                let every = elections
                    .first()
                    .map_or(Duration::ZERO, |s| s.timing().wave_every(groups));
                leaderd_core::WaveSchedule::new(boot_now(), every, groups)
            },
            local_lease: elections
                .first()
                .map_or(Duration::ZERO, |s| s.timing().local_lease()),
            elections,
            reach,
            asked_at: None,
        };
        tokio::spawn(task.run());
        Link {
            jobs,
            state,
            want,
            looking: Arc::default(),
        }
    }

    /// Whether a connection is open now.
    pub fn connected(&self) -> bool {
        self.state.borrow().connected
    }

    /// The turn to read a look, if no other election's look is being
    /// read: the daemon's looks go one at a time, so that however many
    /// elections look at once (a spread's hand-over, several releases),
    /// the renewals behind them on the connection wait for one read at
    /// most.
    pub fn look_turn(&self) -> Option<LookTurn> {
        let free = self
            .looking
            .compare_exchange(
                false,
                true,
                std::sync::atomic::Ordering::Acquire,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok();
        free.then(|| LookTurn(self.looking.clone()))
    }

    /// The Galera node of the last connection opened, if the database is
    /// one.
    pub fn galera_node(&self) -> Option<Arc<str>> {
        self.state.borrow().node.clone()
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

    /// Releases `election` if `instance` holds it, naming `heir` to lead
    /// next if given; connects first if needed.
    pub async fn release(
        &self,
        election: &str,
        instance: &str,
        heir: Option<Heir>,
    ) -> Result<bool, String> {
        self.ask(|reply| Job::Release {
            election: election.to_owned(),
            instance: instance.to_owned(),
            heir,
            reply,
        })
        .await
    }

    /// Takes `election`'s wake-up lock on the connection (see
    /// [`leaderd_store::Connection::hold_wake_locks`]), connecting first if
    /// needed: whether it is held now, and the connection's generation.
    pub async fn hold_wake_lock(&self, election: &str) -> Result<(WakeLock, u64), String> {
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

    /// Gives up `election`'s turn released to this daemon (`daemon`, its
    /// instance) under `token` (see [`leaderd_store::Connection::decline`]):
    /// whether the row was open to anyone from then. Without a connection
    /// it fails at once: the window ends on its own.
    pub async fn decline(
        &self,
        election: &str,
        daemon: &Arc<str>,
        token: i64,
    ) -> Result<bool, String> {
        self.ask(|reply| Job::Decline {
            election: election.to_owned(),
            daemon: daemon.clone(),
            token,
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
    slots: HashMap<Arc<str>, usize>,
    /// When each group of the elections' leases is renewed (see `wave`).
    waves: leaderd_core::WaveSchedule,
    /// A wave's renewals are cut at the lease they would grant, as a
    /// loop's are ([`leaderd_core::Engine::attempt_timeout`]).
    local_lease: Duration,
    reach: Arc<Reach>,
    /// When the task last asked the database itself (see [`Task::ask`]).
    asked_at: Option<BootTime>,
}

impl Task {
    async fn run(mut self) {
        loop {
            let wave_due = self.wave_due(boot_now());
            if self.conn.is_some() && (wave_due || !self.pending.is_empty()) {
                self.send_batch().await;
                continue;
            }
            if wave_due {
                self.wave_unconnected(boot_now());
            }
            self.answer_unconnected();
            let waiting = self.wanted || !self.pending.is_empty();
            if waiting && self.conn.is_none() {
                self.connector.start();
            }
            let now = boot_now();
            let next_connect = self
                .connector
                .next_start()
                .map(|at| at.saturating_since(now))
                .unwrap_or(Duration::from_millis(100));
            let ask_in = self.reach.ask_at(now, self.asked_at).saturating_since(now);
            let wave_in = self.waves.next().saturating_since(now);
            tokio::select! {
                job = self.rx.recv() => match job {
                    Some(job) => self.pending.push_back(job),
                    None => return,
                },
                () = self.want.notified() => self.wanted = self.conn.is_none(),
                opened = self.connector.finished() => self.opened(opened),
                () = tokio::time::sleep(next_connect), if waiting && self.conn.is_none() => {}
                // Once a connection is wanted, the connector's own pace
                // applies.
                () = tokio::time::sleep(ask_in), if !self.elections.is_empty()
                    && (self.conn.is_some() || !self.wanted) => self.ask(),
                // Sent at the loop's top.
                () = tokio::time::sleep(wave_in), if !self.elections.is_empty() => {}
            }
        }
    }

    /// Nothing was answered for a heartbeat: reads the first election's
    /// row (one index read; nobody waits for the answer), or asks for a
    /// connection.
    fn ask(&mut self) {
        self.asked_at = Some(boot_now());
        if self.conn.is_none() {
            self.wanted = true;
        } else if self.pending.is_empty() {
            self.pending.push_back(Job::Read {
                prefix: self.elections[0].election.to_string(),
                reply: oneshot::channel().0,
            });
        }
    }

    /// Without a connection: attempts fail at once, unsent (the loop retries
    /// once connected), a wake-up lock to free is gone already, and a turn
    /// to give up ends with its window anyway; releases, reads and wake-up
    /// locks to take wait for the connect.
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
                Job::Decline { .. } => fail(job, "no connection", Reached::Nothing),
                Job::WakeLock {
                    free: Some(generation),
                    reply,
                    ..
                } => {
                    let _ = reply.send(Ok((WakeLock::Busy(None), generation)));
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
                // A name the row's address column cannot hold is not
                // recorded (an attempt carrying it would be refused).
                let node = conn
                    .galera_node()
                    .filter(|n| !n.is_empty() && n.chars().count() <= MAX_ADDRESS_CHARS)
                    .map(Arc::from);
                self.conn = Some(conn);
                self.wanted = false;
                self.state.send_modify(|s| {
                    s.connected = true;
                    s.error = None;
                    s.generation += 1;
                    s.node = node;
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
}
