//! Renewal waves: once a renew interval the link renews every lease the
//! daemon holds, in the batch it sends next (on PostgreSQL one statement),
//! the boot clock read just before it goes, and feeds each answer to its
//! election's engine itself ([`Shared::on_wave_answer`]). A leader of
//! thousands of elections then costs one statement a renew interval per
//! group (below) and no wake-up of their loops: a loop wakes for its deadline, or when an answer
//! changes something (a loss, a failure, a flag file to rewrite). A lease
//! just taken is renewed by its own loop until the next wave takes it up.
//! The elections are split into groups ([`Timing::wave_groups`]), renewed
//! one group a turn, on the schedule of a [`WaveSchedule`], so that no
//! statement carries more than a share of the leases.

use std::sync::Arc;

use leaderd_core::{Attempt, BootTime};
#[cfg(doc)]
use leaderd_core::{Timing, WaveSchedule};

use crate::clock::boot_now;
use crate::runtime::shared::Shared;

use super::{Request, Task};

/// A lease renewed in a wave: whose, as which instance and token, and
/// since when.
pub(super) struct Renewal {
    slot: usize,
    instance: Arc<str>,
    held: i64,
    sent_at: BootTime,
}

impl Renewal {
    /// Feeds the answer to the election's engine, and times it as a loop
    /// times its own renewals.
    pub(super) fn answer(self, elections: &[Arc<Shared>], answer: Result<Attempt, String>) {
        let shared = &elections[self.slot];
        let took = boot_now().saturating_since(self.sent_at).as_secs_f64();
        let metrics = &shared.daemon_metrics;
        metrics.heartbeat_duration.observe(took);
        metrics.renewal_duration.observe(took);
        if answer.is_err() {
            metrics.heartbeat_errors.inc();
        }
        shared.on_wave_answer(&self.instance, self.held, self.sent_at, answer);
    }
}

impl Task {
    /// Whether a wave is due at `now`.
    pub(super) fn wave_due(&self, now: BootTime) -> bool {
        !self.elections.is_empty() && now >= self.waves.next()
    }

    /// The wave due: a renewal of every lease held at `sent_at` (read just
    /// before the batch is sent) in the groups whose turn has come, but
    /// those whose loop already sent one in this batch (`queued`, by slot).
    pub(super) fn wave(&mut self, sent_at: BootTime, queued: &[bool]) -> Vec<(Request, Renewal)> {
        let groups = self.waves.groups();
        let due = self.waves.take_due(sent_at);
        let mut wave = Vec::new();
        for (slot, shared) in self.elections.iter().enumerate() {
            // A loop that has not gone round for that long is stuck: its
            // lease runs out at its deadline, as it would have before.
            if !due[slot % groups] || queued[slot] || !shared.healthy() {
                continue;
            }
            let engine = shared.engine();
            let Some((held, _)) = engine.lease(sent_at) else {
                continue;
            };
            let req = Request::new(shared, &engine, sent_at);
            let instance = req.instance.clone();
            wave.push((
                req,
                Renewal {
                    slot,
                    instance,
                    held,
                    sent_at,
                },
            ));
        }
        wave
    }

    /// A wave due with no connection: each lease it renews goes back to
    /// its loop, whose attempt asks for a connection and retries on it
    /// (and is counted and timed there: this one reached nothing).
    pub(super) fn wave_unconnected(&mut self, now: BootTime) {
        self.waves.put_off(now);
        for shared in &self.elections {
            let (instance, held) = {
                let engine = shared.engine();
                let Some((held, _)) = engine.lease(now).filter(|_| engine.renewed_in_waves())
                else {
                    continue;
                };
                (engine.instance().to_owned(), held)
            };
            shared.on_wave_answer(&instance, held, now, Err("no connection".into()));
        }
    }
}
