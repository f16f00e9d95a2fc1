//! SQLite: the embedded default, for one host (several processes may share
//! one file).
//!
//! SQLite has no server clock, so its "database clock" is the host's
//! `CLOCK_BOOTTIME`, shared by every process on the host and immune to
//! wall-clock changes; rows record the boot they were written in, and a row
//! from another boot counts as expired. The file runs in WAL mode so readers
//! never block, with a short busy timeout for writers. Every `UPDATE` takes
//! SQLite's write lock, so followers only read (see `cas`).

use std::time::{SystemTime, UNIX_EPOCH};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::{Connection as _, SqliteConnection};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::RunQueryDsl;
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use crate::cas::{self, CasOps};
use crate::sql::{Bind, Stmt};
use crate::{
    boot_id, boot_now, observed, Attempt, DatabaseUrl, ElectionRow, LeaseRequest, Migrated,
    Observed, StoreError,
};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations/sqlite");

/// Connection set-up; see [`open`].
const SETUP: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;";

/// Migrations may wait for another process's migration this long.
const SETUP_BUSY: &str = "PRAGMA busy_timeout = 5000;";

/// For the lease statements the busy timeout is short: writers hold the lock
/// for microseconds, and an attempt must not outlive the lease it protects.
const STATEMENTS: &str = "PRAGMA busy_timeout = 500;";

const RENEW: &str =
    "UPDATE service_leader_lock SET renewed_at = ?, expires_at = MAX(expires_at, ?) \
    WHERE name = ? AND instance = ? AND boot_id = ? AND expires_at > ?";

const OBSERVE: &str = "SELECT holder, instance, token, \
    CASE WHEN boot_id = ? THEN expires_at - ? ELSE -1 END \
    FROM service_leader_lock WHERE name = ?";

const TAKE: &str = "UPDATE service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, boot_id = ?, \
        acquired_at = ?, renewed_at = ?, expires_at = ? \
    WHERE name = ? AND token = ? AND (boot_id <> ? OR expires_at <= ?)";

const CREATE: &str = "INSERT INTO service_leader_lock (name, token, boot_id, expires_at) \
    VALUES (?, ?, ?, ?) ON CONFLICT (name) DO NOTHING";

const RELEASE: &str =
    "UPDATE service_leader_lock SET holder = NULL, instance = NULL, expires_at = ? \
    WHERE name = ? AND instance = ?";

const ELECTIONS: &str = "SELECT name, holder, token, \
    CASE WHEN boot_id = ? THEN expires_at - ? ELSE -1 END \
    FROM service_leader_lock ORDER BY name";

/// The boot clock in microseconds: SQLite's "database clock".
fn now_us() -> i64 {
    i64::try_from(boot_now().since_boot().as_micros()).unwrap_or(i64::MAX)
}

fn open(path: &str) -> Result<SqliteConnection, StoreError> {
    let mut conn = SqliteConnection::establish(path).map_err(StoreError::Connect)?;
    conn.batch_execute(SETUP_BUSY)?;
    // Switching a new file to WAL needs it exclusively, and SQLite answers
    // "locked" at once (without waiting) when that could deadlock with a
    // writer, e.g. several processes creating the file together: retry.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match conn.batch_execute(SETUP) {
            Ok(()) => return Ok(conn),
            Err(e) if is_locked(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn is_locked(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("locked") || info.message().contains("busy"))
}

/// A SQLite connection holding the lock-table statements.
pub struct SqliteStore {
    conn: SyncConnectionWrapper<SqliteConnection>,
    path: String,
    boot_id: String,
}

opaque_debug!(SqliteStore);

impl SqliteStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let path = url.sqlite_path().unwrap_or_default().to_owned();
        let boot_id =
            boot_id().map_err(|e| StoreError::Local(format!("cannot read the boot id: {e}")))?;
        let p = path.clone();
        let conn = crate::run_blocking(move || {
            let mut conn = open(&p)?;
            conn.batch_execute(STATEMENTS)?;
            Ok(conn)
        })
        .await?;
        Ok(Self {
            conn: SyncConnectionWrapper::new(conn),
            path,
            boot_id,
        })
    }

    pub(crate) async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        cas::acquire_or_renew(self, req).await
    }

    pub(crate) async fn release(
        &mut self,
        election: &str,
        instance: &str,
    ) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            RELEASE,
            [
                Bind::BigInt(now_us()),
                Bind::Text(election),
                Bind::Text(instance),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    pub(crate) async fn elections(&mut self) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<(String, Option<String>, i64, i64)> =
            Stmt::<(Text, Nullable<Text>, BigInt, BigInt)>::new(
                ELECTIONS,
                [Bind::Text(&self.boot_id), Bind::BigInt(now_us())],
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    pub(crate) async fn migrate(self) -> Result<Migrated, StoreError> {
        let path = self.path.clone();
        drop(self);
        crate::run_blocking(move || {
            let mut conn = open(&path)?;
            let latest = crate::latest_version::<diesel::sqlite::Sqlite>(&MIGRATIONS);
            let up_to_date = Stmt::<Bool>::new(
                "SELECT EXISTS (SELECT 1 FROM __diesel_schema_migrations WHERE version = ?) \
                 AND EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'service_leader_lock')",
                [Bind::Text(&latest)],
            );
            if matches!(diesel::RunQueryDsl::get_result::<bool>(up_to_date, &mut conn), Ok(true)) {
                return Ok(0);
            }
            // BEGIN IMMEDIATE takes the write lock first, so concurrent
            // migrations run one after another and the later ones find
            // nothing pending.
            conn.immediate_transaction(|conn| crate::run_migrations(conn, MIGRATIONS))
        })
        .await
        .map(Migrated::from_count)
    }
}

impl CasOps for SqliteStore {
    async fn renew(&mut self, req: &LeaseRequest<'_>) -> Result<bool, StoreError> {
        let now = now_us();
        let n = Stmt::<()>::new(
            RENEW,
            [
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(req.ttl_us())),
                Bind::Text(req.election),
                Bind::Text(req.instance),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let rows: Vec<(Option<String>, Option<String>, i64, i64)> =
            Stmt::<(Nullable<Text>, Nullable<Text>, BigInt, BigInt)>::new(
                OBSERVE,
                [
                    Bind::Text(&self.boot_id),
                    Bind::BigInt(now_us()),
                    Bind::Text(req.election),
                ],
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().next().map(observed))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let now = now_us();
        let n = Stmt::<()>::new(
            TAKE,
            [
                Bind::Text(req.holder),
                Bind::Text(req.instance),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(req.ttl_us())),
                Bind::Text(req.election),
                Bind::BigInt(seen_token),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError> {
        // The boot clock restarts at every boot, so a re-created row seeds its
        // token from the wall clock instead: tokens must never go backwards.
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        Stmt::<()>::new(
            CREATE,
            [
                Bind::Text(req.election),
                Bind::BigInt(seed),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now_us().saturating_add(req.ttl_us())),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}
