//! Acquire-or-renew on PostgreSQL: a leader's renewals of every election
//! it holds in one statement; the other elections' attempts (and any
//! renewal that did not match) in one more (each with plain binds for one
//! election, arrays for more), in parts of at most
//! [`TAKE_LIMIT`] takeovers; missing rows created in a third.

use std::time::Duration;

use leaderd_core::Attempt;
use tokio_postgres::types::ToSql;

use super::statements::*;
use super::store::PgStore;
use crate::shared::error::StoreError;
use crate::shared::lease::{observed, refusal, LeaseRequest};

/// Each request's outcome so far, by its place in the batch.
type Outcomes = Vec<Option<Result<Attempt, StoreError>>>;

/// The request an answer row is about: rows come back by their place in
/// the arrays sent (from 1), not by name, as a batch may hold thousands of
/// elections.
fn place(sent: &[usize], n: i64) -> Result<usize, StoreError> {
    usize::try_from(n - 1)
        .ok()
        .and_then(|k| sent.get(k).copied())
        .ok_or_else(|| StoreError::Local(format!("an answer for element {n} of the batch")))
}

impl PgStore {
    /// [`PgStore::acquire_or_renew_many`] for one election.
    pub(crate) async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        let mut out = self
            .acquire_or_renew_many(std::slice::from_ref(req))
            .await?;
        out.pop()
            .unwrap_or_else(|| Err(StoreError::Local("no answer for the election".to_owned())))
    }

    /// Acquire-or-renew for several elections (distinct names, one ttl):
    /// the renewals in one statement ([`RENEW`] for one); the others, and any renewal that did
    /// not match (lost, or its row locked), in a second; missing rows are
    /// created in a third. So a leader's renewal of every election it holds is one
    /// round trip, as one election's is.
    pub(crate) async fn acquire_or_renew_many(
        &mut self,
        reqs: &[LeaseRequest<'_>],
    ) -> Result<Vec<Result<Attempt, StoreError>>, StoreError> {
        self.trusted()?;
        let mut out: Outcomes = reqs.iter().map(|_| None).collect();
        self.renew_held(reqs, &mut out).await?;
        let rest: Vec<usize> = (0..reqs.len()).filter(|&i| out[i].is_none()).collect();
        if rest.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        self.attempt(reqs, rest.clone(), &mut out).await?;
        let missing: Vec<usize> = rest.into_iter().filter(|&i| out[i].is_none()).collect();
        self.create(reqs, missing, &mut out).await?;
        Ok(out.into_iter().flatten().collect())
    }

    /// Renews the leases `reqs` hold, in one statement; a lease renewed is
    /// answered, one not renewed is left for [`PgStore::attempt`].
    async fn renew_held(
        &mut self,
        reqs: &[LeaseRequest<'_>],
        out: &mut Outcomes,
    ) -> Result<(), StoreError> {
        let ttl_us = reqs.first().map_or(0, LeaseRequest::ttl_us);
        let renewing: Vec<usize> = (0..reqs.len())
            .filter(|&i| reqs[i].held_token.is_some())
            .collect();
        if renewing.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = renewing.iter().map(|&i| reqs[i].election).collect();
        let insts: Vec<&str> = renewing.iter().map(|&i| reqs[i].instance).collect();
        let tokens: Vec<i64> = renewing
            .iter()
            .filter_map(|&i| reqs[i].held_token)
            .collect();
        let rows = match (&names[..], &insts[..], &tokens[..]) {
            ([name], [inst], [token]) => {
                let params: [&(dyn ToSql + Sync); 4] = [name, inst, token, &ttl_us];
                self.query(self.stmts.renew, RENEW_TYPES, &params).await?
            }
            _ => {
                let params: [&(dyn ToSql + Sync); 4] = [&names, &insts, &tokens, &ttl_us];
                self.query(self.stmts.renew_many, RENEW_MANY_TYPES, &params)
                    .await?
            }
        };
        for row in rows {
            let i = place(&renewing, row.try_get(0)?)?;
            let token: i64 = row.try_get(1)?;
            // A renewal keeps the token; anything else is not our
            // statement's answer, and must not read as a grant.
            out[i] = Some(if Some(token) == reqs[i].held_token {
                Ok(Attempt::Granted { token })
            } else {
                Err(StoreError::Local(format!(
                    "a renewal answered token {token}, not the token held"
                )))
            });
        }
        Ok(())
    }

    /// Attempts the requests at `rest` (takes what is free or expired,
    /// renews what is still ours, is refused the rest); a missing row is
    /// left unanswered, for [`PgStore::create`].
    async fn attempt(
        &mut self,
        reqs: &[LeaseRequest<'_>],
        rest: Vec<usize>,
        out: &mut Outcomes,
    ) -> Result<(), StoreError> {
        let ttl_us = reqs.first().map_or(0, LeaseRequest::ttl_us);
        let mut sent = rest;
        let mut left: Vec<usize> = Vec::new();
        loop {
            let names: Vec<&str> = sent.iter().map(|&i| reqs[i].election).collect();
            let insts: Vec<&str> = sent.iter().map(|&i| reqs[i].instance).collect();
            let holders: Vec<&str> = sent.iter().map(|&i| reqs[i].holder).collect();
            let daemons: Vec<Option<&str>> = sent.iter().map(|&i| reqs[i].daemon).collect();
            let addresses: Vec<Option<&str>> = sent.iter().map(|&i| reqs[i].address).collect();
            let rows = match (
                &names[..],
                &insts[..],
                &holders[..],
                &daemons[..],
                &addresses[..],
            ) {
                ([name], [inst], [holder], [daemon], [address]) => {
                    let params: [&(dyn ToSql + Sync); 6] =
                        [name, inst, holder, &ttl_us, daemon, address];
                    self.query(self.stmts.acquire_one, ACQUIRE_ONE_TYPES, &params)
                        .await?
                }
                _ => {
                    let params: [&(dyn ToSql + Sync); 6] =
                        [&names, &insts, &holders, &ttl_us, &daemons, &addresses];
                    self.query(self.stmts.acquire_many, ACQUIRE_MANY_TYPES, &params)
                        .await?
                }
            };
            // The trigger's notices came before the answer.
            let lease = reqs.first().map_or(Duration::ZERO, |r| r.ttl);
            self.held_off.review(lease, std::time::Instant::now());
            let mut taken = 0;
            for row in rows {
                let i = place(&sent, row.try_get(1)?)?;
                let req = &reqs[i];
                let seen = observed((
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                    row.try_get(5)?,
                    row.try_get(6)?,
                ));
                out[i] = Some(if row.try_get::<_, bool>(0)? {
                    if seen.instance.as_deref() == Some(req.instance) {
                        if req.held_token != Some(seen.token) {
                            taken += 1;
                        }
                        Ok(Attempt::Granted { token: seen.token })
                    } else {
                        Err(StoreError::Local(
                            "a grant that does not name this instance".to_owned(),
                        ))
                    }
                } else {
                    refusal(req, seen)
                });
            }
            if taken >= TAKE_LIMIT {
                // The statement took as many rows as it may at once: the
                // rows it left (refusals of expired rows) are asked for
                // again now, at most that many a statement, so each reads
                // only the rows it may take (the whole rest each time read
                // 10,000 expired rows 20 times: 0.9 s).
                left.extend(sent.iter().copied().filter(|&i| {
                    matches!(&out[i], Some(Ok(Attempt::Refused(seen))) if seen.remaining_us <= 0)
                }));
            }
            if left.is_empty() {
                return Ok(());
            }
            sent = left.drain(..left.len().min(TAKE_LIMIT)).collect();
            for &i in &sent {
                out[i] = None;
            }
        }
    }

    /// Creates the rows of the requests at `missing`, free and blocked
    /// (see [`LeaseRequest::block_us`]), in one statement.
    async fn create(
        &mut self,
        reqs: &[LeaseRequest<'_>],
        missing: Vec<usize>,
        out: &mut Outcomes,
    ) -> Result<(), StoreError> {
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = missing.iter().map(|&i| reqs[i].election).collect();
        let blocks: Vec<i64> = missing.iter().map(|&i| reqs[i].block_us()).collect();
        self.query(
            self.stmts.create_many,
            CREATE_MANY_TYPES,
            &[&names, &blocks],
        )
        .await?;
        for i in missing {
            out[i] = Some(Ok(Attempt::Created));
        }
        Ok(())
    }
}
