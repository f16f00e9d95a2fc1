//! Takeovers held off by another session (PostgreSQL). The takeover
//! trigger takes the election's key; when another session holds it (a
//! fenced transaction, or any session that took the key: anyone who may
//! connect can), the trigger skips the row and says who holds it in a
//! notice (SQLSTATE `LF012`, "… held off by pid N (role R)", or by a
//! prepared transaction). A fenced transaction holds a takeover off for
//! its bound at most, normally well under a lease; a holder seen for
//! longer than a lease is logged at WARN, with how long since this
//! connection first saw it (other roles' transaction start times are
//! hidden from the daemon's role), once per holder and then at most once a
//! minute, and counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The notice's SQLSTATE.
pub(crate) const CODE: &str = "LF012";

/// Notices kept between two reviews at most (one per election a takeover
/// statement skipped).
const KEPT: usize = 4096;

/// How often one holder is warned about again while it lasts.
const AGAIN_AFTER: Duration = Duration::from_secs(60);

/// Holders warned about, by this process.
static WARNED: AtomicU64 = AtomicU64::new(0);

/// How many times a takeover was seen held off for longer than a lease by
/// one holder (each holder counted once).
pub fn warned_total() -> u64 {
    WARNED.load(Ordering::Relaxed)
}

/// What one connection heard and remembers.
#[derive(Debug, Default)]
pub(crate) struct HeldOff {
    /// Notices the connection's task received since the last review.
    heard: Arc<Mutex<Vec<String>>>,
    /// Each holder (its notice's text): first seen, last warned.
    since: HashMap<String, (Instant, Option<Instant>)>,
}

impl HeldOff {
    /// Where the connection's task puts the notices it receives.
    pub(crate) fn ear(&self) -> Arc<Mutex<Vec<String>>> {
        Arc::clone(&self.heard)
    }

    /// Keeps a notice (called by the connection's task).
    pub(crate) fn hear(ear: &Mutex<Vec<String>>, message: &str) {
        let mut heard = ear.lock().unwrap_or_else(|e| e.into_inner());
        if heard.len() < KEPT {
            heard.push(message.to_owned());
        }
    }

    /// After a takeover statement: each holder it heard of is remembered
    /// (one it no longer hears of is forgotten) and warned about once it
    /// has held takeovers off for longer than `lease`.
    pub(crate) fn review(&mut self, lease: Duration, now: Instant) {
        let heard = std::mem::take(&mut *self.heard.lock().unwrap_or_else(|e| e.into_inner()));
        self.since.retain(|holder, _| heard.contains(holder));
        for holder in heard {
            let (first, warned) = self.since.entry(holder.clone()).or_insert((now, None));
            let held = now.saturating_duration_since(*first);
            let due = warned.is_none_or(|at| now.saturating_duration_since(at) >= AGAIN_AFTER);
            if held > lease && due {
                if warned.is_none() {
                    WARNED.fetch_add(1, Ordering::Relaxed);
                }
                *warned = Some(now);
                tracing::warn!(
                    holder = %holder,
                    held_off_ms = u64::try_from(held.as_millis()).unwrap_or(u64::MAX),
                    "a takeover is held off for longer than a lease by a session holding the \
                     election's key (a fenced transaction that does not end, a prepared \
                     transaction, or any session that took the key): end it \
                     (docs/operations.md, \"A takeover held off\")"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_warned_about_past_a_lease_once_a_minute() {
        let mut h = HeldOff::default();
        let ear = h.ear();
        let t0 = Instant::now();
        let lease = Duration::from_millis(1200);
        let say = |h: &mut HeldOff, at: Duration| {
            HeldOff::hear(&ear, "held off by pid 7 (role r)");
            h.review(lease, t0 + at);
        };
        let before = warned_total();
        say(&mut h, Duration::ZERO);
        say(&mut h, Duration::from_millis(1000));
        assert_eq!(h.since.values().filter(|(_, w)| w.is_some()).count(), 0);
        say(&mut h, Duration::from_millis(1300));
        let first = h.since.values().next().unwrap().1;
        assert_eq!(first, Some(t0 + Duration::from_millis(1300)));
        say(&mut h, Duration::from_secs(30));
        assert_eq!(
            h.since.values().next().unwrap().1,
            first,
            "not again within a minute"
        );
        say(&mut h, Duration::from_secs(62));
        assert_eq!(
            h.since.values().next().unwrap().1,
            Some(t0 + Duration::from_secs(62))
        );
        assert!(warned_total() > before);
        // A review that did not hear of it: gone, and counted anew later.
        h.review(lease, t0 + Duration::from_secs(63));
        assert!(h.since.is_empty());
    }
}
