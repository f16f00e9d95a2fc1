//! The state one election shares between its loop (`election`), the HTTP
//! handlers, the daemon's link and wake-ups, and the spread: the engine
//! behind a lock, the requests to the loop, and what watchers are told.
//!
//! It sits below all of them, so that none of them imports another to reach
//! it (the loop's file once held it, and the link, the wake-ups and the
//! daemon imported the loop's file, which imported them: a circle).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use leaderd_core::{BootTime, Engine, Event, Replica, Timing, View};
use tokio::sync::{oneshot, watch, Notify};
use tracing::debug;

use crate::clock::{boot_now, micros};
use crate::outputs::metrics::{DaemonMetrics, Metrics};
use crate::runtime::inbox::Inbox;
use crate::runtime::outages::Outages;
use crate::runtime::roster::Roster;
use crate::runtime::signal::Signal;
use crate::settings::Settings;

/// A request to the election loop from outside it (HTTP, the app-health
/// check).
#[derive(Debug)]
pub enum Control {
    /// Step down, release the row, wake the others, and do not attempt again
    /// for `hold`. Answered with the `/leader` view after the release, or
    /// `Err` with the view when this replica did not lead.
    Release {
        hold: Duration,
        /// The whole replica drains for `hold` (see
        /// the daemon's drain): an election not led here is
        /// left to the others ([`leaderd_core::Engine::drain`]).
        drain: bool,
        reply: oneshot::Sender<Result<View, View>>,
    },
    /// End a hold and a drain now (`leaderd resume`); answered with whether
    /// there was one.
    Resume { reply: oneshot::Sender<bool> },
    /// The app passes (or fails) its health check.
    AppHealthy(bool),
    /// Leave free rows to others for a heartbeat, or stop (see `spread`).
    Yield(bool),
}

/// State shared by the election loop and the HTTP handlers.
#[derive(Debug)]
pub struct Shared {
    /// Shared with each request (see [`crate::runtime::link::Request`]).
    pub election: Arc<str>,
    pub id: Arc<str>,
    /// The daemon's, shared by its elections: who is named at a release.
    pub roster: Arc<Roster>,
    pub(crate) engine: Mutex<Engine>,
    /// Last time the loop went round, for the `/healthz` watchdog
    /// ([`BootTime::as_nanos`]).
    last_progress: AtomicU64,
    pub metrics: Metrics,
    /// The daemon's, shared by its elections: the attempts' timings.
    pub daemon_metrics: Arc<DaemonMetrics>,
    /// The daemon's, shared by its elections: their failures, logged once
    /// per cause.
    pub outages: Arc<Outages>,
    /// Requests to the loop (see [`Shared::control`]).
    pub(crate) control: Inbox<Control>,
    /// What `/leader/watch` and `exec` react to; see [`Shared::publish`].
    /// Made at the first subscription: a watch channel's allocation costs
    /// hundreds of bytes in each of thousands of elections nobody watches.
    changes: OnceLock<watch::Sender<Leadership>>,
    /// Whether a command run under `exec` is alive: the row is not released
    /// on purpose until it is gone, or its successor could overlap it.
    /// A flag and a `Notify` rather than a watch channel: that one's
    /// allocation costs hundreds of bytes in each of thousands of elections
    /// that never run a command.
    child_running: AtomicBool,
    /// The daemon stops (see [`Shared::stop`]): the loop stops claiming
    /// leadership, releases the row and ends. A flag rather than a child
    /// of the daemon's cancellation token each: that one's node cost 128
    /// bytes in each of thousands of elections.
    stopping: AtomicBool,
    /// Woken when `child_running` is cleared or `stopping` set: its
    /// waiters each check their own flag.
    settled: Notify,
    /// Wakes the loop for a request queued, events a renewal wave left it,
    /// a release announced, the replica's join (see [`Shared::begin`]) or
    /// the daemon's stop. One wake-up for all: each one the loop waits on
    /// costs a registration and its removal at every turn, and its place in
    /// the loop's future.
    pub(crate) wake: Signal,
    /// Events of the renewal waves (see `link`) for the loop to report,
    /// in the engine's order: appended and taken under the engine's lock.
    waves_left: Mutex<Vec<Event>>,
    /// A renewal is reported by the loop even when nothing else changed:
    /// the flag file carries the deadline.
    loop_reports_renewals: bool,
    /// A release of this election was announced (see `wakeups`).
    pub(crate) release_noticed: AtomicBool,
}

/// The part of the `/leader` body whose every change is announced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leadership {
    pub is_leader: bool,
    pub leader: Option<String>,
    pub token: Option<i64>,
    /// Why this replica does not compete (a hold's remaining time is not
    /// announced: it changes all the time).
    pub not_competing: Option<leaderd_core::NotCompeting>,
}

impl From<View> for Leadership {
    fn from(v: View) -> Self {
        Self {
            is_leader: v.is_leader,
            leader: v.leader,
            token: v.token,
            not_competing: v.standing.not_competing,
        }
    }
}

impl Shared {
    /// `replica` is made once for every election of the daemon, from the
    /// same `settings`.
    pub fn new(
        settings: &Settings,
        replica: Arc<Replica>,
        roster: Arc<Roster>,
        daemon_metrics: Arc<DaemonMetrics>,
        outages: Arc<Outages>,
    ) -> Self {
        debug_assert_eq!(
            *replica,
            Replica::new(
                settings.timing,
                settings.id.as_str(),
                settings.advertise.as_deref()
            )
        );
        debug_assert_eq!(roster.timing(), settings.timing);
        let instance = uuid::Uuid::new_v4().to_string();
        let now = boot_now();
        let id: Arc<str> = replica.id().clone();
        let mut engine = Engine::of(replica, instance, now);
        if settings.app_health.is_some() {
            // Not before the app's first check passes: an app that never
            // became healthy never leads.
            engine.set_competing(now, false, uuid::Uuid::new_v4().to_string());
        }
        Self {
            election: settings.election.as_str().into(),
            id,
            roster,
            engine: Mutex::new(engine),
            last_progress: AtomicU64::new(now.as_nanos()),
            metrics: Metrics::default(),
            daemon_metrics,
            outages,
            control: Inbox::default(),
            changes: OnceLock::new(),
            child_running: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            settled: Notify::new(),
            wake: Signal::default(),
            waves_left: Mutex::new(Vec::new()),
            loop_reports_renewals: settings.flag_file.is_some(),
            release_noticed: AtomicBool::new(false),
        }
    }

    /// The daemon's timing, the same for all its elections: the roster's
    /// (a copy here cost 32 bytes in each of thousands of elections).
    pub fn timing(&self) -> Timing {
        self.roster.timing()
    }

    /// What the loop reports at `now`: the events the renewal waves left
    /// it, then a step-down at the deadline, in the order they happened.
    pub(crate) fn events(&self, now: BootTime) -> Vec<Event> {
        let mut engine = self.engine();
        let mut events = std::mem::take(&mut *self.left());
        events.extend(engine.poll(now));
        events
    }

    /// Feeds a renewal wave's answer for this election's lease of token
    /// `held`, renewed for `instance` (see `link`): a lone renewal is
    /// logged here; anything else, a failure included, is left for the
    /// loop, which is woken.
    pub(crate) fn on_wave_answer(
        &self,
        instance: &str,
        held: i64,
        sent_at: BootTime,
        answer: Result<leaderd_core::Attempt, String>,
    ) {
        let received_at = boot_now();
        let mut engine = self.engine();
        // Stepped down on purpose since (a new instance): its release
        // follows this renewal on the connection; the answer is the old
        // instance's.
        if engine.instance() != instance {
            return;
        }
        let events: Vec<Event> = match answer {
            Ok(answer) => engine.on_wave_renewal(sent_at, received_at, held, answer),
            Err(_) => engine.on_wave_failure(received_at).into_iter().collect(),
        };
        if let ([Event::Renewed { token }], false) = (events.as_slice(), self.loop_reports_renewals)
        {
            self.log_renewed(*token, engine.lease(received_at).map(|(_, d)| d));
            return;
        }
        self.left().extend(events);
        drop(engine);
        self.wake.notify();
    }

    /// The renewal's log line (debug): its deadline lets a checker rebuild
    /// each replica's leadership from the logs. Under the loop's target,
    /// as the other transitions, whoever renewed: a filter on it keeps
    /// them all.
    pub(crate) fn log_renewed(&self, token: i64, deadline: Option<BootTime>) {
        debug!(
            target: "leaderd::runtime::election::report",
            election = %self.election,
            token,
            deadline_us = deadline.map(micros),
            "renewed"
        );
    }

    fn left(&self) -> MutexGuard<'_, Vec<Event>> {
        self.waves_left.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the loop that a release of its election was announced: its
    /// follower attempts now.
    pub fn notice_release(&self) {
        self.release_noticed.store(true, Ordering::Relaxed);
        self.wake.notify();
    }

    /// Announces a change of leadership to watchers. The loop calls it after
    /// every event and answer, and it wakes at the local deadline, so a
    /// deadline passing is announced too. Watchers wake only on a change.
    pub fn publish(&self) {
        // Nobody subscribed yet: the first one starts from the engine.
        let Some(changes) = self.changes.get() else {
            return;
        };
        let engine = self.engine();
        let now = boot_now();
        let (is_leader, leader, token) = engine.leadership(now);
        let not_competing = engine.standing(now).not_competing;
        // Compared in place, under the read lock: the write lock and a copy
        // only when it changed (rarely; this runs at every turn).
        let same = |was: &Leadership| {
            was.is_leader == is_leader
                && was.token == token
                && was.leader.as_deref() == leader
                && was.not_competing == not_competing
        };
        if same(&changes.borrow()) {
            return;
        }
        changes.send_if_modified(|was| {
            if same(was) {
                return false;
            }
            *was = Leadership {
                is_leader,
                leader: leader.map(str::to_owned),
                token,
                not_competing,
            };
            true
        });
    }

    /// A receiver woken at every change [`Shared::publish`] announces.
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        let receiver = self
            .changes
            .get_or_init(|| watch::Sender::new(self.view().into()))
            .subscribe();
        // A change between the first value's reading and the channel's
        // making found no channel to announce it on: announce it now.
        self.publish();
        receiver
    }

    /// The lease this replica holds at this instant (token and deadline),
    /// for a supervisor that may start a child on it: the gate is closed in
    /// the same engine lock, so a step-down either comes first (no lease) or
    /// finds the gate closed and waits for [`Shared::set_child_running`].
    pub fn lease_for_child(&self) -> Option<(i64, BootTime)> {
        let engine = self.engine();
        let lease = engine.lease(boot_now());
        if lease.is_some() {
            self.child_running.store(true, Ordering::SeqCst);
        }
        lease
    }

    /// Tells the loop whether a command run under `exec` is alive.
    pub fn set_child_running(&self, running: bool) {
        // Woken only when a command ended: the supervisor says "none" at
        // every turn, and the loop's attempt waits on the same `Notify`.
        let was = self.child_running.swap(running, Ordering::SeqCst);
        if was && !running {
            self.settled.notify_waiters();
        }
    }

    /// Resolves once no command run under `exec` is alive.
    pub(crate) async fn child_gone(&self) {
        self.settled_when(|| !self.child_running.load(Ordering::SeqCst))
            .await;
    }

    /// The daemon stops: the loop stops claiming leadership, releases the
    /// row and ends (see `election`). For good. The loop waiting for its
    /// next turn hears it as a wake-up, an attempt or a look in flight
    /// from [`Shared::stopped`].
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.settled.notify_waiters();
        self.wake.notify();
    }

    /// Whether [`Shared::stop`] was called.
    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Resolves once [`Shared::stop`] was called.
    pub(crate) async fn stopped(&self) {
        self.settled_when(|| self.is_stopping()).await;
    }

    /// Resolves once `done` holds, checked whenever `settled` is woken.
    async fn settled_when(&self, done: impl Fn() -> bool) {
        loop {
            // Registered before the flag is read, so a change in between
            // is not missed.
            let woken = self.settled.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if done() {
                return;
            }
            woken.await;
        }
    }

    /// The replica has joined (see `presence::begin`): the loop, waiting
    /// for that, begins.
    pub fn begin(&self) {
        self.wake.notify();
    }

    /// Sends a request to the election loop; `false` when it has stopped.
    pub fn control(&self, request: Control) -> bool {
        let sent = self.control.send(request);
        if sent {
            self.wake.notify();
        }
        sent
    }

    /// The next request to the loop, for a test's stand-in loop.
    #[cfg(test)]
    pub async fn next_control(&self) -> Control {
        loop {
            if let Some(request) = self.control.try_recv() {
                return request;
            }
            self.wake.taken().await;
        }
    }

    /// Asks the loop to step down (see [`Control::Release`]): `Ok` with the
    /// view after the release, `Err` with the view when it did not lead,
    /// `None` when the loop has stopped. With `drain`, a loop that did not
    /// lead holds off all the same.
    pub async fn release(&self, hold: Duration, drain: bool) -> Option<Result<View, View>> {
        let (reply, answer) = oneshot::channel();
        if !self.control(Control::Release { hold, drain, reply }) {
            return None;
        }
        answer.await.ok()
    }

    /// Asks the loop to end its hold and drain (see [`Control::Resume`]):
    /// whether there was one, `None` when the loop has stopped.
    pub async fn resume(&self) -> Option<bool> {
        let (reply, answer) = oneshot::channel();
        if !self.control(Control::Resume { reply }) {
            return None;
        }
        answer.await.ok()
    }

    /// Whether this replica competes (its app passes its health check, or
    /// none is configured).
    pub fn app_healthy(&self) -> bool {
        self.engine().competing()
    }

    pub(crate) fn engine(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock cannot leave the engine half-updated
        // in a way that matters more than stopping would.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Who holds this election at `now`, in one look: `Ok(token)` while
    /// this replica leads, else the other replica last seen holding a
    /// lease live now or less than a heartbeat ago, if any (see
    /// [`Engine::other_holder`]).
    pub fn holder_at<R>(&self, now: BootTime, f: impl FnOnce(Result<i64, Option<&str>>) -> R) -> R {
        let engine = self.engine();
        match engine.lease(now) {
            Some((token, _)) => f(Ok(token)),
            None => f(Err(engine.other_holder(now))),
        }
    }

    /// Whether this replica leads at `now` (cheaper than a [`View`]).
    pub fn is_leader(&self, now: BootTime) -> bool {
        self.engine().is_leader(now)
    }

    /// Leadership as of this instant.
    pub fn view(&self) -> View {
        self.engine().view(boot_now())
    }

    /// What a scrape reports, in one look: the view, and whether another
    /// process holds the lease under this replica's id.
    pub fn scraped(&self) -> (View, bool) {
        let engine = self.engine();
        let now = boot_now();
        (engine.view(now), engine.duplicate_held(now))
    }

    /// The loop went round recently. It wakes at least once per heartbeat and
    /// every attempt is bounded (a follower's by a heartbeat, a leader's
    /// renewal by the local lease it would grant), so silence longer than
    /// either means it is stuck.
    pub fn healthy(&self) -> bool {
        let t = self.timing();
        let limit =
            (t.heartbeat() * 5).max(t.local_lease() + t.heartbeat()) + Duration::from_secs(1);
        let last = BootTime::from_nanos(self.last_progress.load(Ordering::Relaxed));
        boot_now().saturating_since(last) <= limit
    }

    pub(crate) fn progress(&self, now: BootTime) {
        self.last_progress.store(now.as_nanos(), Ordering::Relaxed);
    }
}
