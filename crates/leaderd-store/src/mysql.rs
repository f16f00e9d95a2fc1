//! MySQL 8 / MariaDB 10.6+: the lock table on `mysql_async` (pure Rust) via
//! diesel-async.
//!
//! Clock: `UTC_TIMESTAMP(6)` into `DATETIME(6)` columns, so neither the
//! session `time_zone` nor whole-second rounding affects expiry (`NOW(6)`
//! would follow the session time zone). MySQL evaluates `SET` assignments left
//! to right, each seeing the ones before; no assignment here reads a column
//! assigned earlier in the same statement. The driver connects with
//! `CLIENT_FOUND_ROWS`, so counts are matched rows. `lock` is a reserved word;
//! nothing here is named that.

use diesel::mysql::Mysql;
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use crate::cas::{self, CasOps};
use crate::sql::{Bind, Stmt};
use crate::{
    observed, Attempt, DatabaseUrl, ElectionRow, LeaseRequest, Migrated, Observed, StoreError,
};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations/mysql");

const RENEW: &str = "UPDATE service_leader_lock \
    SET renewed_at = UTC_TIMESTAMP(6), \
        expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
    WHERE name = ? AND instance = ? AND expires_at > UTC_TIMESTAMP(6)";

const OBSERVE: &str = "SELECT holder, instance, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
    FROM service_leader_lock WHERE name = ?";

const TAKE: &str = "UPDATE service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, \
        acquired_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6), \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND token = ? AND expires_at <= UTC_TIMESTAMP(6)";

// A plain INSERT with a no-op on a duplicate (not INSERT IGNORE, which would
// also turn truncation into a warning). It is never behind a locking read.
const CREATE: &str = "INSERT INTO service_leader_lock (name, token, expires_at) \
    VALUES (?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), \
            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
    ON DUPLICATE KEY UPDATE id = id";

const RELEASE: &str = "UPDATE service_leader_lock \
    SET holder = NULL, instance = NULL, expires_at = UTC_TIMESTAMP(6) \
    WHERE name = ? AND instance = ?";

const ELECTIONS: &str = "SELECT name, holder, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
    FROM service_leader_lock ORDER BY name";

/// A MySQL/MariaDB connection holding the lock-table statements.
pub struct MysqlStore {
    conn: AsyncMysqlConnection,
}

opaque_debug!(MysqlStore);

impl MysqlStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let conn: AsyncMysqlConnection = crate::establish(url).await?;
        Ok(Self { conn })
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
        let n = Stmt::<()>::new(RELEASE, [Bind::Text(election), Bind::Text(instance)])
            .execute(&mut self.conn)
            .await?;
        Ok(n > 0)
    }

    pub(crate) async fn elections(&mut self) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<(String, Option<String>, i64, i64)> =
            Stmt::<(Text, Nullable<Text>, BigInt, BigInt)>::new(ELECTIONS, [])
                .load(&mut self.conn)
                .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        let latest = crate::latest_version::<Mysql>(&MIGRATIONS);
        let check = Stmt::<Bool>::new(
            "SELECT EXISTS (SELECT 1 FROM __diesel_schema_migrations WHERE version = ?) \
             AND EXISTS (SELECT 1 FROM information_schema.tables \
                         WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock')",
            [Bind::Text(&latest)],
        );
        if matches!(check.get_result::<bool>(&mut self.conn).await, Ok(true)) {
            return Ok(Migrated::UpToDate);
        }
        let wrapper: AsyncConnectionWrapper<AsyncMysqlConnection> = self.conn.into();
        crate::run_blocking(move || {
            let mut conn = wrapper;
            use diesel::connection::SimpleConnection;
            // DDL is not transactional in MySQL: serialise concurrent
            // migrations with a named lock instead.
            conn.batch_execute("DO GET_LOCK('leaderd_migrate', 30)")?;
            let result = crate::run_migrations(&mut conn, MIGRATIONS);
            conn.batch_execute("DO RELEASE_LOCK('leaderd_migrate')")?;
            result
        })
        .await
        .map(Migrated::from_count)
    }
}

impl CasOps for MysqlStore {
    async fn renew(&mut self, req: &LeaseRequest<'_>) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            RENEW,
            [
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::Text(req.instance),
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
                [Bind::Text(req.election)],
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().next().map(observed))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            TAKE,
            [
                Bind::Text(req.holder),
                Bind::Text(req.instance),
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::BigInt(seen_token),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError> {
        Stmt::<()>::new(
            CREATE,
            [Bind::Text(req.election), Bind::BigInt(req.ttl_us())],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}
