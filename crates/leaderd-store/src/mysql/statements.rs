//! MySQL's and MariaDB's SQL: the lease's renewal, read, takeover and
//! creation (alone and for many elections at once), the release, the
//! listing and the record of terms, each written once for both servers
//! with its lock waits bounded inside it ([`Sql`]).

use diesel::sql_types::{BigInt, Nullable, Text};

/// [`OBSERVE`]'s row: holder, instance, token, remaining µs, address,
/// successor.
pub(super) type SeenRow = (
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<String>,
    Option<String>,
);
pub(super) type SeenSql = (
    Nullable<Text>,
    Nullable<Text>,
    BigInt,
    BigInt,
    Nullable<Text>,
    Nullable<Text>,
);

/// A statement for both servers, with its server-side lock waits bounded
/// inside the statement itself (no session `SET`): a statement that waits on
/// a row or metadata lock outlives the client's timeout on the server, and
/// every retry would add another waiting connection. MariaDB takes
/// `SET STATEMENT … FOR` (a row-lock wait of 0 fails at once). MySQL 8 takes
/// a `SET_VAR` hint for the metadata-lock wait only: it does not accept
/// `innodb_lock_wait_timeout` there, so on MySQL a row-lock wait is bounded
/// by the server's `innodb_lock_wait_timeout` (docs/databases.md).
pub(super) struct Sql {
    pub(super) mariadb: &'static str,
    pub(super) mysql: &'static str,
}

macro_rules! bounded {
    ($verb:literal, $rest:expr) => {
        Sql {
            mariadb: concat!(
                "SET STATEMENT innodb_lock_wait_timeout = 0, lock_wait_timeout = 1 FOR ",
                $verb,
                $rest
            ),
            mysql: concat!($verb, " /*+ SET_VAR(lock_wait_timeout = 1) */", $rest),
        }
    };
}

/// What a renewal sets (one bind: ttl µs); shared by [`RENEW`] and
/// [`RENEW_ALL`].
macro_rules! renew_set {
    ($l:literal) => {
        concat!(
            "SET ",
            $l,
            "renewed_at = UTC_TIMESTAMP(6), ",
            $l,
            "expires_at = GREATEST(",
            $l,
            "expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) "
        )
    };
}

/// Extends this instance's live lease, if its token is still the one it
/// holds. Binds: ttl µs, election, instance, token.
pub(super) const RENEW: Sql = bounded!(
    "UPDATE",
    concat!(
        " service_leader_lock ",
        renew_set!(""),
        "WHERE name = ? AND instance = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
    )
);

/// The most leases one renewal statement carries: their JSON is about 100
/// bytes each, 1.6 MB in all, well within `max_allowed_packet` (16 MiB by
/// default on MariaDB 10.11, 64 MiB on MySQL 8). More go in several.
pub(super) const RENEW_MANY_MAX: usize = 16_384;

/// [`RENEW`] for several leases at once, each matched on its own name,
/// instance and token and judged by the server's clock. Binds: a JSON array
/// of `[name, instance, token]`, sorted by name (two statements lock rows
/// in one order), then ttl µs. One text whatever the number, prepared once
/// per connection. The names drive the join (`STRAIGHT_JOIN`) and the index
/// hint keeps each lookup on the name index: the table first, as MariaDB
/// chose below about 100 rows whatever the hint, scanned and, under
/// REPEATABLE READ, locked every row, so one replica's renewal made the
/// others' statements busy (333 of 3,000 renewals of another lease
/// refused in a review's test).
pub(super) const RENEW_ALL: Sql = bounded!(
    "UPDATE",
    concat!(
        " (SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', \
            inst VARCHAR(64) PATH '$[1]', tok BIGINT PATH '$[2]')) AS x) AS j \
        STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) \
          ON l.name = j.n AND l.instance = j.inst AND l.token = j.tok ",
        renew_set!("l."),
        "WHERE l.expires_at > UTC_TIMESTAMP(6)"
    )
);

/// The row, with the holder's address (only while the instance that wrote
/// it holds the row) and the successor it was released to (see
/// `crate::as_heir`).
pub(super) const OBSERVE: Sql = bounded!(
    "SELECT",
    " holder, instance, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
    IF(address_instance = instance, address, NULL), successor \
    FROM service_leader_lock WHERE name = ?"
);

/// Takes the row if it is expired, or released to this daemon (its
/// successor window), and its token is the one seen; writes the taker's
/// address with its instance. Binds: holder, instance, address, instance,
/// ttl µs, name, token seen, daemon.
pub(super) const TAKE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, successor = NULL, \
        address = ?, address_instance = ?, \
        acquired_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6), \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND token = ? \
      AND (expires_at <= UTC_TIMESTAMP(6) OR (instance IS NULL AND successor = ?))"
);

// A plain INSERT with a no-op on a duplicate (not INSERT IGNORE, which would
// also turn truncation into a warning). It is never behind a locking read.
pub(super) const CREATE: Sql = bounded!(
    "INSERT",
    " INTO service_leader_lock (name, token, expires_at) \
    SELECT ?, GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), \
                       COALESCE((SELECT token + 1 FROM service_leader_token WHERE name = ?), 0)), \
           UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    ON DUPLICATE KEY UPDATE id = id"
);

/// [`OBSERVE`] for several elections in one statement: the rows that exist,
/// each with its place in the JSON array of names (bind), from 1. A plain
/// read (no lock); the names drive it, one index lookup each.
pub(super) const OBSERVE_ALL: Sql = bounded!(
    "SELECT",
    " j.i, l.holder, l.instance, l.token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at), \
    IF(l.address_instance = l.instance, l.address, NULL), l.successor \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(100) PATH '$')) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) ON l.name = j.n"
);

/// The most rows one takeover statement carries: a row's JSON is at most
/// about 1.5 KB (an address of 255 characters is up to 1 KB of UTF-8), so
/// 6 MB for 4,096, well within `max_allowed_packet` (16 MiB by default on
/// MariaDB 10.11). More go in several, in name order.
pub(super) const TAKE_MANY_MAX: usize = 4_096;

/// [`TAKE`] for several expired rows in one statement, each on the token
/// seen. Binds: a JSON array of `[name, holder, instance, token seen,
/// daemon, address]`,
/// sorted by name so that two takers lock rows in one order, then ttl µs.
/// The matched-row count says whether all were taken. Joined as
/// [`RENEW_ALL`] is, for the same reason.
pub(super) const TAKE_ALL: Sql = bounded!(
    "UPDATE",
    " (SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', \
        h VARCHAR(100) PATH '$[1]', inst VARCHAR(64) PATH '$[2]', tok BIGINT PATH '$[3]', \
        d VARCHAR(64) PATH '$[4]', a VARCHAR(255) PATH '$[5]')) AS x) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) \
      ON l.name = j.n AND l.token = j.tok \
    SET l.token = l.token + 1, l.holder = j.h, l.instance = j.inst, l.successor = NULL, \
        l.address = j.a, l.address_instance = j.inst, \
        l.acquired_at = UTC_TIMESTAMP(6), l.renewed_at = UTC_TIMESTAMP(6), \
        l.expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE l.expires_at <= UTC_TIMESTAMP(6) OR (l.instance IS NULL AND l.successor = j.d)"
);

/// [`CREATE`] for several missing rows in one statement. Binds: a JSON
/// array of `[name, block µs]` (see `LeaseRequest::block_us`).
pub(super) const CREATE_ALL: Sql = bounded!(
    "INSERT",
    " INTO service_leader_lock (name, token, expires_at) \
    SELECT j.n, GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), \
                COALESCE((SELECT t.token + 1 FROM service_leader_token t WHERE t.name = j.n), 0)), \
           UTC_TIMESTAMP(6) + INTERVAL j.b MICROSECOND \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', b BIGINT PATH '$[1]')) AS j \
    ON DUPLICATE KEY UPDATE id = id"
);

/// Frees the row if `instance` holds it; released to a successor, it stays
/// blocked for the window (`crate::Successor`). Binds: successor, window µs
/// (0 with none), name, instance.
pub(super) const RELEASE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET holder = NULL, instance = NULL, successor = ?, address = NULL, address_instance = NULL, \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND instance = ?"
);

/// Gives up being a row's named successor: the row, free and blocked for
/// the window only the bound daemon instance may take, is open to anyone
/// now. Matches nothing unless the row is free, names that instance,
/// carries the token of the release seen (a later release, naming it
/// again, is left alone) and its window is still running. Binds: name,
/// instance, token.
pub(super) const DECLINE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock SET successor = NULL, expires_at = UTC_TIMESTAMP(6) \
    WHERE name = ? AND instance IS NULL AND successor = ? AND token = ? \
      AND expires_at > UTC_TIMESTAMP(6)"
);

/// [`RELEASE`] for several elections at once, each matched on its own name
/// and instance: shutting down, a daemon leading thousands released them
/// one statement each, and most were left to expire (5,000 on MariaDB: 3,976
/// left held when the daemon exited). Binds: a JSON array of `[name,
/// instance, successor or null, window µs]`, sorted by name (two statements
/// lock rows in one order). The join and the index hint as in
/// [`RENEW_ALL`].
pub(super) const RELEASE_ALL: Sql = bounded!(
    "UPDATE",
    " (SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', \
        inst VARCHAR(64) PATH '$[1]', succ VARCHAR(64) PATH '$[2]', \
        w BIGINT PATH '$[3]')) AS x) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) \
      ON l.name = j.n AND l.instance = j.inst \
    SET l.holder = NULL, l.instance = NULL, l.successor = j.succ, l.address = NULL, \
        l.address_instance = NULL, l.expires_at = UTC_TIMESTAMP(6) + INTERVAL j.w MICROSECOND"
);

/// The most releases one [`RELEASE_ALL`] carries: about 120 bytes of JSON
/// each. More go in several.
pub(super) const RELEASE_MANY_MAX: usize = 4_096;

/// Of the names in the bind (a JSON array of names), those no instance
/// holds: after a [`RELEASE_ALL`] that matched fewer rows than it carried,
/// the ones it released (the others are another instance's).
pub(super) const FREE_OF: Sql = bounded!(
    "SELECT",
    " CAST(l.name AS CHAR) \
    FROM (SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$')) AS x) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) ON l.name = j.n \
    WHERE l.instance IS NULL"
);

/// The rows whose name starts with the bind (twice; every row for `''`);
/// `name` is bytes, so the prefix is counted in bytes.
///
/// A range on the name's index (bind the prefix twice): every name that
/// starts with the prefix sorts from it up to it followed by byte 0xFF,
/// which UTF-8 never holds. A `LEFT(name, …) = ?` read every row of the
/// table, other apps' elections too, at every look of the spread.
pub(super) const ELECTIONS: &str = "SELECT CAST(name AS CHAR), holder, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), instance, \
    IF(instance IS NULL, NULL, TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6))), \
    IF(address_instance = instance, address, NULL), IF(instance IS NULL, successor, NULL) \
    FROM service_leader_lock WHERE name >= ? AND name < CONCAT(?, X'FF') ORDER BY name";

/// What the server is and how the session runs, read once at connect.
pub(super) const SESSION: &str = "SELECT @@autocommit, VERSION()";

/// MySQL/MariaDB's (see [`POSTGRES`]). Binds: the election twice (NULL:
/// all), the limit.
pub(crate) const HISTORY: &str = "\
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
