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

use leaderd_core::{Attempt, Observed};

use super::error::StoreError;
use super::lease::LeaseRequest;

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

/// A backend that reads, takes and creates several rows together (MySQL/
/// MariaDB: one statement each; SQLite: one blocking call each, the writes
/// in one transaction), for [`acquire_or_renew_many_read_together`].
pub(crate) trait CasBatch: CasOps {
    /// [`CasOps::observe`] for several elections (distinct names), in order.
    async fn observe_all(
        &mut self,
        reqs: &[&LeaseRequest<'_>],
    ) -> Result<Vec<Option<Observed>>, StoreError>;
    /// [`CasOps::take`] for several expired rows (`(request, token seen)`,
    /// distinct names, one ttl); whether each was taken.
    async fn take_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError>;
    /// [`CasOps::create`] for several missing rows.
    async fn create_all(&mut self, reqs: &[&LeaseRequest<'_>]) -> Result<(), StoreError>;
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

/// Acquire-or-renew for several elections: the held leases first (renewed
/// together where there are several, [`CasOps::renew_all`]); then the
/// followers' rows are read in one statement, then those
/// missing created in one and those expired taken in one, each decided as
/// [`acquire_or_renew`] decides it. A lease not renewed together still goes
/// the whole path alone (rare: a lease lost, a row locked elsewhere).
/// A server far away costs a few round trips per batch, not a few per
/// election (150 ms away, six followers one by one ran past their budget).
pub(crate) async fn acquire_or_renew_many_read_together(
    ops: &mut impl CasBatch,
    reqs: &[LeaseRequest<'_>],
) -> Vec<Result<Attempt, StoreError>> {
    read_together(ops, reqs)
        .await
        .unwrap_or_else(|e| vec![Err(e)])
}

/// The held leases of `reqs` answered, before any follower's statement (a
/// follower's write may wait for the disk or a lock): renewed together,
/// else each alone. The answers so far, in `reqs`' order (`None` for a
/// follower), and the followers' places.
async fn answer_held(
    ops: &mut impl CasOps,
    reqs: &[LeaseRequest<'_>],
) -> Result<(Vec<Option<Result<Attempt, StoreError>>>, Vec<usize>), StoreError> {
    let renewed = renew_together(ops, reqs).await?;
    let mut out = Vec::with_capacity(reqs.len());
    let mut followers = Vec::new();
    for (i, (req, renewed)) in reqs.iter().zip(renewed).enumerate() {
        if req.held_token.is_none() {
            followers.push(i);
            out.push(None);
        } else {
            out.push(Some(answer_alone(ops, req, renewed).await?));
        }
    }
    Ok((out, followers))
}

async fn read_together(
    ops: &mut impl CasBatch,
    reqs: &[LeaseRequest<'_>],
) -> Result<Vec<Result<Attempt, StoreError>>, StoreError> {
    let (mut out, followers) = answer_held(ops, reqs).await?;
    if followers.is_empty() {
        return Ok(out.into_iter().flatten().collect());
    }
    let asked: Vec<&LeaseRequest<'_>> = followers.iter().map(|&i| &reqs[i]).collect();
    let seen = ops.observe_all(&asked).await?;
    let mut missing = Vec::new();
    let mut expired = Vec::new();
    for (&i, seen) in followers.iter().zip(seen) {
        out[i] = match seen {
            None => {
                missing.push(i);
                Some(Ok(Attempt::Created))
            }
            Some(seen) if seen.remaining_us <= 0 => {
                expired.push((i, seen));
                None
            }
            Some(seen) => Some(row_error(still_ours(ops, &reqs[i], seen).await)?),
        };
    }
    if !missing.is_empty() {
        let creating: Vec<&LeaseRequest<'_>> = missing.iter().map(|&i| &reqs[i]).collect();
        match ops.create_all(&creating).await {
            Ok(()) => {}
            // A fence row locked by an app's fenced transaction (MySQL):
            // these rows are not made now; each is answered busy, and tried
            // again.
            Err(StoreError::Busy) => {
                for i in missing {
                    out[i] = Some(Err(StoreError::Busy));
                }
            }
            Err(e) => return Err(e),
        }
    }
    if !expired.is_empty() {
        let items: Vec<(&LeaseRequest<'_>, i64)> = expired
            .iter()
            .map(|(i, seen)| (&reqs[*i], seen.token))
            .collect();
        let taken = ops.take_all(&items).await?;
        for ((i, seen), taken) in expired.into_iter().zip(taken) {
            out[i] = Some(Ok(taken_or_refused(taken, seen)));
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// The held leases of `reqs` renewed together (in one statement where the
/// backend can): whether each request was.
async fn renew_together(
    ops: &mut impl CasOps,
    reqs: &[LeaseRequest<'_>],
) -> Result<Vec<bool>, StoreError> {
    let mut renewed = vec![false; reqs.len()];
    let renewing: Vec<(usize, i64)> = reqs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.held_token.map(|token| (i, token)))
        .collect();
    // One alone goes the whole path alone (its plain `renew` first), as
    // every lease not renewed together does.
    if renewing.len() < 2 {
        return Ok(renewed);
    }
    let items: Vec<_> = renewing.iter().map(|&(i, t)| (&reqs[i], t)).collect();
    match ops.renew_all(&items).await {
        Ok(matched) => {
            for (&(i, _), ok) in renewing.iter().zip(matched) {
                renewed[i] = ok;
            }
        }
        // A row locked elsewhere: each goes alone, and only that one is
        // answered busy.
        Err(StoreError::Busy) => {}
        Err(e) => return Err(e),
    }
    Ok(renewed)
}

/// One request's answer after the renewals together: granted if renewed
/// there, else the whole path alone (a renewal that did not match is tried
/// once more, harmlessly, then the row is read). `Err` only for a failure
/// that is not the row's own.
async fn answer_alone(
    ops: &mut impl CasOps,
    req: &LeaseRequest<'_>,
    renewed: bool,
) -> Result<Result<Attempt, StoreError>, StoreError> {
    match req.held_token {
        Some(token) if renewed => Ok(Ok(Attempt::Granted { token })),
        _ => row_error(acquire_or_renew(ops, req).await),
    }
}

/// A row's own refusal to be written ([`StoreError::Busy`]) stays that
/// request's answer; any other failure is the batch's.
fn row_error(
    answer: Result<Attempt, StoreError>,
) -> Result<Result<Attempt, StoreError>, StoreError> {
    match answer {
        Err(e) if !matches!(e, StoreError::Busy) => Err(e),
        answer => Ok(answer),
    }
}

/// A live row: refused, unless it is still this instance's though it no
/// longer counted on it locally (its deadline passed first): renewed then,
/// same token.
async fn still_ours(
    ops: &mut impl CasOps,
    req: &LeaseRequest<'_>,
    seen: Observed,
) -> Result<Attempt, StoreError> {
    if seen.instance.as_deref() == Some(req.instance) && ops.renew(req, seen.token).await? {
        return Ok(Attempt::Granted { token: seen.token });
    }
    Ok(Attempt::Refused(seen))
}

/// The answer to a take of an expired row seen with `seen`'s token.
fn taken_or_refused(taken: bool, seen: Observed) -> Attempt {
    if taken {
        Attempt::Granted {
            token: seen.token + 1,
        }
    } else {
        // Someone else won the race: report what we saw; the engine retries
        // shortly and reads the winner then.
        Attempt::Refused(seen)
    }
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
        let taken = ops.take(req, seen.token).await?;
        return Ok(taken_or_refused(taken, seen));
    }
    still_ours(ops, req, seen).await
}
