//! Database adapters of leaderd: the `service_leader_lock` table on
//! PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! A [`Connection`] runs the lease's operations as fixed SQL statements:
//! - acquire-or-renew, judged by the database's clock. A leader's renewal is
//!   one round trip everywhere; a refused attempt writes and locks nothing.
//!   PostgreSQL does it all in one `UPDATE … RETURNING`; MySQL and SQLite read
//!   first and write only to renew or to take an expired row.
//!   A missing row is inserted free and blocked for one ttl.
//! - release by the holding instance only, waking the other replicas;
//! - listing the elections, reading the record of terms, and creating the
//!   table.
//!
//! The crate is laid out in rooms, each importing only the ones below it:
//! - this file and `waiter` are the front: [`Connection`] and [`Waiter`],
//!   which pick a backend by the URL, and the public types re-exported
//!   from the rooms below;
//! - one folder per database: `postgres/`, `mysql/` (MySQL 8 and MariaDB,
//!   Galera clusters included: each statement there is one `Sql` with a
//!   MariaDB text and a MySQL text) and `sqlite/`. Each holds the same
//!   roles: `store.rs` (the connection and the lease's operations),
//!   `statements.rs` (its SQL: renewal, takeover, creation, release,
//!   listings), `lease.rs` (acquire-or-renew), its opening of a connection
//!   (`connect.rs`, SQLite's `open.rs`), its wake-ups (PostgreSQL's
//!   `listener.rs`; `wake.rs` and `galera.rs` on MySQL/MariaDB; SQLite's
//!   `wake.rs`) and `plan.rs`, its migration plan over the SQL files in
//!   `migrations/<backend>/` at the repository's root. A backend never
//!   imports another backend, nor the front;
//! - `shared/` is what every backend rests on and which knows none of them:
//!   the error type, the lease's vocabulary (`lease.rs`: requests, releases,
//!   rows), URLs and TLS, the read-first acquire-or-renew (`cas`), diesel's
//!   statement type (`sql`), the boot clock, the record of terms' rows
//!   (`history`), and the migration runner (`migrate`), which each backend
//!   hands a plan as data.
//!
//! A new backend is a new folder beside these three with those roles, a
//! variant of [`Backend`] in `shared/url.rs` (and its URL schemes there), an
//! arm in each method of [`Connection`] and [`Waiter`], and its SQL files
//! under `migrations/`. A server that speaks another's protocol and SQL
//! with small differences (as MariaDB does MySQL's) is a variant inside
//! that backend's folder instead; CockroachDB, which speaks PostgreSQL's
//! protocol but has no `LISTEN`/`NOTIFY` and its own DDL, would be a folder
//! of its own. A new statement goes in its backend's `statements.rs`, and
//! its call in that backend's `store.rs` (or the file of the path it
//! serves: `lease.rs`, a wake-up's file).
//!
//! This crate does not decide leadership (that is `leaderd-core`), retry, or
//! time out: callers wrap each call in their own timeout and drop the
//! connection when it fires.

// First, so that its macro (`opaque_debug!`) is in scope in every room.
#[macro_use]
mod shared;

mod mysql;
mod postgres;
mod sqlite;
mod waiter;

pub use leaderd_core::{Attempt, Observed};
pub use postgres::{takeovers_held_off_total, Listener, Probe};
pub use shared::clock::{boot_id, boot_now};
use shared::error::row_answer;
pub use shared::error::StoreError;
pub use shared::history::Term;
pub use shared::lease::{
    ElectionRow, FenceStatus, LeaseRequest, Migrated, Release, Successor, WakeLock,
    MAX_ADDRESS_CHARS, WARM_UP_PREFIX,
};
pub use shared::url::{Backend, DatabaseUrl};
pub use sqlite::check_file_system;
pub use waiter::{Presence, Released, Waiter};

use postgres::CancelHandle;
use shared::cas;
use shared::lease::check_address;

/// Cancels the statement in flight on a connection, from outside it: a
/// client-side timeout alone leaves the server working (or waiting on a lock)
/// for a client that has gone. A cancel request opens a new connection, with
/// the same TLS as the one it cancels.
pub struct Canceller(CancelHandle);

opaque_debug!(Canceller);

impl Canceller {
    /// Asks the server to cancel; no timeout, wrap it.
    pub async fn cancel(self) -> Result<(), StoreError> {
        self.0.cancel().await
    }
}

/// A connection to the lock table on one backend.
#[derive(Debug)]
pub enum Connection {
    Postgres(postgres::PgStore),
    Mysql(mysql::MysqlStore),
    Sqlite(sqlite::SqliteStore),
}

impl Connection {
    /// Opens a connection. No timeout: wrap it.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        Ok(match url.backend() {
            Backend::Postgres => Connection::Postgres(postgres::PgStore::connect(url).await?),
            Backend::Mysql => Connection::Mysql(mysql::MysqlStore::connect(url).await?),
            Backend::Sqlite => Connection::Sqlite(sqlite::SqliteStore::connect(url).await?),
        })
    }

    /// MySQL/MariaDB: prepares the statements that serve several elections
    /// at once, so that the first batches after a connect cost one round
    /// trip each, as every later one does (no table yet: an error the
    /// server answers; they are then prepared at first use). Elsewhere
    /// nothing to do: PostgreSQL's unnamed statements go in one round
    /// trip, SQLite is local.
    pub async fn prepare_batches(&mut self) -> Result<(), StoreError> {
        match self {
            Connection::Mysql(c) => c.prepare_batches().await,
            Connection::Postgres(_) | Connection::Sqlite(_) => Ok(()),
        }
    }

    /// PostgreSQL: runs a takeover and a release once on a row of the
    /// connection's own and undoes them, so that the server's session has
    /// compiled the table's triggers before a handover needs them (see
    /// `postgres::warm_up`; its row's name starts with [`WARM_UP_PREFIX`]).
    /// One round trip, two more on a direct connection (to have one
    /// election's takeover and release planned for good). Elsewhere
    /// nothing to do. An error the server
    /// answers costs only the gain.
    pub async fn warm_up(&mut self) -> Result<(), StoreError> {
        match self {
            Connection::Postgres(c) => c.warm_up().await,
            Connection::Mysql(_) | Connection::Sqlite(_) => Ok(()),
        }
    }

    /// The node's name when the database is a node of a MariaDB Galera
    /// cluster (read at connect); `None` elsewhere.
    pub fn galera_node(&self) -> Option<&str> {
        match self {
            Connection::Mysql(c) => c.galera_node(),
            Connection::Postgres(_) | Connection::Sqlite(_) => None,
        }
    }

    /// PostgreSQL: the rights this connection's role has beyond what the
    /// daemon needs (a superuser, the lock table's owner, CREATE in a
    /// schema on its search_path), one phrase each, read at connect. Empty
    /// elsewhere, and for the least-privilege daemon role.
    pub fn excess_rights(&self) -> &[String] {
        match self {
            Connection::Postgres(c) => c.excess_rights(),
            Connection::Mysql(_) | Connection::Sqlite(_) => &[],
        }
    }

    /// PostgreSQL: the roles other than its owner that may create objects
    /// in the lock table's schema (`PUBLIC`: everyone), read at connect.
    /// There, an app's call of `leaderd_fence` that is not written with its
    /// schema and argument types may find one of theirs. Empty elsewhere.
    pub fn others_may_create(&self) -> &[String] {
        match self {
            Connection::Postgres(c) => c.others_may_create(),
            Connection::Mysql(_) | Connection::Sqlite(_) => &[],
        }
    }

    /// A handle that cancels this connection's statement in flight, on
    /// backends that have cancel requests (PostgreSQL). MySQL and SQLite
    /// bound their waits inside each statement instead.
    pub fn canceller(&self) -> Option<Canceller> {
        match self {
            Connection::Postgres(c) => Some(Canceller(c.cancel_handle())),
            Connection::Mysql(_) | Connection::Sqlite(_) => None,
        }
    }

    /// PostgreSQL: whether statements are named and prepared once on this
    /// connection, which is done only when it was found to reach the server
    /// directly (no pooler or proxy); else they are unnamed. `None` while
    /// that is being found (beside the first statements, which are unnamed
    /// until then). Elsewhere `Some(false)` (diesel prepares MySQL's and
    /// SQLite's once per connection, which needs no such care: no
    /// transaction pooler sits in front).
    pub fn named_statements(&mut self) -> Option<bool> {
        match self {
            Connection::Postgres(c) => c.named_statements(),
            Connection::Mysql(_) | Connection::Sqlite(_) => Some(false),
        }
    }

    /// PostgreSQL: overrides [`Connection::named_statements`], for the
    /// heartbeat bench's comparison. Never force named statements through a
    /// pooler: they fail there, or run another client's statement of the
    /// same name. Elsewhere a no-op.
    pub fn set_named_statements(&mut self, named: bool) {
        if let Connection::Postgres(c) = self {
            c.set_named_statements(named);
        }
    }

    /// Acquire-or-renew, judged by the database's clock.
    pub async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        check_address(std::slice::from_ref(req))?;
        match self {
            Connection::Postgres(c) => c.acquire_or_renew(req).await,
            Connection::Mysql(c) => cas::acquire_or_renew(c, req).await,
            Connection::Sqlite(c) => cas::acquire_or_renew(c, req).await,
        }
    }

    /// Acquire-or-renew for several elections at once (distinct names, one
    /// ttl): the outcome of each, in order. Any failure fails them all (the
    /// outer error: drop the connection), except a row's own refusal to be
    /// written (its lock held elsewhere: [`StoreError::Busy`]), which is
    /// that request's alone.
    ///
    /// PostgreSQL renews every held lease in one statement and attempts the
    /// rest in one more (see `postgres::lease`). MySQL renews them in one statement (up
    /// to 16,384), reads the followers' rows in one, and creates or takes
    /// them in one each (see `cas::acquire_or_renew_many_read_together`).
    /// SQLite renews them in one transaction (one commit), reads the
    /// followers' rows together, and takes (or creates) them in one
    /// transaction more.
    pub async fn acquire_or_renew_many(
        &mut self,
        reqs: &[LeaseRequest<'_>],
    ) -> Result<Vec<Result<Attempt, StoreError>>, StoreError> {
        check_address(reqs)?;
        let mut results = match self {
            Connection::Postgres(c) => c.acquire_or_renew_many(reqs).await?,
            Connection::Mysql(c) => cas::acquire_or_renew_many_read_together(c, reqs).await,
            Connection::Sqlite(c) => cas::acquire_or_renew_many_read_together(c, reqs).await,
        };
        // Anything but a row's own lock is the connection's (or the
        // answer's) fault: the whole batch fails, and its connection with it.
        let fatal = results
            .iter()
            .position(|r| matches!(r, Err(e) if !matches!(e, StoreError::Busy)));
        match fatal {
            Some(i) => Err(results.swap_remove(i).expect_err("found above")),
            None => Ok(results),
        }
    }

    /// Releases several elections (each by its instance) at once; whether
    /// each was released, in order. As with
    /// [`Connection::acquire_or_renew_many`], any failure fails them all
    /// except a row's own lock held elsewhere ([`StoreError::Busy`]), which
    /// is that release's alone. One statement on PostgreSQL and on MySQL (a
    /// few thousand a statement there), one transaction on SQLite.
    pub async fn release_many(
        &mut self,
        items: &[Release<'_>],
    ) -> Result<Vec<Result<bool, StoreError>>, StoreError> {
        // One alone takes the single statement (prepared, and announced).
        if let [one] = items {
            return Ok(vec![row_answer(self.release_one(one).await)?]);
        }
        let all = |released: Vec<bool>| released.into_iter().map(Ok).collect();
        match self {
            Connection::Postgres(c) => c.release_many(items).await.map(all),
            Connection::Sqlite(c) => c.release_many(items).await.map(all),
            Connection::Mysql(c) => c.release_many(items).await,
        }
    }

    /// Releases the lease if `instance` holds it, naming no successor;
    /// returns whether it did.
    pub async fn release(&mut self, election: &str, instance: &str) -> Result<bool, StoreError> {
        self.release_one(&Release {
            election,
            instance,
            successor: None,
        })
        .await
    }

    /// Releases the lease if its instance holds it; returns whether it did.
    pub async fn release_one(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        match self {
            Connection::Postgres(c) => c.release(item).await,
            Connection::Mysql(c) => c.release(item).await,
            Connection::Sqlite(c) => c.release(item).await,
        }
    }

    /// Gives up being `election`'s named successor, for a daemon that will
    /// not take it within the window (it holds the election off, or
    /// drains): the row, released to `daemon` (a daemon instance) under
    /// `token` (as read) and blocked for everyone else, is open to anyone
    /// now, rather than at the window's end. Whether it was: a row that is
    /// held, open already, released to another or released again since
    /// is left alone, with nothing written or locked.
    pub async fn decline(
        &mut self,
        election: &str,
        daemon: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        match self {
            Connection::Postgres(c) => c.decline(election, daemon, token).await,
            Connection::Mysql(c) => c.decline(election, daemon, token).await,
            Connection::Sqlite(c) => c.decline(election, daemon, token).await,
        }
    }

    /// MySQL/MariaDB: takes the elections' wake-up locks (see [`Presence`])
    /// without waiting, in one statement; whether this session holds each
    /// now. Idempotent (a lock held already stays held once), held until
    /// freed or the connection ends. Elsewhere nothing to hold (the release
    /// announces): all `true`.
    pub async fn hold_wake_locks(
        &mut self,
        elections: &[&str],
    ) -> Result<Vec<WakeLock>, StoreError> {
        match self {
            Connection::Mysql(c) => c.hold_wake_locks(elections).await,
            Connection::Postgres(_) | Connection::Sqlite(_) => {
                Ok(vec![WakeLock::Held; elections.len()])
            }
        }
    }

    /// Frees the elections' wake-up locks in one statement, waking the
    /// waiters (a no-op for a lock this session does not hold, and on
    /// other backends).
    pub async fn free_wake_locks(&mut self, elections: &[&str]) -> Result<(), StoreError> {
        match self {
            Connection::Mysql(c) => c.free_wake_locks(elections).await,
            Connection::Postgres(_) | Connection::Sqlite(_) => Ok(()),
        }
    }

    /// The rows whose name starts with `prefix` (`""`: every row), by
    /// name. The filter runs in the database: a daemon that wants a few
    /// rows of a table of thousands does not fetch them all.
    pub async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        match self {
            Connection::Postgres(c) => c.elections(prefix).await,
            Connection::Mysql(c) => c.elections(prefix).await,
            Connection::Sqlite(c) => c.elections(prefix).await,
        }
    }

    /// The record of terms (see [`Term`]), newest first: of `election`
    /// (every election's with `None`), at most `limit`. `None` when it is
    /// not installed in this database.
    pub async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        match self {
            Connection::Postgres(c) => c.history(election, limit).await,
            Connection::Mysql(c) => c.history(election, limit).await,
            Connection::Sqlite(c) => c.history(election, limit).await,
        }
    }

    /// Whether the fence is installed (one query; SQLite: none).
    pub async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        match self {
            Connection::Postgres(c) => c.fence_status().await,
            Connection::Mysql(c) => c.fence_status().await,
            Connection::Sqlite(c) => c.fence_status().await,
        }
    }

    /// Creates or upgrades the table. Safe when many replicas run it at once;
    /// writes nothing (and needs no DDL rights) when already up to date.
    pub async fn migrate(self) -> Result<Migrated, StoreError> {
        match self {
            Connection::Postgres(c) => c.migrate().await,
            Connection::Mysql(c) => c.migrate().await,
            Connection::Sqlite(c) => c.migrate().await,
        }
    }
}
