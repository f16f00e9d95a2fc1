//! Whether the database answers this daemon: `/readyz` and `leaderd_db_up`.
//!
//! They mean the database link and nothing else. A replica that does not
//! compete (its app fails its health check, it is held or draining, its
//! elections are left to others) sends no attempts, yet its link must not
//! read as down: on-call would be sent to a database that is fine, and a
//! readiness probe on `/readyz` would take the pod out of its Service. So
//! the daemon's connection records every statement that succeeds (a
//! connect alone is not enough: the table may be gone, a right revoked),
//! and when it has sent nothing for a heartbeat
//! it asks the database itself (see `link`), which costs an idle replica
//! one read a heartbeat and a busy one nothing.

use std::sync::Mutex;
use std::time::Duration;

use leaderd_core::{BootTime, Timing};

/// The last round trip that succeeded on the daemon's connection.
#[derive(Debug)]
pub struct Reach {
    last_ok: Mutex<Option<BootTime>>,
    /// How long after a round trip the database still counts as up:
    /// `max(3 × heartbeat, ttl)`, so that one slow or lost answer does not
    /// flap readiness.
    window: Duration,
    /// How long the link may go without a round trip before it asks.
    ask_after: Duration,
}

impl Reach {
    pub fn new(timing: &Timing) -> Self {
        Self {
            last_ok: Mutex::new(None),
            window: (timing.heartbeat() * 3).max(timing.ttl()),
            ask_after: timing.heartbeat(),
        }
    }

    /// A round trip answered at `at`.
    pub fn answered(&self, at: BootTime) {
        let mut last = self.last_ok.lock().unwrap_or_else(|e| e.into_inner());
        *last = Some(last.map_or(at, |was| was.max(at)));
    }

    /// Whether the database answered within the window before `now`.
    pub fn up(&self, now: BootTime) -> bool {
        self.last()
            .is_some_and(|at| now.saturating_since(at) <= self.window)
    }

    /// When the link must ask the database, having sent nothing that was
    /// answered since: a heartbeat after the last answer and after its own
    /// last ask (`asked`: a database that fails every statement is asked
    /// once a heartbeat, not as fast as it fails), or `now` when neither
    /// happened.
    pub fn ask_at(&self, now: BootTime, asked: Option<BootTime>) -> BootTime {
        let after = |at: Option<BootTime>| at.map_or(now, |at| at + self.ask_after);
        after(self.last()).max(after(asked))
    }

    fn last(&self) -> Option<BootTime> {
        *self.last_ok.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(heartbeat_ms: u64, ttl_ms: u64) -> Timing {
        Timing::new(
            Duration::from_millis(heartbeat_ms),
            Duration::from_millis(ttl_ms),
        )
        .unwrap()
    }

    #[test]
    fn up_within_three_heartbeats_or_a_ttl_of_the_last_answer() {
        let start = BootTime::from_since_boot(Duration::from_secs(10));
        let reach = Reach::new(&timing(1000, 1200));
        assert!(!reach.up(start), "never answered");
        assert_eq!(reach.ask_at(start, None), start, "asks at once");
        // Asked and not answered: again a heartbeat later, not at once.
        let asked = Some(start);
        assert_eq!(reach.ask_at(start, asked), start + Duration::from_secs(1));
        reach.answered(start);
        assert!(reach.up(start + Duration::from_millis(3000)));
        assert!(!reach.up(start + Duration::from_millis(3001)));
        assert_eq!(reach.ask_at(start, None), start + Duration::from_secs(1));
        // A late answer of an earlier send never moves it back.
        reach.answered(start - Duration::from_millis(500));
        assert_eq!(reach.ask_at(start, None), start + Duration::from_secs(1));
        // A ttl longer than three heartbeats sets the window.
        let long = Reach::new(&timing(100, 1200));
        long.answered(start);
        assert!(long.up(start + Duration::from_millis(1200)));
        assert!(!long.up(start + Duration::from_millis(1201)));
    }
}
