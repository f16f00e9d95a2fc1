//! MySQL's and MariaDB's migration plans (and a Galera cluster's): the
//! checks that say whether the schema, its columns, the kept-tokens
//! trigger, the fence and the record of terms are current, and the files
//! under `migrations/mysql/` that make them so. The runner
//! (`shared::migrate`) runs them.

use std::sync::atomic::AtomicBool;

use diesel_async::AsyncMysqlConnection;

use crate::shared::migrate::{self, address_present, BestEffort, Column};

/// Whether a MySQL/MariaDB user can see the lock table's triggers:
/// `information_schema.triggers` shows them only to users with the TRIGGER
/// right on their table (a daemon's user has none).
macro_rules! mysql_triggers_visible {
    () => {
        "SELECT EXISTS (SELECT 1 FROM information_schema.user_privileges \
         WHERE privilege_type = 'TRIGGER') \
         OR EXISTS (SELECT 1 FROM information_schema.schema_privileges \
         WHERE privilege_type = 'TRIGGER' AND table_schema = DATABASE()) \
         OR EXISTS (SELECT 1 FROM information_schema.table_privileges \
         WHERE privilege_type = 'TRIGGER' AND table_schema = DATABASE() \
         AND table_name = 'service_leader_lock')"
    };
}

// The triggers' checks name the schema as `event_object_schema` (a
// trigger's is its table's), which MariaDB looks up directly: by
// `trigger_schema` it opens the lock table's triggers in every database
// on the server, at every connect.

/// [`MYSQL_FENCE`]'s check, as a literal (see [`postgres_fence_current`]).
macro_rules! mysql_fence_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM information_schema.routines \
        WHERE routine_schema = DATABASE() AND routine_name = 'leaderd_fence' \
        AND routine_comment REGEXP '^leaderd fence [0-9]+$' \
        AND CAST(SUBSTRING_INDEX(routine_comment, ' ', -1) AS UNSIGNED) >= 4) \
        AND EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_fence') \
        AND (SELECT COUNT(*) FROM information_schema.triggers \
        WHERE event_object_schema = DATABASE() AND event_object_table = 'service_leader_lock' \
        AND trigger_name IN ('service_leader_fence_take', 'service_leader_fence_new')) = 2"
    };
}

/// MySQL 8's fenced writes (`CALL leaderd_fence`): the fence table, its
/// triggers and the procedure, all three checked (a table or trigger lost,
/// e.g. with the lock table dropped and made again, is installed again).
/// DDL commits at once there: no savepoint; the statements stop at the
/// first refused, and the procedure installed first says "not installed"
/// until the last one replaces it.
pub(super) const MYSQL_FENCE: BestEffort = BestEffort {
    install: concat!(
        include_str!("../../../../migrations/mysql/2026-11-26-000000_fence/up.sql"),
        "CREATE ",
        include_str!("../../../../migrations/mysql/2026-11-26-000000_fence/procedure.sql")
    ),
    ..MARIADB_FENCE
};

/// MariaDB's: the same, each part replaced in place (`CREATE OR REPLACE`),
/// so that no moment lacks the triggers and the procedure keeps its grants.
pub(super) const MARIADB_FENCE: BestEffort = BestEffort::fence(
    mysql_fence_current!(),
    // Triggers show in information_schema only to users with the TRIGGER
    // right on their table (a daemon's user has none).
    Some(mysql_triggers_visible!()),
    concat!(
        include_str!("../../../../migrations/mysql/2026-11-26-000000_fence/mariadb.sql"),
        "CREATE OR REPLACE ",
        include_str!("../../../../migrations/mysql/2026-11-26-000000_fence/mariadb-procedure.sql")
    ),
    None,
);

/// [`MYSQL_KEPT_TOKENS`]'s check, as a literal (see [`postgres_fence_current`]).
macro_rules! mysql_kept_tokens_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM information_schema.triggers \
        WHERE event_object_schema = DATABASE() AND event_object_table = 'service_leader_lock' \
        AND trigger_name = 'service_leader_keep_token')"
    };
}

/// MySQL/MariaDB's kept-tokens trigger (docs/design.md, "The fencing token's floor"):
/// best effort, as the fence, because a server with binary logging refuses
/// triggers to a user without SUPER; in a step that refusal failed the whole
/// migration. Made only when missing, never dropped and made again: a gap
/// between the two (a lock wait, or MySQL refusing the CREATE after letting
/// the DROP through) would lose the floor of a row deleted meanwhile. On
/// its own, so that its refusal leaves the fence as it is.
pub(super) const MYSQL_KEPT_TOKENS: BestEffort = BestEffort {
    refused: "the trigger that keeps a deleted lease row's token is not installed: this database \
        user may not create triggers (with binary logging: SUPER or \
        log_bin_trust_function_creators); a row deleted and made again is seeded from the clock \
        alone. Run `leaderd migrate` once as a user who may",
    said: &KEPT_TOKENS_SAID,
    current: mysql_kept_tokens_current!(),
    visible: None,
    install: include_str!("../../../../migrations/mysql/2026-11-24-000000_token_floor/trigger.sql"),
    savepoint: None,
};
pub(super) static KEPT_TOKENS_SAID: AtomicBool = AtomicBool::new(false);

/// MySQL/MariaDB: a user who cannot see the triggers (see
/// [`mysql_triggers_visible`]) cannot make them either; for it the table
/// is enough, so that its daemons do not try at every start.
macro_rules! mysql_history_current {
    () => {
        concat!(
            "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
            WHERE table_schema = DATABASE() AND table_name = 'service_leader_history') \
            AND ((SELECT COUNT(*) FROM information_schema.triggers \
            WHERE event_object_schema = DATABASE() AND event_object_table = 'service_leader_lock' \
            AND trigger_name IN ('service_leader_history_term', 'service_leader_history_first')) = 2 \
            OR NOT (",
            mysql_triggers_visible!(),
            "))"
        )
    };
}

pub(super) const HISTORY: BestEffort = BestEffort::history(
    mysql_history_current!(),
    include_str!("../../../../migrations/mysql/2026-12-04-000000_history/up.sql"),
    None,
);

/// MySQL/MariaDB steps, in order.
pub(super) const STEPS: &[&str] = &[
    include_str!(
        "../../../../migrations/mysql/2026-11-22-000000_create_service_leader_lock/up.sql"
    ),
    include_str!("../../../../migrations/mysql/2026-11-23-000000_exact_names/up.sql"),
    include_str!("../../../../migrations/mysql/2026-11-24-000000_token_floor/up.sql"),
];

macro_rules! mysql_column_present {
    ($column:literal) => {
        concat!(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
            WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock' \
            AND column_name = '",
            $column,
            "')"
        )
    };
}

pub(super) const MYSQL_SUCCESSOR: Column = Column {
    present: mysql_column_present!("successor"),
    add: include_str!("../../../../migrations/mysql/2026-11-27-000000_successor/up.sql"),
};
pub(super) const MYSQL_ADDRESS: Column = Column {
    present: address_present!(mysql_column_present),
    add: include_str!("../../../../migrations/mysql/2026-11-28-000000_address/up.sql"),
};

/// The steps' work is there once the kept-tokens table is (its trigger is
/// made apart from the steps, best effort: `MYSQL_KEPT_TOKENS`). A
/// literal, so that [`MIGRATION`] asks it together with the fence's and the
/// trigger's checks.
macro_rules! schema_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock' \
        AND column_name = 'name' AND data_type = 'varbinary') \
        AND EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_token')"
    };
}

/// DDL is not transactional in MySQL: concurrent migrations are serialised
/// with a named lock (freed with the session if this one dies).
pub(super) const MIGRATION: migrate::Plan = migrate::Plan {
    current: concat!(
        "SELECT (",
        schema_current!(),
        ") AND (",
        mysql_column_present!("successor"),
        ") AND (",
        address_present!(mysql_column_present),
        ") AND (",
        mysql_fence_current!(),
        ") AND (",
        mysql_kept_tokens_current!(),
        ") AND (",
        mysql_history_current!(),
        ")"
    ),
    steps_current: schema_current!(),
    // Every metadata lock a step needs (its DDL locks the lock table) is
    // waited for as briefly as the server allows, on this connection (used
    // for the migration only): a request queued behind a long transaction
    // queues every renewal behind it. MariaDB: 0, no wait at all, and the
    // steps are tried again for 100 ms (`retry_busy`); MySQL's least is 1 s.
    lock: "SET SESSION lock_wait_timeout = IF(VERSION() LIKE '%MariaDB%', 0, 1), \
        innodb_lock_wait_timeout = 1",
    // Tried, never waited for on the server: anyone may hold the name.
    try_lock: "SELECT COALESCE(GET_LOCK('leaderd_migrate', 0), 0) = 1",
    claim: None,
    unlock: "DO RELEASE_LOCK('leaderd_migrate')",
    steps: STEPS,
    columns: &[MYSQL_SUCCESSOR, MYSQL_ADDRESS],
    tune: None,
    // A base table only: a view could call a function as this user.
    legacy: "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = '__diesel_schema_migrations' \
        AND table_type = 'BASE TABLE')",
    retry_busy: true,
    fence: Some(MYSQL_FENCE),
    extras: &[MYSQL_KEPT_TOKENS, HISTORY],
};

/// MariaDB's plan: the same steps, its own way of installing the fence.
pub(super) const MIGRATION_MARIADB: migrate::Plan = migrate::Plan {
    fence: Some(MARIADB_FENCE),
    ..MIGRATION
};

/// How long a Galera migration's claim lasts: a migration that died
/// holding it postpones the others' for at most this long.
macro_rules! galera_claim_seconds {
    () => {
        "30"
    };
}

/// MariaDB in a Galera cluster: `GET_LOCK` is each node's own, so
/// migrations on two nodes ran together (one failed on a column the other
/// had just added, and two `CREATE TRIGGER`s at once left a node's
/// replication waiting on a metadata lock for good). The migration claims
/// a row instead: committed writes are certified across the cluster, so of
/// two claims made at once on two nodes one commits and the other is
/// refused. A claim lasts [`galera_claim_seconds`] by the server's clock,
/// is renewed at each try of its owner (a session's random id), and is
/// deleted when the migration ends.
pub(super) const MIGRATION_GALERA: migrate::Plan = migrate::Plan {
    claim: Some(concat!(
        "CREATE TABLE IF NOT EXISTS service_leader_migration (\
            id INT NOT NULL PRIMARY KEY, owner VARCHAR(36) NOT NULL, \
            until DATETIME(6) NOT NULL) ENGINE = InnoDB; \
        SET @leaderd_claim = COALESCE(@leaderd_claim, UUID()); \
        INSERT INTO service_leader_migration (id, owner, until) \
        VALUES (1, @leaderd_claim, UTC_TIMESTAMP(6) + INTERVAL ",
        galera_claim_seconds!(),
        " SECOND) \
        ON DUPLICATE KEY UPDATE \
            owner = IF(until < UTC_TIMESTAMP(6), VALUES(owner), owner), \
            until = IF(owner = VALUES(owner), VALUES(until), until)"
    )),
    try_lock: "SELECT EXISTS (SELECT 1 FROM service_leader_migration \
        WHERE id = 1 AND owner = @leaderd_claim)",
    unlock: "DELETE FROM service_leader_migration WHERE id = 1 AND owner = @leaderd_claim",
    ..MIGRATION_MARIADB
};

migrate::diesel_migrator!(AsyncMysqlConnection);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_check_asks_every_part() {
        MIGRATION.assert_current_asks_every_check();
        MIGRATION_MARIADB.assert_current_asks_every_check();
    }

    /// The check every connect sends reads this database's catalog only:
    /// on a server holding many databases (one per tenant, each with its
    /// lock table), a look into each would cost every connect of every
    /// daemon. MariaDB's plan says how many databases each part scans.
    #[tokio::test]
    async fn the_connect_check_reads_no_other_database() {
        use diesel::sql_types::{Nullable, Text};
        use diesel::QueryableByName;
        use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

        use crate::mysql::connect::establish;
        use crate::shared::url::DatabaseUrl;

        #[derive(QueryableByName)]
        struct Step {
            #[diesel(sql_type = Nullable<Text>, column_name = "Extra")]
            extra: Option<String>,
        }
        // A database of its own on the local MariaDB, migrated.
        let admin = DatabaseUrl::parse("mysql://root@127.0.0.1:3306/test").unwrap();
        let mut admin = establish(&admin).await.expect("the local MariaDB");
        let name = format!("leaderd_unit_{}", uuid::Uuid::new_v4().simple());
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let url = DatabaseUrl::parse(&format!("mysql://root@127.0.0.1:3306/{name}")).unwrap();
        let mut sql = establish(&url).await.unwrap();
        migrate::run(&mut sql, &MIGRATION_MARIADB).await.unwrap();
        let steps: Vec<Step> = diesel::sql_query(format!("EXPLAIN {}", MIGRATION_MARIADB.current))
            .load(&mut sql)
            .await
            .unwrap();
        admin
            .batch_execute(&format!("DROP DATABASE {name}"))
            .await
            .unwrap();
        let scans: Vec<String> = steps
            .into_iter()
            .filter_map(|s| s.extra)
            .filter(|e| e.contains("Scanned"))
            .collect();
        assert!(!scans.is_empty(), "no catalog read in the plan");
        for extra in &scans {
            assert!(extra.contains("Scanned 0 databases"), "{extra}");
        }
    }
}
