//! Database adapters of leaderd: the `service_leader_lock` table on
//! PostgreSQL, MySQL/MariaDB and SQLite.
//!
//! A [`Connection`] runs the spec's operations as fixed SQL statements (see
//! `sql`), which the driver prepares once per connection:
//! - acquire-or-renew, judged by the database's clock. A leader's renewal is
//!   one round trip everywhere; a refused attempt writes and locks nothing.
//!   PostgreSQL does it all in one `UPDATE … RETURNING`; MySQL and SQLite read
//!   first and write only to renew or to take an expired row (see `cas`).
//!   A missing row is inserted free and blocked for one ttl.
//! - release by the holding instance only (with `NOTIFY` on PostgreSQL);
//! - listing the elections, and migrations embedded in the binary.
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
mod mysql;
mod pg;
mod sql;
mod sqlite;
mod url;

use std::time::Duration;

use diesel::backend::Backend as DieselBackend;
use diesel::migration::MigrationSource;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness};

pub use clock::{boot_id, boot_now};
pub use leaderd_core::{Attempt, Observed};
pub use pg::Listener;
pub use url::{Backend, DatabaseUrl};

/// Errors of the store. Messages never contain the database password.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL cannot be used.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// Connecting failed (network, authentication, unknown database).
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] diesel::ConnectionError),
    /// A statement failed (missing table, permission denied, lost connection).
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
    /// Creating or upgrading the table failed.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Local I/O failed (reading the boot id, a blocking task died).
    #[error("{0}")]
    Local(String),
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
}

impl LeaseRequest<'_> {
    fn ttl_us(&self) -> i64 {
        i64::try_from(self.ttl.as_micros()).unwrap_or(i64::MAX)
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
}

impl ElectionRow {
    /// The holder while its lease is live by the database's clock.
    pub fn live_holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|_| self.remaining_us > 0)
    }
}

impl From<(String, Option<String>, i64, i64)> for ElectionRow {
    fn from((name, holder, token, remaining_us): (String, Option<String>, i64, i64)) -> Self {
        Self {
            name,
            holder,
            token,
            remaining_us,
        }
    }
}

fn observed(
    (holder, instance, token, remaining_us): (Option<String>, Option<String>, i64, i64),
) -> Observed {
    Observed {
        holder,
        instance,
        token,
        remaining_us,
    }
}

/// What a migration run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrated {
    /// Everything was already in place; nothing was written.
    UpToDate,
    /// Pending migrations were applied.
    Applied,
}

impl Migrated {
    fn from_count(applied: usize) -> Self {
        if applied == 0 {
            Migrated::UpToDate
        } else {
            Migrated::Applied
        }
    }
}

/// The newest embedded migration's version.
fn latest_version<DB: DieselBackend>(migrations: &impl MigrationSource<DB>) -> String {
    migrations
        .migrations()
        .ok()
        .and_then(|m| m.iter().map(|m| m.name().version().to_string()).max())
        .unwrap_or_default()
}

/// Runs the pending migrations, then makes sure the table really exists: an
/// operator may have dropped it while the migration stayed recorded. The
/// migrations are idempotent (`CREATE TABLE IF NOT EXISTS`), so re-running
/// them is safe. Returns how many ran.
fn run_migrations<DB, C>(conn: &mut C, migrations: EmbeddedMigrations) -> Result<usize, StoreError>
where
    DB: DieselBackend,
    C: diesel::Connection<Backend = DB> + MigrationHarness<DB> + 'static,
    EmbeddedMigrations: MigrationSource<DB>,
{
    let failed = |e: Box<dyn std::error::Error + Send + Sync>| StoreError::Migration(e.to_string());
    let all = MigrationSource::<DB>::migrations(&migrations).map_err(failed)?;
    let mut ran = conn
        .run_pending_migrations(migrations)
        .map_err(failed)?
        .len();
    if conn
        .batch_execute("SELECT 1 FROM service_leader_lock WHERE 1 = 0")
        .is_err()
    {
        for m in all {
            m.run(conn).map_err(failed)?;
            ran += 1;
        }
    }
    Ok(ran)
}

/// Opens a diesel-async connection; the error never carries the URL.
async fn establish<C: diesel_async::AsyncConnection>(url: &DatabaseUrl) -> Result<C, StoreError> {
    C::establish(url.expose())
        .await
        .map_err(StoreError::Connect)
}

/// Runs blocking work (migrations, opening SQLite) off the async threads.
async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Local(format!("blocking task failed: {e}")))?
}

/// A connection to the lock table on one backend.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "a daemon holds one or two connections; boxing would buy nothing"
)]
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

    /// The spec's acquire-or-renew, judged by the database's clock.
    pub async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        match self {
            Connection::Postgres(c) => c.acquire_or_renew(req).await,
            Connection::Mysql(c) => c.acquire_or_renew(req).await,
            Connection::Sqlite(c) => c.acquire_or_renew(req).await,
        }
    }

    /// Releases the lease if `instance` holds it; returns whether it did.
    pub async fn release(&mut self, election: &str, instance: &str) -> Result<bool, StoreError> {
        match self {
            Connection::Postgres(c) => c.release(election, instance).await,
            Connection::Mysql(c) => c.release(election, instance).await,
            Connection::Sqlite(c) => c.release(election, instance).await,
        }
    }

    /// Every election in the table, by name.
    pub async fn elections(&mut self) -> Result<Vec<ElectionRow>, StoreError> {
        match self {
            Connection::Postgres(c) => c.elections().await,
            Connection::Mysql(c) => c.elections().await,
            Connection::Sqlite(c) => c.elections().await,
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
