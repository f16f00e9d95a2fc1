//! The followers' wake-ups on PostgreSQL: `LISTEN leaderd`, which a
//! release's `NOTIFY` reaches, checked at start with a notification to
//! itself (transaction-pooling proxies drop them silently).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use super::connect::open;
use crate::shared::error::StoreError;
use crate::shared::url::DatabaseUrl;

/// The `LISTEN`/`NOTIFY` channel; the payload is the election name.
pub const CHANNEL: &str = "leaderd";

/// What [`Listener::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Our own notification came back.
    pub delivered: bool,
    /// Release notifications (election names) that arrived meanwhile.
    pub others: Vec<String>,
}

/// A dedicated connection that `LISTEN`s for release notifications.
pub struct Listener {
    client: Client,
    notifications: mpsc::UnboundedReceiver<Result<String, tokio_postgres::Error>>,
    /// For the probe's sender, a connection of its own.
    url: DatabaseUrl,
}

opaque_debug!(Listener);

impl Listener {
    /// Connects and subscribes.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let opened = open(url, true).await?;
        // The simple-query protocol: no prepared statement, named or not.
        opened
            .client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await?;
        Ok(Self {
            client: opened.client,
            notifications: opened.notifications.expect("opened to listen"),
            url: url.clone(),
        })
    }

    /// Sends a notification to itself and waits up to `within` for it.
    /// `delivered: false` means notifications are not delivered (e.g. a
    /// transaction-pooling proxy sits in between): poll instead.
    /// `nonce` tells our probe from other processes' (PIDs repeat across
    /// containers; the instance id does not). Real notifications that arrive
    /// meanwhile are returned, not lost.
    pub async fn probe(&mut self, within: Duration, nonce: &str) -> Result<Probe, StoreError> {
        let payload = format!("leaderd-probe-{nonce}");
        // Sent from another connection, as a release is: through a
        // transaction pooler both could run on the same server connection,
        // and the notification would come back to the listener although
        // releases never would.
        let sender = open(&self.url, false).await?;
        sender
            .client
            .query_typed(
                "SELECT pg_catalog.pg_notify($1, $2)::pg_catalog.text",
                &[(&CHANNEL, Type::TEXT), (&payload, Type::TEXT)],
            )
            .await?;
        let mut others = Vec::new();
        let wait = async {
            loop {
                match self.next().await? {
                    p if p == payload => return Ok::<(), StoreError>(()),
                    p if p.starts_with("leaderd-probe-") => continue,
                    p => others.push(p),
                }
            }
        };
        let delivered = match tokio::time::timeout(within, wait).await {
            Ok(r) => r.map(|()| true)?,
            Err(_) => false,
        };
        if !delivered {
            // Through a pooler the `LISTEN` stays on whichever server
            // connection ran it (no reset in transaction pooling): undo it,
            // as well as can be, before the listener is dropped.
            let _ = tokio::time::timeout(within, self.client.batch_execute("UNLISTEN *")).await;
        }
        Ok(Probe { delivered, others })
    }

    /// The payload (election name) of the next notification.
    pub async fn next(&mut self) -> Result<String, StoreError> {
        match self.notifications.recv().await {
            Some(Ok(payload)) => Ok(payload),
            Some(Err(e)) => Err(e.into()),
            None => Err(StoreError::Query(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ClosedConnection,
                Box::new("notification stream closed".to_owned()),
            ))),
        }
    }
}
