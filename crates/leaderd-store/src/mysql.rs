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

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use crate::cas::{self, CasOps};
use crate::migrate;
use crate::sql::{Bind, Stmt};
use crate::{
    observed, Attempt, DatabaseUrl, ElectionRow, LeaseRequest, Migrated, Observed, StoreError,
};

/// A statement for both servers, with its server-side lock waits bounded
/// inside the statement itself (no session `SET`): a statement that waits on
/// a row or metadata lock outlives the client's timeout on the server, and
/// every retry would add another waiting connection. MariaDB takes
/// `SET STATEMENT … FOR` (a row-lock wait of 0 fails at once); MySQL 8 takes
/// `SET_VAR` hints (1 s is its smallest row-lock wait).
struct Sql {
    mariadb: &'static str,
    mysql: &'static str,
}

macro_rules! bounded {
    ($verb:literal, $rest:literal) => {
        Sql {
            mariadb: concat!(
                "SET STATEMENT innodb_lock_wait_timeout = 0, lock_wait_timeout = 1 FOR ",
                $verb,
                $rest
            ),
            mysql: concat!(
                $verb,
                " /*+ SET_VAR(innodb_lock_wait_timeout = 1) SET_VAR(lock_wait_timeout = 1) */",
                $rest
            ),
        }
    };
}

/// Extends this instance's live lease, if its token is still the one it
/// holds. Binds: ttl µs, election, instance, token.
const RENEW: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET renewed_at = UTC_TIMESTAMP(6), \
        expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
    WHERE name = ? AND instance = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
);

const OBSERVE: Sql = bounded!(
    "SELECT",
    " holder, instance, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
    FROM service_leader_lock WHERE name = ?"
);

const TAKE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, \
        acquired_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6), \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND token = ? AND expires_at <= UTC_TIMESTAMP(6)"
);

// A plain INSERT with a no-op on a duplicate (not INSERT IGNORE, which would
// also turn truncation into a warning). It is never behind a locking read.
const CREATE: Sql = bounded!(
    "INSERT",
    " INTO service_leader_lock (name, token, expires_at) \
    VALUES (?, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), \
            UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) \
    ON DUPLICATE KEY UPDATE id = id"
);

const RELEASE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET holder = NULL, instance = NULL, expires_at = UTC_TIMESTAMP(6) \
    WHERE name = ? AND instance = ?"
);

const ELECTIONS: &str = "SELECT CAST(name AS CHAR), holder, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
    FROM service_leader_lock ORDER BY name";

/// What the server is and how the session runs, read once at connect.
const SESSION: &str = "SELECT @@autocommit, VERSION()";

/// DDL is not transactional in MySQL: concurrent migrations are serialised
/// with a named lock (freed with the session if this one dies).
const MIGRATION: migrate::Plan = migrate::Plan {
    current: "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock' \
        AND column_name = 'name' AND data_type = 'varbinary')",
    lock: "DO GET_LOCK('leaderd_migrate', 30)",
    unlock: "DO RELEASE_LOCK('leaderd_migrate')",
    steps: migrate::MYSQL,
    legacy: "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = '__diesel_schema_migrations')",
};

migrate::migrate_with!(AsyncMysqlConnection);

/// A MySQL/MariaDB connection holding the lock-table statements.
pub struct MysqlStore {
    conn: AsyncMysqlConnection,
    mariadb: bool,
}

opaque_debug!(MysqlStore);

impl MysqlStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let mut conn: AsyncMysqlConnection = crate::establish(url).await?;
        let (autocommit, version): (i64, String) = Stmt::<(BigInt, Text)>::new(SESSION, [])
            .get_result(&mut conn)
            .await?;
        if autocommit == 0 {
            // Nothing leaderd writes would ever commit: its renewals would be
            // invisible and another replica would take over a live leader.
            return Err(StoreError::Unsupported(
                "the server starts sessions with autocommit off (@@autocommit = 0, \
                 e.g. autocommit=0 or init_connect in its configuration); \
                 leaderd needs every statement to commit on its own"
                    .into(),
            ));
        }
        let mariadb = version.contains("MariaDB");
        Ok(Self { conn, mariadb })
    }

    fn sql(&self, sql: &Sql) -> &'static str {
        if self.mariadb {
            sql.mariadb
        } else {
            sql.mysql
        }
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
            self.sql(&RELEASE),
            [Bind::Text(election), Bind::Text(instance)],
        )
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
        migrate_with(&mut self.conn, &MIGRATION).await
    }
}

impl CasOps for MysqlStore {
    async fn renew(&mut self, req: &LeaseRequest<'_>, token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&RENEW),
            [
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::Text(req.instance),
                Bind::BigInt(token),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let rows: Vec<(Option<String>, Option<String>, i64, i64)> =
            Stmt::<(Nullable<Text>, Nullable<Text>, BigInt, BigInt)>::new(
                self.sql(&OBSERVE),
                [Bind::Text(req.election)],
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().next().map(observed))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&TAKE),
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
            self.sql(&CREATE),
            [Bind::Text(req.election), Bind::BigInt(req.ttl_us())],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}
