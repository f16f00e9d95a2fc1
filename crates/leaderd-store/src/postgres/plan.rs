//! PostgreSQL's migration plan: the checks that say whether the schema,
//! its columns, the fence and the record of terms are current, and the
//! files under `migrations/postgres/` that make them so. The runner
//! (`shared::migrate`) runs it.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use crate::shared::error::StoreError;
use crate::shared::migrate::{self, address_present, BestEffort, Column};

/// PostgreSQL steps, in order.
pub(super) const STEPS: &[&str] = &[
    include_str!(
        "../../../../migrations/postgres/2026-11-22-000000_create_service_leader_lock/up.sql"
    ),
    include_str!("../../../../migrations/postgres/2026-11-24-000000_token_floor/up.sql"),
    POSTGRES_FILLFACTOR,
];

/// [`FENCE`]'s check, as a literal: the plan asks it together with
/// the schema's, in the one query every connect sends. Its version is the
/// function's comment: this one or a newer one (a newer daemon's) counts as
/// installed, with both takeover triggers on the lock table (a table made
/// again has none, and the fence would hold nothing off without them) and
/// its unique index over the token (which makes a takeover a key update).
macro_rules! postgres_fence_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p \
        WHERE p.proname OPERATOR(pg_catalog.=) 'leaderd_fence' \
        AND p.pronamespace OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace n \
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()) \
        AND pg_catalog.obj_description(p.oid, 'pg_proc') OPERATOR(pg_catalog.~) '^leaderd fence [0-9]+$' \
        AND pg_catalog.split_part(pg_catalog.obj_description(p.oid, 'pg_proc'), ' ', 3)::int \
        OPERATOR(pg_catalog.>=) 6) \
        AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger t \
        WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.format('%I.service_leader_lock', \
        pg_catalog.current_schema())) \
        AND t.tgname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_take', \
        'service_leader_take_new']::pg_catalog.name[])) OPERATOR(pg_catalog.=) 2 \
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
        WHERE i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.format('%I.service_leader_lock', \
        pg_catalog.current_schema())) \
        AND i.indexrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.format( \
        '%I.service_leader_lock_name_token', pg_catalog.current_schema())) AND i.indisunique)"
    };
}

/// PostgreSQL's fenced writes (`leaderd_fence`), installed apart from the
/// steps: see [`BestEffort`].
pub(super) const FENCE: BestEffort = BestEffort::fence(
    postgres_fence_current!(),
    None,
    // The trigger functions' file first: an upgrade from a version before
    // their search_path was pg_catalog's replaces them with the fence.
    concat!(
        include_str!("../../../../migrations/postgres/2026-11-24-000000_token_floor/up.sql"),
        include_str!("../../../../migrations/postgres/2026-11-26-000000_fence/up.sql")
    ),
    Some("leaderd_fence"),
);

/// The record of terms' check, per backend, as a literal (see
/// [`postgres_fence_current`]): its table, of this version or a newer one
/// (PostgreSQL: the table's comment), and both its triggers.
macro_rules! postgres_history_current {
    () => {
        "SELECT COALESCE(pg_catalog.obj_description(pg_catalog.to_regclass(pg_catalog.format( \
        '%I.service_leader_history', pg_catalog.current_schema())), 'pg_class') \
        OPERATOR(pg_catalog.~) '^leaderd history [0-9]+$', false) \
        AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger t \
        WHERE t.tgrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.format('%I.service_leader_lock', \
        pg_catalog.current_schema())) \
        AND t.tgname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_record_term', \
        'service_leader_record_first']::pg_catalog.name[])) OPERATOR(pg_catalog.=) 2"
    };
}

/// The record of terms (`leaderd history`): a table and triggers that
/// record each change of holder, whoever's statement made it. Best effort,
/// as the fence: a user who may not create triggers runs the daemon
/// without it.
pub(super) const HISTORY: BestEffort = BestEffort::history(
    postgres_history_current!(),
    // After the token floor's file, whose guard it relies on (the schema
    // is this user's, no other role's table or function has leaderd's
    // names), and which replaces the older versions' trigger functions.
    concat!(
        include_str!("../../../../migrations/postgres/2026-11-24-000000_token_floor/up.sql"),
        include_str!("../../../../migrations/postgres/2026-12-04-000000_history/up.sql")
    ),
    Some("leaderd_history"),
);

/// The last PostgreSQL step, also run on its own when the schema is
/// already current: it tunes a table earlier versions made, and never fails
/// nor waits (see the file).
pub(super) const POSTGRES_FILLFACTOR: &str =
    include_str!("../../../../migrations/postgres/2026-11-25-000000_fillfactor/up.sql");

/// Whether a column of the lock table is there, as a literal per backend,
/// so that the plans ask it in their one check.
macro_rules! postgres_column_present {
    ($column:literal) => {
        concat!(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a \
            JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid \
            WHERE c.relname OPERATOR(pg_catalog.=) 'service_leader_lock' \
            AND a.attname OPERATOR(pg_catalog.=) '",
            $column,
            "' AND NOT a.attisdropped AND c.relnamespace OPERATOR(pg_catalog.=) \
            (SELECT n.oid FROM pg_catalog.pg_namespace n \
            WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()))"
        )
    };
}

/// The named successor's column, per backend.
pub(super) const POSTGRES_SUCCESSOR: Column = Column {
    present: postgres_column_present!("successor"),
    add: include_str!("../../../../migrations/postgres/2026-11-27-000000_successor/up.sql"),
};
pub(super) const POSTGRES_ADDRESS: Column = Column {
    present: address_present!(postgres_column_present),
    add: include_str!("../../../../migrations/postgres/2026-11-28-000000_address/up.sql"),
};

/// The steps' work is there: the last step makes the trigger that keeps
/// deleted rows' tokens. It reads `pg_class` with the statement's snapshot:
/// `to_regclass` goes through the catalog cache, which taking an advisory
/// lock does not refresh, so a waiter would miss the table its predecessor
/// just created. A literal, so that [`MIGRATION`] asks it together with the
/// fence's check.
macro_rules! schema_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t \
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid \
        WHERE t.tgname OPERATOR(pg_catalog.=) 'service_leader_keep_token' \
        AND c.relname OPERATOR(pg_catalog.=) 'service_leader_lock' \
        AND c.relnamespace OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace n \
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()))"
    };
}

/// A superuser uses leaderd's tables and functions only while they, and
/// the schema, belong to a superuser: a trigger or policy that another
/// role put on them, or a table that role put in their place, would run
/// with the superuser's rights. When they do not, the migration runs, and
/// its guard refuses (LF010): leaderd then uses the database no further.
/// Other users are held to the guard only when they install.
macro_rules! trusted_by_a_superuser {
    () => {
        "SELECT NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r \
        WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) \
        OR (NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) c.relowner \
        WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(pg_catalog.quote_ident(pg_catalog.current_schema())) \
        AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', 'service_leader_token', \
        'service_leader_fence_key', 'service_leader_fence_gate', 'service_leader_fence_boot', \
        'service_leader_history']::pg_catalog.name[]) \
        AND NOT o.rolsuper) \
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) p.proowner \
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(pg_catalog.quote_ident(pg_catalog.current_schema())) \
        AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_keep_token', 'service_leader_seed_token', \
        'service_leader_token_floor', 'service_leader_take', 'service_leader_take_key', \
        'service_leader_open_transactions', 'service_leader_fenced_session', 'service_leader_record_term', \
        'leaderd_fence']::pg_catalog.name[]) \
        AND NOT o.rolsuper) \
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a \
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid \
        JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) t.typowner \
        WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(pg_catalog.quote_ident(pg_catalog.current_schema())) \
        AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', 'service_leader_token', \
        'service_leader_fence_key', 'service_leader_fence_gate', 'service_leader_fence_boot', \
        'service_leader_history']::pg_catalog.name[]) \
        AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped \
        AND t.typnamespace OPERATOR(pg_catalog.<>) pg_catalog.to_regnamespace('pg_catalog') \
        AND NOT o.rolsuper) \
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) n.nspowner \
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema() \
        AND (o.rolsuper OR (o.rolname OPERATOR(pg_catalog.=) 'pg_database_owner' \
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_database d \
        JOIN pg_catalog.pg_roles dr ON dr.oid OPERATOR(pg_catalog.=) d.datdba \
        WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() AND dr.rolsuper)))))"
    };
}

/// Whoever connects uses leaderd's objects only while their owners are
/// ones it trusts (see `session::untrusted`): a role that may create in
/// the schema could make them all, with the right names, before leaderd
/// was installed there. When they are not, the migration runs, and its
/// guard refuses (LF010).
macro_rules! trusted_by_anyone {
    () => {
        concat!(
            "SELECT NOT EXISTS (",
            super::session::untrusted!(
                "(SELECT m.oid FROM pg_catalog.pg_namespace m                  WHERE m.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema())"
            ),
            ")"
        )
    };
}

/// The steps' work is there, and a superuser may trust it: asked again
/// under the lock, so that an installation that only looks current (made
/// by another role) runs the steps, whose guard then refuses it.
macro_rules! steps_current {
    () => {
        concat!(
            "SELECT (",
            schema_current!(),
            ") AND (",
            trusted_by_a_superuser!(),
            ") AND (",
            trusted_by_anyone!(),
            ")"
        )
    };
}

/// DDL is transactional here: the steps run under a transaction-level
/// advisory lock (pooler-safe, released by COMMIT or a dropped session). The
/// key is "leaderd" in ASCII.
pub(super) const MIGRATION: migrate::Plan = migrate::Plan {
    current: concat!(
        "SELECT (",
        steps_current!(),
        ") AND (",
        postgres_column_present!("successor"),
        ") AND (",
        address_present!(postgres_column_present),
        ") AND (",
        postgres_fence_current!(),
        ") AND (",
        postgres_history_current!(),
        ")"
    ),
    steps_current: steps_current!(),
    // Every lock a step needs (a trigger's DDL locks the lock table) is
    // waited for 100 ms at most, for this transaction only: a lock request
    // queued behind a long transaction queues every renewal behind it, and
    // leaders lose their leases.
    lock: "BEGIN; SET LOCAL lock_timeout = '100ms'",
    // Tried, never waited for: any role that may connect can hold the key.
    try_lock: "SELECT pg_catalog.pg_try_advisory_xact_lock(30510766455353956)",
    claim: None,
    unlock: "COMMIT",
    steps: STEPS,
    columns: &[POSTGRES_SUCCESSOR, POSTGRES_ADDRESS],
    tune: Some(POSTGRES_FILLFACTOR),
    // Touched only when it is a plain table of this user's (or a
    // superuser's): the cleanup runs with this user's rights, and a trigger
    // or policy another role put on it would run with them.
    legacy: "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) c.relowner \
        WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.format('%I.__diesel_schema_migrations', \
        pg_catalog.current_schema()))::pg_catalog.oid \
        AND c.relkind OPERATOR(pg_catalog.=) 'r' AND NOT c.relrowsecurity \
        AND (o.rolname OPERATOR(pg_catalog.=) CURRENT_USER OR o.rolsuper))",
    retry_busy: false,
    fence: Some(FENCE),
    extras: &[HISTORY],
};

/// After an upgrade from the advisory fence (versions 4 and 5), the
/// transactions open once it has committed, listed with those open while
/// it was installed (see the fence's SQL): an old fence called after the
/// installation read its list, and before its commit was seen, is on it
/// then, and a transaction begun later is not. Skips a list a takeover is
/// settling now (it lists the same), and does nothing once settled.
pub(super) const SETTLE_UPGRADE: &str = "DO $settle$
DECLARE
    s pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    -- Only its owner may (a daemon's role that runs migrate does not).
    IF pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_fence_gate', s)) IS NOT NULL
       AND pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_open_transactions()', s))
           IS NOT NULL
       AND pg_catalog.has_table_privilege(pg_catalog.format('%s.service_leader_fence_gate', s), 'UPDATE')
       AND pg_catalog.has_function_privilege(
               pg_catalog.format('%s.service_leader_open_transactions()', s), 'EXECUTE') THEN
        EXECUTE pg_catalog.format('UPDATE %1$s.service_leader_fence_gate g '
            'SET old_fences = g.old_fences OPERATOR(pg_catalog.||) %1$s.service_leader_open_transactions(), '
            'settled = true WHERE g.name IN (SELECT o.name FROM %1$s.service_leader_fence_gate o '
            'WHERE o.name OPERATOR(pg_catalog.=) $1 AND NOT o.settled AND o.old_fences IS NOT NULL '
            'FOR UPDATE SKIP LOCKED)', s) USING '';
    END IF;
END $settle$";

/// The checks are unnamed statements and the lock and steps one transaction,
/// so a transaction pooler runs them all on one server connection.
impl migrate::Migrator for Client {
    async fn flag(&mut self, sql: &'static str) -> Result<bool, StoreError> {
        let rows = self.query_typed(sql, &[]).await?;
        Ok(rows
            .first()
            .map(|r| r.try_get(0))
            .transpose()?
            .unwrap_or(false))
    }

    async fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.batch_execute(sql).await?)
    }

    async fn execute(&mut self, sql: &'static str, text: &str) -> Result<u64, StoreError> {
        let bind = [(&text as &(dyn ToSql + Sync), Type::VARCHAR)];
        Ok(self.execute_typed(&bound_here(sql), &bind).await?)
    }

    async fn count(&mut self, sql: &'static str, text: &str) -> Result<i64, StoreError> {
        let bind = [(&text as &(dyn ToSql + Sync), Type::VARCHAR)];
        let rows = self.query_typed(&bound_here(sql), &bind).await?;
        Ok(rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
    }
}

/// A statement the backends share (`column = ?`, `column <> ?`,
/// `COUNT(*)`) in PostgreSQL's form: its bind `$1`, and its operators and
/// functions `pg_catalog`'s, not whatever the search_path finds (see
/// `session`).
pub(super) fn bound_here(sql: &str) -> String {
    sql.replace(" = ?", " OPERATOR(pg_catalog.=) $1")
        .replace(" <> ?", " OPERATOR(pg_catalog.<>) $1")
        .replace("COUNT(*)", "pg_catalog.count(*)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_check_asks_every_part() {
        MIGRATION.assert_current_asks_every_check();
    }

    #[test]
    fn shared_statements_take_pg_catalogs_operators() {
        assert_eq!(
            bound_here(migrate::LEGACY_OTHERS),
            "SELECT pg_catalog.count(*) FROM __diesel_schema_migrations \
             WHERE version OPERATOR(pg_catalog.<>) $1"
        );
        assert!(!bound_here(migrate::LEGACY_DELETE).contains('?'));
    }
}
