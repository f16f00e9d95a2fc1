//! Looking: a read of the election's row that takes nothing, for a
//! replica that may not ask for the row now (it has just released it, or
//! comes late) yet should name the successor that takes it as soon as the
//! others do (`Engine::look_due`); a look that finds this replica named
//! successor of a row it will not take gives that turn up (`turn`).

use leaderd_store::ElectionRow;

use crate::clock::boot_now;

use super::Loop;

impl Loop {
    /// One look, answered within a heartbeat (one statement on the
    /// daemon's connection, queued with the others', and one look of the
    /// daemon's at a time); a look that fails or is cut ends the looks.
    /// Shutdown does not wait for it.
    pub(super) async fn look(&mut self) {
        let election = &*self.shared.election;
        // Another election's look is being read: this one comes a take
        // watch later.
        let Some(_one_look) = self.db.link.look_turn() else {
            self.shared.engine().look_later(boot_now());
            return;
        };
        let budget = self.shared.timing().heartbeat();
        let read = tokio::select! {
            () = self.shared.stopped() => return,
            read = tokio::time::timeout(budget, self.db.link.read(election)) => read,
        };
        let received_at = boot_now();
        match read {
            // The read is by prefix: other elections' names may start
            // with this one's.
            Ok(Ok(rows)) => {
                let row = rows.into_iter().find(|r| r.name == election);
                let give_up = row.as_ref().and_then(|r| self.turn_to_give_up(r));
                let seen = row.map(ElectionRow::into_observed);
                self.shared.engine().on_look(received_at, seen);
                if let Some(turn) = give_up {
                    let shared = self.shared.clone();
                    let give_up = tokio::time::timeout(budget, self.give_turn_up(turn));
                    tokio::select! {
                        () = shared.stopped() => {}
                        _ = give_up => {}
                    }
                }
            }
            Ok(Err(_)) | Err(_) => self.shared.engine().on_look_failed(),
        }
        self.shared.publish();
    }
}
