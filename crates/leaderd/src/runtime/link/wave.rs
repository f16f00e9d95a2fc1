//! Renewal waves: once a renew interval the link renews every lease the
//! daemon holds, in the batch it sends next (on PostgreSQL one statement),
//! the boot clock read just before it goes, and feeds each answer to its
//! election's engine itself ([`Shared::on_wave_answer`]). A leader of
//! thousands of elections then costs one statement a renew interval and no
//! wake-up of their loops: a loop wakes for its deadline, or when an answer
//! changes something (a loss, a failure, a flag file to rewrite). A lease
//! just taken is renewed by its own loop until the next wave takes it up.

use leaderd_core::BootTime;

use crate::runtime::shared::Shared;

use super::{Request, Task};

/// A lease renewed in a wave: whose, as which instance, and since when.
pub(super) struct Renewal {
    slot: usize,
    instance: String,
    sent_at: BootTime,
}

impl Renewal {
    /// Feeds the answer to the election's engine.
    pub(super) fn answer(
        self,
        elections: &[std::sync::Arc<Shared>],
        answer: Result<leaderd_core::Attempt, String>,
    ) {
        elections[self.slot].on_wave_answer(&self.instance, self.sent_at, answer);
    }
}

impl Task {
    /// Whether a wave is due at `now`.
    pub(super) fn wave_due(&self, now: BootTime) -> bool {
        !self.elections.is_empty() && now >= self.wave_at
    }

    /// The wave due: a renewal of every lease held at `sent_at` (read just
    /// before the batch is sent), but those whose loop already sent one in
    /// this batch (`queued`, by slot).
    pub(super) fn wave(&mut self, sent_at: BootTime, queued: &[bool]) -> Vec<(Request, Renewal)> {
        self.wave_at = sent_at + self.renew_every;
        let mut wave = Vec::new();
        for (slot, shared) in self.elections.iter().enumerate() {
            if queued[slot] {
                continue;
            }
            let engine = shared.engine();
            if engine.lease(sent_at).is_none() {
                continue;
            }
            let req = Request::new(shared, &engine, sent_at);
            let instance = req.instance.clone();
            wave.push((
                req,
                Renewal {
                    slot,
                    instance,
                    sent_at,
                },
            ));
        }
        wave
    }

    /// A wave due with no connection: each lease it renews goes back to
    /// its loop, whose attempt asks for a connection and retries on it.
    pub(super) fn wave_unconnected(&mut self, now: BootTime) {
        self.wave_at = now + self.renew_every;
        for shared in &self.elections {
            let instance = {
                let engine = shared.engine();
                if !engine.renewed_in_waves() || engine.lease(now).is_none() {
                    continue;
                }
                engine.instance().to_owned()
            };
            shared.on_wave_answer(&instance, now, Err("no connection".into()));
        }
    }
}
