//! The elections' failed attempts, logged once per cause for the daemon.
//!
//! Every election of a daemon shares its one connection, so when the
//! database goes away they all fail together, with the same error. Logged
//! by each election, one dropped connection at 10,000 elections wrote
//! 20,000 lines: on-call could not find the cause in them, and the log
//! queue dropped whatever else was said meanwhile. Here the daemon logs
//! each cause once, and the database's return once, with how many
//! elections the outage cost and for how long.
//!
//! An outage runs from the first failure after every election was fine
//! until every election is fine again: elections that fail and succeed in
//! turn (a row refused under a cold start's contention) keep one outage
//! open rather than opening one each. Within it each cause, the error's
//! text, is logged the first time any election fails with it: a second,
//! different problem is never hidden behind the first, and a connect that
//! fails with one of two errors in turn is said twice, not at every turn.
//! An election that stops attempting while it fails (held, its app
//! failing) keeps the outage open until it attempts again; so that a
//! later outage is not hidden behind it, a cause said more than
//! [`SAY_AGAIN_AFTER`] ago is said again when another election fails with
//! it.

use std::sync::Mutex;
use std::time::Duration;

use leaderd_core::BootTime;
use tracing::{debug, info, warn};

/// How long a cause said stays said (see the module's docs): at most one
/// line a minute for each cause, however long an outage lasts.
const SAY_AGAIN_AFTER: Duration = Duration::from_secs(60);

/// The causes said in one outage are kept, to say each once; beyond
/// this many (errors that differ in a detail each time) they are said
/// again rather than kept without bound.
const CAUSES_KEPT: usize = 32;

/// The daemon's current outage, if any: see the module's docs.
#[derive(Debug, Default)]
pub struct Outages {
    outage: Mutex<Outage>,
}

#[derive(Debug, Default)]
struct Outage {
    /// Elections whose last attempt failed.
    failing: usize,
    /// The most that failed at once in this outage.
    most: usize,
    since: Option<BootTime>,
    /// The causes said in this outage, the first first, and when each was
    /// said last.
    causes: Vec<(String, BootTime)>,
}

/// What a change of an election's standing means for the daemon's log.
#[derive(Debug, PartialEq, Eq)]
pub enum Said {
    /// Nothing new: said already in this outage.
    Nothing,
    /// A cause not yet said in this outage.
    New,
    /// The last election failing recovered.
    Over {
        /// The most elections that failed at once.
        elections: usize,
        lasted: Duration,
        /// The outage's first cause.
        first: String,
    },
}

impl Outages {
    /// `election`'s attempt failed at `now` with `reason`, its last one
    /// with `was` (`None` when it succeeded); logs a cause new to the
    /// outage.
    pub fn failed(&self, election: &str, was: Option<&str>, reason: &str, now: BootTime) {
        if was == Some(reason) {
            debug!(election, error = %reason, "attempt failed again");
            return;
        }
        match self.fail(was.is_some(), reason, now) {
            Said::New => {
                warn!(election, error = %reason, "database attempt failed; retrying");
            }
            // Said already in this outage.
            _ => debug!(election, error = %reason, "attempt failed"),
        }
    }

    /// `election`'s attempt succeeded at `now` after failing; logs the end
    /// of the outage when no election fails any more.
    pub fn recovered(&self, election: &str, now: BootTime) {
        if let Said::Over {
            elections,
            lasted,
            first,
        } = self.recover(now)
        {
            info!(
                election,
                elections,
                failing_for_ms = lasted.as_millis(),
                after = %first,
                "database reachable again"
            );
        }
    }

    /// Counts a failure with `reason` of an election whose last attempt
    /// failed too (`again`) or succeeded.
    fn fail(&self, again: bool, reason: &str, now: BootTime) -> Said {
        let mut o = self.outage.lock().unwrap_or_else(|e| e.into_inner());
        if o.failing == 0 {
            *o = Outage {
                since: Some(now),
                ..Outage::default()
            };
        }
        if !again || o.failing == 0 {
            o.failing += 1;
            o.most = o.most.max(o.failing);
        }
        if let Some((_, said)) = o.causes.iter_mut().find(|(c, _)| c == reason) {
            if now.saturating_since(*said) < SAY_AGAIN_AFTER {
                return Said::Nothing;
            }
            *said = now;
            return Said::New;
        }
        if o.causes.len() < CAUSES_KEPT {
            o.causes.push((reason.to_owned(), now));
        }
        Said::New
    }

    fn recover(&self, now: BootTime) -> Said {
        let mut o = self.outage.lock().unwrap_or_else(|e| e.into_inner());
        if o.failing == 0 {
            return Said::Nothing;
        }
        o.failing -= 1;
        if o.failing > 0 {
            return Said::Nothing;
        }
        let o = std::mem::take(&mut *o);
        Said::Over {
            elections: o.most,
            lasted: o
                .since
                .map_or(Duration::ZERO, |since| now.saturating_since(since)),
            first: o
                .causes
                .into_iter()
                .next()
                .map(|(c, _)| c)
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootTime {
        BootTime::from_since_boot(Duration::from_millis(ms))
    }

    fn over(elections: usize, lasted_ms: u64, first: &str) -> Said {
        Said::Over {
            elections,
            lasted: Duration::from_millis(lasted_ms),
            first: first.into(),
        }
    }

    #[test]
    fn a_cause_shared_by_many_elections_is_said_once_and_its_end_once() {
        let o = Outages::default();
        assert_eq!(o.fail(false, "gone", at(10)), Said::New);
        for _ in 1..1000 {
            assert_eq!(o.fail(false, "gone", at(20)), Said::Nothing);
        }
        for _ in 1..1000 {
            assert_eq!(o.recover(at(500)), Said::Nothing);
        }
        assert_eq!(o.recover(at(510)), over(1000, 500, "gone"));
        // A later outage with the same cause is said again.
        assert_eq!(o.fail(false, "gone", at(900)), Said::New);
    }

    #[test]
    fn a_new_cause_is_said_even_within_an_outage() {
        let o = Outages::default();
        assert_eq!(o.fail(false, "gone", at(0)), Said::New);
        assert_eq!(o.fail(false, "gone", at(0)), Said::Nothing);
        assert_eq!(o.fail(true, "refused", at(5)), Said::New);
        assert_eq!(o.recover(at(50)), Said::Nothing);
        assert_eq!(o.recover(at(60)), over(2, 60, "gone"));
    }

    #[test]
    fn causes_that_alternate_are_said_once_each() {
        let o = Outages::default();
        assert_eq!(o.fail(false, "reset", at(0)), Said::New);
        assert_eq!(o.fail(true, "early eof", at(1)), Said::New);
        for i in 2..100 {
            let reason = if i % 2 == 0 { "reset" } else { "early eof" };
            assert_eq!(o.fail(true, reason, at(i)), Said::Nothing);
        }
        assert_eq!(o.recover(at(100)), over(1, 100, "reset"));
    }

    #[test]
    fn elections_failing_and_succeeding_in_turn_keep_one_outage() {
        let o = Outages::default();
        assert_eq!(o.fail(false, "refused", at(0)), Said::New);
        for i in 1..100 {
            // Another election fails, the one before it succeeds.
            assert_eq!(o.fail(false, "refused", at(i)), Said::Nothing);
            assert_eq!(o.recover(at(i)), Said::Nothing);
        }
        assert_eq!(o.recover(at(100)), over(2, 100, "refused"));
    }

    #[test]
    fn a_cause_said_a_minute_ago_is_said_again() {
        let o = Outages::default();
        assert_eq!(o.fail(false, "gone", at(0)), Said::New);
        // Held while failing: it never recovers, and the outage stays open.
        assert_eq!(o.fail(false, "gone", at(30_000)), Said::Nothing);
        assert_eq!(o.recover(at(31_000)), Said::Nothing);
        // A later failure with the same cause, over a minute after it was
        // said: said again, then not for another minute.
        assert_eq!(o.fail(false, "gone", at(61_000)), Said::New);
        assert_eq!(o.fail(false, "gone", at(62_000)), Said::Nothing);
        assert_eq!(o.fail(true, "gone", at(121_000)), Said::New);
    }

    #[test]
    fn causes_beyond_those_kept_are_said_again_not_kept() {
        let o = Outages::default();
        for i in 0..CAUSES_KEPT + 5 {
            assert_eq!(o.fail(i > 0, &format!("cause {i}"), at(0)), Said::New);
        }
        assert_eq!(o.fail(true, "cause 0", at(0)), Said::Nothing);
        assert_eq!(o.fail(true, "cause 40", at(0)), Said::New);
        assert_eq!(o.outage.lock().unwrap().causes.len(), CAUSES_KEPT);
    }

    #[test]
    fn a_recovery_outside_an_outage_says_nothing() {
        let o = Outages::default();
        assert_eq!(o.recover(at(0)), Said::Nothing);
    }
}
