//! Reporting: the logs, metrics and flag file of each event.

use crate::clock::{boot_now, micros, unix_ms};
use crate::runtime::shared::Shared;

use super::Report;

use std::time::Duration;

use leaderd_core::Event;
use tracing::{error, info};

impl Report {
    /// Stops claiming leadership, for good: 503 from now on, flag file gone.
    pub(super) fn step_down(&mut self, shared: &Shared) {
        let event = shared.engine().shutdown(boot_now());
        self.handle(shared, event.into_iter().collect());
        self.remove_flag();
        shared.publish();
    }

    /// Logs, counts and updates the flag file for each event.
    ///
    /// Transitions carry boot-clock times in microseconds (`at_us`,
    /// `deadline_us`), comparable across every process on the host, so a
    /// checker can rebuild each replica's leadership intervals from the logs.
    pub(super) fn handle(&mut self, shared: &Shared, events: Vec<Event>) {
        if events.is_empty() {
            return;
        }
        // Watchers first: a log line may wait in the queue, an event may not.
        shared.publish();
        let (election, id) = (&*shared.election, &*shared.id);
        for event in events {
            let now = boot_now();
            match event {
                Event::Acquired { token } => {
                    let deadline = shared.engine().lease(now).map(|(_, d)| d);
                    self.write_flag(shared);
                    info!(
                        election,
                        id,
                        token,
                        at_us = micros(now),
                        deadline_us = deadline.map(micros),
                        "acquired leadership"
                    );
                    shared.metrics.acquired.inc();
                }
                Event::Renewed { token } => {
                    self.write_flag(shared);
                    shared.log_renewed(token, shared.engine().lease(now).map(|(_, d)| d));
                }
                Event::Lost {
                    token,
                    reason,
                    deadline,
                } => {
                    self.remove_flag();
                    info!(
                        election,
                        id,
                        token,
                        reason = reason.as_str(),
                        at_us = micros(now),
                        deadline_us = micros(deadline),
                        "lost leadership"
                    );
                    shared.metrics.lost.inc();
                }
                Event::DuplicateId { instance } => {
                    // Once per offending process, not at every poll.
                    if self.duplicate_seen.as_ref() == Some(&instance) {
                        continue;
                    }
                    self.duplicate_seen = Some(instance.clone());
                    error!(
                        election,
                        id,
                        other_instance = instance.as_deref().unwrap_or(""),
                        "another process holds the lease under this replica's id; give every replica its own id"
                    );
                }
            }
        }
    }

    /// Asks for the flag file to say this replica leads (never waits).
    pub(super) fn write_flag(&self, shared: &Shared) {
        let Some(flag) = &self.flag else { return };
        let Some((token, deadline)) = shared.engine().lease(boot_now()) else {
            return;
        };
        flag.write(&shared.election, &shared.id, token, unix_ms(deadline));
    }

    /// Asks for the flag file to go (never waits; see [`Report::flag_removed`]).
    pub(super) fn remove_flag(&self) {
        if let Some(flag) = &self.flag {
            flag.remove();
        }
    }

    /// Whether the flag file is gone, waiting at most `within` for the disk.
    pub(super) async fn flag_removed(&self, within: Duration) -> bool {
        match &self.flag {
            Some(flag) => flag.removed(within).await,
            None => true,
        }
    }
}

/// The flag file never outlives its loop: a loop that ends by a panic
/// leaves no file claiming leadership for its election (its engine is
/// stepped down beside it, see `ClosedOnDrop`). After a normal end the
/// file is gone already, and this asks again for nothing.
impl Drop for Report {
    fn drop(&mut self) {
        self.remove_flag();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::flag_file::{FlagFile, FlagWriter};

    #[test]
    fn a_loop_that_ends_leaves_no_flag_file() {
        let dir = std::env::temp_dir().join(format!("leaderd-report-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("leader");
        let flag = FlagWriter::start(FlagFile::new(path.clone())).unwrap();
        flag.write("default", "pod-a", 7, u64::MAX);
        let wait_until = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !done() {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        wait_until("the flag file was written", &|| path.exists());
        let report = Report {
            flag: Some(flag),
            duplicate_seen: None,
        };
        // As a panic in the loop would drop it.
        drop(report);
        wait_until("the flag file outlived its loop", &|| !path.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
