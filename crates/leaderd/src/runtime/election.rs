//! The election loop: drives the [`leaderd_core::Engine`] with real
//! database answers and real time, and carries out its events (logs,
//! metrics, flag file). The state it shares with the rest of the daemon is
//! in `shared`.
//!
//! One loop per election, one attempt at a time, on the daemon's one
//! connection (see `link`, which sends the loops' statements together).
//! Each attempt reads the boot clock before it is handed over (so waiting
//! for the batch shortens, never lengthens, the lease), runs under a timeout
//! no longer than what is left of the lease, and a failure drops the
//! connection so the retry uses a fresh one (cancelling a statement the
//! server may still be running). On shutdown the engine stops claiming
//! leadership first, a statement in flight may finish, then the row is
//! released on the same connection, all within a fixed budget.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::{BootTime, Event};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::clock::{boot_now, micros, unix_ms, BootTimer};
use crate::outputs::flag_file::{FlagFile, FlagWriter};
use crate::runtime::link::{Link, Reached, Request};
use crate::runtime::shared::{Control, Shared};
use crate::runtime::wakeups;
use crate::settings::Settings;

/// How long shutdown waits for a statement already in flight, then how long
/// it may spend releasing the row: together they keep the whole shutdown
/// within the spec's 2 s even when the database is gone.
const IN_FLIGHT_BUDGET: Duration = Duration::from_millis(300);
const RELEASE_BUDGET: Duration = Duration::from_millis(800);

/// How long a release on purpose may wait for a just-elected leader's
/// presence (MySQL) to be seen by the waiters; counted with the above.
const NOTICE_BUDGET: Duration = Duration::from_millis(100);

/// How long a release waits for the flag file's removal (beside the
/// [`NOTICE_BUDGET`]) before giving up the release: an fsync-heavy disk was
/// seen to take 75 ms.
const FLAG_BUDGET: Duration = Duration::from_millis(100);

/// How long shutdown waits for the presence to be let go. With the above,
/// the HTTP server's 0.3 s, the runtime's 0.1 s and the log flush's 0.1 s,
/// shutdown stays under 1.8 s.
const PRESENCE_BUDGET: Duration = Duration::from_millis(100);

/// How long after a command's deadline its reaping may take.
const CHILD_REAP_BUDGET: Duration = Duration::from_millis(200);

/// One election's loop, ready to run (see [`Election::run`]).
pub struct Election {
    lp: Loop,
    /// The wake-up presence's task (MySQL only).
    presence: Option<tokio::task::JoinHandle<()>>,
    /// Requests stop being taken when the loop ends, however it ends.
    _closed: ClosedOnDrop,
}

/// Sets up `shared`'s loop (flag file, presence) without awaiting: the
/// settings stay out of the loop's future, one of which lives per election.
pub fn start(shared: Arc<Shared>, settings: &Settings, link: Link) -> Election {
    let flag =
        settings
            .flag_file
            .clone()
            .and_then(|path| match FlagWriter::start(FlagFile::new(path)) {
                Ok(flag) => Some(flag),
                Err(e) => {
                    // No file reads as "not leader": the safe side.
                    error!(error = %e, "cannot start the flag-file writer; no flag file is kept");
                    None
                }
            });
    // A stale one from an earlier run.
    if let Some(flag) = &flag {
        flag.remove();
    }
    // Not even a task, nor its channels, where the backend needs no
    // presence (each costs kilobytes with thousands of elections); when the
    // URL cannot be read yet, the task finds out.
    let (presence, presence_task) = match settings.database.resolve() {
        Ok(url) if !leaderd_store::Presence::needed(&url) => (None, None),
        _ => {
            let (leading, leading_rx) = watch::channel(false);
            let (held_tx, held) = watch::channel(None);
            let task = tokio::spawn(wakeups::keep_presence(
                settings.database.clone(),
                link.clone(),
                shared.election.clone(),
                leading_rx,
                held_tx,
            ));
            (Some(PresenceLink { leading, held }), Some(task))
        }
    };
    let closed = ClosedOnDrop(shared.clone());
    let lp = Loop {
        db: Db {
            link,
            reached: Reached::Nothing,
            wants_link: false,
        },
        report: Report {
            flag,
            deadline: None,
            duplicate_seen: None,
        },
        shared,
        last_error: None,
        granted: false,
        unanswered: false,
        timer: BootTimer::new(),
        presence,
    };
    Election {
        lp,
        presence: presence_task,
        _closed: closed,
    }
}

impl Election {
    /// Runs the election until `shutdown` fires, then releases the row.
    pub async fn run(mut self, shutdown: CancellationToken) {
        self.lp.elect(&shutdown).await;
        // Requests from now on (a `leaderd release` in a preStop hook) are
        // answered at once ("stopped"), not after the release below.
        self.lp.shared.control.close();
        // Boxed, as every rare path: the future of the loop's life stays
        // the size of its waiting.
        Box::pin(self.finish()).await;
    }

    /// After the loop: stop claiming leadership, release the row, let the
    /// presence and the flag file go.
    async fn finish(mut self) {
        let lp = &mut self.lp;
        lp.report.step_down(&lp.shared);
        let instance = lp.shared.engine().instance().to_owned();
        lp.release_row(&instance).await;
        // The named lock (MySQL) goes with the process anyway; letting it
        // go first wakes the others a little sooner. The flag file, if the
        // disk allows, should not outlive the process.
        // Its task ends once the loop's end of `leading` is gone.
        drop(lp.presence.take());
        let presence_gone = async {
            if let Some(presence) = self.presence {
                let _ = tokio::time::timeout(PRESENCE_BUDGET, presence).await;
            }
        };
        let _ = tokio::join!(presence_gone, lp.report.flag_removed(PRESENCE_BUDGET));
    }
}

/// The loop's side of the wake-up presence (see [`wakeups::keep_presence`]).
struct PresenceLink {
    /// Whether this replica leads. Cleared only after a release of the row,
    /// so that the wake-up finds the row free.
    leading: watch::Sender<bool>,
    /// Since when the presence holds its lock.
    held: watch::Receiver<Option<tokio::time::Instant>>,
}

impl PresenceLink {
    fn set_leading(&self, leading: bool) {
        self.leading
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
    }
}

/// Closes the loop's inbox when the loop ends (or unwinds).
struct ClosedOnDrop(Arc<Shared>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.control.close();
    }
}

struct Loop {
    shared: Arc<Shared>,
    db: Db,
    report: Report,
    /// The last failure, so each change of reason is logged once.
    last_error: Option<String>,
    /// The last answer was a grant (even one too late to use).
    granted: bool,
    /// Some statement went unanswered (timed out or failed after sending):
    /// it may still commit, whatever later answers say.
    unanswered: bool,
    /// The wake-up presence (MySQL's named lock), where the backend has one.
    presence: Option<PresenceLink>,
    /// Waits for the next wake-up, and, while an attempt is in flight, for
    /// the local deadline and the attempt's timeout: a leader's on the boot
    /// clock, the clock of the deadline, a follower's on tokio's (see
    /// [`BootTimer::sleep_until_exact_or_not`]).
    timer: BootTimer,
}

/// The connection side of the loop: one attempt at a time on the daemon's
/// connection, opened outside the attempts (see [`Link`]).
struct Db {
    link: Link,
    /// How far the current attempt (or release) got: once its statement
    /// was sent, its fate is unknown if no answer comes.
    reached: Reached,
    /// This loop waits for a connection, and hears how its connect ended.
    wants_link: bool,
}

/// The reporting side: logs, metrics and the flag file for each event.
struct Report {
    flag: Option<FlagWriter>,
    /// The local deadline in force, for the transition logs.
    deadline: Option<BootTime>,
    /// The other process last seen holding the lease under our id.
    duplicate_seen: Option<Option<String>>,
}

impl Loop {
    async fn elect(&mut self, shutdown: &CancellationToken) {
        loop {
            let now = boot_now();
            self.shared.progress(now);
            let events: Vec<Event> = self.shared.engine().poll(now).into_iter().collect();
            self.report.handle(&self.shared, events);
            self.sync_presence();
            // Shutdown before any request still queued (a request handled
            // meanwhile, say a long release, may have let it come).
            if shutdown.is_cancelled() {
                return;
            }
            // Requests first: renewals slower than the renew interval follow
            // one another without a pause, and a release or an unhealthy
            // app must not wait for them to speed up.
            if let Some(request) = self.shared.control.try_recv() {
                // Boxed, as every rare path here: the loop's own future,
                // one per election, stays small.
                Box::pin(self.on_control(request)).await;
                continue;
            }
            let due = self.shared.engine().attempt_due(now);
            // Only a loop waiting for a connection hears of connects (see
            // `on_link`); from before it looks, so none is missed.
            if due && !self.db.wants_link {
                self.db.link.mark_seen();
            }
            if due && !self.db.link.connected() {
                self.db.wants_link = true;
                self.db.link.want_connection();
            } else if due {
                // Boxed: while it waits, the loop's own future (one per
                // election) holds a pointer, not the attempt's state.
                if Box::pin(self.attempt(shutdown)).await {
                    return;
                }
                continue;
            }
            let (wakeup, exact) = self.wakeup(now, due);
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                // A request is taken at the top of the loop.
                () = self.shared.wake.notified() => self.on_wake(),
                changed = self.db.link.changed(), if self.db.wants_link => self.on_link(changed),
                () = self.timer.sleep_until_exact_or_not(wakeup, exact) => {}
            }
        }
    }

    /// One acquire-or-renew, from reading the clock to feeding the answer
    /// to the engine; `true` when shutdown came meanwhile (the loop ends).
    async fn attempt(&mut self, shutdown: &CancellationToken) -> bool {
        // This attempt answers any early renewal asked for.
        self.shared.take_renew_asked();
        // Read the clock before taking the connection: the lease is
        // measured from here.
        let sent_at = boot_now();
        // A deadline that passed since the loop's top is announced now, not
        // once this attempt (then a follower's, on its looser timer) ends.
        if let Some(event) = self.shared.engine().poll(sent_at) {
            self.report.handle(&self.shared, vec![event]);
            self.sync_presence();
        }
        let timeout = self.shared.engine().attempt_timeout(sent_at);
        // A lease held at the send: this attempt renews it.
        let renewal = self.shared.engine().lease(sent_at);
        let (result, stopping) = {
            let exchange = self.db.exchange(&self.shared, sent_at, sent_at + timeout);
            tokio::pin!(exchange);
            // The lease in force, which may run out before its renewal is
            // answered (see `Engine::attempt_timeout`): the one timer wakes
            // at it first, then at the attempt's own timeout (later).
            let mut deadline = renewal.map(|(_, d)| d);
            loop {
                let wake = deadline.unwrap_or(sent_at + timeout);
                tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    // Stop claiming leadership first; then let the
                    // statement in flight finish (it may be a take
                    // that would otherwise land after our release)
                    // so the release follows it on the same
                    // connection.
                    self.report.step_down(&self.shared);
                    let finished = tokio::time::timeout(IN_FLIGHT_BUDGET, &mut exchange).await;
                    break (finished.unwrap_or_else(|_| Err("shutdown: attempt abandoned".into())), true);
                }
                r = &mut exchange => break (r, false),
                // A renewal's on the boot clock, as the lease is: caught
                // in a host's suspend, it ends at resume, and with it a
                // lease that lapsed meanwhile. A follower's attempt has
                // only its timeout, which paces its retries.
                () = self.timer.sleep_until_exact_or_not(wake, renewal.is_some()) => {
                    if deadline.take().is_none() {
                        break (Err(format!("attempt timed out after {timeout:?}")), false);
                    }
                    // Step down on time (watchers, flag file, the
                    // presence); the renewal may still renew the lease.
                    let events = self.shared.engine().poll(boot_now());
                    self.report.handle(&self.shared, events.into_iter().collect());
                    if let Some(p) = &self.presence {
                        p.set_leading(false);
                    }
                }
                }
            }
        };
        self.finish_attempt(sent_at, renewal.is_some(), result);
        stopping
    }

    /// When the loop wakes next, and whether on the boot clock exactly (see
    /// [`BootTimer::sleep_until_exact_or_not`]): while leading, as the wake-up
    /// may be the local deadline; a follower's only paces its attempts, and
    /// comes at least once per heartbeat. While an attempt waits for a
    /// connection: at the local deadline, or a heartbeat on (the link wakes
    /// it sooner when a connect finishes).
    fn wakeup(&self, now: BootTime, due: bool) -> (BootTime, bool) {
        let engine = self.shared.engine();
        let lease = engine.lease(now);
        if !due {
            let at = engine.next_wakeup();
            return match lease {
                Some(_) => (at, true),
                // At least once per heartbeat: a loose wait (a hold of up
                // to an hour) caught in a host's suspend is then late by a
                // heartbeat at most, and the loop shows progress.
                None => (at.min(now + self.shared.timing.heartbeat()), false),
            };
        }
        let later = now + self.shared.timing.heartbeat();
        let at = lease.map_or(later, |(_, deadline)| later.min(deadline));
        (at, lease.is_some())
    }

    /// What [`Shared::wake`] was woken for, beside a request.
    fn on_wake(&mut self) {
        let now = boot_now();
        if self.shared.release_noticed.swap(false, Ordering::Relaxed) {
            self.shared.engine().on_release_notice(now);
        }
        if self.shared.take_renew_asked() {
            self.shared.engine().renew_now(now);
        }
    }

    /// A connect this loop waited for finished: the next turn attempts on
    /// it, or it failed as an attempt would.
    fn on_link(&mut self, changed: Result<(), String>) {
        match changed {
            Ok(()) => self.db.wants_link = false,
            Err(reason) => {
                let events = self.failed(reason, boot_now());
                self.report.handle(&self.shared, events);
            }
        }
    }

    async fn on_control(&mut self, request: Control) {
        let now = boot_now();
        match request {
            Control::Release { hold, drain, reply } => {
                let fresh = uuid::Uuid::new_v4().to_string();
                let step_down = self.shared.engine().release(now, hold, fresh);
                let Some(step_down) = step_down else {
                    if drain {
                        // Not led here: left to the others while the
                        // replica drains (see `Engine::drain`).
                        self.shared.engine().drain(now, hold);
                    }
                    let _ = reply.send(Err(self.shared.view()));
                    return;
                };
                info!(election = %self.shared.election, hold = ?hold, "stepping down on request");
                self.step_down(step_down).await;
                self.shared.engine().hold(boot_now(), hold);
                if drain {
                    self.shared.engine().drain(boot_now(), hold);
                }
                let _ = reply.send(Ok(self.shared.view()));
            }
            Control::AppHealthy(healthy) => {
                let fresh = uuid::Uuid::new_v4().to_string();
                let step_down = self.shared.engine().set_competing(now, healthy, fresh);
                if healthy {
                    info!(election = %self.shared.election, "the app passes its health check; competing");
                } else {
                    warn!(election = %self.shared.election, "the app fails its health check; not competing");
                }
                if let Some(step_down) = step_down {
                    self.step_down(step_down).await;
                }
            }
            Control::Yield(yielding) => self.shared.engine().set_yielding(now, yielding),
        }
    }

    /// Reports a step-down on purpose and releases the lease it gave up. The
    /// engine already competes as a new instance, so this release can never
    /// free a later lease of this replica, however late it lands.
    async fn step_down(&mut self, step_down: leaderd_core::StepDown) {
        self.report.handle(&self.shared, vec![step_down.event]);
        self.release_row(&step_down.released_instance).await;
        // Whatever the release did, what may be held belongs to the old
        // instance; the fresh one has sent nothing (a shutdown now has
        // nothing to release).
        self.granted = false;
        self.unanswered = false;
    }

    /// The database may hold a lease for this instance: release it at
    /// shutdown so nobody waits out the ttl.
    fn may_hold(&self) -> bool {
        self.granted || self.unanswered
    }

    /// Tells the presence (MySQL's named lock) and the watchers whether
    /// this replica leads.
    fn sync_presence(&self) {
        if let Some(p) = &self.presence {
            p.set_leading(self.shared.engine().is_leader(boot_now()));
        }
        self.shared.publish();
    }

    /// Feeds an attempt's outcome to the engine and reports what follows;
    /// `renewal` when a lease was held at the send.
    fn finish_attempt(
        &mut self,
        sent_at: BootTime,
        renewal: bool,
        result: Result<leaderd_core::Attempt, String>,
    ) {
        let received_at = boot_now();
        let took = received_at.saturating_since(sent_at).as_secs_f64();
        self.shared.metrics.heartbeat_duration.observe(took);
        // A renewal that met no connection took no time the database could
        // be blamed for: it would pull the p99 down. One that waited in a
        // stalled batch did.
        if renewal && (result.is_ok() || self.db.reached != Reached::Nothing) {
            self.shared.metrics.renewal_duration.observe(took);
        }
        let events = match result {
            Ok(answer) => {
                self.granted = matches!(answer, leaderd_core::Attempt::Granted { .. });
                self.shared.db_ok(received_at);
                if self.last_error.take().is_some() {
                    info!(election = %self.shared.election, "database reachable again");
                }
                self.shared
                    .engine()
                    .on_attempt(sent_at, received_at, answer)
            }
            Err(reason) => {
                // A statement that was sent may still commit; a failed connect
                // cannot have granted anything.
                self.unanswered |= self.db.reached == Reached::Database;
                self.failed(reason, received_at)
            }
        };
        self.report.handle(&self.shared, events);
        // Watchers and the presence hear of it at the loop's next turn,
        // straight after (no await between), or, after a shutdown's last
        // attempt, from the step-down and `release_row`: the presence must
        // stay until the row is released.
    }

    fn failed(&mut self, reason: String, now: BootTime) -> Vec<Event> {
        self.shared.metrics.heartbeat_errors.inc();
        // A deadline this failure ends is announced before the logging.
        let events = self.shared.engine().on_failure(now).into_iter().collect();
        self.shared.publish();
        if self.last_error.as_deref() != Some(reason.as_str()) {
            warn!(election = %self.shared.election, error = %reason, "database attempt failed; retrying");
            self.last_error = Some(reason);
        } else {
            debug!(error = %reason, "attempt failed again");
        }
        events
    }

    /// After the local step-down: free the row, within [`RELEASE_BUDGET`],
    /// on the connection the last attempt used when it is still usable; then
    /// let the presence go, which wakes the others on MySQL.
    async fn release_row(&mut self, instance: &str) {
        if !self.may_hold() {
            self.sync_presence();
            return;
        }
        // Not the presence: it goes only once the row is free (below).
        self.shared.publish();
        // Under `exec`, the child was told to stop when leadership ended and
        // is killed at the deadline: its successor must not start before it
        // is gone. The bound only guards against a supervisor that is stuck.
        let child_limit = boot_now() + self.shared.timing.ttl() + CHILD_REAP_BUDGET;
        let gone = self.shared.child_gone();
        tokio::pin!(gone);
        loop {
            // The loop is not stuck while it waits: keep `/healthz` green.
            self.shared.progress(boot_now());
            let left = child_limit.saturating_since(boot_now());
            if left.is_zero() {
                error!(election = %self.shared.election, "the command did not stop in time; releasing anyway");
                break;
            }
            let tick = left.min(self.shared.timing.heartbeat());
            if tokio::time::timeout(tick, &mut gone).await.is_ok() {
                break;
            }
        }
        // The file must not say this replica leads once a successor can:
        // a disk that does not answer in time costs the handover (the lease
        // expires by itself), never a file naming a leader that is not.
        // Only a presence wanted (this replica led up to now) is waited for.
        let wanted = self.presence.as_mut().filter(|p| *p.leading.borrow());
        let presence = async {
            if let Some(p) = wanted {
                wakeups::presence_noticed(&mut p.held, NOTICE_BUDGET).await;
            }
        };
        let (flag_gone, ()) = tokio::join!(self.report.flag_removed(FLAG_BUDGET), presence);
        let election = self.shared.election.clone();
        if !flag_gone {
            self.sync_presence();
            error!(
                election,
                "the flag file was not removed in time; not releasing, the lease expires by itself"
            );
            return;
        }
        let released =
            tokio::time::timeout(RELEASE_BUDGET, self.db.release(&election, instance)).await;
        if matches!(released, Ok(Ok(_))) {
            // Whatever was unanswered has been overtaken by this release.
            self.granted = false;
            self.unanswered = false;
        }
        self.sync_presence();
        match released {
            Ok(Ok(true)) => info!(election, "released the lease"),
            Ok(Ok(false)) => info!(election, "nothing to release: the lease was no longer ours"),
            Ok(Err(e)) => {
                warn!(election, error = %e, "could not release the lease; it expires by itself")
            }
            Err(_) => warn!(election, "release timed out; the lease expires by itself"),
        }
    }
}

impl Db {
    /// One acquire-or-renew on the daemon's connection. The caller bounds
    /// it (see [`Loop::elect`]); the link cuts its batch at `until` too.
    async fn exchange(
        &mut self,
        shared: &Shared,
        sent_at: BootTime,
        until: BootTime,
    ) -> Result<leaderd_core::Attempt, String> {
        // The token we hold as of the send time, the instant the timeout was
        // computed for.
        let (held_token, instance) = {
            let engine = shared.engine();
            let held = engine.lease(sent_at).map(|(token, _)| token);
            (held, engine.instance().to_owned())
        };
        let req = Request {
            election: shared.election.clone(),
            holder: shared.id.clone(),
            instance,
            ttl: shared.timing.ttl(),
            held_token,
        };
        self.reached = Reached::Database;
        self.link.attempt(req, until).await.map_err(|failure| {
            self.reached = failure.reached;
            failure.reason
        })
    }

    /// Releases the row if `instance` holds it (connecting first if needed).
    async fn release(&mut self, election: &str, instance: &str) -> Result<bool, String> {
        self.reached = Reached::Database;
        self.link.release(election, instance).await
    }
}

impl Report {
    /// Stops claiming leadership, for good: 503 from now on, flag file gone.
    fn step_down(&mut self, shared: &Shared) {
        let event = shared.engine().shutdown(boot_now());
        self.handle(shared, event.into_iter().collect());
        self.remove_flag();
        shared.publish();
    }

    /// Logs, counts and updates the flag file for each event.
    ///
    /// Transitions carry boot-clock times in microseconds (`at_us`,
    /// `deadline_us`), comparable across every process on the host, so a
    /// checker can rebuild each replica's leadership intervals from the logs.
    fn handle(&mut self, shared: &Shared, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        // Watchers first: a log line may wait in the queue, an event may not.
        shared.publish();
        let (election, id) = (shared.election.as_str(), shared.id.as_str());
        for event in events {
            let now = boot_now();
            match event {
                Event::Acquired { token } => {
                    self.deadline = shared.engine().lease(now).map(|(_, d)| d);
                    self.write_flag(shared);
                    info!(
                        election,
                        id,
                        token,
                        at_us = micros(now),
                        deadline_us = self.deadline.map(micros),
                        "acquired leadership"
                    );
                    shared.metrics.acquired.inc();
                }
                Event::Renewed { token } => {
                    self.deadline = shared.engine().lease(now).map(|(_, d)| d);
                    self.write_flag(shared);
                    debug!(
                        election,
                        token,
                        deadline_us = self.deadline.map(micros),
                        "renewed"
                    );
                }
                Event::Lost { token, reason } => {
                    self.remove_flag();
                    info!(
                        election,
                        id,
                        token,
                        reason = reason.as_str(),
                        at_us = micros(now),
                        deadline_us = self.deadline.take().map(micros),
                        "lost leadership"
                    );
                    shared.metrics.lost.inc();
                }
                Event::DuplicateId { instance } => {
                    shared.metrics.duplicate_id.inc();
                    // Once per offending process, not at every poll.
                    if self.duplicate_seen.as_ref() == Some(&instance) {
                        continue;
                    }
                    self.duplicate_seen = Some(instance.clone());
                    error!(
                        election,
                        id,
                        other_instance = instance.as_deref().unwrap_or(""),
                        "another process holds the lease under this replica's id; give every replica its own id"
                    );
                }
            }
        }
    }

    /// Asks for the flag file to say this replica leads (never waits).
    fn write_flag(&self, shared: &Shared) {
        let Some(flag) = &self.flag else { return };
        let Some((token, deadline)) = shared.engine().lease(boot_now()) else {
            return;
        };
        flag.write(&shared.election, &shared.id, token, unix_ms(deadline));
    }

    /// Asks for the flag file to go (never waits; see [`Report::flag_removed`]).
    fn remove_flag(&self) {
        if let Some(flag) = &self.flag {
            flag.remove();
        }
    }

    /// Whether the flag file is gone, waiting at most `within` for the disk.
    async fn flag_removed(&self, within: Duration) -> bool {
        match &self.flag {
            Some(flag) => flag.removed(within).await,
            None => true,
        }
    }
}
