//! SQLite's SQL: the lease's renewal, read, takeover and creation, the
//! release, the listing and the record of terms, on the boot clock (see
//! `store`).

use crate::shared::clock::boot_now;

/// For the lease statements the busy timeout is short: writers hold the lock
/// for microseconds, and an attempt must not outlive the lease it protects.
pub(super) const STATEMENTS: &str = "PRAGMA busy_timeout = 500;";

pub(super) const RENEW: &str =
    "UPDATE service_leader_lock SET renewed_at = ?, expires_at = MAX(expires_at, ?) \
    WHERE name = ? AND instance = ? AND token = ? AND boot_id = ? AND expires_at > ?";

/// The row, with the holder's address (only while the instance that wrote
/// it holds the row).
pub(super) const OBSERVE: &str = "SELECT holder, instance, token, boot_id, expires_at, \
    COALESCE(renewed_at, -1), successor, \
    CASE WHEN address_instance = instance THEN address END \
    FROM service_leader_lock WHERE name = ?";

/// A compare-and-set on the row exactly as observed: any renewal, take or
/// release since then changes `expires_at` or `renewed_at`. Writes the
/// taker's address with its instance.
pub(super) const TAKE: &str = "UPDATE service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, boot_id = ?, successor = NULL, \
        address = ?, address_instance = ?, \
        acquired_at = ?, renewed_at = ?, expires_at = ? \
    WHERE name = ? AND token = ? AND boot_id = ? AND expires_at = ? \
      AND COALESCE(renewed_at, -1) = ?";

/// Creates a missing row, its token above the wall clock's seed and above
/// any token a deleted row of the election carried (`WHERE true` tells
/// SQLite's parser the `ON CONFLICT` is the upsert's). Binds: name, seed,
/// name, boot id, expiry.
pub(super) const CREATE: &str = "INSERT INTO service_leader_lock (name, token, boot_id, expires_at) \
    SELECT ?, MAX(?, COALESCE((SELECT token + 1 FROM service_leader_token WHERE name = ?), 0)), ?, ? \
    WHERE true ON CONFLICT (name) DO NOTHING";

/// Released to a successor, the row stays blocked for its window
/// (`crate::Successor`). `renewed_at` is the release's time, which the
/// record of terms reads as the term's end. Binds: successor, time,
/// expiry, name, instance.
pub(super) const RELEASE: &str = "UPDATE service_leader_lock \
    SET holder = NULL, instance = NULL, successor = ?, renewed_at = ?, expires_at = ?, \
        address = NULL, address_instance = NULL \
    WHERE name = ? AND instance = ?";

/// Gives up being a row's named successor: the row, free and blocked for
/// the window only the bound daemon instance may take, is open to anyone
/// from now. Matches nothing unless the row is free, names that instance,
/// carries the token of the release seen (a later release, naming it
/// again, is left alone) and its window (this boot's) is still running.
/// Binds: now, name, instance, token, boot id, now.
pub(super) const DECLINE: &str = "UPDATE service_leader_lock \
    SET successor = NULL, expires_at = ? \
    WHERE name = ? AND instance IS NULL AND successor = ? AND token = ? \
      AND boot_id = ? AND expires_at > ?";

/// The rows whose name starts with the bind (after the clock's two; every
/// row for `''`).
pub(super) const ELECTIONS: &str = "SELECT name, holder, token, \
    CASE WHEN boot_id = ? THEN expires_at - ? ELSE -1 END, instance, \
    CASE WHEN instance IS NOT NULL AND boot_id = ? THEN ? - acquired_at END, \
    CASE WHEN address_instance = instance THEN address END, \
    CASE WHEN instance IS NULL THEN successor END \
    FROM service_leader_lock WHERE substr(name, 1, length(?)) = ? ORDER BY name";

/// The boot clock in microseconds: SQLite's "database clock".
pub(super) fn now_us() -> i64 {
    i64::try_from(boot_now().since_boot().as_micros()).unwrap_or(i64::MAX)
}

/// SQLite's: times are the boot clock's, comparable only within the boot
/// that wrote them, so the order is the record's own (its rowid) and the
/// ages are given for this boot's terms alone; `began_at`/`ended_at` are
/// filled in by the caller. Binds: boot id and now (µs); the same; boot
/// id, now, now; boot id, now; the election twice (NULL: all); the limit.
pub(crate) const HISTORY: &str = "\
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
