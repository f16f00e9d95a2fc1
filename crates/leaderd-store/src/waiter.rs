//! Wake-ups: how a graceful release reaches the waiting replicas at once, on
//! every backend. Only wake-ups: a replica woken attempts, and safety rests
//! on the row and the clocks as always; a lost wake-up costs at most one
//! heartbeat.
//!
//! - PostgreSQL: `LISTEN`/`NOTIFY` (the release statement notifies). Checked
//!   at start with a notification to itself, since transaction-pooling
//!   proxies drop them silently.
//! - MySQL/MariaDB: a named lock the leader holds while it leads
//!   ([`Presence`], on the daemon's connection to the lock table);
//!   a follower of one election waits on it with `GET_LOCK`, which returns
//!   when it is freed, by a release or by the leader's session ending; a
//!   daemon of several elections looks at all the locks together (one
//!   connection, one statement every 20 ms), as `GET_LOCK` waits for one
//!   lock per session.
//!   On a MariaDB Galera node, where each node has its own named locks, a
//!   follower reads its elections' rows instead, every 40 ms
//!   (`mysql::galera`).
//! - SQLite: inotify on the database's directory for a file beside the
//!   database that releases append their names to (processes on one host).

use std::sync::Arc;
use std::time::Duration;

use crate::postgres::{Listener, Probe};
use crate::shared::error::StoreError;
use crate::shared::url::{Backend, DatabaseUrl};
use crate::{mysql, sqlite};

/// The follower side: waits for releases of a daemon's elections, on one
/// connection (or file watch) for all of them.
#[derive(Debug)]
pub enum Waiter {
    Postgres(Listener),
    Mysql(mysql::LockWaiter),
    MysqlSeveral(mysql::LocksWatcher),
    Galera(mysql::RowsWatcher),
    Sqlite(sqlite::FileWaiter),
}

impl Waiter {
    /// Connects (or starts watching) for `elections` (never empty).
    /// `heartbeat` bounds each server-side wait.
    pub async fn connect(
        url: &DatabaseUrl,
        elections: &[Arc<str>],
        heartbeat: Duration,
    ) -> Result<Self, StoreError> {
        Ok(match (url.backend(), elections) {
            (Backend::Postgres, _) => Waiter::Postgres(Listener::connect(url).await?),
            (Backend::Mysql, _) => match (mysql::connect_if_galera(url).await?, elections) {
                ((conn, true), all) => Waiter::Galera(mysql::RowsWatcher::new(conn, all)),
                ((conn, false), [one]) => {
                    Waiter::Mysql(mysql::LockWaiter::new(conn, one, heartbeat))
                }
                ((conn, false), several) => {
                    Waiter::MysqlSeveral(mysql::LocksWatcher::new(conn, several))
                }
            },
            (Backend::Sqlite, _) => Waiter::Sqlite(sqlite::FileWaiter::watch(url)?),
        })
    }

    /// Checks that wake-ups arrive at all (PostgreSQL; the others need no
    /// check). See [`Listener::probe`].
    pub async fn probe(&mut self, within: Duration, nonce: &str) -> Result<Probe, StoreError> {
        match self {
            Waiter::Postgres(l) => l.probe(within, nonce).await,
            Waiter::Mysql(_) | Waiter::MysqlSeveral(_) | Waiter::Galera(_) | Waiter::Sqlite(_) => {
                Ok(Probe {
                    delivered: true,
                    others: Vec::new(),
                })
            }
        }
    }

    /// The next release. `wanted` says, at each look,
    /// whether an election's release is worth looking for (not when this
    /// daemon leads it): MySQL's several elections are looked for by
    /// polling, and a daemon leading them all then asks the server nothing.
    pub async fn next(
        &mut self,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<Released, StoreError> {
        let named = match self {
            Waiter::Postgres(l) => l.next().await?,
            Waiter::Mysql(w) => w.next().await?,
            Waiter::MysqlSeveral(w) => w.next(wanted).await?,
            Waiter::Galera(w) => w.next(wanted).await?,
            Waiter::Sqlite(w) => {
                return Ok(w
                    .next()
                    .await?
                    .map_or(Released::Unknown, Released::Election))
            }
        };
        Ok(Released::Election(named))
    }
}

/// What a [`Waiter`] heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Released {
    /// This election was released.
    Election(String),
    /// Something was released that the waiter cannot name (SQLite's wake
    /// file replaced, say): every election should look.
    Unknown,
}

/// The leader side: what a leader holds while it leads so that its end wakes
/// the others. Only MySQL/MariaDB needs one, a named lock per election led,
/// held on the daemon's one connection to the lock table (see
/// `Connection::hold_wake_locks`); elsewhere the release itself
/// announces.
#[derive(Debug)]
pub struct Presence;

impl Presence {
    /// How long the lock must have been held before letting it go wakes the
    /// waiters: a leader that releases sooner (just elected) waits for that
    /// first, or they miss the release and find out by polling.
    pub const NOTICED_WITHIN: Duration = mysql::NOTICED_WITHIN;

    /// Whether the backend needs a presence at all.
    pub fn needed(url: &DatabaseUrl) -> bool {
        url.backend() == Backend::Mysql
    }
}
