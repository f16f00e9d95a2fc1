//! Database adapters of leaderd: the `service_leader_lock` table on each
//! backend.
//!
//! A [`Connection`] runs the spec's operations as fixed SQL statements built
//! as small diesel `QueryFragment`s, so the driver prepares each once and a
//! renewal costs one round trip:
//! - acquire-or-renew: an `UPDATE … WHERE (expired OR mine) … RETURNING`, with
//!   the current holder read in the same statement when refused; a refused
//!   attempt writes nothing and locks nothing. Only a missing row costs an
//!   `INSERT`, which creates it free and blocked for one ttl.
//! - release by the holding instance only, with a `NOTIFY` on PostgreSQL.
//!
//! Every time that matters is the database's own clock. This crate does not
//! decide leadership (that is `leaderd-core`), retry, or time out: callers wrap
//! each call in their own timeout and drop the connection when it fires.

mod pg;
mod url;

use std::time::Duration;

pub use leaderd_core::{Attempt, Observed};
pub use pg::Listener;
pub use url::{Backend, DatabaseUrl};

/// Errors of the store. Messages never contain the database password.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL cannot be used.
    #[error("invalid database URL: {0}")]
    InvalidUrl(String),
    /// This build has no driver for the URL's backend.
    #[error("the {0} backend is not supported by this build")]
    Unsupported(&'static str),
    /// Connecting failed (network, authentication, unknown database).
    #[error("cannot connect to the database: {0}")]
    Connect(#[source] diesel::ConnectionError),
    /// A statement failed (missing table, permission denied, lost connection).
    #[error("database error: {0}")]
    Query(#[from] diesel::result::Error),
    /// Creating or upgrading the table failed.
    #[error("migration failed: {0}")]
    Migration(String),
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

/// What a migration run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrated {
    /// Everything was already in place; nothing was written.
    UpToDate,
    /// Pending migrations were applied.
    Applied,
}

/// A connection to the lock table on one backend.
#[derive(Debug)]
pub enum Connection {
    Postgres(pg::PgStore),
}

impl Connection {
    /// Opens a connection. No timeout: wrap it.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        match url.backend() {
            Backend::Postgres => Ok(Connection::Postgres(pg::PgStore::connect(url).await?)),
            other => Err(StoreError::Unsupported(other.as_str())),
        }
    }

    /// The spec's acquire-or-renew, judged by the database's clock.
    pub async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        match self {
            Connection::Postgres(c) => c.acquire_or_renew(req).await,
        }
    }

    /// Releases the lease if `instance` holds it; returns whether it did.
    pub async fn release(&mut self, election: &str, instance: &str) -> Result<bool, StoreError> {
        match self {
            Connection::Postgres(c) => c.release(election, instance).await,
        }
    }

    /// Every election in the table, by name.
    pub async fn elections(&mut self) -> Result<Vec<ElectionRow>, StoreError> {
        match self {
            Connection::Postgres(c) => c.elections().await,
        }
    }

    /// Creates or upgrades the table. Safe when many replicas run it at once;
    /// writes nothing (and needs no DDL rights) when already up to date.
    pub async fn migrate(self) -> Result<Migrated, StoreError> {
        match self {
            Connection::Postgres(c) => c.migrate().await,
        }
    }
}
