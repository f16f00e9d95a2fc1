//! Database adapters of leaderd: the `service_leader_lock` table on
//! PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! A [`Connection`] runs the lease's operations as fixed SQL statements: on
//! MySQL and SQLite through diesel (see `sql`), prepared once per connection;
//! on PostgreSQL on tokio-postgres as unnamed statements, so that they work
//! through a transaction pooler (see `pg`). TLS (rustls) and the URL's
//! parameters are in `tls` and `url`.
//! - acquire-or-renew, judged by the database's clock. A leader's renewal is
//!   one round trip everywhere; a refused attempt writes and locks nothing.
//!   PostgreSQL does it all in one `UPDATE … RETURNING`; MySQL and SQLite read
//!   first and write only to renew or to take an expired row (see `cas`).
//!   A missing row is inserted free and blocked for one ttl.
//! - release by the holding instance only (with `NOTIFY` on PostgreSQL);
//! - listing the elections, and creating the table (see `migrate`).
//!
//! This crate does not decide leadership (that is `leaderd-core`), retry, or
//! time out: callers wrap each call in their own timeout and drop the
//! connection when it fires.

/// `Debug` for a type that wraps a live connection: its name, nothing inside
/// (drivers' own `Debug` may show connection details).
macro_rules! opaque_debug {
    ($ty:ident) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty)).finish_non_exhaustive()
            }
        }
    };
}

mod cas;
mod clock;
mod galera;
mod held_off;
mod history;
mod migrate;
mod mysql;
mod pg;
mod pg_session;
mod sql;
mod sqlite;
mod tls;
mod url;
mod wake;

use std::time::Duration;

pub use clock::{boot_id, boot_now};
pub use held_off::warned_total as takeovers_held_off_total;
pub use history::Term;
pub use leaderd_core::{Attempt, Observed};
pub use pg::{Listener, Probe};
pub use sqlite::check_file_system;
pub use url::{Backend, DatabaseUrl};
pub use wake::{Presence, Waiter};

/// Errors of the store. Messages never contain the database password.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL cannot be used.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// Connecting failed (network, authentication, unknown database, a
    /// TLS handshake refused: the message says why).
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] diesel::ConnectionError),
    /// The TLS set-up cannot be made (a CA or key file unreadable, no CA
    /// store on the system).
    #[error("TLS: {0}")]
    Tls(String),
    /// A PostgreSQL statement failed (tokio-postgres runs the lock-table
    /// statements directly; see `pg`).
    #[error("database error: {}", pg::describe(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// A statement failed (missing table, permission denied, lost connection).
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
    /// The row is ours, but another transaction holds its lock: nothing was
    /// written, nothing waited. Not a refusal: the lease may still be ours.
    #[error("the lock row is locked by another transaction")]
    Busy,
    /// The server or session cannot be used safely (e.g. autocommit off).
    #[error("unsupported database session: {0}")]
    Unsupported(String),
    /// The database file cannot be used safely (e.g. on a network file
    /// system).
    #[error("{0}")]
    UnsafeFile(String),
    /// Creating or upgrading the table failed.
    #[error("migration failed: {0}")]
    Migration(String),
    /// The database is not safe to use: leaderd's schema, tables or
    /// functions belong to a role that could run code with this user's
    /// rights through them (the migration's guard said so, naming which).
    /// Nothing was installed, and no lease is attempted there.
    #[error("unsafe database: {0}")]
    Unsafe(String),
    /// A lock the migration needs is held by another transaction, and was
    /// not waited for (waiting would queue every renewal behind it):
    /// nothing was changed; try again later.
    #[error("migration postponed: the lock table is in use by another transaction ({0})")]
    MigrationBusy(String),
    /// Local I/O failed (reading the boot id, a blocking task died).
    #[error("{0}")]
    Local(String),
}

impl StoreError {
    /// Whether the database answered with this error (a refused statement,
    /// a missing right), as opposed to not answering (a connection that
    /// failed or was cut): trying again changes nothing until someone acts.
    pub fn answered(&self) -> bool {
        match self {
            StoreError::Postgres(e) => e.as_db_error().is_some(),
            StoreError::Query(diesel::result::Error::DatabaseError(..)) => true,
            StoreError::Query(_) => false,
            StoreError::Migration(_)
            | StoreError::Unsafe(_)
            | StoreError::Busy
            | StoreError::Unsupported(_)
            | StoreError::UnsafeFile(_) => true,
            // Answered, but not for good: the lock is free again soon.
            StoreError::MigrationBusy(_) => false,
            StoreError::InvalidUrl(_)
            | StoreError::Connect(_)
            | StoreError::Tls(_)
            | StoreError::Local(_) => false,
        }
    }
}

/// One acquire-or-renew request.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// The election (row) name.
    pub election: &'a str,
    /// The configured `id`, stored as `holder`.
    pub holder: &'a str,
    /// This process's random instance id; only it may renew or release.
    pub instance: &'a str,
    /// Lease length granted by the database.
    pub ttl: Duration,
    /// The token this instance holds while it leads, so a renewal can be a
    /// single `UPDATE` on backends without `RETURNING`.
    pub held_token: Option<i64>,
    /// The daemon's own instance, as releases name successors (see
    /// [`Successor`]): a row released to it may be taken before its window
    /// ends. `None`: only as anyone may.
    pub daemon: Option<&'a str>,
    /// Where this replica's app can be reached (`advertise`), written to
    /// the row when this request takes it over, with `instance`.
    pub address: Option<&'a str>,
}

impl LeaseRequest<'_> {
    fn ttl_us(&self) -> i64 {
        i64::try_from(self.ttl.as_micros()).unwrap_or(i64::MAX)
    }

    /// How long a row this request creates stays blocked: one ttl, so that
    /// a holder whose row was deleted steps down before anyone takes over.
    /// A presence row (`leaderd_core::spread::PRESENCE_PREFIX`) leases
    /// nothing anyone acts on, and is open at once: a replica that has just
    /// started is a candidate (a successor, a share) from its first round.
    fn block_us(&self) -> i64 {
        if self
            .election
            .starts_with(leaderd_core::spread::PRESENCE_PREFIX)
        {
            0
        } else {
            self.ttl_us()
        }
    }
}

/// The most characters an address may hold (the column's width).
pub const MAX_ADDRESS_CHARS: usize = 255;

/// Refuses an address the column cannot hold, before anything is sent: a
/// backend would cut it short (MySQL's `JSON_TABLE`, with a warning) or
/// fail the whole batch.
fn check_address(reqs: &[LeaseRequest<'_>]) -> Result<(), StoreError> {
    match reqs
        .iter()
        .filter_map(|r| r.address)
        .find(|a| a.chars().count() > MAX_ADDRESS_CHARS)
    {
        Some(a) => Err(StoreError::Local(format!(
            "an address of {} characters (at most {MAX_ADDRESS_CHARS})",
            a.chars().count()
        ))),
        None => Ok(()),
    }
}

/// One lease to free.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    pub election: &'a str,
    /// Only this instance's lease is freed.
    pub instance: &'a str,
    /// Who should lead next, if anyone was named.
    pub successor: Option<Successor<'a>>,
}

/// A named successor: the released row is
/// free but blocked for `window` by the database's clock, and only an
/// attempt whose [`LeaseRequest::daemon`] is `daemon` may take it before
/// then. So the others, woken by the release, are refused (writing
/// nothing) and try again once the window is over: a successor that died
/// costs at most the window.
#[derive(Debug, Clone, Copy)]
pub struct Successor<'a> {
    pub daemon: &'a str,
    pub window: Duration,
}

impl Release<'_> {
    /// The successor's window in microseconds; 0 with none.
    fn window_us(&self) -> i64 {
        self.successor.map_or(0, |s| {
            i64::try_from(s.window.as_micros()).unwrap_or(i64::MAX)
        })
    }
}

/// One row of the table, as `leaderd status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionRow {
    pub name: String,
    pub holder: Option<String>,
    pub token: i64,
    /// Remaining lease by the database's clock; negative when expired.
    pub remaining_us: i64,
    /// The holding instance, `None` when free.
    pub instance: Option<String>,
    /// How long the holding instance has held the row, by the database's
    /// clock (since `acquired_at`); 0 when free.
    pub held_us: i64,
    /// The holder's advertised address, `None` when it set none (or its
    /// daemon predates addresses).
    pub address: Option<String>,
}

impl ElectionRow {
    /// The row as an attempt's refusal would report it (a look's answer).
    pub fn into_observed(self) -> Observed {
        Observed {
            holder: self.holder,
            instance: self.instance,
            token: self.token,
            remaining_us: self.remaining_us,
            address: self.address,
        }
    }

    /// The holder while its lease is live by the database's clock.
    pub fn live_holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|_| self.remaining_us > 0)
    }

    /// The live holder's advertised address.
    pub fn live_address(&self) -> Option<&str> {
        self.address.as_deref().filter(|_| self.remaining_us > 0)
    }
}

/// A row as the backends read it: name, holder, token, remaining µs,
/// instance, held µs, address.
pub(crate) type RowParts = (
    String,
    Option<String>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
);

impl From<RowParts> for ElectionRow {
    fn from((name, holder, token, remaining_us, instance, held_us, address): RowParts) -> Self {
        Self {
            name,
            holder,
            token,
            remaining_us,
            instance,
            held_us: held_us.unwrap_or(0),
            address,
        }
    }
}

/// A refusal as the backend reported it. A row that is still this
/// instance's live lease yet was not renewed was skipped because another
/// transaction holds its lock: that is [`StoreError::Busy`], never a loss.
fn refusal(req: &LeaseRequest<'_>, seen: Observed) -> Result<Attempt, StoreError> {
    if seen.instance.as_deref() == Some(req.instance) && seen.remaining_us > 0 {
        return Err(StoreError::Busy);
    }
    Ok(Attempt::Refused(seen))
}

/// The holder, instance, token, remaining µs and address of a row.
type SeenParts = (Option<String>, Option<String>, i64, i64, Option<String>);

fn observed((holder, instance, token, remaining_us, address): SeenParts) -> Observed {
    Observed {
        holder,
        instance,
        token,
        remaining_us,
        address,
    }
}

/// A row as `req` sees it (the read-first backends): released to `req`'s
/// daemon (free, `successor` it), it is open to it now, whatever is left of
/// the window the others wait out, so it reads as expired.
fn as_heir(req: &LeaseRequest<'_>, mut seen: Observed, successor: Option<&str>) -> Observed {
    if seen.instance.is_none() && successor.is_some() && successor == req.daemon {
        seen.remaining_us = seen.remaining_us.min(0);
    }
    seen
}

/// What a migration run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrated {
    /// Everything was already in place; nothing was written.
    UpToDate,
    /// Pending migrations were applied.
    Applied,
}

/// Whether this database offers fenced writes (docs/integrating.md, "Fenced writes"), as
/// the connected user can see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceStatus {
    /// `leaderd_fence` at this daemon's version or a newer one (on
    /// MySQL/MariaDB with its table and both triggers).
    Installed,
    /// Absent, older, or the "not installed" stub: an app's call fails.
    NotInstalled,
    /// Not seen, and this user could not see it (MySQL/MariaDB: triggers
    /// show only to users with the TRIGGER right, which a daemon's user
    /// lacks): ask as the migrating user.
    NotVisible,
    /// SQLite has no function: the app follows the documented recipe.
    Recipe,
}

impl FenceStatus {
    /// The name `leaderd status` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceStatus::Installed => "installed",
            FenceStatus::NotInstalled => "not_installed",
            FenceStatus::NotVisible => "not_visible_to_this_user",
            FenceStatus::Recipe => "sqlite_recipe",
        }
    }
}

/// Runs blocking work (migrations, opening SQLite) off the async threads.
async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Local(format!("blocking task failed: {e}")))?
}

/// Cancels the statement in flight on a connection, from outside it: a
/// client-side timeout alone leaves the server working (or waiting on a lock)
/// for a client that has gone. A cancel request opens a new connection, with
/// the same TLS as the one it cancels.
pub struct Canceller(pg::CancelHandle);

opaque_debug!(Canceller);

impl Canceller {
    /// Asks the server to cancel; no timeout, wrap it.
    pub async fn cancel(self) -> Result<(), StoreError> {
        self.0.cancel().await
    }
}

/// A wake-up lock (MySQL/MariaDB) as a take left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeLock {
    /// This connection holds it.
    Held,
    /// Another connection holds it: its id, when the server said.
    Busy(Option<u64>),
}

/// A connection to the lock table on one backend.
#[derive(Debug)]
pub enum Connection {
    Postgres(pg::PgStore),
    Mysql(mysql::MysqlStore),
    Sqlite(sqlite::SqliteStore),
}

impl Connection {
    /// Opens a connection. No timeout: wrap it.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        Ok(match url.backend() {
            Backend::Postgres => Connection::Postgres(pg::PgStore::connect(url).await?),
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
    /// rest in one more (see `pg`). MySQL renews them in one statement (up
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
    /// each was released. One statement on PostgreSQL, one transaction on
    /// SQLite, one statement each on MySQL.
    pub async fn release_many(&mut self, items: &[Release<'_>]) -> Result<Vec<bool>, StoreError> {
        // One alone takes the single statement (prepared, and announced).
        if let [one] = items {
            return Ok(vec![self.release_one(one).await?]);
        }
        match self {
            Connection::Postgres(c) => return c.release_many(items).await,
            Connection::Sqlite(c) => return c.release_many(items).await,
            Connection::Mysql(_) => {}
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(self.release_one(item).await?);
        }
        Ok(out)
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
