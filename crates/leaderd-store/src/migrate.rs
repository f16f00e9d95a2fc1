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

/// The version earlier leaderd releases recorded in
/// `__diesel_schema_migrations`.
pub(crate) const LEGACY_VERSION: &str = "20261122000000";

/// PostgreSQL steps, in order.
pub(crate) const POSTGRES: &[&str] = &[
    include_str!(
        "../../../migrations/postgres/2026-11-22-000000_create_service_leader_lock/up.sql"
    ),
    include_str!("../../../migrations/postgres/2026-11-24-000000_token_floor/up.sql"),
    POSTGRES_FILLFACTOR,
];

/// The PostgreSQL step that also runs on its own after the others, current
/// or not: it tunes a table earlier versions made, and never fails (see
/// the file).
pub(crate) const POSTGRES_FILLFACTOR: &str =
    include_str!("../../../migrations/postgres/2026-11-25-000000_fillfactor/up.sql");

/// MySQL/MariaDB steps, in order.
pub(crate) const MYSQL: &[&str] = &[
    include_str!("../../../migrations/mysql/2026-11-22-000000_create_service_leader_lock/up.sql"),
    include_str!("../../../migrations/mysql/2026-11-23-000000_exact_names/up.sql"),
    include_str!("../../../migrations/mysql/2026-11-24-000000_token_floor/up.sql"),
];

/// SQLite steps, in order.
pub(crate) const SQLITE: &[&str] = &[
    include_str!("../../../migrations/sqlite/2026-11-22-000000_create_service_leader_lock/up.sql"),
    include_str!("../../../migrations/sqlite/2026-11-24-000000_token_floor/up.sql"),
];

/// Removes leaderd's legacy row (bind: [`LEGACY_VERSION`]).
pub(crate) const LEGACY_DELETE: &str = "DELETE FROM __diesel_schema_migrations WHERE version = ?";

/// Whether anything but leaderd's legacy row is recorded.
pub(crate) const LEGACY_OTHERS: &str =
    "SELECT COUNT(*) FROM __diesel_schema_migrations WHERE version <> ?";

/// Dropped when leaderd's row was all it held: leaderd created it.
pub(crate) const LEGACY_DROP: &str = "DROP TABLE __diesel_schema_migrations";

/// How one backend checks, serialises and applies the steps.
#[derive(Debug)]
pub(crate) struct Plan {
    /// One boolean: the schema is current. A read only, so a user with data
    /// rights alone passes once the table exists.
    pub current: &'static str,
    /// Serialises concurrent migrations; may open a transaction.
    pub lock: &'static str,
    /// Undoes `lock` (commits).
    pub unlock: &'static str,
    /// The idempotent steps, in order.
    pub steps: &'static [&'static str],
    /// One boolean: the legacy bookkeeping table exists.
    pub legacy: &'static str,
}

/// Defines `async fn migrate_with(conn, plan)` for one connection type (a
/// generic function would need higher-ranked bounds that make its future not
/// `Send`).
///
/// It brings the schema up to date: checks, and when needed takes the lock,
/// checks again (another replica may have done it meanwhile) and runs every
/// step. Then it forgets the legacy bookkeeping, best effort. On error the
/// caller drops the connection, which rolls back and frees the lock.
macro_rules! migrate_with {
    ($conn:ty) => {
        async fn migrate_with(
            conn: &mut $conn,
            plan: &$crate::migrate::Plan,
        ) -> Result<$crate::Migrated, $crate::StoreError> {
            use diesel::sql_types::{BigInt, Bool};
            use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
            use $crate::migrate::{LEGACY_DELETE, LEGACY_DROP, LEGACY_OTHERS, LEGACY_VERSION};
            use $crate::sql::{Bind, Stmt};
            use $crate::{Migrated, StoreError};

            async fn flag(conn: &mut $conn, sql: &'static str) -> Result<bool, StoreError> {
                Ok(Stmt::<Bool>::new(sql, []).get_result(conn).await?)
            }
            async fn forget_legacy(conn: &mut $conn) -> Result<(), StoreError> {
                let ours = Stmt::<()>::new(LEGACY_DELETE, [Bind::Text(LEGACY_VERSION)])
                    .execute(conn)
                    .await?;
                if ours == 0 {
                    return Ok(());
                }
                let others: i64 = Stmt::<BigInt>::new(LEGACY_OTHERS, [Bind::Text(LEGACY_VERSION)])
                    .get_result(conn)
                    .await?;
                if others == 0 {
                    Stmt::<()>::new(LEGACY_DROP, []).execute(conn).await?;
                }
                Ok(())
            }

            let mut result = Migrated::UpToDate;
            if !flag(conn, plan.current).await? {
                conn.batch_execute(plan.lock).await?;
                if !flag(conn, plan.current).await? {
                    // A refusal is the migration's failure; a lost
                    // connection stays one (it is worth another try).
                    conn.batch_execute(&plan.steps.concat())
                        .await
                        .map_err(|e| match e {
                            diesel::result::Error::DatabaseError(..) => {
                                StoreError::Migration(e.to_string())
                            }
                            other => StoreError::Query(other),
                        })?;
                    result = Migrated::Applied;
                }
                conn.batch_execute(plan.unlock).await?;
            }
            if flag(conn, plan.legacy).await? {
                if let Err(e) = forget_legacy(conn).await {
                    tracing::warn!(
                        error = %e,
                        "could not remove leaderd's old entry from __diesel_schema_migrations"
                    );
                }
            }
            Ok(result)
        }
    };
}

pub(crate) use migrate_with;
