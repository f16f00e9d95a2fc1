//! Acquire-or-renew on SQLite: the read-first operations (`shared::cas`),
//! each statement run in a blocking task on the one connection, alone or
//! for many elections in one transaction.

use diesel::SqliteConnection;
use leaderd_core::Observed;

use super::statements::*;
use super::store::{SeenRow, SqliteStore};
use crate::shared::cas::{CasBatch, CasOps};
use crate::shared::error::StoreError;
use crate::shared::lease::{as_heir, observed, LeaseRequest};

/// A lease request, owned, for statements run in a blocking task.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    pub(super) election: String,
    pub(super) holder: String,
    pub(super) instance: String,
    pub(super) ttl_us: i64,
    /// How long a row made for it stays blocked (`LeaseRequest::block_us`).
    pub(super) block_us: i64,
    pub(super) address: Option<String>,
}

impl Lease {
    fn of(req: &LeaseRequest<'_>) -> Self {
        Self {
            election: req.election.to_owned(),
            holder: req.holder.to_owned(),
            instance: req.instance.to_owned(),
            ttl_us: req.ttl_us(),
            block_us: req.block_us(),
            address: req.address.map(str::to_owned),
        }
    }
}

/// The lease statements, run synchronously on the connection inside one
/// blocking task: a batch of thousands costs one hand-off to the blocking
/// pool, not one per statement, and its writes one transaction (one commit,
/// one wait for the disk).
mod run {
    use diesel::sql_types::{BigInt, Nullable, Text};
    use diesel::{QueryResult, RunQueryDsl, SqliteConnection};

    use super::{now_us, Lease, SeenRow, CREATE, OBSERVE, RENEW, TAKE};
    use crate::shared::sql::{Bind, Stmt};

    /// A row as `OBSERVE` reads it: holder, instance, address, the rest,
    /// and the successor it was released to.
    pub(super) type Seen = (
        Option<String>,
        Option<String>,
        Option<String>,
        SeenRow,
        Option<String>,
    );

    pub(super) fn renew(
        c: &mut SqliteConnection,
        boot_id: &str,
        lease: &Lease,
        token: i64,
    ) -> QueryResult<bool> {
        let now = now_us();
        let n = Stmt::<()>::new(
            RENEW,
            [
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(lease.ttl_us)),
                Bind::Text(&lease.election),
                Bind::Text(&lease.instance),
                Bind::BigInt(token),
                Bind::Text(boot_id),
                Bind::BigInt(now),
            ],
        )
        .execute(c)?;
        Ok(n > 0)
    }

    pub(super) fn observe(c: &mut SqliteConnection, election: &str) -> QueryResult<Option<Seen>> {
        type Row = (
            Option<String>,
            Option<String>,
            i64,
            String,
            i64,
            i64,
            Option<String>,
            Option<String>,
        );
        type RowSql = (
            Nullable<Text>,
            Nullable<Text>,
            BigInt,
            Text,
            BigInt,
            BigInt,
            Nullable<Text>,
            Nullable<Text>,
        );
        let rows: Vec<Row> = Stmt::<RowSql>::new(OBSERVE, [Bind::Text(election)]).load(c)?;
        Ok(rows.into_iter().next().map(
            |(holder, instance, token, boot_id, expires_at, renewed_at, successor, address)| {
                let row = SeenRow {
                    token,
                    boot_id,
                    expires_at,
                    renewed_at,
                };
                (holder, instance, address, row, successor)
            },
        ))
    }

    /// The compare-and-set on the row exactly as `seen`.
    pub(super) fn take(
        c: &mut SqliteConnection,
        boot_id: &str,
        lease: &Lease,
        seen: &SeenRow,
    ) -> QueryResult<bool> {
        let now = now_us();
        let n = Stmt::<()>::new(
            TAKE,
            [
                Bind::Text(&lease.holder),
                Bind::Text(&lease.instance),
                Bind::Text(boot_id),
                lease.address.as_deref().map_or(Bind::NullText, Bind::Text),
                Bind::Text(&lease.instance),
                Bind::BigInt(now),
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(lease.ttl_us)),
                Bind::Text(&lease.election),
                Bind::BigInt(seen.token),
                Bind::Text(&seen.boot_id),
                Bind::BigInt(seen.expires_at),
                Bind::BigInt(seen.renewed_at),
            ],
        )
        .execute(c)?;
        Ok(n > 0)
    }

    pub(super) fn create(
        c: &mut SqliteConnection,
        boot_id: &str,
        lease: &Lease,
    ) -> QueryResult<()> {
        // The boot clock restarts at every boot, so a re-created row seeds
        // its token from the wall clock instead, and above what a deleted
        // row carried (the wall clock may have stepped back): tokens must
        // never go backwards.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        Stmt::<()>::new(
            CREATE,
            [
                Bind::Text(&lease.election),
                Bind::BigInt(seed),
                Bind::Text(&lease.election),
                Bind::Text(boot_id),
                Bind::BigInt(now_us().saturating_add(lease.block_us)),
            ],
        )
        .execute(c)?;
        Ok(())
    }

    /// `f` for each item, in one write transaction (`BEGIN IMMEDIATE`: the
    /// write lock first, so no take slips between one item's check and its
    /// write, and nothing waits half-way); one commit for all.
    pub(super) fn each<T, R>(
        c: &mut SqliteConnection,
        items: &[T],
        mut f: impl FnMut(&mut SqliteConnection, &T) -> QueryResult<R>,
    ) -> QueryResult<Vec<R>> {
        c.immediate_transaction(|c| items.iter().map(|item| f(c, item)).collect())
    }
}

impl SqliteStore {
    /// `f` run on the connection in one blocking task.
    async fn blocking<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut SqliteConnection, &str) -> diesel::QueryResult<R> + Send + 'static,
    ) -> Result<R, StoreError> {
        let boot_id = self.boot_id.clone();
        Ok(self.conn.spawn_blocking(move |c| f(c, &boot_id)).await?)
    }

    /// What `observe` answers for a row `run::observe` read just now; keeps
    /// the row for the take that may follow.
    fn seen(&mut self, lease: &LeaseRequest<'_>, seen: Option<run::Seen>) -> Option<Observed> {
        let now = now_us();
        let Some((holder, instance, address, row, successor)) = seen else {
            self.seen.remove(lease.election);
            return None;
        };
        let remaining_us = self.remaining_us(lease.election, &row, lease.ttl_us(), now);
        let token = row.token;
        self.seen.insert(lease.election.to_owned(), row);
        let seen = observed((holder, instance, token, remaining_us, address));
        Some(as_heir(lease, seen, successor.as_deref()))
    }

    /// The row last observed for `election`, if its token is still
    /// `seen_token` (the take's compare-and-set is on all of it).
    fn seen_for_take(&mut self, election: &str, seen_token: i64) -> Option<SeenRow> {
        self.seen.remove(election).filter(|s| s.token == seen_token)
    }
}

impl CasOps for SqliteStore {
    /// In one transaction: under `synchronous = FULL` every commit waits
    /// for the disk, and a commit per lease made hundreds of renewals late.
    async fn renew_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let items: Vec<(Lease, i64)> = items.iter().map(|(r, t)| (Lease::of(r), *t)).collect();
        self.blocking(move |c, boot| run::each(c, &items, |c, (l, t)| run::renew(c, boot, l, *t)))
            .await
    }

    async fn renew(&mut self, req: &LeaseRequest<'_>, token: i64) -> Result<bool, StoreError> {
        let lease = Lease::of(req);
        self.blocking(move |c, boot| run::renew(c, boot, &lease, token))
            .await
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let election = req.election.to_owned();
        let seen = self
            .blocking(move |c, _| run::observe(c, &election))
            .await?;
        Ok(self.seen(req, seen))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let Some(seen) = self.seen_for_take(req.election, seen_token) else {
            return Ok(false);
        };
        let lease = Lease::of(req);
        let taken = self
            .blocking(move |c, boot| run::take(c, boot, &lease, &seen))
            .await?;
        self.foreign.remove(req.election);
        Ok(taken)
    }

    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError> {
        let lease = Lease::of(req);
        self.blocking(move |c, boot| run::create(c, boot, &lease))
            .await
    }
}

/// Followers' reads in one blocking task (WAL: reads take no lock), their
/// takes in one transaction and their creates in another: a survivor that
/// must take over thousands of elections at once commits once for all of
/// them. A commit each (a disk flush each, under `synchronous = FULL`) ran
/// the batch past its budget, and every take with it, again and again.
impl CasBatch for SqliteStore {
    async fn observe_all(
        &mut self,
        reqs: &[&LeaseRequest<'_>],
    ) -> Result<Vec<Option<Observed>>, StoreError> {
        let names: Vec<String> = reqs.iter().map(|r| r.election.to_owned()).collect();
        let seen = self
            .blocking(move |c, _| names.iter().map(|n| run::observe(c, n)).collect())
            .await?;
        let seen: Vec<Option<run::Seen>> = seen;
        Ok(reqs
            .iter()
            .zip(seen)
            .map(|(req, seen)| self.seen(req, seen))
            .collect())
    }

    async fn take_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        // Only rows observed with that token are tried (the others are not
        // taken, as `take` answers alone).
        let mut tried = Vec::new();
        let mut places = Vec::new();
        for (i, (req, token)) in items.iter().enumerate() {
            if let Some(seen) = self.seen_for_take(req.election, *token) {
                tried.push((Lease::of(req), seen));
                places.push(i);
            }
        }
        let mut out = vec![false; items.len()];
        if tried.is_empty() {
            return Ok(out);
        }
        let taken = self
            .blocking(move |c, boot| run::each(c, &tried, |c, (l, s)| run::take(c, boot, l, s)))
            .await?;
        for (i, taken) in places.into_iter().zip(taken) {
            self.foreign.remove(items[i].0.election);
            out[i] = taken;
        }
        Ok(out)
    }

    async fn create_all(&mut self, reqs: &[&LeaseRequest<'_>]) -> Result<(), StoreError> {
        let leases: Vec<Lease> = reqs.iter().map(|r| Lease::of(r)).collect();
        self.blocking(move |c, boot| run::each(c, &leases, |c, l| run::create(c, boot, l)))
            .await?;
        Ok(())
    }
}
