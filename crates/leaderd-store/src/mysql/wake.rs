//! Wake-ups on MySQL/MariaDB: a named lock per election that its leader
//! holds while it leads, on its connection to the lock table; a follower
//! of one election waits on it with `GET_LOCK`, a follower of several looks
//! at them all together.

use std::sync::Arc;

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use super::store::MysqlStore;
use crate::shared::error::StoreError;
use crate::shared::lease::WakeLock;
use crate::shared::sql::{Bind, Stmt};

/// The named lock of an election: server-wide, so the database name is part
/// of it, hashed to stay within MySQL's 64 characters. Bind: election.
macro_rules! lock_name {
    () => {
        lock_name!("?")
    };
    ($name:literal) => {
        concat!(
            "CONCAT('leaderd:', SHA1(CONCAT(DATABASE(), '/', ",
            $name,
            ")))"
        )
    };
}

/// The rows `j.n` of a JSON array of election names (bind), in order.
macro_rules! names_of_json {
    () => {
        " FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(100) PATH '$')) AS j \
         ORDER BY j.i"
    };
}

/// Waits until a leader's named lock is freed (bind: election, then the wait
/// in milliseconds): 1 when it was, 0 on timeout.
pub(super) const WAIT_FOR_LOCK: &str = concat!("SELECT GET_LOCK(", lock_name!(), ", ? / 1000)");
/// Gives back a lock won only by waking up.
pub(super) const LET_GO: &str = concat!("SELECT RELEASE_LOCK(", lock_name!(), ")");
/// Whether someone (a leader) holds the lock now.
pub(super) const LOCK_HELD: &str = concat!("SELECT IS_USED_LOCK(", lock_name!(), ") IS NOT NULL");
/// A leader takes its elections' locks without waiting, all in one
/// statement: for each, 0 when it holds it now, else the connection that
/// does (anyone who may connect can take a named lock), or -1 when the
/// server did not say. Idempotent: a lock this session holds already is
/// not taken again (a session counts a lock taken twice, and one free
/// would leave it held). Bind: the names, a JSON array.
pub(super) const TAKE_LOCKS: &str = concat!(
    "SELECT IF(IS_USED_LOCK(",
    lock_name!("j.n"),
    ") <=> CONNECTION_ID() OR COALESCE(GET_LOCK(",
    lock_name!("j.n"),
    ", 0), 0) = 1, 0, COALESCE(IS_USED_LOCK(",
    lock_name!("j.n"),
    "), -1))",
    names_of_json!()
);
/// Frees the leader's locks of those elections (bind: the names, a JSON
/// array), each waking one waiter.
pub(super) const LET_GO_ALL: &str = concat!(
    "SELECT RELEASE_LOCK(",
    lock_name!("j.n"),
    ")",
    names_of_json!()
);

/// How soon a waiter looks again for a leader's lock that nobody holds: often
/// for a while after a release (a new leader takes its lock within
/// milliseconds, and a waiter that looks late misses the next release), then
/// rarely while the election has no leader.
pub(super) const IDLE_SOON: std::time::Duration = std::time::Duration::from_millis(20);
pub(super) const IDLE_SOON_FOR: std::time::Duration = std::time::Duration::from_secs(3);
pub(super) const IDLE_LATER: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a leader's lock must have been held for the waiters (looking
/// every [`IDLE_SOON`]) to be waiting on it: two looks and a round trip.
pub(crate) const NOTICED_WITHIN: std::time::Duration =
    std::time::Duration::from_millis(2 * IDLE_SOON.as_millis() as u64 + 10);

/// Gives the election's named lock back (a no-op when this session does not
/// hold it).
pub(super) async fn let_go(
    conn: &mut AsyncMysqlConnection,
    election: &str,
) -> Result<(), StoreError> {
    Stmt::<Nullable<BigInt>>::new(LET_GO, [Bind::Text(election)])
        .get_result::<Option<i64>>(conn)
        .await?;
    Ok(())
}

/// Wake-ups without polling: while it leads, a leader holds a named lock on
/// its connection to the lock table ([`MysqlStore::hold_wake_locks`]); a
/// follower waits for that lock with `GET_LOCK`, which returns the moment
/// the leader frees it (a release, or its session ending) and gives it
/// straight back. Only a wake-up: the lock says nothing about who leads.
pub struct LockWaiter {
    conn: AsyncMysqlConnection,
    election: String,
    /// The longest single server-side wait, so that a vanished client's wait
    /// ends soon on the server too.
    wait: std::time::Duration,
}

opaque_debug!(LockWaiter);

impl LockWaiter {
    pub(crate) fn new(
        conn: AsyncMysqlConnection,
        election: &str,
        wait: std::time::Duration,
    ) -> Self {
        Self {
            conn,
            election: election.to_owned(),
            wait,
        }
    }

    /// Returns when a leader's lock was freed.
    pub(crate) async fn next(&mut self) -> Result<String, StoreError> {
        let wait_ms = i64::try_from(self.wait.as_millis()).unwrap_or(i64::MAX);
        // When a leader was last seen holding the lock: its lock is looked
        // for often for a while after it goes (see `IDLE_SOON`).
        let mut woke = tokio::time::Instant::now();
        loop {
            let held: bool =
                Stmt::<diesel::sql_types::Bool>::new(LOCK_HELD, [Bind::Text(&self.election)])
                    .get_result(&mut self.conn)
                    .await?;
            if !held {
                // No leader holds it (yet).
                let idle = if woke.elapsed() < IDLE_SOON_FOR {
                    IDLE_SOON
                } else {
                    IDLE_LATER
                };
                tokio::time::sleep(idle).await;
                continue;
            }
            woke = tokio::time::Instant::now();
            let got: Option<i64> = Stmt::<Nullable<BigInt>>::new(
                WAIT_FOR_LOCK,
                [Bind::Text(&self.election), Bind::BigInt(wait_ms)],
            )
            .get_result(&mut self.conn)
            .await?;
            if got == Some(1) {
                // Let go at once: nobody must find a follower holding it.
                let_go(&mut self.conn, &self.election).await?;
                return Ok(self.election.clone());
            }
        }
    }
}

/// Which named locks of the daemon's own elections are held now (bind:
/// their names, a JSON array): one statement whatever their number, and no
/// table read at all. Reading the lock table for the names read every row
/// of it at every look, other apps' elections too: with 20,000 rows, one
/// idle daemon kept MariaDB at a third of a core.
pub(super) const LOCKS_HELD: &str = concat!(
    "SELECT j.n, IS_USED_LOCK(",
    lock_name!("j.n"),
    ") IS NOT NULL",
    names_of_json!()
);

/// Wake-ups for several elections on one connection: `GET_LOCK` waits for
/// one lock per session, so instead the leaders' locks are all looked at
/// together every [`IDLE_SOON`] (longer beyond 200 elections), and each one
/// seen held and then free is a release (or a leader gone). Only the
/// elections this daemon does not lead are looked at: an idle daemon that
/// leads all of its own sends nothing.
pub struct LocksWatcher {
    conn: AsyncMysqlConnection,
    /// The elections watched, whose locks were held at the last look.
    looks: Looks,
    every: std::time::Duration,
}

opaque_debug!(LocksWatcher);

impl LocksWatcher {
    pub(crate) fn new(conn: AsyncMysqlConnection, elections: &[Arc<str>]) -> Self {
        // Each look asks for every election's lock: keep the looks per
        // second bounded.
        let every =
            IDLE_SOON * u32::try_from(elections.len().div_ceil(200).max(1)).unwrap_or(u32::MAX);
        Self {
            conn,
            looks: Looks::new(elections),
            every,
        }
    }

    /// The next election whose leader's lock was freed, among those
    /// `wanted` at each look (none wanted: no statement at all).
    pub(crate) async fn next(
        &mut self,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<String, StoreError> {
        loop {
            if let Some(name) = self.looks.next_freed() {
                return Ok(name);
            }
            let looked = self.looks.wanted(wanted);
            let held: Vec<(String, bool)> = if looked.is_empty() {
                Vec::new()
            } else {
                let names = names_json(&looked);
                Stmt::<(Text, diesel::sql_types::Bool)>::new(LOCKS_HELD, [Bind::Text(&names)])
                    .load(&mut self.conn)
                    .await?
            };
            // A lock's holder is only "held": seen held, looked at again,
            // and free now is a release.
            let held = held.into_iter().filter(|(_, held)| *held);
            let looked: Vec<String> = looked.into_iter().map(str::to_owned).collect();
            self.looks.record(
                looked,
                held.map(|(name, _)| (name, String::new())).collect(),
            );
            if self.looks.pending().is_empty() {
                tokio::time::sleep(self.every).await;
            }
        }
    }
}

impl MysqlStore {
    /// Takes the elections' named locks (see [`LockWaiter`]) without
    /// waiting, in one statement; whether this session holds each now, or
    /// who does (a follower that just woke may hold one for an instant:
    /// try again).
    pub(crate) async fn hold_wake_locks(
        &mut self,
        elections: &[&str],
    ) -> Result<Vec<WakeLock>, StoreError> {
        let names = names_json(elections);
        let got: Vec<i64> = Stmt::<BigInt>::new(TAKE_LOCKS, [Bind::Text(&names)])
            .load(&mut self.conn)
            .await?;
        // One row per name, in order (one missing reads as not held).
        Ok((0..elections.len())
            .map(|i| match got.get(i) {
                Some(0) => WakeLock::Held,
                Some(&id) => WakeLock::Busy(u64::try_from(id).ok()),
                None => WakeLock::Busy(None),
            })
            .collect())
    }

    /// Frees the elections' named locks, in one statement, each waking one
    /// waiter (who wakes the next).
    pub(crate) async fn free_wake_locks(&mut self, elections: &[&str]) -> Result<(), StoreError> {
        let names = names_json(elections);
        Stmt::<Nullable<BigInt>>::new(LET_GO_ALL, [Bind::Text(&names)])
            .load::<Option<i64>>(&mut self.conn)
            .await?;
        Ok(())
    }
}

/// What a follower of several elections learns by looking at all of them
/// at once (their wake-up locks, or on Galera their rows): each election
/// looked at and its holder then, and the releases not yet returned, each
/// one seen held and then not by the same holder. One not looked at (led
/// here meanwhile) is forgotten, not released: when it is looked at again,
/// its first look only records its holder.
#[derive(Debug)]
pub(super) struct Looks {
    /// Shared with the daemon: a count each, not a copy.
    elections: Vec<Arc<str>>,
    seen: std::collections::HashMap<String, String>,
    freed: std::collections::VecDeque<String>,
}

impl Looks {
    pub(super) fn new(elections: &[Arc<str>]) -> Self {
        Self {
            elections: elections.to_vec(),
            seen: std::collections::HashMap::new(),
            freed: std::collections::VecDeque::new(),
        }
    }

    /// The elections `wanted` says to look at now (see `waiter`).
    pub(super) fn wanted(&self, wanted: &(dyn Fn(&str) -> bool + Sync)) -> Vec<&str> {
        self.elections
            .iter()
            .map(|e| &**e)
            .filter(|e| wanted(e))
            .collect()
    }

    /// Records a look at `looked`, with the holder of each one held in
    /// `holders` (the others are free).
    pub(super) fn record(
        &mut self,
        looked: Vec<String>,
        holders: std::collections::HashMap<String, String>,
    ) {
        for name in looked {
            let before = self.seen.remove(&name);
            if before.is_some() && before.as_ref() != holders.get(&name) {
                self.freed.push_back(name);
            }
        }
        self.seen = holders;
    }

    /// The oldest release not yet returned.
    pub(super) fn next_freed(&mut self) -> Option<String> {
        self.freed.pop_front()
    }

    /// The releases not yet returned.
    pub(super) fn pending(&self) -> &std::collections::VecDeque<String> {
        &self.freed
    }
}

/// Names as a JSON array, for `JSON_TABLE`: one bind, one statement text,
/// whatever their number.
pub(crate) fn names_json(elections: &[&str]) -> String {
    serde_json::to_string(elections).expect("strings serialize")
}
