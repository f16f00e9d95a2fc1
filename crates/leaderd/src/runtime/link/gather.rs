//! Gathering: when a batch carries a renewal, the daemon's other leaders
//! are asked to renew now and waited for briefly, so that a leader of many
//! elections sends one renewal statement per renew interval.

use crate::clock::boot_now;

use super::{Job, Task};

impl Task {
    /// When a renewal is pending, asks every other election this daemon
    /// leads to renew now, and waits (briefly) for their attempts.
    pub(super) async fn align(&mut self) {
        let now = boot_now();
        // Once per wave (waves come a renew interval apart): the leaders
        // asked are on their way, in this batch or the next few. Asking
        // again for each of those batches scanned every election each time
        // and had the leaders that had just renewed renew again.
        if self
            .aligned_at
            .is_some_and(|at| now.saturating_since(at) < self.realign_after)
        {
            return;
        }
        // A renewal of one of the elections (not of the spread's presence,
        // which keeps its own rhythm). Elections are found by index: with
        // thousands of them, comparing names pairwise cost a core.
        let mut queued = vec![false; self.elections.len()];
        let mut renewing = false;
        for job in &self.pending {
            if let Job::Attempt { req, .. } = job {
                if let Some(&i) = self.slots.get(&req.election) {
                    queued[i] = true;
                    renewing |= req.held_token.is_some();
                }
            }
        }
        if !renewing {
            return;
        }
        self.aligned_at = Some(now);
        let mut asked = vec![false; self.elections.len()];
        let mut missing = 0usize;
        for (i, shared) in self.elections.iter().enumerate() {
            if !queued[i] && shared.is_leader(now) {
                shared.renew_soon();
                asked[i] = true;
                missing += 1;
            }
        }
        // A leader that does not come (stopping, or releasing on purpose)
        // costs the wave the whole wait; a handover's job, pending or
        // arriving, ends it (the asked come in the next batch).
        // The queue is looked through once, then each job as it comes: a
        // look through it per arrival was quadratic in the wave.
        let generation = self.state.borrow().generation;
        let mut handing_over = self.pending.iter().any(|j| j.hands_over(generation));
        let until = tokio::time::Instant::now() + self.gather_for;
        while missing > 0 && !handing_over {
            let job = match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(job)) => job,
                Ok(None) | Err(_) => return,
            };
            handing_over = job.hands_over(generation);
            if let Job::Attempt { req, .. } = &job {
                let slot = self.slots.get(&req.election).copied();
                if slot.is_some_and(|i| std::mem::take(&mut asked[i])) {
                    missing -= 1;
                }
            }
            self.pending.push_back(job);
        }
    }
}
