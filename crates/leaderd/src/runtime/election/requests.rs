//! Reacting: to a request from outside the loop (a release, the app's
//! health, the spread's yield), a wake-up, a connect, and keeping the
//! wake-up presence in step.

use crate::clock::boot_now;
use crate::runtime::shared::Control;

use super::Loop;

use std::sync::atomic::Ordering;

use tracing::{debug, info};

impl Loop {
    /// Woken ([`Shared::wake`]): whether the daemon stops, else what the
    /// wake-up brought.
    pub(super) fn woken(&mut self) -> bool {
        if self.shared.is_stopping() {
            return true;
        }
        self.on_wake();
        false
    }

    /// What [`Shared::wake`] was woken for, beside a request.
    fn on_wake(&mut self) {
        let now = boot_now();
        if self.shared.release_noticed.swap(false, Ordering::Relaxed) {
            self.shared.engine().on_release_notice(now);
        }
    }

    /// A connect this loop waited for finished: the next turn attempts on
    /// it, or it failed as an attempt would.
    pub(super) fn on_link(&mut self, changed: Result<(), String>) {
        match changed {
            Ok(()) => self.db.wants_link = false,
            Err(reason) => {
                let events = self.failed(reason, boot_now());
                self.report.handle(&self.shared, events);
            }
        }
    }

    pub(super) async fn on_control(&mut self, request: Control) {
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
                self.step_down(step_down, drain).await;
                self.shared.engine().hold(boot_now(), hold);
                // The release may have taken a while (an `exec` command
                // stopping): the successor's take comes from now.
                self.shared.engine().look_for_take(boot_now());
                if drain {
                    self.shared.engine().drain(boot_now(), hold);
                }
                let _ = reply.send(Ok(self.shared.view()));
            }
            Control::Resume { reply } => {
                let ended = self.shared.engine().resume(now);
                if ended {
                    info!(election = %self.shared.election, "resuming on request: competing again");
                }
                let _ = reply.send(ended);
            }
            Control::AppHealthy(healthy) => {
                let fresh = uuid::Uuid::new_v4().to_string();
                let step_down = self.shared.engine().set_competing(now, healthy, fresh);
                // The presence row goes (or comes back) at once, as at a
                // drain, not at the next round: a release meanwhile would
                // name this replica, which does not take the row. From
                // every election, each after its own change: the round
                // reads the first's, and a nudge while a round runs brings
                // one more.
                self.shared.roster.nudge();
                // Said once for the daemon, with the check's outcome, by
                // `app_health`.
                debug!(election = %self.shared.election, healthy, "the app's health changed");
                if let Some(step_down) = step_down {
                    self.step_down(step_down, true).await;
                }
            }
            Control::Yield(yielding) => self.shared.engine().set_yielding(now, yielding),
        }
    }

    /// Reports a step-down on purpose and releases the lease it gave up. The
    /// engine already competes as a new instance, so this release can never
    /// free a later lease of this replica, however late it lands.
    /// `leaving`: the replica goes (drains, or stops competing), not only
    /// this election (a spread hand-over).
    pub(super) async fn step_down(&mut self, step_down: leaderd_core::StepDown, leaving: bool) {
        self.report.handle(&self.shared, vec![step_down.event]);
        self.release_row(&step_down.released_instance, leaving)
            .await;
        // Whatever the release did, what may be held belongs to the old
        // instance; the fresh one has sent nothing (a shutdown now has
        // nothing to release).
        self.granted = false;
        self.unanswered = false;
    }

    /// The database may hold a lease for this instance: release it at
    /// shutdown so nobody waits out the ttl.
    pub(super) fn may_hold(&self) -> bool {
        self.granted || self.unanswered
    }

    /// Tells the presence (MySQL's named lock) and the watchers whether
    /// this replica leads.
    pub(super) fn sync_presence(&self) {
        if let Some(p) = &self.presence {
            p.set_leading(self.shared.engine().is_leader(boot_now()));
        }
        self.shared.publish();
    }
}
