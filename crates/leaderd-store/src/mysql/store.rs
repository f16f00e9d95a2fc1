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

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use super::connect::{establish, galera_node, has_json_table};
use super::plan::{MIGRATION, MIGRATION_GALERA, MIGRATION_MARIADB};
use super::statements::*;
use crate::shared::cas::CasBatch;
use crate::shared::error::StoreError;
use crate::shared::history::{Term, TermParts, TermSql};
use crate::shared::lease::{ElectionRow, FenceStatus, LeaseRequest, Migrated, RowParts, RowSql};
use crate::shared::migrate;
use crate::shared::sql::{Bind, Stmt};
use crate::shared::url::DatabaseUrl;

/// A MySQL/MariaDB connection holding the lock-table statements.
pub struct MysqlStore {
    pub(super) conn: AsyncMysqlConnection,
    pub(super) mariadb: bool,
    /// The node's name when the server is a node of a MariaDB Galera
    /// cluster (`@@wsrep_on`).
    pub(super) galera_node: Option<String>,
}

opaque_debug!(MysqlStore);

impl MysqlStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let mut conn: AsyncMysqlConnection = establish(url).await?;
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
        if !has_json_table(&version, mariadb) {
            // Every batch statement reads its rows from `JSON_TABLE`.
            return Err(StoreError::Unsupported(format!(
                "the server is {version}; leaderd needs MySQL 8.0.4 or later, or MariaDB \
                 10.6 or later (JSON_TABLE)"
            )));
        }
        let galera_node = galera_node(&mut conn, &version).await;
        Ok(Self {
            conn,
            mariadb,
            galera_node,
        })
    }

    /// The Galera node this connection is on, if the server is one.
    pub(crate) fn galera_node(&self) -> Option<&str> {
        self.galera_node.as_deref()
    }

    /// Runs each batch statement once on nothing (`[]`: no row read,
    /// locked or written), and the plain ones a lone lease uses, so that
    /// each is prepared at connect, outside any attempt's budget: a
    /// statement's first use costs a round trip more (its prepare), and
    /// 120 ms away the first batches after a connect ran their leases past
    /// the deadline (led, lost and led again for a second or more). One
    /// text each whatever the batch's size.
    pub(crate) async fn prepare_batches(&mut self) -> Result<(), StoreError> {
        // The plain statements a lone lease uses, on a `NULL` name (never
        // equal to anything: the server sees an impossible `WHERE` and
        // reads nothing). Not `CREATE` (an `INSERT`): one alone goes in
        // `CREATE_ALL` too.
        Stmt::<SeenSql>::new(self.sql(&OBSERVE), [Bind::NullText])
            .load::<SeenRow>(&mut self.conn)
            .await?;
        let ttl = Bind::BigInt(0);
        Stmt::<()>::new(
            self.sql(&RENEW),
            [ttl, Bind::NullText, Bind::Text(""), Bind::BigInt(0)],
        )
        .execute(&mut self.conn)
        .await?;
        Stmt::<()>::new(
            self.sql(&TAKE),
            [
                Bind::Text(""),
                Bind::Text(""),
                Bind::NullText,
                Bind::Text(""),
                ttl,
                Bind::NullText,
                Bind::BigInt(0),
                Bind::NullText,
            ],
        )
        .execute(&mut self.conn)
        .await?;
        self.observe_all(&[]).await?;
        for sql in [&RENEW_ALL, &TAKE_ALL] {
            Stmt::<()>::new(self.sql(sql), [Bind::Text("[]"), Bind::BigInt(0)])
                .execute(&mut self.conn)
                .await?;
        }
        Stmt::<()>::new(self.sql(&CREATE_ALL), [Bind::Text("[]")])
            .execute(&mut self.conn)
            .await?;
        Stmt::<()>::new(self.sql(&RELEASE_ALL), [Bind::Text("[]")])
            .execute(&mut self.conn)
            .await?;
        Stmt::<Text>::new(self.sql(&FREE_OF), [Bind::Text("[]")])
            .load::<String>(&mut self.conn)
            .await?;
        self.hold_wake_locks(&[]).await?;
        self.free_wake_locks(&[]).await
    }

    pub(super) fn sql(&self, sql: &Sql) -> &'static str {
        if self.mariadb {
            sql.mariadb
        } else {
            sql.mysql
        }
    }

    /// The renewal statement for `items` (distinct leases, one ttl); the
    /// number of rows it matched.
    pub(super) async fn renew_together(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<usize, diesel::result::Error> {
        let mut rows: Vec<(&str, &str, i64)> = items
            .iter()
            .map(|(req, token)| (req.election, req.instance, *token))
            .collect();
        rows.sort_unstable_by_key(|r| r.0.as_bytes());
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        Stmt::<()>::new(
            self.sql(&RENEW_ALL),
            [Bind::Text(&rows), Bind::BigInt(items[0].0.ttl_us())],
        )
        .execute(&mut self.conn)
        .await
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<RowParts> =
            Stmt::<RowSql>::new(ELECTIONS, [Bind::Text(prefix), Bind::Text(prefix)])
                .load(&mut self.conn)
                .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    /// The record of terms, newest first (`None`: not installed).
    pub(crate) async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        let name = election.map_or(Bind::NullText, Bind::Text);
        let rows: Result<Vec<TermParts>, _> =
            Stmt::<TermSql>::new(HISTORY, [name, name, Bind::BigInt(limit)])
                .load(&mut self.conn)
                .await;
        match rows {
            Err(e) if crate::shared::history::missing_table_diesel(&e) => Ok(None),
            rows => Ok(Some(rows?.into_iter().map(Term::from).collect())),
        }
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        let plan = if self.galera_node.is_some() {
            &MIGRATION_GALERA
        } else {
            self.plan()
        };
        migrate::run(&mut self.conn, plan).await
    }

    pub(crate) async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        let plan = self.plan();
        migrate::fence_status(&mut self.conn, plan).await
    }

    fn plan(&self) -> &'static migrate::Plan {
        if self.mariadb {
            &MIGRATION_MARIADB
        } else {
            &MIGRATION
        }
    }
}
