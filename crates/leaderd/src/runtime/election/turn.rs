//! Giving up a named successor's turn: a release named this replica to
//! lead next, but it will not take the row before the window only it may
//! take ends (held off this election, or draining), so it opens the row to
//! the others at once instead of leaving the election leaderless for the
//! window (`Engine::gives_turn_up`).
//!
//! Seen on a look (`look`), which a held or draining replica takes after a
//! release notice: a replica held off one of several elections keeps its
//! presence row for the others, so a release of this one may still name
//! it.

use std::time::Duration;

use leaderd_store::ElectionRow;
use tracing::{info, warn};

use crate::clock::boot_now;

use super::Loop;

/// A turn to give up: what was left of the window when the row was read,
/// and the token it was released under.
pub(super) struct Turn {
    left: Duration,
    token: i64,
}

impl Loop {
    /// The turn to give up, if `row` (this election's, as a look read it)
    /// is free and released to this daemon and this replica would not
    /// take it within its window.
    pub(super) fn turn_to_give_up(&self, row: &ElectionRow) -> Option<Turn> {
        let named = row.holder.is_none()
            && row.remaining_us > 0
            && row.successor.as_deref() == Some(&**self.shared.roster.daemon());
        let left = Duration::from_micros(row.remaining_us.unsigned_abs());
        (named && self.shared.engine().gives_turn_up(boot_now(), left)).then_some(Turn {
            left,
            token: row.token,
        })
    }

    /// Opens the row to anyone now: one statement, which writes nothing
    /// unless the row is still free and released to this daemon under the
    /// token read. A failure leaves the window to end on its own.
    pub(super) async fn give_turn_up(&mut self, turn: Turn) {
        let election = &*self.shared.election;
        let daemon = self.shared.roster.daemon();
        // Why it does not take the row, as `/leader` reports it.
        let why = self.shared.engine().standing(boot_now()).not_competing;
        let why = why.map_or("", |w| w.as_str());
        match self.db.link.decline(election, daemon, turn.token).await {
            Ok(true) => info!(
                election,
                not_competing = why,
                window_left = ?turn.left,
                "named successor of an election this replica does not take now; opened it to the others"
            ),
            Ok(false) => {}
            Err(e) => warn!(
                election,
                not_competing = why,
                error = %e,
                "named successor of an election this replica does not take now, and could not open it to the others; it may wait out the successor's window"
            ),
        }
    }
}
