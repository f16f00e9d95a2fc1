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
//! election planned for good (`plan_for_good`, two more round trips).
//! Through a transaction pooler it readies whichever server session the
//! pooler picks: no gain, no harm. A failure the server answers (no table
//! yet, a role without the right, a read-only standby, a lock not granted
//! within 100 ms) costs only the gain.

use tokio_postgres::types::ToSql;

use super::store::PgStore;
use crate::shared::error::StoreError;
use crate::shared::lease::WARM_UP_PREFIX;

/// How often [`PgStore::plan_for_good`] runs each statement: the server
/// plans a prepared statement for the values bound at its first five uses,
/// and for any values at the sixth, a plan it keeps where it looks no
/// dearer (as for one election's plain binds).
const PLAN_USES: usize = 6;

/// Around [`PgStore::plan_for_good`]'s uses: a transaction undone at the
/// end, whose statements give up a row lock after 100 ms.
const PLAN_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '100ms'";
const PLAN_END: &str = "ROLLBACK";

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
            self.plan_for_good().await?;
        }
        Ok(())
    }

    /// Prepares the statements (one round trip), then runs one election's
    /// takeover and release [`PLAN_USES`] times each, on a name no
    /// election may have, in a transaction undone at its end (one more):
    /// should a row of that name exist (made by hand, or by an older
    /// version's daemon), nothing done to it is kept and no notification
    /// is sent, and a lock on it is waited for 100 ms at most. Without
    /// it, a replica's first five attempts and releases were planned for
    /// their values, and a handover among them, typically to or from a new
    /// replica in a rolling update, paid that plan: 0.5–1.3 ms for a
    /// takeover (see `Statements::acquire_one`).
    async fn plan_for_good(&mut self) -> Result<(), StoreError> {
        self.prepare_hot().await;
        let (Some(acquire), Some(release)) = (
            self.prepared(self.stmts.acquire_one),
            self.prepared(self.stmts.release_one),
        ) else {
            return Ok(());
        };
        let name = format!("{WARM_UP_PREFIX}plan");
        let none: Option<&str> = None;
        let acquire_params: [&(dyn ToSql + Sync); 6] = [&name, &name, &name, &0_i64, &none, &none];
        let release_params: [&(dyn ToSql + Sync); 4] = [&name, &name, &none, &0_i64];
        let client = &self.client;
        // Sent together, in order: the end goes whatever the uses answer.
        let (begun, acquired, released, ended) = tokio::join!(
            client.batch_execute(PLAN_BEGIN),
            futures_util::future::join_all(
                (0..PLAN_USES).map(|_| client.query(&acquire, &acquire_params))
            ),
            futures_util::future::join_all(
                (0..PLAN_USES).map(|_| client.query(&release, &release_params))
            ),
            client.batch_execute(PLAN_END),
        );
        begun?;
        for used in acquired.into_iter().chain(released) {
            used?;
        }
        ended?;
        Ok(())
    }
}
