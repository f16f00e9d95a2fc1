//! The lease's vocabulary, the same on every backend: a request to acquire
//! or renew, a release (with its named successor), a row as `leaderd
//! status` shows it, and the small rules every backend applies alike (what
//! a refusal means, an address's width, how an heir reads a released row).

use std::time::Duration;

use diesel::sql_types::{BigInt, Nullable, Text};

use super::error::StoreError;
use leaderd_core::{Attempt, Observed};

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
    pub(crate) fn ttl_us(&self) -> i64 {
        i64::try_from(self.ttl.as_micros()).unwrap_or(i64::MAX)
    }

    /// How long a row this request creates stays blocked: one ttl, so that
    /// a holder whose row was deleted steps down before anyone takes over.
    /// A presence row (`leaderd_core::spread::PRESENCE_PREFIX`) leases
    /// nothing anyone acts on, and is open at once: a replica that has just
    /// started is a candidate (a successor, a share) from its first round.
    pub(crate) fn block_us(&self) -> i64 {
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

/// The start of the name of the row a PostgreSQL connection's warm-up
/// makes (and undoes): no election may be named so (see
/// `Connection::warm_up`).
pub const WARM_UP_PREFIX: &str = "leaderd-warm-up/";

/// The most characters an address may hold (the column's width).
pub const MAX_ADDRESS_CHARS: usize = 255;

/// Refuses an address the column cannot hold, before anything is sent: a
/// backend would cut it short (MySQL's `JSON_TABLE`, with a warning) or
/// fail the whole batch.
pub(crate) fn check_address(reqs: &[LeaseRequest<'_>]) -> Result<(), StoreError> {
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
    pub(crate) fn window_us(&self) -> i64 {
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
    /// While the row is free: the daemon instance its release named (see
    /// [`Successor`]), whose window may have ended. `None` when held.
    pub successor: Option<String>,
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
/// instance, held µs, address, successor (free rows only).
pub(crate) type RowParts = (
    String,
    Option<String>,
    i64,
    i64,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
);

/// [`RowParts`]' SQL types, for diesel (MySQL, SQLite).
pub(crate) type RowSql = (
    Text,
    Nullable<Text>,
    BigInt,
    BigInt,
    Nullable<Text>,
    Nullable<BigInt>,
    Nullable<Text>,
    Nullable<Text>,
);

impl From<RowParts> for ElectionRow {
    fn from(
        (name, holder, token, remaining_us, instance, held_us, address, successor): RowParts,
    ) -> Self {
        Self {
            name,
            holder,
            token,
            remaining_us,
            instance,
            held_us: held_us.unwrap_or(0),
            address,
            successor,
        }
    }
}

/// A refusal as the backend reported it. A row that is still this
/// instance's live lease yet was not renewed was skipped because another
/// transaction holds its lock: that is [`StoreError::Busy`], never a loss.
pub(crate) fn refusal(req: &LeaseRequest<'_>, seen: Observed) -> Result<Attempt, StoreError> {
    if seen.instance.as_deref() == Some(req.instance) && seen.remaining_us > 0 {
        return Err(StoreError::Busy);
    }
    Ok(Attempt::Refused(seen))
}

/// The holder, instance, token, remaining µs and address of a row.
pub(crate) type SeenParts = (Option<String>, Option<String>, i64, i64, Option<String>);

pub(crate) fn observed((holder, instance, token, remaining_us, address): SeenParts) -> Observed {
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
pub(crate) fn as_heir(
    req: &LeaseRequest<'_>,
    mut seen: Observed,
    successor: Option<&str>,
) -> Observed {
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

/// As the daemon's log says it (`lock table checked`).
impl std::fmt::Display for Migrated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Migrated::UpToDate => "already in place, nothing written",
            Migrated::Applied => "created or upgraded",
        })
    }
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

/// A wake-up lock (MySQL/MariaDB) as a take left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeLock {
    /// This connection holds it.
    Held,
    /// Another connection holds it: its id, when the server said.
    Busy(Option<u64>),
}
