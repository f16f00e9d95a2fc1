//! When a command run under `leaderd exec` starts and stops: "Running a
//! command only while leading" (docs/integrating.md), as a state machine fed with
//! the lease and the time, like [`Engine`](crate::engine::Engine).
//!
//! Rules:
//! - a child starts when this replica leads and has more than `stop_grace`
//!   of its lease left, one child at a time (a new term's child waits for the
//!   old one to be gone);
//! - it gets SIGTERM when its term ends (lost, released, shutdown, a new
//!   token), or once less than `stop_grace` is left of the local deadline,
//!   which with the limit on `stop_grace` below means renewals are failing;
//! - it gets SIGKILL at the deadline of its term, as last known, if still
//!   alive: the lease may pass to another replica right after;
//! - a child that exits without having been told to is the end of the run.
//!
//! Reading the lease, sending signals and reaping are the caller's job.

use std::time::Duration;

use crate::time::{BootTime, Timing};

/// Why a `stop_grace` was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StopGraceError {
    /// Longer than this would warn a healthy child before each renewal.
    #[error(
        "stop_grace must be at most {max:?} (half of what a lease has left when a renewal is due), got {got:?}"
    )]
    TooLong { max: Duration, got: Duration },
    #[error("stop_grace must be more than zero")]
    Zero,
}

impl Timing {
    /// Longest `stop_grace`: half of what a lease has left when its renewal
    /// falls due. A child is then warned only when a renewal has been
    /// overdue for at least as long as the grace, never while one is merely
    /// in flight.
    pub fn max_stop_grace(&self) -> Duration {
        self.local_lease().saturating_sub(self.renew_every()) / 2
    }

    /// The default, `ttl / 4`, within [`Timing::max_stop_grace`]
    /// (only very short leases need the cap).
    pub fn default_stop_grace(&self) -> Duration {
        (self.ttl() / 4).min(self.max_stop_grace())
    }

    /// Checks a configured `stop_grace`.
    pub fn check_stop_grace(&self, stop_grace: Duration) -> Result<Duration, StopGraceError> {
        if stop_grace.is_zero() {
            return Err(StopGraceError::Zero);
        }
        let max = self.max_stop_grace();
        if stop_grace > max {
            return Err(StopGraceError::TooLong {
                max,
                got: stop_grace,
            });
        }
        Ok(stop_grace)
    }
}

/// What the caller must do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildAction {
    /// Start the command for the term with this fencing token.
    Start { token: i64 },
    /// Send SIGTERM to the child's process group.
    Term,
    /// Send SIGKILL to the child's process group.
    Kill,
    /// Nothing to do until this instant (then ask again), or until the lease
    /// or the child changes when `None`.
    Wait(Option<BootTime>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Running {
    token: i64,
    /// The deadline of its term, as last seen while the term lasted.
    deadline: BootTime,
    termed: bool,
    killed: bool,
}

/// The child's life, one term at a time. See the module docs.
#[derive(Debug)]
pub struct ChildTimer {
    stop_grace: Duration,
    child: Option<Running>,
    stopping: bool,
}

impl ChildTimer {
    /// `stop_grace` as checked by [`Timing::check_stop_grace`].
    pub fn new(stop_grace: Duration) -> Self {
        Self {
            stop_grace,
            child: None,
            stopping: false,
        }
    }

    /// No new child from now on; the one running, if any, is stopped.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// Whether a child is running (started and not yet reaped).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// The next thing to do at `now`, given the lease this replica holds at
    /// `now` (its token and local deadline). Call again after carrying out
    /// anything but [`ChildAction::Wait`].
    pub fn next(&mut self, now: BootTime, lease: Option<(i64, BootTime)>) -> ChildAction {
        let grace = self.stop_grace;
        let Some(child) = &mut self.child else {
            return match lease {
                _ if self.stopping => ChildAction::Wait(None),
                Some((token, deadline)) if now + grace < deadline => {
                    self.child = Some(Running {
                        token,
                        deadline,
                        termed: false,
                        killed: false,
                    });
                    ChildAction::Start { token }
                }
                // Renewals are failing: start once one succeeds, or not at
                // all if the deadline passes first.
                Some((_, deadline)) => ChildAction::Wait(Some(deadline)),
                None => ChildAction::Wait(None),
            };
        };
        let same_term = matches!(lease, Some((token, _)) if token == child.token);
        if let (true, Some((_, deadline))) = (same_term, lease) {
            child.deadline = deadline;
        }
        if child.killed {
            return ChildAction::Wait(None);
        }
        if now >= child.deadline {
            child.killed = true;
            return ChildAction::Kill;
        }
        if !child.termed && (self.stopping || !same_term || now + grace >= child.deadline) {
            child.termed = true;
            return ChildAction::Term;
        }
        ChildAction::Wait(Some(if child.termed {
            child.deadline
        } else {
            child.deadline - grace
        }))
    }

    /// The child's own process exited. Returns whether it did so by itself
    /// (not told to stop), which ends the run. Processes it started may live
    /// on in its group: the child counts as running, and is stopped like one,
    /// until [`ChildTimer::gone`].
    pub fn exited(&mut self) -> bool {
        let by_itself = self.child.is_some_and(|c| !c.termed && !c.killed);
        if by_itself {
            self.stopping = true;
        }
        by_itself
    }

    /// Nothing of the child is left (its whole process group is gone).
    pub fn gone(&mut self) {
        self.child = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::test_times::{at, ms};

    fn timer() -> ChildTimer {
        ChildTimer::new(ms(300))
    }

    #[test]
    fn the_default_grace_is_a_quarter_of_the_ttl_within_the_limit() {
        let t = Timing::new(ms(1000), ms(1200)).unwrap();
        // local lease 1150, renew every 400: a renewal is due with 750 left.
        assert_eq!(t.max_stop_grace(), ms(375));
        assert_eq!(t.default_stop_grace(), ms(300));
        let short = Timing::new(ms(20), ms(100)).unwrap();
        assert_eq!(short.default_stop_grace(), short.max_stop_grace());
        assert!(short.default_stop_grace() < ms(25));
    }

    #[test]
    fn a_grace_is_checked() {
        let t = Timing::new(ms(1000), ms(1200)).unwrap();
        assert_eq!(t.check_stop_grace(ms(375)), Ok(ms(375)));
        assert_eq!(
            t.check_stop_grace(ms(376)),
            Err(StopGraceError::TooLong {
                max: ms(375),
                got: ms(376)
            })
        );
        assert_eq!(t.check_stop_grace(ms(0)), Err(StopGraceError::Zero));
    }

    #[test]
    fn a_healthy_leader_runs_one_child_undisturbed() {
        let mut t = timer();
        assert_eq!(t.next(at(0), None), ChildAction::Wait(None));
        assert_eq!(
            t.next(at(0), Some((7, at(1150)))),
            ChildAction::Start { token: 7 }
        );
        assert!(t.running());
        assert_eq!(
            t.next(at(0), Some((7, at(1150)))),
            ChildAction::Wait(Some(at(850)))
        );
        // Renewed at 400: the warning moves with the deadline.
        assert_eq!(
            t.next(at(850), Some((7, at(1550)))),
            ChildAction::Wait(Some(at(1250)))
        );
    }

    #[test]
    fn failing_renewals_warn_then_kill_at_the_deadline() {
        let mut t = timer();
        t.next(at(0), Some((7, at(1150))));
        assert_eq!(t.next(at(850), Some((7, at(1150)))), ChildAction::Term);
        assert_eq!(
            t.next(at(851), Some((7, at(1150)))),
            ChildAction::Wait(Some(at(1150)))
        );
        // The lease is gone at the deadline; the child's term is not renewed.
        assert_eq!(t.next(at(1150), None), ChildAction::Kill);
        assert_eq!(t.next(at(1151), None), ChildAction::Wait(None));
        assert!(!t.exited(), "a killed child did not exit by itself");
        assert!(t.running(), "until its group is gone");
        t.gone();
        assert!(!t.running());
    }

    #[test]
    fn a_renewal_after_the_warning_moves_the_kill_but_not_back_the_warning() {
        let mut t = timer();
        t.next(at(0), Some((7, at(1150))));
        assert_eq!(t.next(at(900), Some((7, at(1150)))), ChildAction::Term);
        // Renewed at last: the child was told to go, and may take until the
        // new deadline.
        assert_eq!(
            t.next(at(950), Some((7, at(2000)))),
            ChildAction::Wait(Some(at(2000)))
        );
        assert!(!t.exited());
        t.gone();
        // Leading with a healthy lease again: a new child for the same term.
        assert_eq!(
            t.next(at(960), Some((7, at(2000)))),
            ChildAction::Start { token: 7 }
        );
    }

    #[test]
    fn a_lost_term_stops_the_child_and_kills_it_at_its_old_deadline() {
        let mut t = timer();
        t.next(at(0), Some((7, at(1150))));
        assert_eq!(t.next(at(100), None), ChildAction::Term);
        assert_eq!(t.next(at(100), None), ChildAction::Wait(Some(at(1150))));
        assert_eq!(t.next(at(1150), None), ChildAction::Kill);
    }

    #[test]
    fn a_new_term_waits_for_the_old_child() {
        let mut t = timer();
        t.next(at(0), Some((7, at(1150))));
        // The database handed out a new token (the old lease lapsed there).
        assert_eq!(t.next(at(500), Some((8, at(1600)))), ChildAction::Term);
        assert_eq!(
            t.next(at(501), Some((8, at(1600)))),
            ChildAction::Wait(Some(at(1150)))
        );
        assert!(!t.exited());
        t.gone();
        assert_eq!(
            t.next(at(600), Some((8, at(1600)))),
            ChildAction::Start { token: 8 }
        );
    }

    #[test]
    fn no_child_starts_with_less_than_the_grace_left() {
        let mut t = timer();
        assert_eq!(
            t.next(at(900), Some((7, at(1150)))),
            ChildAction::Wait(Some(at(1150)))
        );
        assert!(!t.running());
    }

    #[test]
    fn stopping_terms_the_child_and_starts_no_other() {
        let mut t = timer();
        t.next(at(0), Some((7, at(1150))));
        t.stop();
        assert_eq!(t.next(at(10), Some((7, at(1150)))), ChildAction::Term);
        assert!(!t.exited());
        t.gone();
        assert_eq!(t.next(at(20), Some((7, at(1150)))), ChildAction::Wait(None));
    }

    #[test]
    fn a_child_that_exits_by_itself_ends_the_run() {
        let mut t = timer();
        t.next(at(0), Some((7, at(1150))));
        assert!(t.exited());
        // What it started is told to stop, and killed at the deadline.
        assert_eq!(t.next(at(10), Some((7, at(1150)))), ChildAction::Term);
        assert_eq!(t.next(at(1150), None), ChildAction::Kill);
        t.gone();
        assert_eq!(
            t.next(at(1160), Some((7, at(2000)))),
            ChildAction::Wait(None)
        );
    }
}
