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
