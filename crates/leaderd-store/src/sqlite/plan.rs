//! SQLite's migration plan: the checks that say whether the schema, its
//! columns and the record of terms are current, and the files under
//! `migrations/sqlite/` that make them so. The runner (`shared::migrate`)
//! runs it.

use diesel::SqliteConnection;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;

use crate::shared::migrate::{self, address_present, BestEffort, Column};

/// The record of terms' check, as a literal (see `migrate::Plan::current`).
macro_rules! sqlite_history_current {
    () => {
        "SELECT (SELECT COUNT(*) FROM sqlite_master \
        WHERE (type = 'table' AND name = 'service_leader_history') \
           OR (type = 'trigger' AND name IN ('service_leader_history_release', \
               'service_leader_history_take', 'service_leader_history_first'))) = 4"
    };
}

pub(super) const HISTORY: BestEffort = BestEffort::history(
    sqlite_history_current!(),
    include_str!("../../../../migrations/sqlite/2026-12-04-000000_history/up.sql"),
    // The steps run in a transaction here, as on PostgreSQL.
    Some("leaderd_history"),
);

/// SQLite steps, in order.
pub(super) const STEPS: &[&str] = &[
    include_str!(
        "../../../../migrations/sqlite/2026-11-22-000000_create_service_leader_lock/up.sql"
    ),
    include_str!("../../../../migrations/sqlite/2026-11-24-000000_token_floor/up.sql"),
];

macro_rules! sqlite_column_present {
    ($column:literal) => {
        concat!(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('service_leader_lock') \
            WHERE name = '",
            $column,
            "')"
        )
    };
}

pub(super) const SQLITE_SUCCESSOR: Column = Column {
    present: sqlite_column_present!("successor"),
    add: include_str!("../../../../migrations/sqlite/2026-11-27-000000_successor/up.sql"),
};

pub(super) const SQLITE_ADDRESS: Column = Column {
    present: address_present!(sqlite_column_present),
    add: include_str!("../../../../migrations/sqlite/2026-11-28-000000_address/up.sql"),
};

/// The steps' work is there.
macro_rules! schema_current {
    () => {
        "SELECT (SELECT COUNT(*) FROM sqlite_master \
        WHERE (type = 'table' AND name IN ('service_leader_lock', 'service_leader_token')) \
           OR (type = 'trigger' AND name = 'service_leader_keep_token')) = 3"
    };
}

/// `BEGIN IMMEDIATE` takes the write lock first, so concurrent migrations run
/// one after another and the later ones find the work done.
pub(super) const MIGRATION: migrate::Plan = migrate::Plan {
    // SQLite has no fence to install: the app's recipe needs nothing of
    // the migration.
    current: concat!(
        "SELECT (",
        schema_current!(),
        ") AND (",
        sqlite_column_present!("successor"),
        ") AND (",
        address_present!(sqlite_column_present),
        ") AND (",
        sqlite_history_current!(),
        ")"
    ),
    steps_current: schema_current!(),
    // The write lock, waited for 5 s at most by the busy timeout.
    lock: "PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE",
    try_lock: "SELECT 1",
    claim: None,
    unlock: "COMMIT",
    steps: STEPS,
    columns: &[SQLITE_SUCCESSOR, SQLITE_ADDRESS],
    tune: None,
    legacy: "SELECT EXISTS (SELECT 1 FROM sqlite_master \
        WHERE type = 'table' AND name = '__diesel_schema_migrations')",
    retry_busy: false,
    fence: None,
    extras: &[HISTORY],
};

migrate::diesel_migrator!(SyncConnectionWrapper<SqliteConnection>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_check_asks_every_part() {
        MIGRATION.assert_current_asks_every_check();
    }
}
