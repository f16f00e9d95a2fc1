//! Releasing the row this replica may hold, within the shutdown's budgets.

use crate::clock::boot_now;
use crate::runtime::{presence, wakeups};

use super::{Loop, CHILD_REAP_BUDGET, FLAG_BUDGET, NOTICE_BUDGET, RELEASE_BUDGET};

use tracing::{error, info, warn};

impl Loop {
    /// After the local step-down: free the row, within [`RELEASE_BUDGET`],
    /// on the connection the last attempt used when it is still usable,
    /// naming the successor (`leaving`: this replica goes, see
    /// `Roster::successor`); then let the presence go, which wakes the
    /// others on MySQL. Whether it freed the row.
    pub(super) async fn release_row(&mut self, instance: &str, leaving: bool) -> bool {
        if !self.may_hold() {
            self.sync_presence();
            return false;
        }
        // Not the presence: it goes only once the row is free (below).
        self.shared.publish();
        // Under `exec`, the child was told to stop when leadership ended and
        // is killed at the deadline: its successor must not start before it
        // is gone. The bound only guards against a supervisor that is stuck.
        let child_limit = boot_now() + self.shared.timing().ttl() + CHILD_REAP_BUDGET;
        let gone = self.shared.child_gone();
        tokio::pin!(gone);
        loop {
            // The loop is not stuck while it waits: keep `/healthz` green.
            self.shared.progress(boot_now());
            let left = child_limit.saturating_since(boot_now());
            if left.is_zero() {
                error!(election = %self.shared.election, "the command did not stop in time; releasing anyway");
                break;
            }
            let tick = left.min(self.shared.timing().heartbeat());
            if tokio::time::timeout(tick, &mut gone).await.is_ok() {
                break;
            }
        }
        // The file must not say this replica leads once a successor can:
        // a disk that does not answer in time costs the handover (the lease
        // expires by itself), never a file naming a leader that is not.
        // Only a presence wanted (this replica led up to now) is waited for.
        let wanted = self.presence.as_mut().filter(|p| *p.leading.borrow());
        let presence = async {
            if let Some(p) = wanted {
                wakeups::presence_noticed(&mut p.held, NOTICE_BUDGET).await;
            }
        };
        let (flag_gone, ()) = tokio::join!(self.report.flag_removed(FLAG_BUDGET), presence);
        let name = self.shared.election.clone();
        let election = &*name;
        if !flag_gone {
            self.sync_presence();
            error!(
                election,
                "the flag file was not removed in time; not releasing, the lease expires by itself"
            );
            return false;
        }
        let roster = self.shared.roster.clone();
        let released = tokio::time::timeout(RELEASE_BUDGET, async {
            let heir = presence::successor(&roster, &self.db.link, leaving).await;
            if let Some(heir) = &heir {
                info!(election, successor = %heir.id, instance = %heir.daemon, "naming the successor");
            } else if roster.alone_unsaid(boot_now()) {
                // Once for the elections released together (see
                // `Roster::alone_unsaid`).
                warn!(
                    election,
                    "releasing with no successor to name: no other replica competes, so nobody \
                     leads until one does (a replica held or draining competes again at \
                     `leaderd resume`)"
                );
            }
            self.db.release(election, instance, heir).await
        })
        .await;
        if matches!(released, Ok(Ok(_))) {
            // Whatever was unanswered has been overtaken by this release.
            self.granted = false;
            self.unanswered = false;
        }
        self.sync_presence();
        let freed = matches!(released, Ok(Ok(true)));
        match released {
            Ok(Ok(true)) => info!(election, "released the lease"),
            Ok(Ok(false)) => info!(election, "nothing to release: the lease was no longer ours"),
            Ok(Err(e)) => {
                warn!(election, error = %e, "could not release the lease; it expires by itself")
            }
            Err(_) => warn!(election, "release timed out; the lease expires by itself"),
        }
        freed
    }
}
