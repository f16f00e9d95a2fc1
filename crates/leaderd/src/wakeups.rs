//! The wake-up adapters beside the election loop: a task that waits for
//! releases of this election and pokes the loop, and (MySQL) a task that
//! holds the leader's named lock while this replica leads. Wake-ups only:
//! the loop attempts when poked, and safety rests on the row and the clocks.

use std::sync::Arc;
use std::time::Duration;

use leaderd_store::{Presence, Waiter};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::settings::DatabaseSource;

/// Wakes the loop when a release of `election` is announced. Checks at start
/// that PostgreSQL notifications arrive at all; when they do not (a
/// transaction-pooling proxy drops them silently) it gives up and the loop
/// relies on polling, which it does anyway.
pub async fn wait_for_releases(
    source: DatabaseSource,
    election: String,
    instance: String,
    heartbeat: Duration,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    let mut checked = false;
    while !shutdown.is_cancelled() {
        let result: Result<(), String> = async {
            let url = source.resolve()?;
            let mut waiter = Waiter::connect(&url, &election, heartbeat)
                .await
                .map_err(|e| e.to_string())?;
            if !checked {
                let probe = waiter
                    .probe(Duration::from_secs(2), &instance)
                    .await
                    .map_err(|e| e.to_string())?;
                if probe.others.contains(&election) {
                    wake.notify_one();
                }
                if !probe.delivered {
                    // Expected behind a transaction pooler (PgBouncer): not
                    // a fault, and polling keeps every guarantee.
                    info!("release notifications are not delivered (transaction-pooling proxy?); polling only");
                    return Ok(());
                }
                debug!("release wake-ups work");
                checked = true;
            }
            backoff = Duration::from_millis(100);
            loop {
                let released = waiter.next().await.map_err(|e| e.to_string())?;
                if released == election {
                    wake.notify_one();
                }
            }
        }
        .await;
        match result {
            Ok(()) => return,
            Err(e) => debug!(error = %e, "release waiter failed; reconnecting"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(heartbeat.max(Duration::from_secs(1)));
    }
}

/// Holds the election's named lock while `leading` is true (MySQL/MariaDB;
/// returns at once on the other backends, which need none). Ends when the
/// loop drops its end of `leading`, letting the lock go.
pub async fn keep_presence(
    source: DatabaseSource,
    election: String,
    mut leading: watch::Receiver<bool>,
) {
    // The backend cannot change under a running daemon; a URL file that is
    // not readable yet (a Secret mounted late) is waited for.
    loop {
        match source.resolve() {
            Ok(url) if !Presence::needed(&url) => return,
            Ok(_) => break,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    let mut presence: Option<Presence> = None;
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        let held: Result<(), String> = async {
            if presence.is_none() {
                let url = source.resolve()?;
                let connected = Presence::connect(&url, &election).await;
                presence = Some(connected.map_err(|e| e.to_string())?);
            }
            let p = presence.as_mut().expect("connected above");
            // A follower that just woke holds the lock for an instant.
            while *leading.borrow() && !p.hold().await.map_err(|e| e.to_string())? {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = leading.wait_for(|l| !*l).await;
            p.let_go().await.map_err(|e| e.to_string())
        }
        .await;
        match held {
            Ok(()) => {}
            Err(e) => {
                debug!(error = %e, "leader presence failed; reconnecting");
                presence = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
