//! One statement type for the diesel backends (MySQL, SQLite): fixed SQL
//! text with `?` where each bind goes. PostgreSQL's statements run on
//! tokio-postgres directly (see `postgres`).
//!
//! diesel caches neither `sql_query` nor its INSERT/UPDATE builders as
//! prepared statements; a `QueryFragment` whose SQL text never changes is
//! cached (keyed by that text), so each statement is prepared once per
//! connection and then costs one round trip.

use std::marker::PhantomData;

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Nullable, Text};
use diesel::QueryResult;

/// A bind value.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bind<'a> {
    Text(&'a str),
    BigInt(i64),
    /// A text `NULL` (`x = NULL` is never true: a statement run only to be
    /// prepared reads and locks nothing).
    NullText,
}

/// Fixed SQL with `?` placeholders (MySQL and SQLite; PostgreSQL's statements
/// are in `postgres/statements.rs`) and the binds in order. `ST` is the row type it returns.
#[derive(Debug)]
pub(crate) struct Stmt<'a, ST = ()> {
    sql: &'static str,
    binds: Vec<Bind<'a>>,
    row: PhantomData<ST>,
}

impl<'a, ST> Stmt<'a, ST> {
    pub(crate) fn new(sql: &'static str, binds: impl Into<Vec<Bind<'a>>>) -> Self {
        let binds = binds.into();
        debug_assert_eq!(sql.matches('?').count(), binds.len(), "{sql}");
        Self {
            sql,
            binds,
            row: PhantomData,
        }
    }
}

impl<DB, ST> QueryFragment<DB> for Stmt<'_, ST>
where
    DB: Backend + HasSqlType<Text> + HasSqlType<BigInt>,
    str: ToSql<Text, DB>,
    i64: ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        let mut pieces = self.sql.split('?');
        out.push_sql(pieces.next().unwrap_or_default());
        for (bind, piece) in self.binds.iter().zip(pieces) {
            match bind {
                Bind::Text(s) => out.push_bind_param::<Text, str>(s)?,
                Bind::BigInt(n) => out.push_bind_param::<BigInt, i64>(n)?,
                Bind::NullText => out.push_bind_param::<Nullable<Text>, Option<&str>>(&None)?,
            }
            out.push_sql(piece);
        }
        Ok(())
    }
}

impl<ST> QueryId for Stmt<'_, ST> {
    // Not a static id: the prepared-statement cache then keys on the SQL text,
    // which is fixed for each statement.
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<ST: 'static> Query for Stmt<'_, ST> {
    type SqlType = ST;
}

// For the blocking migration check on a plain SQLite connection.
impl<Conn, ST> diesel::RunQueryDsl<Conn> for Stmt<'_, ST> {}
