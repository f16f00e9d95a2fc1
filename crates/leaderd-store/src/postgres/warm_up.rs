//! Readying a new connection's server session for a takeover.
//!
//! A server session runs the table's triggers (the fence's gate, the
//! record of terms) from code it compiles, and plans the statements in
//! them, the first time each is used. A follower's attempts are refused
//! and fire none, so a connection's first takeover paid for all of it:
//! 3.9–4.7 ms against 1.2–1.5 ms after a warm-up (docs/databases.md),
//! most of a graceful handover to a replica that had never led (a new
//! replica in a rolling update). So the daemon's first connection runs
//! that path once on a row of its own, undone (`WARM_UP`): one round trip,
//! nothing kept, nothing another session reads.
//!
//! Through a transaction pooler it readies whichever server session the
//! pooler picks: no gain, no harm. A failure the server answers (no table
//! yet, a role without the right, a read-only standby, a lock not granted
//! within 100 ms) costs only the gain.

use super::store::PgStore;
use crate::shared::error::StoreError;

impl PgStore {
    /// Runs the takeover's and the release's path once, undone.
    pub(crate) async fn warm_up(&mut self) -> Result<(), StoreError> {
        self.trusted()?;
        if let Some(sql) = self.stmts.warm_up {
            self.client.batch_execute(sql).await?;
        }
        Ok(())
    }
}
