//! MariaDB Galera clusters: wake-ups when replicas sit on different nodes.
//!
//! `GET_LOCK` is each node's own, so a follower waiting on a leader's named
//! lock (`mysql::LockWaiter`) on another node than the leader's never sees
//! it held, and learned of a release only at its next poll: a handover took
//! a heartbeat (about 1 s) across nodes. On Galera a follower instead reads
//! its elections' rows, which the cluster replicates, every [`EVERY`] (one
//! statement for all of them, each row by its index), and wakes its loop on
//! a row it saw held and now sees free or held by another instance. Only a
//! wake-up, as everywhere: safety rests on the row and the clocks.
//!
//! Idle cost: each follower reads one row per election it does not lead per
//! look, 25 rows a second per election (the look slows beyond 200
//! elections, so a follower reads at most 5,000 rows a second).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::{Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use super::connect::{establish, galera_node};
use super::wake::{names_json, Looks, NOTICED_WITHIN};
use crate::shared::error::StoreError;
use crate::shared::sql::{Bind, Stmt};
use crate::shared::url::DatabaseUrl;

/// How often a follower reads its rows: a release is seen within this, and
/// a handover across nodes takes about this plus two round trips.
pub(crate) const EVERY: Duration = Duration::from_millis(40);

// A leader just elected waits `NOTICED_WITHIN` before it releases, so that
// the followers have seen it hold the row: a look and a round trip.
const _: () = assert!(EVERY.as_millis() + 10 <= NOTICED_WITHIN.as_millis());

/// Elections per look before the look slows down ([`EVERY`] more per as
/// many more).
const PER_LOOK: usize = 200;

/// How often a follower of `elections` elections reads their rows:
/// [`EVERY`], once more per [`PER_LOOK`] more.
fn period(elections: usize) -> Duration {
    EVERY * u32::try_from(elections.div_ceil(PER_LOOK).max(1)).unwrap_or(u32::MAX)
}

/// Each election's holding instance (bind: the names, a JSON array); a
/// plain read, no row lock, and a metadata-lock wait (a migration's `ALTER`)
/// bounded to a second. MariaDB only (`SET STATEMENT`): Galera is detected
/// on MariaDB only.
const HOLDERS: &str = "SET STATEMENT lock_wait_timeout = 1 FOR \
    SELECT CAST(l.name AS CHAR), l.instance \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$')) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) ON l.name = j.n";

/// Whether the server behind `url` is a MariaDB Galera node, on a
/// connection of its own that the caller goes on using.
pub(crate) async fn connect_if_galera(
    url: &DatabaseUrl,
) -> Result<(AsyncMysqlConnection, bool), StoreError> {
    let mut conn = establish(url).await?;
    let version: String = Stmt::<Text>::new("SELECT VERSION()", [])
        .get_result(&mut conn)
        .await?;
    let galera = galera_node(&mut conn, &version).await.is_some();
    Ok((conn, galera))
}

/// Releases of a daemon's elections on a Galera node, seen in their rows.
pub struct RowsWatcher {
    conn: AsyncMysqlConnection,
    /// The elections watched, and their holding instances at the last look.
    looks: Looks,
    /// The looks, at a fixed rate (a slow look does not space the next).
    every: tokio::time::Interval,
}

opaque_debug!(RowsWatcher);

impl RowsWatcher {
    pub(crate) fn new(conn: AsyncMysqlConnection, elections: &[Arc<str>]) -> Self {
        Self {
            conn,
            looks: Looks::new(elections),
            every: {
                let mut every = tokio::time::interval(period(elections.len()));
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                every
            },
        }
    }

    /// The next election whose row was seen held and then not by the same
    /// instance, among those `wanted` at each look (none wanted: no
    /// statement at all).
    pub(crate) async fn next(
        &mut self,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<String, StoreError> {
        loop {
            if let Some(name) = self.looks.next_freed() {
                return Ok(name);
            }
            self.every.tick().await;
            self.look(wanted).await?;
        }
    }

    /// One look at the rows of the elections `wanted` now.
    async fn look(&mut self, wanted: &(dyn Fn(&str) -> bool + Sync)) -> Result<(), StoreError> {
        let looked = self.looks.wanted(wanted);
        let holders: HashMap<String, String> = if looked.is_empty() {
            HashMap::new()
        } else {
            let names = names_json(&looked);
            Stmt::<(Text, Nullable<Text>)>::new(HOLDERS, [Bind::Text(&names)])
                .load::<(String, Option<String>)>(&mut self.conn)
                .await?
                .into_iter()
                .filter_map(|(name, instance)| Some((name, instance?)))
                .collect()
        };
        let looked: Vec<String> = looked.into_iter().map(str::to_owned).collect();
        self.looks.record(looked, holders);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Against the local MariaDB (not a Galera node: the rows are read the
    //! same way), in a database of its own.
    use diesel_async::SimpleAsyncConnection;

    use super::*;
    use crate::mysql::scratch::migrated;

    #[test]
    fn a_follower_reads_at_most_5000_rows_a_second() {
        assert_eq!(period(0), Duration::from_millis(40));
        assert_eq!(period(200), Duration::from_millis(40));
        assert_eq!(period(201), Duration::from_millis(80));
        for n in [1, 199, 200, 201, 1_000, 20_000] {
            let per_second = n as f64 / period(n).as_secs_f64();
            assert!(per_second <= 5_000.0, "{n} elections: {per_second} rows/s");
        }
    }

    #[tokio::test]
    async fn a_release_or_a_new_holder_wakes_only_a_wanted_election() {
        let (url, mut sql, dropper) = migrated().await;
        sql.batch_execute(
            "INSERT INTO service_leader_lock (name, token, holder, instance, expires_at) VALUES \
             ('e1', 1, 'a', 'ia', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR), \
             ('e2', 1, 'a', 'ia', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR), \
             ('e3', 1, 'a', 'ia', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
        )
        .await
        .unwrap();
        let (conn, galera) = connect_if_galera(&url).await.unwrap();
        assert!(!galera, "the local MariaDB is no Galera node");
        let elections: Vec<Arc<str>> = ["e1", "e2", "e3"].map(Arc::from).to_vec();
        let mut w = RowsWatcher::new(conn, &elections);
        let wanted = |e: &str| e != "e3";
        // The first look records; nothing changes: nothing is freed.
        w.look(&wanted).await.unwrap();
        w.look(&wanted).await.unwrap();
        assert!(
            w.looks.pending().is_empty(),
            "woke with no change: {:?}",
            w.looks
        );
        // e3 is not wanted (led here), e2 is released, e1 changes holder.
        sql.batch_execute(
            "UPDATE service_leader_lock SET instance = NULL, holder = NULL WHERE name IN ('e2', 'e3'); \
             UPDATE service_leader_lock SET instance = 'ib', holder = 'b', token = 2 WHERE name = 'e1'",
        )
        .await
        .unwrap();
        assert_eq!(w.next(&wanted).await.unwrap(), "e1");
        assert_eq!(w.next(&wanted).await.unwrap(), "e2");
        // A free row stays free, a holder stays: no second wake-up.
        w.look(&wanted).await.unwrap();
        assert!(w.looks.pending().is_empty(), "woke again: {:?}", w.looks);
        drop(w);
        dropper.drop_now().await;
    }
}
