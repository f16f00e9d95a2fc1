//! The app-health gate (opt-in `app_health`): the app beside leaderd is
//! checked every heartbeat; after `app_health_failures` failed checks in a
//! row this replica stops competing (releasing the lease if it leads), and it
//! competes again at the first passing check. A sidecar that is healthy while
//! its app crash-loops would otherwise keep the leadership only the app can
//! use.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::debug;

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
    let heartbeat = daemon.first().timing.heartbeat();
    // The engine starts out not competing: until the first check passes.
    let mut healthy = false;
    let mut failures = failures_allowed;
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
        if !passed {
            debug!(url = %check.url, outcome = ?reply.map(|r| r.status), "app health check failed");
        }
        failures = if passed {
            0
        } else {
            failures.saturating_add(1)
        };
        let now_healthy = failures < failures_allowed;
        if now_healthy != healthy {
            healthy = now_healthy;
            // The app serves every election: all stop (or start) competing.
            for shared in daemon.all() {
                shared.control(Control::AppHealthy(healthy));
            }
        }
        for shared in daemon.all() {
            shared
                .metrics
                .app_healthy
                .store(healthy, std::sync::atomic::Ordering::Relaxed);
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(heartbeat) => {}
        }
    }
}
