//! PostgreSQL: the lock table on `tokio-postgres` (pure Rust), over rustls
//! when the URL asks for TLS (see `shared::tls`).
//!
//! Clock: `now()`, the start of each autocommit statement, on the server.
//! Acquire-or-renew is one `UPDATE … RETURNING` that also reads the holder when
//! refused. Release wakes waiting replicas with `NOTIFY leaderd, '<election>'`.
//!
//! Pooler-safe: the lock-table statements run on tokio-postgres directly and
//! the session is never `SET`. Through PgBouncer in transaction pooling each
//! statement may run on another server connection, where a named statement
//! prepared earlier does not exist (or another client's exists under the same
//! name, which could even be a different statement); diesel-async prepares
//! named statements for every query and `SET`s the time zone at connect, so
//! it is not used here at all. Statements are therefore *unnamed*
//! (`query_typed`: parse, bind and execute in one round trip) unless the
//! connection is known to be direct: the server's view of its peer is a TCP
//! socket of this very process (see `session`). Then they are named and
//! prepared once (from the first statement after the check answers): the server's parse and plan of each renewal cost
//! 2.5× the throughput at 32 electors (BENCHMARKS.md). Anything unknown
//! (a Unix socket, NAT, a proxy of any kind, no `/proc`) counts as not
//! direct: slower, never wrong.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};

use super::connect::{open, CancelHandle};
use super::from_row::FromRow;
use super::held_off::HeldOff;
use super::plan::{MIGRATION, SETTLE_UPGRADE};
use super::session::{Facts, Session};
use super::statements::*;
use crate::shared::error::StoreError;
use crate::shared::history::{Term, TermParts};
use crate::shared::lease::{ElectionRow, FenceStatus, Migrated, Release, RowParts};
use crate::shared::migrate;
use crate::shared::url::DatabaseUrl;

/// A PostgreSQL connection running the lock-table statements.
pub struct PgStore {
    pub(super) client: Client,
    pub(super) cancel: CancelHandle,
    /// Its statements, naming the lock table where this connection found it.
    pub(super) stmts: &'static Statements,
    /// What this role may do beyond the daemon's needs, what of leaderd's
    /// it should not trust (while there is any, no statement is sent), and
    /// who else may create in the table's schema (see `session`).
    pub(super) facts: Box<Facts>,
    /// Who held this connection's takeovers off, and since when.
    pub(super) held_off: Box<HeldOff>,
    /// Named statements prepared once on this connection, once it is known
    /// to be direct; `None`: unnamed statements, the pooler-safe default.
    pub(super) named: Option<Vec<(&'static str, tokio_postgres::Statement)>>,
    /// Whether the connection is direct, while `session` finds out.
    pub(super) finding: Option<tokio::task::JoinHandle<bool>>,
}

opaque_debug!(PgStore);

impl PgStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let opened = open(url, false).await?;
        let session = Session::read(&opened.client).await?;
        Ok(Self {
            client: opened.client,
            cancel: opened.cancel,
            stmts: Statements::naming(&session.table),
            held_off: Box::new(opened.held_off),
            facts: Box::new(session.facts),
            named: None,
            finding: session.finding,
        })
    }

    /// The roles other than its owner that may create objects in the lock
    /// table's schema (`PUBLIC`: everyone).
    pub(crate) fn others_may_create(&self) -> &[String] {
        &self.facts.open_to
    }

    /// Refuses every statement on objects whose owner this user should not
    /// trust: running them could run that owner's code with this user's
    /// rights.
    pub(super) fn trusted(&self) -> Result<(), StoreError> {
        if self.facts.untrusted.is_empty() {
            return Ok(());
        }
        Err(StoreError::Unsafe(format!(
            "{} belong to a role that is neither a superuser, this user, nor the schema's \
             owner, and could run code with this user's rights (another role made them): \
             not used; have the schema's owner make them (docs/security.md)",
            self.facts.untrusted.join(", ")
        )))
    }

    /// The rights this connection's role has beyond what the daemon needs,
    /// one phrase each (none: it runs as the least-privilege daemon role).
    pub(crate) fn excess_rights(&self) -> &[String] {
        &self.facts.excess
    }

    pub(crate) fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Waits for whether the connection is direct, if that is being found.
    pub(super) async fn found_direct(&mut self) -> bool {
        if let Some(finding) = self.finding.take() {
            self.found(finding.await);
        }
        self.named.is_some()
    }

    /// Names statements from now on if the check found the connection
    /// direct (a failed check: unnamed, as through a pooler).
    fn found(&mut self, direct: Result<bool, tokio::task::JoinError>) {
        if matches!(direct, Ok(true)) {
            self.named = Some(Vec::new());
        }
    }

    /// Prepares the statements of a lease's life not prepared yet, on a
    /// direct connection (see `Statements::hot`), in one round trip.
    pub(super) async fn prepare_hot(&mut self) {
        let Some(named) = &mut self.named else {
            return;
        };
        let wanted: Vec<_> = unprepared(self.stmts, named).collect();
        prepare(&self.client, named, &wanted).await;
    }

    /// The statement `sql` prepared on this connection, if it is.
    pub(super) fn prepared(&self, sql: &str) -> Option<tokio_postgres::Statement> {
        let named = self.named.as_ref()?;
        named
            .iter()
            .find(|(s, _)| *s == sql)
            .map(|(_, st)| st.clone())
    }

    /// Takes the answer to whether the connection is direct once it is there.
    fn settle(&mut self) {
        use futures_util::FutureExt;
        if let Some(mut finding) = self.finding.take_if(|f| f.is_finished()) {
            match (&mut finding).now_or_never() {
                Some(direct) => self.found(direct),
                // Finished, but this task's budget was spent: kept, to be
                // taken at the next statement rather than lost.
                None => self.finding = Some(finding),
            }
        }
    }

    /// Whether statements are named and prepared once on this connection
    /// (found direct) rather than unnamed; `None` while that is being found.
    pub(crate) fn named_statements(&mut self) -> Option<bool> {
        self.settle();
        self.finding.is_none().then_some(self.named.is_some())
    }

    /// Overrides what is found at connect, for the heartbeat bench's
    /// comparison. Named statements through a transaction pooler fail, or
    /// run another client's statement of the same name.
    pub(crate) fn set_named_statements(&mut self, named: bool) {
        self.finding = None;
        match (named, self.named.is_some()) {
            (true, false) => self.named = Some(Vec::new()),
            (false, true) => self.named = None,
            _ => {}
        }
    }

    /// One statement, one round trip.
    pub(super) async fn query(
        &mut self,
        sql: &'static str,
        types: &[Type],
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.settle();
        let typed = || -> Vec<(&(dyn ToSql + Sync), Type)> {
            params
                .iter()
                .zip(types)
                .map(|(p, t)| (*p, t.clone()))
                .collect()
        };
        let Some(named) = &mut self.named else {
            return Ok(self.client.query_typed(sql, &typed()).await?);
        };
        if let Some((_, stmt)) = named.iter().find(|(s, _)| *s == sql) {
            return Ok(self.client.query(stmt, params).await?);
        }
        // Not prepared yet: this call runs unnamed, and the statement is
        // prepared beside it, pipelined on the connection: still one round
        // trip. So are the lease's other statements not prepared yet: the
        // first release or takeover on a connection, a handover's, would
        // otherwise wait for its statement's parse and plan twice.
        let now_typed = typed();
        let mut wanted: Vec<(&'static str, &[Type])> = vec![(sql, types)];
        for (s, t) in unprepared(self.stmts, named) {
            if s != sql {
                wanted.push((s, t));
            }
        }
        let client = &self.client;
        let (rows, ()) = tokio::join!(
            client.query_typed(sql, &now_typed),
            prepare(client, named, &wanted)
        );
        Ok(rows?)
    }

    /// Releases several elections in one statement (each by its instance);
    /// whether each was released.
    pub(crate) async fn release_many(
        &mut self,
        items: &[Release<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.trusted()?;
        let names: Vec<&str> = items.iter().map(|r| r.election).collect();
        let insts: Vec<&str> = items.iter().map(|r| r.instance).collect();
        let succs: Vec<Option<&str>> = items
            .iter()
            .map(|r| r.successor.map(|s| s.daemon))
            .collect();
        let windows: Vec<i64> = items.iter().map(Release::window_us).collect();
        let rows = match (&names[..], &insts[..], &succs[..], &windows[..]) {
            ([name], [inst], [succ], [window]) => {
                let params: [&(dyn ToSql + Sync); 4] = [name, inst, succ, window];
                self.query(self.stmts.release_one, RELEASE_ONE_TYPES, &params)
                    .await?
            }
            _ => {
                let params: [&(dyn ToSql + Sync); 4] = [&names, &insts, &succs, &windows];
                self.query(self.stmts.release_many, RELEASE_MANY_TYPES, &params)
                    .await?
            }
        };
        let released: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        Ok(names
            .iter()
            .map(|n| released.iter().any(|r| r == n))
            .collect())
    }

    pub(crate) async fn release(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        Ok(self.release_many(std::slice::from_ref(item)).await? == [true])
    }

    /// Gives up being `election`'s named successor (see [`DECLINE`]):
    /// whether the row, released under `token`, named `daemon` and is open
    /// to anyone now.
    pub(crate) async fn decline(
        &mut self,
        election: &str,
        daemon: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
        self.trusted()?;
        let rows = self
            .query(
                self.stmts.decline,
                DECLINE_TYPES,
                &[&election, &daemon, &token],
            )
            .await?;
        Ok(!rows.is_empty())
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        self.trusted()?;
        let rows = self
            .query(self.stmts.elections, &[Type::VARCHAR], &[&prefix])
            .await?;
        rows.iter()
            .map(|r| Ok(ElectionRow::from(RowParts::from_row(r)?)))
            .collect()
    }

    /// The record of terms, newest first (`None`: not installed).
    pub(crate) async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        self.trusted()?;
        let rows = match self
            .query(
                self.stmts.history,
                &[Type::VARCHAR, Type::INT8],
                &[&election, &limit],
            )
            .await
        {
            Err(e) if crate::shared::history::missing_table(&e) => return Ok(None),
            rows => rows?,
        };
        rows.iter()
            .map(|r| Ok(Term::from(TermParts::from_row(r)?)))
            .collect::<Result<_, StoreError>>()
            .map(Some)
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        let migrated = migrate::run(&mut self.client, &MIGRATION).await?;
        self.client.batch_execute(SETTLE_UPGRADE).await?;
        Ok(migrated)
    }

    pub(crate) async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        migrate::fence_status(&mut self.client, &MIGRATION).await
    }
}

/// The statements of a lease's life (`Statements::hot`) not in `named`.
fn unprepared<'a>(
    stmts: &'static Statements,
    named: &'a [(&'static str, tokio_postgres::Statement)],
) -> impl Iterator<Item = (&'static str, &'static [Type])> + 'a {
    stmts
        .hot()
        .into_iter()
        .filter(|(s, _)| !named.iter().any(|(n, _)| n == s))
}

/// Prepares `wanted`, pipelined (one round trip), and keeps in `named`
/// what the server accepted (the rest goes unnamed, as before).
async fn prepare(
    client: &Client,
    named: &mut Vec<(&'static str, tokio_postgres::Statement)>,
    wanted: &[(&'static str, &[Type])],
) {
    let stmts =
        futures_util::future::join_all(wanted.iter().map(|(s, t)| client.prepare_typed(s, t)))
            .await;
    for ((s, _), stmt) in wanted.iter().zip(stmts) {
        if let Ok(stmt) = stmt {
            named.push((s, stmt));
        }
    }
}
