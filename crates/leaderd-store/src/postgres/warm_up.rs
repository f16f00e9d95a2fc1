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
//! On a direct connection it then has the takeover and the release of one
//! election planned for good (`plan_for_good`). Through a transaction pooler it readies
//! whichever server session the pooler picks: no gain, no harm. A failure the server answers (no table
//! yet, a role without the right, a read-only standby, a lock not granted
//! within 100 ms) costs only the gain.

use tokio_postgres::types::{ToSql, Type};

use super::statements::{ACQUIRE_ONE_TYPES, RELEASE_ONE_TYPES};
use super::store::PgStore;
use crate::shared::error::StoreError;
use crate::shared::lease::WARM_UP_PREFIX;

/// How often [`PgStore::plan_for_good`] runs a statement: the server
/// plans a prepared statement for the values bound at its first five uses,
/// and for any values at the sixth, a plan it keeps where it looks no
/// dearer (as for one election's plain binds).
const PLAN_USES: usize = 6;

impl PgStore {
    /// Runs the takeover's and the release's path once, undone; then, on a
    /// direct connection, has one election's takeover and release planned
    /// for good.
    pub(crate) async fn warm_up(&mut self) -> Result<(), StoreError> {
        self.trusted()?;
        if let Some(sql) = self.stmts.warm_up {
            self.client.batch_execute(sql).await?;
        }
        if self.found_direct().await {
            let name = format!("{WARM_UP_PREFIX}plan");
            let none: Option<&str> = None;
            let (acquire, release) = (self.stmts.acquire_one, self.stmts.release_one);
            let params: [&(dyn ToSql + Sync); 6] = [&name, &name, &name, &0_i64, &none, &none];
            self.plan_for_good(acquire, ACQUIRE_ONE_TYPES, &params)
                .await?;
            let params: [&(dyn ToSql + Sync); 4] = [&name, &name, &none, &0_i64];
            self.plan_for_good(release, RELEASE_ONE_TYPES, &params)
                .await?;
        }
        Ok(())
    }

    /// Runs `sql` [`PLAN_USES`] times, in one round trip, for a name no
    /// row has (names with the warm-up's prefix are refused as elections):
    /// nothing is read, locked or written. Without it, a replica's first
    /// five attempts or releases are planned for their values, and a
    /// handover among them, typically to or from a new replica in a
    /// rolling update, paid that plan: 0.5–1.3 ms for a takeover (see
    /// `Statements::acquire_one`).
    async fn plan_for_good(
        &mut self,
        sql: &'static str,
        types: &[Type],
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        // The first use prepares it (see `PgStore::query`).
        self.query(sql, types, params).await?;
        let Some(stmt) = self.prepared(sql) else {
            return Ok(());
        };
        let client = &self.client;
        let uses =
            futures_util::future::join_all((0..PLAN_USES).map(|_| client.query(&stmt, params)))
                .await;
        for used in uses {
            used?;
        }
        Ok(())
    }
}
