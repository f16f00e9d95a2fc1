//! The record of terms (`leaderd history`): what the database's own
//! triggers wrote at each change of holder (installed by the migration,
//! `migrations/<backend>/2026-12-04-000000_history`), read back here with
//! each backend's statement. The store only reads it: no daemon statement
//! writes it, so a takeover by any daemon, of any version, is in it.

use diesel::sql_types::{BigInt, Nullable, Text};

/// One term of an election: a holder and its token, from the takeover that
/// began it to the release or expiry that ended it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub election: String,
    pub token: i64,
    pub holder: Option<String>,
    /// The daemon process instance that held it.
    pub instance: Option<String>,
    /// The holder's advertised address (`None`: it set none, or its daemon
    /// predates addresses).
    pub address: Option<String>,
    /// How it began: `first`, `expired`, `released` or `successor`.
    pub began_how: String,
    /// Taken by a daemon of a version that predates addresses (an earlier
    /// release's, in a rolling upgrade or a rollback).
    pub earlier_version: bool,
    /// When it began: RFC 3339 in UTC by the database's clock (SQLite: the
    /// host's wall clock, from the boot clock's age; `None` for a term of
    /// another boot).
    pub began_at: Option<String>,
    /// How long ago it began, by the database's clock (SQLite: `None` for
    /// another boot).
    pub began_ago_us: Option<i64>,
    /// When it ended, as `began_at`; `None` while it runs.
    pub ended_at: Option<String>,
    pub ended_ago_us: Option<i64>,
    /// How it ended: `released`, `expired`, or `unknown` (its row was
    /// deleted or renamed since); `None` while it runs.
    pub ended_how: Option<String>,
}

/// Rows as the statements below return them: name, token, holder,
/// instance, address, began_how, earlier_version (0/1), began_at, began
/// ago, ended_at, ended ago, ended_how.
pub(crate) type TermParts = (
    String,
    i64,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<String>,
);

/// [`TermParts`]' SQL types, for diesel (MySQL, SQLite).
pub(crate) type TermSql = (
    Text,
    BigInt,
    Nullable<Text>,
    Nullable<Text>,
    Nullable<Text>,
    Text,
    BigInt,
    Nullable<Text>,
    Nullable<BigInt>,
    Nullable<Text>,
    Nullable<BigInt>,
    Nullable<Text>,
);

impl From<TermParts> for Term {
    fn from(p: TermParts) -> Self {
        Term {
            election: p.0,
            token: p.1,
            holder: p.2,
            instance: p.3,
            address: p.4,
            began_how: p.5,
            earlier_version: p.6 != 0,
            began_at: p.7,
            began_ago_us: p.8,
            ended_at: p.9,
            ended_ago_us: p.10,
            ended_how: p.11,
        }
    }
}

/// Whether a statement failed only because the record is not installed
/// (its table missing): then there is nothing to read, which is not an
/// error of the connection.
pub(crate) fn missing_table(e: &super::error::StoreError) -> bool {
    match e {
        super::error::StoreError::Postgres(e) => {
            e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
        }
        super::error::StoreError::Query(e) => missing_table_diesel(e),
        _ => false,
    }
}

/// [`missing_table`] for MySQL's and SQLite's errors, as diesel keeps
/// them (the message, not the number).
pub(crate) fn missing_table_diesel(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("service_leader_history")
            && (info.message().contains("doesn't exist") || info.message().contains("no such table")))
}

/// A wall-clock time as RFC 3339 in UTC, with microseconds (as the servers'
/// statements give theirs).
pub(crate) fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}
