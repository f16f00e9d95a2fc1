//! Acquire-or-renew for backends without `UPDATE … RETURNING` that can read
//! without locking (MySQL/MariaDB) or whose every `UPDATE` takes the write lock
//! (SQLite): read first, write only when there is something to win.
//!
//! - A leader renews with one `UPDATE … WHERE instance = me AND token = held
//!   AND live`: one round trip, and the token it already holds stays valid.
//! - Everyone else reads the row with a plain, non-locking `SELECT`. Held by
//!   someone else: refused, having written and locked nothing. Expired or
//!   free: a compare-and-set `UPDATE … WHERE token = <seen> AND expired` takes
//!   it, decided by the matched-row count, and the new token is `seen + 1`.
//!   Missing: insert it free and blocked for one ttl.

use crate::{Attempt, LeaseRequest, Observed, StoreError};

/// The four statements a backend supplies.
pub(crate) trait CasOps {
    /// Extends this instance's live lease if its token is still `token`;
    /// whether a row matched.
    async fn renew(&mut self, req: &LeaseRequest<'_>, token: i64) -> Result<bool, StoreError>;
    /// The row as it is, with `remaining_us` by the database's clock (≤ 0
    /// when expired); `None` when missing.
    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError>;
    /// Takes the expired row if its token is still `seen_token`; whether a row
    /// matched.
    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError>;
    /// Inserts the missing row, free and blocked for one ttl; a concurrent
    /// insert of the same row is not an error.
    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError>;
    /// [`CasOps::renew`] for several leases (`(request, token held)`);
    /// whether each matched. One after the other unless the backend knows
    /// better.
    async fn renew_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError>
    where
        Self: Sized,
    {
        renew_each(self, items).await
    }
}

/// [`CasOps::renew`] for each item, stopping at the first error.
pub(crate) async fn renew_each(
    ops: &mut impl CasOps,
    items: &[(&LeaseRequest<'_>, i64)],
) -> Result<Vec<bool>, StoreError> {
    let mut out = Vec::with_capacity(items.len());
    for (req, token) in items {
        out.push(ops.renew(req, *token).await?);
    }
    Ok(out)
}

/// Acquire-or-renew for several elections: the renewals together
/// ([`CasOps::renew_all`]), then the rest one by one, as
/// [`acquire_or_renew`] alone would. Stops at the first failure that is
/// not the row's own (see [`crate::Connection::acquire_or_renew_many`]).
pub(crate) async fn acquire_or_renew_many(
    ops: &mut impl CasOps,
    reqs: &[LeaseRequest<'_>],
) -> Vec<Result<Attempt, StoreError>> {
    let mut renewed = vec![false; reqs.len()];
    let renewing: Vec<(usize, i64)> = reqs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.held_token.map(|token| (i, token)))
        .collect();
    if renewing.len() > 1 {
        let items: Vec<_> = renewing.iter().map(|&(i, t)| (&reqs[i], t)).collect();
        match ops.renew_all(&items).await {
            Ok(matched) => {
                for (&(i, _), ok) in renewing.iter().zip(matched) {
                    renewed[i] = ok;
                }
            }
            // A row locked elsewhere: each goes alone, and only that one
            // is answered busy.
            Err(StoreError::Busy) => {}
            Err(e) => return vec![Err(e)],
        }
    }
    let mut out = Vec::with_capacity(reqs.len());
    for (req, renewed) in reqs.iter().zip(renewed) {
        let one = match req.held_token {
            Some(token) if renewed => Ok(Attempt::Granted { token }),
            // Not renewed together: the whole path (a renewal that did not
            // match is tried once more, harmlessly, then the row is read).
            _ => acquire_or_renew(ops, req).await,
        };
        let fatal = matches!(&one, Err(e) if !matches!(e, StoreError::Busy));
        out.push(one);
        if fatal {
            break;
        }
    }
    out
}

pub(crate) async fn acquire_or_renew(
    ops: &mut impl CasOps,
    req: &LeaseRequest<'_>,
) -> Result<Attempt, StoreError> {
    if let Some(token) = req.held_token {
        if ops.renew(req, token).await? {
            return Ok(Attempt::Granted { token });
        }
    }
    let Some(seen) = ops.observe(req).await? else {
        ops.create(req).await?;
        return Ok(Attempt::Created);
    };
    if seen.remaining_us <= 0 {
        if ops.take(req, seen.token).await? {
            return Ok(Attempt::Granted {
                token: seen.token + 1,
            });
        }
        // Someone else won the race: report what we saw; the engine retries
        // shortly and reads the winner then.
        return Ok(Attempt::Refused(seen));
    }
    if seen.instance.as_deref() == Some(req.instance) && ops.renew(req, seen.token).await? {
        // Still ours in the database though we no longer counted on it
        // locally (our deadline passed first): renew, same token.
        return Ok(Attempt::Granted { token: seen.token });
    }
    Ok(Attempt::Refused(seen))
}
