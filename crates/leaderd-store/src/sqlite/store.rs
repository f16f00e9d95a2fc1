//! SQLite: the embedded default, for one host (several processes may share
//! one file).
//!
//! SQLite has no server clock, so its "database clock" is the host's
//! `CLOCK_BOOTTIME`, shared by every process on the host and immune to
//! wall-clock changes; rows record the boot they were written in. A row from
//! another boot has times on a clock this process cannot read, so it is not
//! taken on its face: it is taken once this process has watched it stay
//! unchanged for longer than its lease (no holder anywhere has renewed it, so
//! none can still lead). That covers a reboot (one ttl's wait) and a file that
//! somehow is shared with another host.
//!
//! The file must be on a local file system: network and FUSE file systems
//! are refused (SQLite's locking is unreliable there, and two hosts would
//! each see the other's boot as foreign). The file runs in WAL mode so
//! readers never block, with `synchronous = FULL` so a committed take
//! survives a power loss (else the next take could hand out the same token),
//! and a short busy timeout for writers. Every `UPDATE` takes SQLite's write
//! lock, so followers only read (see `shared::cas`).

use diesel::connection::SimpleConnection;
use diesel::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

use super::open::{check_file_system, open, run_blocking};
use super::plan::MIGRATION;
use super::statements::*;
use super::wake::{announce_release, wakes_anyone};
use crate::shared::clock::boot_id;
use crate::shared::error::StoreError;
use crate::shared::history::{Term, TermParts, TermSql};
use crate::shared::lease::{ElectionRow, FenceStatus, Migrated, Release, RowParts, RowSql};
use crate::shared::migrate;
use crate::shared::sql::{Bind, Stmt};
use crate::shared::url::DatabaseUrl;

/// The row as `OBSERVE` read it, for the compare-and-set in `take` and for
/// watching a row from another boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SeenRow {
    pub(super) token: i64,
    pub(super) boot_id: String,
    pub(super) expires_at: i64,
    /// -1 when never renewed.
    pub(super) renewed_at: i64,
}

/// A row from another boot, and when (on our clock) we first saw it as it is.
#[derive(Debug)]
pub(super) struct Foreign {
    pub(super) row: SeenRow,
    pub(super) since_us: i64,
}

/// A SQLite connection holding the lock-table statements.
pub struct SqliteStore {
    pub(super) conn: SyncConnectionWrapper<SqliteConnection>,
    pub(super) path: String,
    pub(super) boot_id: String,
    /// Per election, its row as last observed (what a take compares
    /// against).
    pub(super) seen: std::collections::HashMap<String, SeenRow>,
    /// Per election, its row from another boot that has not changed since
    /// `since_us`. One per election: the daemon's elections share this
    /// connection, and one slot for all restarted every election's wait at
    /// each look at another's row, so after a reboot none was ever taken.
    pub(super) foreign: std::collections::HashMap<String, Foreign>,
}

opaque_debug!(SqliteStore);

impl SqliteStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let path = url.sqlite_path().unwrap_or_default().to_owned();
        check_file_system(&path)?;
        let boot_id =
            boot_id().map_err(|e| StoreError::Local(format!("cannot read the boot id: {e}")))?;
        let p = path.clone();
        let conn = run_blocking(move || {
            let mut conn = open(&p)?;
            conn.batch_execute(STATEMENTS)?;
            Ok(conn)
        })
        .await?;
        Ok(Self {
            conn: SyncConnectionWrapper::new(conn),
            path,
            boot_id,
            seen: std::collections::HashMap::new(),
            foreign: std::collections::HashMap::new(),
        })
    }

    pub(crate) async fn release(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        let released = self.release_row(item).await?;
        if released && wakes_anyone(item.election) {
            self.announce(&[item.election]);
        }
        Ok(released)
    }

    /// [`SqliteStore::release`] for several elections, in one transaction
    /// (one commit, where a commit each would wait for the disk once per
    /// election within the shutdown's budget), with one wake-up naming
    /// every election it released.
    pub(crate) async fn release_many(
        &mut self,
        items: &[Release<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.begin().await?;
        let released = self.release_each(items).await;
        let released = self.end(released).await?;
        let woken: Vec<&str> = items
            .iter()
            .zip(&released)
            .filter(|(item, r)| **r && wakes_anyone(item.election))
            .map(|(item, _)| item.election)
            .collect();
        if !woken.is_empty() {
            self.announce(&woken);
        }
        Ok(released)
    }

    async fn release_each(&mut self, items: &[Release<'_>]) -> Result<Vec<bool>, StoreError> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(self.release_row(item).await?);
        }
        Ok(out)
    }

    async fn release_row(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        let now = now_us();
        let n = Stmt::<()>::new(
            RELEASE,
            [
                item.successor
                    .map_or(Bind::NullText, |s| Bind::Text(s.daemon)),
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(item.window_us())),
                Bind::Text(item.election),
                Bind::Text(item.instance),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    /// Gives up being `election`'s named successor (see [`DECLINE`]):
    /// whether the row named `daemon` and is open to anyone now. No
    /// wake-up: the others woken by the release ask again every few
    /// milliseconds while the row waits for its successor.
    pub(crate) async fn decline(
        &mut self,
        election: &str,
        daemon: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        let now = now_us();
        let n = Stmt::<()>::new(
            DECLINE,
            [
                Bind::BigInt(now),
                Bind::Text(election),
                Bind::Text(daemon),
                Bind::BigInt(token),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    fn announce(&self, elections: &[&str]) {
        if let Err(e) = announce_release(&self.path, elections) {
            // The others find the row free at their next poll.
            tracing::warn!(error = %e, "could not wake the waiting processes");
        }
    }

    /// Opens a write transaction (`BEGIN IMMEDIATE`: the write lock
    /// first, so nothing in it waits half-way). Ended by
    /// [`SqliteStore::end`]; a caller that gives up half-way drops the
    /// connection, which rolls it back.
    async fn begin(&mut self) -> Result<(), StoreError> {
        Ok(self.conn.batch_execute("BEGIN IMMEDIATE").await?)
    }

    /// Commits what [`SqliteStore::begin`] opened, or rolls it back when
    /// `result` is an error.
    async fn end<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match result {
            Ok(value) => match self.conn.batch_execute("COMMIT").await {
                Ok(()) => Ok(value),
                Err(e) => {
                    // Never leave it open: what it wrote must not look
                    // committed to a later statement on this connection.
                    let _ = self.conn.batch_execute("ROLLBACK").await;
                    Err(e.into())
                }
            },
            Err(e) => {
                let _ = self.conn.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    }

    /// The record of terms, newest first (`None`: not installed). Times
    /// of this boot's terms are given on the host's wall clock, from their
    /// age on the boot clock.
    pub(crate) async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        let now = now_us();
        let wall = std::time::SystemTime::now();
        let (boot, name) = (
            Bind::Text(&self.boot_id),
            election.map_or(Bind::NullText, Bind::Text),
        );
        let at = Bind::BigInt(now);
        let rows: Result<Vec<TermParts>, _> = Stmt::<TermSql>::new(
            HISTORY,
            [
                boot,
                at,
                boot,
                at,
                boot,
                at,
                at,
                boot,
                at,
                name,
                name,
                Bind::BigInt(limit),
            ],
        )
        .load(&mut self.conn)
        .await;
        let terms = match rows {
            Err(e) if crate::shared::history::missing_table_diesel(&e) => return Ok(None),
            rows => rows?,
        };
        let when = |ago: Option<i64>| {
            ago.and_then(|us| {
                wall.checked_sub(std::time::Duration::from_micros(us.try_into().ok()?))
            })
            .map(crate::shared::history::rfc3339)
        };
        Ok(Some(
            terms
                .into_iter()
                .map(|parts| {
                    let mut term = Term::from(parts);
                    term.began_at = when(term.began_ago_us);
                    term.ended_at = when(term.ended_ago_us);
                    term
                })
                .collect(),
        ))
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        let now = now_us();
        let rows: Vec<RowParts> = Stmt::<RowSql>::new(
            ELECTIONS,
            [
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
                Bind::Text(prefix),
                Bind::Text(prefix),
            ],
        )
        .load(&mut self.conn)
        .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        migrate::run(&mut self.conn, &MIGRATION).await
    }

    pub(crate) async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        migrate::fence_status(&mut self.conn, &MIGRATION).await
    }

    /// What is left of a row's lease by the clock this process can read.
    /// Same boot: its expiry. Another boot: at least the row's own lease
    /// length (and our ttl) after we first saw it unchanged, since any holder
    /// renews well within its lease.
    pub(super) fn remaining_us(
        &mut self,
        election: &str,
        row: &SeenRow,
        ttl_us: i64,
        now: i64,
    ) -> i64 {
        if row.boot_id == self.boot_id {
            self.foreign.remove(election);
            return row.expires_at - now;
        }
        let since = match self.foreign.get(election) {
            Some(f) if f.row == *row => f.since_us,
            _ => {
                self.foreign.insert(
                    election.to_owned(),
                    Foreign {
                        row: row.clone(),
                        since_us: now,
                    },
                );
                now
            }
        };
        let lease = if row.renewed_at >= 0 {
            row.expires_at.saturating_sub(row.renewed_at)
        } else {
            0
        };
        let lease = lease.max(ttl_us);
        since
            .saturating_add(lease)
            .saturating_add(FOREIGN_SLACK_US + lease / 100)
            .saturating_sub(now)
    }
}

/// Waited on top of a foreign row's lease (plus 1 % of it): covers two
/// clocks running at slightly different rates.
pub(super) const FOREIGN_SLACK_US: i64 = 50_000;
