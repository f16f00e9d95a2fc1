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
    fn from(
        (
            election,
            token,
            holder,
            instance,
            address,
            began_how,
            earlier,
            began_at,
            began_ago_us,
            ended_at,
            ended_ago_us,
            ended_how,
        ): TermParts,
    ) -> Self {
        Term {
            election,
            token,
            holder,
            instance,
            address,
            began_how,
            earlier_version: earlier != 0,
            began_at,
            began_ago_us,
            ended_at,
            ended_ago_us,
            ended_how,
        }
    }
}

/// The most recent terms first: of one election (`$1`, or every election
/// when NULL), at most `$2`. A term whose lease ran out and that nobody has
/// taken over since ends at that expiry (the trigger writes an end only at
/// the next takeover or release); one whose row was deleted or renamed
/// since has an `unknown` end. Every operator and function is named
/// with its schema: the daemon's role may run this with a search_path
/// where another role has made look-alikes. `{t}`/`{h}`: the lock table
/// and the history, with their schema.
pub(crate) const POSTGRES: &str = "\
SELECT h.name, h.token, h.holder, h.instance, h.address, h.began_how,
       CASE WHEN h.earlier_version THEN 1::bigint ELSE 0::bigint END,
       pg_catalog.to_char(h.began_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
       (EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) h.began_at)
        OPERATOR(pg_catalog.*) 1000000)::bigint,
       pg_catalog.to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
       (EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) e.at)
        OPERATOR(pg_catalog.*) 1000000)::bigint,
       e.how
  FROM {h} h
  LEFT JOIN {t} l ON l.name OPERATOR(pg_catalog.=) h.name AND l.token OPERATOR(pg_catalog.=) h.token
                 AND l.holder IS NOT NULL
  CROSS JOIN LATERAL (
    SELECT CASE WHEN h.ended_at IS NOT NULL THEN h.ended_at
                WHEN l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN l.expires_at END AS at,
           CASE WHEN h.ended_at IS NOT NULL THEN h.ended_how
                WHEN l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'expired'
                WHEN l.name IS NULL THEN 'unknown' END AS how) e
 WHERE $1::varchar IS NULL OR h.name OPERATOR(pg_catalog.=) $1::varchar
 ORDER BY h.began_at DESC, h.token DESC
 LIMIT $2";

/// MySQL/MariaDB's (see [`POSTGRES`]). Binds: the election twice (NULL:
/// all), the limit.
pub(crate) const MYSQL: &str = "\
SELECT CAST(h.name AS CHAR), h.token, h.holder, h.instance, h.address, h.began_how,
       CAST(h.earlier_version AS SIGNED),
       DATE_FORMAT(h.began_at, '%Y-%m-%dT%H:%i:%s.%fZ'),
       TIMESTAMPDIFF(MICROSECOND, h.began_at, UTC_TIMESTAMP(6)),
       DATE_FORMAT(COALESCE(h.ended_at, IF(l.expires_at <= UTC_TIMESTAMP(6), l.expires_at, NULL)),
                   '%Y-%m-%dT%H:%i:%s.%fZ'),
       TIMESTAMPDIFF(MICROSECOND,
                     COALESCE(h.ended_at, IF(l.expires_at <= UTC_TIMESTAMP(6), l.expires_at, NULL)),
                     UTC_TIMESTAMP(6)),
       COALESCE(h.ended_how, IF(l.expires_at <= UTC_TIMESTAMP(6), 'expired', NULL),
                IF(l.name IS NULL, 'unknown', NULL))
  FROM service_leader_history h
  LEFT JOIN service_leader_lock l ON l.name = h.name AND l.token = h.token AND l.holder IS NOT NULL
 WHERE ? IS NULL OR h.name = ?
 ORDER BY h.began_at DESC, h.token DESC
 LIMIT ?";

/// SQLite's: times are the boot clock's, comparable only within the boot
/// that wrote them, so the order is the record's own (its rowid) and the
/// ages are given for this boot's terms alone; `began_at`/`ended_at` are
/// filled in by the caller. Binds: boot id and now (µs); the same; boot
/// id, now, now; boot id, now; the election twice (NULL: all); the limit.
pub(crate) const SQLITE: &str = "\
SELECT h.name, h.token, h.holder, h.instance, h.address, h.began_how, h.earlier_version,
       NULL,
       CASE WHEN h.boot_id = ? THEN ? - h.began_at END,
       NULL,
       CASE WHEN h.ended_at IS NOT NULL THEN CASE WHEN h.boot_id = ? THEN ? - h.ended_at END
            WHEN l.boot_id = ? AND l.expires_at <= ? THEN ? - l.expires_at END,
       COALESCE(h.ended_how, CASE WHEN l.boot_id = ? AND l.expires_at <= ? THEN 'expired'
                                  WHEN l.name IS NULL THEN 'unknown' END)
  FROM service_leader_history h
  LEFT JOIN service_leader_lock l ON l.name = h.name AND l.token = h.token AND l.holder IS NOT NULL
 WHERE ? IS NULL OR h.name = ?
 ORDER BY h.rowid DESC
 LIMIT ?";

/// Whether a statement failed only because the record is not installed
/// (its table missing): then there is nothing to read, which is not an
/// error of the connection.
pub(crate) fn missing_table(e: &crate::StoreError) -> bool {
    match e {
        crate::StoreError::Postgres(e) => {
            e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE)
        }
        crate::StoreError::Query(e) => missing_table_diesel(e),
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
