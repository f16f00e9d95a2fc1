//! Takeovers held off by another session (PostgreSQL). The takeover
//! trigger locks the election's gate row; when a fenced transaction holds
//! it (only the fence, with its owner's rights, can), the trigger skips
//! the row and says who holds it in a notice (SQLSTATE `LF012`, "… held off by pid N (role R)", or by a
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
    /// Each election held off: since when, when last heard of, when last
    /// warned about. By election, not by holder: a holder that keeps
    /// changing (a new session every half a lease) holds it off as long.
    since: HashMap<String, Held>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    first: Instant,
    last: Instant,
    warned: Option<Instant>,
}

/// The election a notice names: `… election "NAME" held off by …` (the
/// last such marker, so that a quote in the name does not cut it short).
fn election_of(notice: &str) -> Option<&str> {
    let start = notice.find("election \"")? + "election \"".len();
    let end = notice.rfind("\" held off by ")?;
    notice.get(start..end)
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

    /// After a takeover statement: each election it heard of as held off
    /// is remembered, and warned about, naming its holder now, once it has
    /// been held off for longer than `lease`. An election not heard of for
    /// two leases is forgotten: a takeover held off is tried again within
    /// a heartbeat, which is shorter than a lease.
    pub(crate) fn review(&mut self, lease: Duration, now: Instant) {
        let heard = std::mem::take(&mut *self.heard.lock().unwrap_or_else(|e| e.into_inner()));
        self.since
            .retain(|_, held| now.saturating_duration_since(held.last) <= lease * 2);
        for notice in &heard {
            let Some(election) = election_of(notice) else {
                continue;
            };
            let held = self.since.entry(election.to_owned()).or_insert(Held {
                first: now,
                last: now,
                warned: None,
            });
            held.last = now;
            let for_how_long = now.saturating_duration_since(held.first);
            let due = held
                .warned
                .is_none_or(|at| now.saturating_duration_since(at) >= AGAIN_AFTER);
            if for_how_long > lease && due {
                if held.warned.is_none() {
                    WARNED.fetch_add(1, Ordering::Relaxed);
                }
                held.warned = Some(now);
                tracing::warn!(
                    holder = %notice,
                    held_off_ms = u64::try_from(for_how_long.as_millis()).unwrap_or(u64::MAX),
                    "a takeover is held off for longer than a lease by a fenced transaction \
                     that does not end (its timeouts lifted, or prepared): end it \
                     (docs/operations.md, \"A takeover held off\")"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(pid: u32) -> String {
        format!("leaderd: takeover of election \"e\"1\" held off by pid {pid} (role r)")
    }

    #[test]
    fn an_election_held_off_is_warned_about_past_a_lease_once_a_minute() {
        let mut h = HeldOff::default();
        let ear = h.ear();
        let t0 = Instant::now();
        let lease = Duration::from_millis(1200);
        // A new holder at every try: still one election held off.
        let say = |h: &mut HeldOff, at_ms: u64| {
            HeldOff::hear(&ear, &notice(u32::try_from(at_ms).unwrap()));
            h.review(lease, t0 + Duration::from_millis(at_ms));
        };
        let before = warned_total();
        // Tried every second for 62 s: warned past the lease, then once a
        // minute.
        let mut warnings = Vec::new();
        for at_ms in (0..=62_000).step_by(1000) {
            let was = h.since.get("e\"1").and_then(|held| held.warned);
            say(&mut h, at_ms);
            let now = h.since["e\"1"].warned;
            if now != was {
                warnings.push(at_ms);
            }
        }
        assert_eq!(warnings, [2000, 62_000]);
        assert_eq!(warned_total(), before + 1, "one election held off");
        // Not heard of for two leases: forgotten.
        h.review(lease, t0 + Duration::from_millis(65_000));
        assert!(h.since.is_empty());
    }

    #[test]
    fn the_election_is_read_from_the_notice() {
        assert_eq!(election_of(&notice(7)), Some("e\"1"));
        assert_eq!(election_of("something else"), None);
    }
}
