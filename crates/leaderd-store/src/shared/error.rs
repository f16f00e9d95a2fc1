//! The store's one error type, and how its errors are read: which the
//! database answered, which a lock wait cut short, which the installed SQL's
//! guard raised. Every backend returns it; none of its messages holds a
//! password.

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
    /// statements directly; see `postgres`).
    #[error("database error: {}", describe(.0))]
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

/// A tokio-postgres error with its causes: its own `Display` says only
/// "db error" or "error performing TLS handshake", leaving out the server's
/// message or why the handshake failed (unknown CA, name mismatch, no TLS).
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// Whether the installed SQL's guard refused the database (SQLSTATE
/// LF010): another role could run code as this user through what leaderd
/// would use there.
pub(crate) fn guard_refused(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|d| d.code().code() == "LF010")
}

/// One row's outcome within a batch: its own lock held elsewhere
/// ([`StoreError::Busy`]) is that row's answer; any other error is the
/// batch's (the outer one: its connection is dropped).
pub(crate) fn row_answer<T>(
    outcome: Result<T, StoreError>,
) -> Result<Result<T, StoreError>, StoreError> {
    match outcome {
        Err(StoreError::Busy) => Ok(Err(StoreError::Busy)),
        outcome => outcome.map(Ok),
    }
}

/// Whether a step was refused because a lock it needs was not granted
/// within the plan's bound: PostgreSQL's `lock_not_available` (55P03),
/// MySQL's lock wait timeout (1205), or a deadlock (1213), which is also
/// how a Galera node reports a statement that lost to another node's
/// (seen with three nodes migrating at once on a busy machine): each
/// statement of the migration may run again.
pub(crate) fn lock_wait_cut(e: &StoreError) -> bool {
    match e {
        StoreError::Postgres(e) => {
            e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE)
        }
        StoreError::Query(diesel::result::Error::DatabaseError(_, info)) => {
            // diesel keeps MySQL's message, not its number.
            info.message().contains("Lock wait timeout exceeded")
                || info
                    .message()
                    .contains("Deadlock found when trying to get lock")
        }
        _ => false,
    }
}

/// An error the server answered (a refusal), not a lost connection.
pub(crate) fn refused_by_server(e: &StoreError) -> bool {
    match e {
        StoreError::Postgres(e) => e.as_db_error().is_some(),
        StoreError::Query(diesel::result::Error::DatabaseError(..)) => true,
        _ => false,
    }
}
