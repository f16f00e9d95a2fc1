//! Attempting: one acquire-or-renew from reading the clock to feeding the
//! answer to the engine, when the next one is due, and the connection side
//! of it ([`Db`]).

use crate::clock::boot_now;
use crate::runtime::link::{Reached, Request};
use crate::runtime::roster::Heir;
use crate::runtime::shared::Shared;

use super::{Db, Loop, IN_FLIGHT_BUDGET};

use leaderd_core::{BootTime, Event};

impl Loop {
    /// One acquire-or-renew, from reading the clock to feeding the answer
    /// to the engine; `true` when the daemon stopped meanwhile (the loop
    /// ends).
    pub(super) async fn attempt(&mut self) -> bool {
        // Read the clock before taking the connection: the lease is
        // measured from here.
        let sent_at = boot_now();
        // A deadline that passed since the loop's top is announced now, not
        // once this attempt (then a follower's, on its looser timer) ends.
        // Bound first: a guard in the `if let` would be held through its
        // body, and `sync_presence` takes the engine's lock again (on
        // MySQL this deadlocked the worker thread, and the link behind it).
        let passed = self.shared.engine().poll(sent_at);
        if let Some(event) = passed {
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
                () = self.shared.stopped() => {
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
    pub(super) fn wakeup(&self, now: BootTime, due: bool) -> (BootTime, bool) {
        let engine = self.shared.engine();
        let lease = engine.lease(now);
        if !due {
            let at = engine.next_wakeup();
            let at = engine.naming_until(now).map_or(at, |until| at.min(until));
            return match lease {
                Some(_) => (at, true),
                // At least once per heartbeat: a loose wait (a hold of up
                // to an hour) caught in a host's suspend is then late by a
                // heartbeat at most, and the loop shows progress.
                None => (at.min(now + self.shared.timing().heartbeat()), false),
            };
        }
        let later = now + self.shared.timing().heartbeat();
        let at = lease.map_or(later, |(_, deadline)| later.min(deadline));
        (at, lease.is_some())
    }

    /// Feeds an attempt's outcome to the engine and reports what follows;
    /// `renewal` when a lease was held at the send.
    pub(super) fn finish_attempt(
        &mut self,
        sent_at: BootTime,
        renewal: bool,
        result: Result<leaderd_core::Attempt, String>,
    ) {
        let received_at = boot_now();
        let took = received_at.saturating_since(sent_at).as_secs_f64();
        self.shared.daemon_metrics.heartbeat_duration.observe(took);
        // A renewal that met no connection took no time the database could
        // be blamed for: it would pull the p99 down. One that waited in a
        // stalled batch did.
        if renewal && (result.is_ok() || self.db.reached != Reached::Nothing) {
            self.shared.daemon_metrics.renewal_duration.observe(took);
        }
        let events = match result {
            Ok(answer) => {
                self.granted = matches!(answer, leaderd_core::Attempt::Granted { .. });
                if self.last_error.take().is_some() {
                    self.shared
                        .outages
                        .recovered(&self.shared.election, received_at);
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

    pub(super) fn failed(&mut self, reason: String, now: BootTime) -> Vec<Event> {
        self.shared.daemon_metrics.heartbeat_errors.inc();
        // A deadline this failure ends is announced before the logging.
        let events = self.shared.engine().on_failure(now).into_iter().collect();
        self.shared.publish();
        let was = self.last_error.as_deref();
        self.shared
            .outages
            .failed(&self.shared.election, was, &reason, now);
        self.last_error = Some(reason);
        events
    }
}

impl Db {
    /// One acquire-or-renew on the daemon's connection. The caller bounds
    /// it (see [`Loop::elect`]); the link cuts its batch at `until` too.
    pub(super) async fn exchange(
        &mut self,
        shared: &Shared,
        sent_at: BootTime,
        until: BootTime,
    ) -> Result<leaderd_core::Attempt, String> {
        // As of the send time, the instant the timeout was computed for.
        let req = Request::new(shared, &shared.engine(), sent_at);
        self.reached = Reached::Database;
        self.link.attempt(req, until).await.map_err(|failure| {
            self.reached = failure.reached;
            failure.reason
        })
    }

    /// Releases the row if `instance` holds it (connecting first if
    /// needed), naming `heir` to lead next.
    pub(super) async fn release(
        &mut self,
        election: &str,
        instance: &str,
        heir: Option<Heir>,
    ) -> Result<bool, String> {
        self.reached = Reached::Database;
        self.link.release(election, instance, heir).await
    }
}
