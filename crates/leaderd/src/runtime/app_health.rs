//! The app-health gate (opt-in `app_health`): the app beside leaderd is
//! checked every heartbeat; after `app_health_failures` failed checks in a
//! row this replica stops competing (releasing the lease if it leads), and it
//! competes again at the first passing check. A sidecar that is healthy while
//! its app crash-loops would otherwise keep the leadership only the app can
//! use.
//!
//! Its log is the on-call's first clue when nobody leads: a WARN naming the
//! URL and what came back as soon as the app counts as failing (also when it
//! never passed since the start), again at most once a minute while it
//! lasts, and an INFO when it passes again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::http_client;
use crate::runtime::daemon::Daemon;
use crate::runtime::shared::Control;
use crate::settings::AppHealth;

/// Checks until `shutdown`. A check is a GET with a timeout of one
/// heartbeat; any 2xx passes.
pub async fn watch(
    daemon: Arc<Daemon>,
    check: AppHealth,
    failures_allowed: u32,
    shutdown: CancellationToken,
) {
    let heartbeat = daemon.first().timing().heartbeat();
    // The engine starts out not competing: until the first check passes.
    let mut healthy = false;
    let mut failures = failures_allowed;
    let mut said = Said::default();
    loop {
        let reply = http_client::request(
            &check.host,
            check.port,
            "GET",
            &check.target,
            &[],
            heartbeat,
        )
        .await;
        let passed = matches!(&reply, Ok(r) if (200..300).contains(&r.status));
        let outcome = match &reply {
            Ok(r) => format!("answered {}", r.status),
            Err(e) => format!("no answer: {e}"),
        };
        if !passed {
            debug!(url = %check.url, %outcome, "app health check failed");
        }
        failures = if passed {
            0
        } else {
            failures.saturating_add(1)
        };
        let now_healthy = failures < failures_allowed;
        match said.after_check(Instant::now(), now_healthy) {
            Say::Failing { since } => warn!(
                url = %check.url,
                %outcome,
                failures,
                failing_for_s = since.as_secs(),
                "the app fails its health check: this replica does not compete for any \
                 election until it passes"
            ),
            Say::Passing => info!(url = %check.url, "the app passes its health check: competing"),
            Say::Nothing => {}
        }
        if now_healthy != healthy {
            healthy = now_healthy;
            // The app serves every election: all stop (or start) competing.
            for shared in daemon.all() {
                shared.control(Control::AppHealthy(healthy));
            }
        }
        daemon
            .metrics()
            .app_healthy
            .store(healthy, std::sync::atomic::Ordering::Relaxed);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(heartbeat) => {}
        }
    }
}

/// What the log says of the app's health after a check.
#[derive(Debug, PartialEq, Eq)]
enum Say {
    /// It counts as failing: first since it passed (or since the start),
    /// or a minute since this was last said; `since` it began to fail.
    Failing {
        since: Duration,
    },
    /// It passes again after failing (not at the first pass after a start
    /// that was never failing long enough to be said).
    Passing,
    Nothing,
}

/// How often a failing app is said again.
const AGAIN_AFTER: Duration = Duration::from_secs(60);

/// What was said so far of a failing app.
#[derive(Debug, Default)]
struct Said {
    /// Since when it fails, once said.
    failing_since: Option<Instant>,
    last_said: Option<Instant>,
}

impl Said {
    fn after_check(&mut self, now: Instant, healthy: bool) -> Say {
        if healthy {
            self.last_said = None;
            return match self.failing_since.take() {
                Some(_) => Say::Passing,
                None => Say::Nothing,
            };
        }
        let since = *self.failing_since.get_or_insert(now);
        if self
            .last_said
            .is_some_and(|at| now.duration_since(at) < AGAIN_AFTER)
        {
            return Say::Nothing;
        }
        self.last_said = Some(now);
        Say::Failing {
            since: now.duration_since(since),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_app_is_said_at_once_then_each_minute_and_its_recovery_once() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut said = Said::default();
        // A start that passes says nothing.
        assert_eq!(said.after_check(s(0), true), Say::Nothing);
        assert_eq!(
            said.after_check(s(1), false),
            Say::Failing {
                since: Duration::ZERO
            }
        );
        assert_eq!(said.after_check(s(2), false), Say::Nothing);
        assert_eq!(said.after_check(s(60), false), Say::Nothing);
        assert_eq!(
            said.after_check(s(61), false),
            Say::Failing {
                since: Duration::from_secs(60)
            }
        );
        assert_eq!(said.after_check(s(62), true), Say::Passing);
        assert_eq!(said.after_check(s(63), true), Say::Nothing);
        // A new failure is said at once, counted from itself.
        assert_eq!(
            said.after_check(s(64), false),
            Say::Failing {
                since: Duration::ZERO
            }
        );
    }
}
