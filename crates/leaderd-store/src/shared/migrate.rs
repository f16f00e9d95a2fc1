//! Creating and upgrading the lock table, without bookkeeping in anyone
//! else's tables.
//!
//! The table lives in the app's database, often beside the app's own diesel
//! migrations. leaderd therefore records nothing in
//! `__diesel_schema_migrations` (a version there that the app's migration
//! directory does not know breaks `diesel migration revert`/`redo`). Instead
//! every step under `migrations/<backend>/` is idempotent, whether the schema
//! is current is read from the catalog (a read a user with data rights alone
//! may do), and the steps run together under a lock when it is not.
//!
//! Installations migrated by earlier versions carry leaderd's version in
//! `__diesel_schema_migrations`; [`LEGACY_VERSION`] is removed from there (and
//! the table dropped when nothing else is left in it), best effort.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::{describe, guard_refused, lock_wait_cut, refused_by_server, StoreError};
use super::lease::{FenceStatus, Migrated};

/// The version earlier leaderd releases recorded in
/// `__diesel_schema_migrations`.
pub(crate) const LEGACY_VERSION: &str = "20261122000000";

/// What the log says, once per process, when the server refuses the fence.
const FENCE_REFUSED: &str = "fenced writes are not installed or not current (leaderd_fence and \
    the lock table's triggers): this database user may not create or replace them (MySQL/MariaDB \
    with binary logging: SUPER or log_bin_trust_function_creators); leader election works, and \
    an app's call to leaderd_fence fails or runs an older version. Run `leaderd migrate` once as \
    the user who owns them (docs/security.md)";
static FENCE_SAID: AtomicBool = AtomicBool::new(false);

const HISTORY_REFUSED: &str = "the record of terms (`leaderd history`) is not installed: this \
    database user may not create its table and triggers (MySQL/MariaDB with binary logging: \
    SUPER or log_bin_trust_function_creators); leader election works, and no change of holder \
    is recorded. Run `leaderd migrate` once as the user who owns the lock table";
static HISTORY_SAID: AtomicBool = AtomicBool::new(false);

/// Something installed under the migration's lock when missing or older,
/// but apart from the steps, and best effort: the fenced-writes function
/// (docs/integrating.md, "Fenced writes"), MySQL's kept-tokens trigger. A user who may
/// not create it (data rights alone, no SUPER under binary logging) still
/// runs the daemon without it (an app's fence call then fails: never a
/// silent pass). Said once per process.
#[derive(Debug)]
pub(crate) struct BestEffort {
    /// What is logged when the server refuses it, and whether it was.
    pub refused: &'static str,
    pub said: &'static AtomicBool,
    /// One boolean: it is installed (this version or a newer one).
    pub current: &'static str,
    /// One boolean: this user can see every part `current` reads (where
    /// the server hides some from users without a right; `None`: all see
    /// all). When it cannot, a negative `current` says nothing.
    pub visible: Option<&'static str>,
    /// The statements that install it.
    pub install: &'static str,
    /// Where the steps run in a transaction (PostgreSQL, SQLite): the
    /// savepoint `install` runs under, so that a refusal does not undo the
    /// steps. Set in the same batch as `install` and released after it:
    /// each round trip counts to a database far away.
    pub savepoint: Option<&'static str>,
}

impl BestEffort {
    /// Fenced writes, as a backend installs them (see the fields).
    pub(crate) const fn fence(
        current: &'static str,
        visible: Option<&'static str>,
        install: &'static str,
        savepoint: Option<&'static str>,
    ) -> Self {
        Self {
            refused: FENCE_REFUSED,
            said: &FENCE_SAID,
            current,
            visible,
            install,
            savepoint,
        }
    }

    /// The record of terms (`leaderd history`): a table and triggers that
    /// record each change of holder, whoever's statement made it. Best
    /// effort, as the fence: a user who may not create triggers runs the
    /// daemon without it.
    pub(crate) const fn history(
        current: &'static str,
        install: &'static str,
        savepoint: Option<&'static str>,
    ) -> Self {
        Self {
            refused: HISTORY_REFUSED,
            said: &HISTORY_SAID,
            current,
            visible: None,
            install,
            savepoint,
        }
    }

    /// `install` in one batch, under its savepoint where it has one.
    fn batch(&self) -> std::borrow::Cow<'static, str> {
        match self.savepoint {
            None => self.install.into(),
            Some(name) => format!(
                "SAVEPOINT {name};\n{};\nRELEASE SAVEPOINT {name}",
                self.install.trim_end().trim_end_matches(';')
            )
            .into(),
        }
    }

    /// Undoes a failed [`BestEffort::batch`] (nothing to undo without a
    /// savepoint: each statement committed or failed on its own).
    async fn undo<M: Migrator>(&self, conn: &mut M) -> Result<(), StoreError> {
        match self.savepoint {
            None => Ok(()),
            Some(name) => conn.batch(&format!("ROLLBACK TO SAVEPOINT {name}")).await,
        }
    }
}

/// Removes leaderd's legacy row (bind: [`LEGACY_VERSION`]).
pub(crate) const LEGACY_DELETE: &str = "DELETE FROM __diesel_schema_migrations WHERE version = ?";

/// Whether anything but leaderd's legacy row is recorded.
pub(crate) const LEGACY_OTHERS: &str =
    "SELECT COUNT(*) FROM __diesel_schema_migrations WHERE version <> ?";

/// Dropped when leaderd's row was all it held: leaderd created it.
pub(crate) const LEGACY_DROP: &str = "DROP TABLE __diesel_schema_migrations";

/// A column added to a table earlier versions made, when it is missing:
/// after the steps, under the migration's lock. A step of its own rather
/// than SQL, because neither MySQL 8 nor SQLite can add a column only if it
/// is missing.
#[derive(Debug)]
pub(crate) struct Column {
    /// One boolean: the column is there.
    pub present: &'static str,
    /// Adds it.
    pub add: &'static str,
}

/// The holder's advertised address and the instance that wrote it: both
/// there, per backend (one step adds both; one alone, left by hand, reads
/// as missing, and the step then fails naming the column).
macro_rules! address_present {
    ($present:ident) => {
        concat!(
            "SELECT (",
            $present!("address"),
            ") AND (",
            $present!("address_instance"),
            ")"
        )
    };
}
pub(crate) use address_present;

/// How one backend checks, serialises and applies the steps.
#[derive(Debug)]
pub(crate) struct Plan {
    /// One boolean: the schema is current, and the fence installed where
    /// the backend has one: the one check every connect sends. A read only,
    /// so a user with data rights alone passes once the table exists.
    pub current: &'static str,
    /// One boolean: the steps' work is there (`current` without the
    /// columns and the fence), asked again under the lock.
    pub steps_current: &'static str,
    /// Prepares the session for the migration; may open a transaction.
    pub lock: &'static str,
    /// One boolean: the lock that serialises concurrent migrations, tried
    /// without waiting (anyone who may connect can hold it, for as long as
    /// they like): tried again for up to [`LOCK_WAIT`], then the migration
    /// stops, postponed, rather than run beside another. The server never
    /// waits for it, so a migration given up leaves no session waiting.
    pub try_lock: &'static str,
    /// Run before each `try_lock` where the lock is a row to claim rather
    /// than a lock of the server's (a Galera cluster, whose nodes share no
    /// lock: see `mysql`). A failed claim is a try that did not get it.
    pub claim: Option<&'static str>,
    /// Undoes `lock` (commits).
    pub unlock: &'static str,
    /// The idempotent steps, in order.
    pub steps: &'static [&'static str],
    /// Columns added after the steps where missing, each on its own check
    /// (so a missing column re-runs no step: a step's DDL may need the
    /// same lock for nothing).
    pub columns: &'static [Column],
    /// The last step, run on its own (best effort) when the schema is
    /// current: a tuning that tables made by earlier versions get too, and
    /// that a user without the right to it goes on without.
    pub tune: Option<&'static str>,
    /// One boolean: the legacy bookkeeping table exists.
    pub legacy: &'static str,
    /// The steps may run again after a lock they did not get: each is its
    /// own statement, not in a transaction (MySQL, whose DDL commits at
    /// once). They are then tried for up to [`BUSY_RETRY_FOR`], each try
    /// waiting for no lock (MariaDB: `lock_wait_timeout = 0`), so that a
    /// lock held for an instant (a renewal, another migrator's look at the
    /// catalog) costs a retry, not the migration.
    pub retry_busy: bool,
    /// Fenced writes, where the backend has them.
    pub fence: Option<BestEffort>,
    /// Installed before the fence, each apart from the others (the record
    /// of terms; MySQL's kept-tokens trigger).
    pub extras: &'static [BestEffort],
}

#[cfg(test)]
impl Plan {
    /// `current` is the one query that stands for every other check (a
    /// literal, built by hand with `concat!`): a part whose check it left
    /// out would never be installed where the rest is current.
    pub(crate) fn assert_current_asks_every_check(&self) {
        let parts = [Some(self.steps_current)]
            .into_iter()
            .chain(self.extras.iter().map(|p| Some(p.current)))
            .chain([self.fence.as_ref().map(|p| p.current)]);
        let columns = self.columns.iter().map(|c| Some(c.present));
        for check in parts.chain(columns).flatten() {
            assert!(
                self.current == check || self.current.contains(&format!("({check})")),
                "the plan's `current` does not ask {check}"
            );
        }
    }
}

/// How long the migration's own lock is tried for: another migration
/// (milliseconds) is waited out; a session that keeps it postpones the
/// migration well within a daemon's connect budget (10 s).
pub(crate) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(4);

/// The pause between tries of the migration's lock.
const LOCK_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Tries the plan's lock (its claim first, where it has one) until it is
/// granted or [`LOCK_WAIT`] has passed.
async fn take_lock<M: Migrator>(conn: &mut M, plan: &Plan) -> Result<(), StoreError> {
    let until = tokio::time::Instant::now() + LOCK_WAIT;
    let mut claim_failed = None;
    loop {
        if let Some(claim) = plan.claim {
            // Two nodes' claims at once: one commits, the other is refused
            // (a duplicate key, or a deadlock error from certification).
            claim_failed = conn.batch(claim).await.err();
        }
        if conn.flag(plan.try_lock).await? {
            return Ok(());
        }
        if tokio::time::Instant::now() + LOCK_PAUSE >= until {
            let why = claim_failed.map_or_else(String::new, |e| format!(" (the last claim: {e})"));
            return Err(StoreError::MigrationBusy(format!(
                "another session kept the migration's lock for {LOCK_WAIT:?}{why}"
            )));
        }
        tokio::time::sleep(LOCK_PAUSE).await;
    }
}

/// How long the steps are tried again after a lock they did not get, where
/// the plan allows it: the migration's whole wait for a lock.
const BUSY_RETRY_FOR: std::time::Duration = std::time::Duration::from_millis(100);

/// The pause between such tries.
const BUSY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// What [`run`] needs of one backend's connection. Implemented per
/// connection type: a function generic over diesel's connections would need
/// higher-ranked bounds that make its future not `Send`.
pub(crate) trait Migrator: Send {
    /// A query answering one boolean.
    fn flag(&mut self, sql: &'static str) -> impl Future<Output = Result<bool, StoreError>> + Send;
    /// SQL text of one or more statements, without binds.
    fn batch(&mut self, sql: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// A statement with one text bind (written `?`): the rows it changed.
    fn execute(
        &mut self,
        sql: &'static str,
        text: &str,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
    /// A query with one text bind (written `?`) answering one count.
    fn count(
        &mut self,
        sql: &'static str,
        text: &str,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;
}

/// Brings the schema up to date: checks, and when needed takes the lock,
/// checks again (another replica may have done it meanwhile) and runs every
/// step; then the plan's tuning, and forgets the legacy bookkeeping, both
/// best effort. On error the caller drops the connection, which rolls back
/// and frees the lock.
pub(crate) async fn run<M: Migrator>(conn: &mut M, plan: &Plan) -> Result<Migrated, StoreError> {
    let mut result = Migrated::UpToDate;
    let mut stepped = false;
    if !conn.flag(plan.current).await? {
        conn.batch(plan.lock).await?;
        take_lock(conn, plan).await?;
        if !conn.flag(plan.steps_current).await? {
            batch_retrying(conn, &plan.steps.concat(), plan.retry_busy)
                .await
                .map_err(refusal)?;
            result = Migrated::Applied;
            stepped = true;
        }
        for column in plan.columns {
            if !conn.flag(column.present).await? {
                match batch_retrying(conn, column.add, plan.retry_busy).await {
                    Ok(()) => result = Migrated::Applied,
                    Err(e) if !again_current(conn, plan.retry_busy, column.present).await => {
                        return Err(refusal(e))
                    }
                    Err(_) => {}
                }
            }
        }
        for part in plan.extras.iter().chain(&plan.fence) {
            if install(conn, part, plan.retry_busy).await? {
                result = Migrated::Applied;
            }
        }
        // Tried again as the steps are: on Galera the claim's delete can
        // lose certification to another node's claim on the same row made
        // at that moment ("Deadlock found"), and the migration, done, would
        // fail and leave its claim to hold the others off for its 30 s.
        batch_retrying(conn, plan.unlock, plan.retry_busy).await?;
    }
    // Not after the steps, which end with it: a round trip saved where
    // each is dear (a first start far from the database).
    if let (Some(tune), false) = (plan.tune, stepped) {
        if let Err(e) = conn.batch(tune).await {
            tracing::warn!(error = %e, "could not tune service_leader_lock; it works, at a higher cost");
        }
    }
    if conn.flag(plan.legacy).await? {
        // With the steps' bounds on every lock it needs: another session
        // reading the table would otherwise hold the DROP for as long as
        // it likes (and the DROP, queued, every reader after it).
        conn.batch(plan.lock).await?;
        if let Err(e) = forget_legacy(conn, plan.retry_busy).await {
            tracing::warn!(
                error = %e,
                "could not remove leaderd's old entry from __diesel_schema_migrations; \
                 trying again at the next migration"
            );
        }
        batch_retrying(conn, plan.unlock, plan.retry_busy).await?;
    }
    Ok(result)
}

/// A step's failure as the migration's: the server's refusal is the
/// migration's failure, a lock not granted in time makes it busy, and a
/// lost connection stays one (it is worth another try).
fn refusal(e: StoreError) -> StoreError {
    match e {
        e if lock_wait_cut(&e) => StoreError::MigrationBusy(e.to_string()),
        StoreError::Postgres(e) if guard_refused(&e) => StoreError::Unsafe(describe(&e)),
        StoreError::Query(e @ diesel::result::Error::DatabaseError(..)) => {
            StoreError::Migration(e.to_string())
        }
        StoreError::Postgres(e) if e.as_db_error().is_some() => StoreError::Migration(describe(&e)),
        other => other,
    }
}

/// Whether the plan's fence is in place, by the check the migration makes
/// (no fence in the plan: SQLite's recipe).
pub(crate) async fn fence_status<M: Migrator>(
    conn: &mut M,
    plan: &Plan,
) -> Result<FenceStatus, StoreError> {
    let Some(fence) = &plan.fence else {
        return Ok(FenceStatus::Recipe);
    };
    if conn.flag(fence.current).await? {
        return Ok(FenceStatus::Installed);
    }
    Ok(match fence.visible {
        Some(visible) if !conn.flag(visible).await? => FenceStatus::NotVisible,
        _ => FenceStatus::NotInstalled,
    })
}

/// Runs `sql`; with `retry`, again for up to [`BUSY_RETRY_FOR`] while a lock
/// it waited for no longer than the plan allows cuts it short (see
/// [`Plan::retry_busy`]).
async fn batch_retrying<M: Migrator>(
    conn: &mut M,
    sql: &str,
    retry: bool,
) -> Result<(), StoreError> {
    let tried_until = tokio::time::Instant::now() + BUSY_RETRY_FOR;
    let mut ran = conn.batch(sql).await;
    while retry
        && ran.as_ref().is_err_and(lock_wait_cut)
        && tokio::time::Instant::now() + BUSY_PAUSE < tried_until
    {
        tokio::time::sleep(BUSY_PAUSE).await;
        ran = conn.batch(sql).await;
    }
    ran
}

/// After a statement of the migration failed: whether what it was to make
/// (`check`) is there now, made by another migration. Only where the plan
/// runs each statement on its own (`retry_busy`: MySQL/MariaDB, nothing
/// left aborted): there the migration's lock
/// (`GET_LOCK`) serialises the migrations of one server, but a Galera
/// cluster does not share it between its nodes, so two migrations on two
/// nodes run together and the later one finds a column the other just
/// added ("Duplicate column name").
async fn again_current<M: Migrator>(conn: &mut M, retry_busy: bool, check: &'static str) -> bool {
    retry_busy && conn.flag(check).await.unwrap_or(false)
}

/// Installs `part` unless another migrator just did; whether this one
/// did. A refusal (no right to create it) is said once per process and
/// leaves the steps' work in place; a lost connection stays an error.
async fn install<M: Migrator>(
    conn: &mut M,
    part: &BestEffort,
    retry_busy: bool,
) -> Result<bool, StoreError> {
    if conn.flag(part.current).await? {
        return Ok(false);
    }
    let tried_until = tokio::time::Instant::now() + BUSY_RETRY_FOR;
    let mut installed = conn.batch(&part.batch()).await;
    // A lock held for an instant (a renewal's, on the lock table a trigger
    // is made on) is waited out as the steps' are; a longer one postpones.
    while retry_busy
        && installed.as_ref().is_err_and(lock_wait_cut)
        && tokio::time::Instant::now() + BUSY_PAUSE < tried_until
    {
        tokio::time::sleep(BUSY_PAUSE).await;
        part.undo(conn).await?;
        installed = conn.batch(&part.batch()).await;
    }
    match installed {
        Err(StoreError::Postgres(e)) if guard_refused(&e) => {
            part.undo(conn).await?;
            Err(StoreError::Unsafe(describe(&e)))
        }
        Err(e) if lock_wait_cut(&e) => {
            part.undo(conn).await?;
            Err(StoreError::MigrationBusy(e.to_string()))
        }
        Ok(()) => Ok(true),
        Err(e) if refused_by_server(&e) => {
            part.undo(conn).await?;
            if again_current(conn, retry_busy, part.current).await {
                // Another migration installed it meanwhile: nothing to say.
                return Ok(false);
            }
            if !part.said.swap(true, Ordering::Relaxed) {
                tracing::warn!(error = %e, "{}", part.refused);
            }
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

async fn forget_legacy<M: Migrator>(conn: &mut M, retry_busy: bool) -> Result<(), StoreError> {
    if conn.execute(LEGACY_DELETE, LEGACY_VERSION).await? == 0 {
        return Ok(());
    }
    if conn.count(LEGACY_OTHERS, LEGACY_VERSION).await? == 0 {
        // MariaDB waits for no metadata lock here (the plan's lock), and
        // InnoDB's statistics thread holds one for an instant after the
        // table was written: tried again as the steps are.
        batch_retrying(conn, LEGACY_DROP, retry_busy).await?;
    }
    Ok(())
}

/// Implements [`Migrator`] for one diesel connection type.
macro_rules! diesel_migrator {
    ($conn:ty) => {
        impl $crate::shared::migrate::Migrator for $conn {
            async fn flag(
                &mut self,
                sql: &'static str,
            ) -> Result<bool, $crate::shared::error::StoreError> {
                use diesel_async::RunQueryDsl;
                Ok(
                    $crate::shared::sql::Stmt::<diesel::sql_types::Bool>::new(sql, [])
                        .get_result(self)
                        .await?,
                )
            }

            async fn batch(&mut self, sql: &str) -> Result<(), $crate::shared::error::StoreError> {
                use diesel_async::SimpleAsyncConnection;
                Ok(self.batch_execute(sql).await?)
            }

            async fn execute(
                &mut self,
                sql: &'static str,
                text: &str,
            ) -> Result<u64, $crate::shared::error::StoreError> {
                use diesel_async::RunQueryDsl;
                let n = $crate::shared::sql::Stmt::<()>::new(
                    sql,
                    [$crate::shared::sql::Bind::Text(text)],
                )
                .execute(self)
                .await?;
                Ok(n as u64)
            }

            async fn count(
                &mut self,
                sql: &'static str,
                text: &str,
            ) -> Result<i64, $crate::shared::error::StoreError> {
                use diesel_async::RunQueryDsl;
                Ok($crate::shared::sql::Stmt::<diesel::sql_types::BigInt>::new(
                    sql,
                    [$crate::shared::sql::Bind::Text(text)],
                )
                .get_result(self)
                .await?)
            }
        }
    };
}

pub(crate) use diesel_migrator;
