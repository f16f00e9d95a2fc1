//! Waiting for a flag file to appear, woken by the kernel when an entry of
//! its directory is created or renamed into place (inotify) rather than by
//! polling. Polled every 0.5 ms, a handover's time was rounded up by a
//! quarter of a millisecond on average (both leaderd's and ZooKeeper's),
//! and the poller's 2,000 wake-ups a second ran on the cores the daemons
//! and the database use.

use std::mem::MaybeUninit;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::fd::OwnedFd;
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};

/// How long [`FlagWatch::wait`] waits before it gives up.
const GIVE_UP: Duration = Duration::from_secs(10);

/// Entries made in one directory.
pub(crate) struct FlagWatch {
    fd: OwnedFd,
}

impl FlagWatch {
    /// Watches `dir` for entries created or renamed into it (flag files
    /// are written to a temporary file and renamed).
    pub(crate) fn new(dir: &Path) -> Result<Self> {
        let fd =
            inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).context("inotify_init1")?;
        inotify::add_watch(&fd, dir, WatchFlags::CREATE | WatchFlags::MOVED_TO)
            .with_context(|| format!("watching {}", dir.display()))?;
        Ok(Self { fd })
    }

    /// What `found` finds, and when (from `from`): asked at once and again
    /// after every entry made in the directory; panics with `what` after
    /// [`GIVE_UP`].
    pub(crate) fn wait<T>(
        &self,
        from: Instant,
        what: &str,
        mut found: impl FnMut() -> Option<T>,
    ) -> (T, Duration) {
        loop {
            // Emptied before the look: an entry made after it wakes the
            // poll below.
            self.drain();
            if let Some(found) = found() {
                return (found, from.elapsed());
            }
            let left = GIVE_UP.checked_sub(from.elapsed()).expect(what);
            // A bound on each wait: a directory replaced under the watch
            // would never wake it.
            let step = left.min(Duration::from_millis(100));
            let timeout = Timespec::try_from(step).expect("a short wait");
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            // Interrupted or timed out: look again either way.
            let _ = poll(&mut fds, Some(&timeout));
        }
    }

    /// Reads every event queued, without waiting.
    fn drain(&self) {
        let mut buf = [MaybeUninit::uninit(); 4096];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        while events.next().is_ok() {}
    }
}
