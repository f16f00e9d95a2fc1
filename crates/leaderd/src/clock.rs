//! The boot clock at the binary's edge: waiting for a boot-clock instant,
//! and converting one to wall-clock time for the flag file or to
//! microseconds for the logs.

use std::os::fd::OwnedFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leaderd_core::BootTime;
pub use leaderd_store::boot_now;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;

/// Waits for instants on `CLOCK_BOOTTIME`. tokio's timers run on
/// `CLOCK_MONOTONIC`, which stops while the host is suspended: a deadline
/// that passed during a suspend would be acted on only after its remaining
/// time had passed *again* after resume (a command under `exec` killed late,
/// the flag file and the watchers told late). A boot-clock timer fires at
/// once on resume. Where no timerfd can be made (a sandbox refusing the
/// syscall) it falls back to tokio's timer.
#[derive(Debug)]
pub struct BootTimer {
    fd: Option<AsyncFd<OwnedFd>>,
    /// Times round the waiting loop, for the tests.
    #[cfg(test)]
    rounds: u32,
}

impl BootTimer {
    /// Needs a tokio runtime with I/O enabled.
    pub fn new() -> Self {
        let fd = timerfd_create(
            TimerfdClockId::Boottime,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )
        .ok()
        .and_then(register);
        if fd.is_none() {
            fall_back("no boot-clock timer can be made");
        }
        Self {
            fd,
            #[cfg(test)]
            rounds: 0,
        }
    }

    /// Returns once the boot clock reads `at` or later (at once if it does
    /// already). Cancel-safe: a later call re-arms the timer.
    pub async fn sleep_until(&mut self, at: BootTime) {
        loop {
            #[cfg(test)]
            {
                self.rounds += 1;
            }
            let now = boot_now();
            if now >= at {
                return;
            }
            let Some(fd) = &self.fd else {
                tokio::time::sleep(at.saturating_since(now)).await;
                continue;
            };
            if arm(fd.get_ref(), at).is_err() {
                self.fd = fall_back("arming the boot-clock timer failed");
                continue;
            }
            // A stale expiry (of an earlier, cancelled wait) may wake this
            // one early: the clock is read again above.
            let Ok(mut guard) = fd.readable().await else {
                self.fd = fall_back("waiting on the boot-clock timer failed");
                continue;
            };
            let mut expiries = [0u8; 8];
            // Nothing to read (the stale case) clears the readiness.
            let read = guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut expiries).map_err(std::io::Error::from)
            });
            if let Ok(Err(_)) = read {
                self.fd = fall_back("reading the boot-clock timer failed");
            }
        }
    }

    /// [`BootTimer::sleep_until`], or never for `None`.
    pub async fn sleep_until_some(&mut self, at: Option<BootTime>) {
        match at {
            Some(at) => self.sleep_until(at).await,
            None => std::future::pending().await,
        }
    }
}

impl Default for BootTimer {
    fn default() -> Self {
        Self::new()
    }
}

/// Says (once per process) that waits fall back to tokio's timer, which
/// stands still while the host is suspended.
fn fall_back(why: &str) -> Option<AsyncFd<OwnedFd>> {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "{why}; waiting on CLOCK_MONOTONIC instead: after a host suspend, deadlines are acted on late"
        );
    });
    None
}

/// Registers a timerfd with tokio's reactor (read interest only).
#[allow(unsafe_code)]
fn register(fd: OwnedFd) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is an open descriptor that stays open, and its
    // `as_raw_fd` the same, until it is dropped with the `AsyncFd`: the
    // condition tokio states (its safe constructors are deprecated for
    // types that could break it; `OwnedFd` cannot).
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

/// Arms `fd` to expire once, at `at` on the boot clock (never zero, which
/// would disarm it: `at` is past the boot).
fn arm(fd: &OwnedFd, at: BootTime) -> rustix::io::Result<()> {
    let since_boot = at.since_boot().max(Duration::from_nanos(1));
    let value = Timespec {
        tv_sec: i64::try_from(since_boot.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(since_boot.subsec_nanos()),
    };
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    timerfd_settime(
        fd,
        TimerfdTimerFlags::ABSTIME,
        &Itimerspec {
            it_interval: zero,
            it_value: value,
        },
    )
    .map(|_| ())
}

/// `at` as milliseconds since the Unix epoch, by this host's wall clock.
pub fn unix_ms(at: BootTime) -> u64 {
    let now_boot = boot_now();
    let now_wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let wall = if at >= now_boot {
        now_wall + at.saturating_since(now_boot)
    } else {
        now_wall.saturating_sub(now_boot.saturating_since(at))
    };
    u64::try_from(wall.as_millis()).unwrap_or(u64::MAX)
}

/// `t` in microseconds since boot, as the transition logs carry it.
pub fn micros(t: BootTime) -> u64 {
    u64::try_from(t.since_boot().as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits with a bound, so that a timer that never fires fails the test
    /// instead of hanging it.
    async fn bounded(timer: &mut BootTimer, at: BootTime) {
        tokio::time::timeout(Duration::from_secs(2), timer.sleep_until(at))
            .await
            .expect("the timer fired");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wakes_at_the_boot_clock_instant_and_not_before() {
        let mut timer = BootTimer::new();
        let fd = timer.fd.as_ref().expect("a boot-clock timerfd");
        let flags = rustix::fs::fcntl_getfl(fd.get_ref()).expect("its flags");
        assert!(
            flags.contains(rustix::fs::OFlags::NONBLOCK),
            "a blocking read would stall the runtime"
        );
        for ms in [1, 30, 120] {
            let at = boot_now() + Duration::from_millis(ms);
            timer.rounds = 0;
            bounded(&mut timer, at).await;
            let woke = boot_now();
            assert!(woke >= at, "woke {:?} early", at.saturating_since(woke));
            let late = woke.saturating_since(at);
            assert!(late < Duration::from_millis(500), "woke {late:?} late");
            // Arm, wake, see the time: no spinning on a readiness never
            // cleared.
            assert!(timer.rounds <= 3, "{} rounds for one wait", timer.rounds);
        }
    }

    #[tokio::test]
    async fn a_past_instant_returns_at_once() {
        let mut timer = BootTimer::new();
        let past = boot_now();
        tokio::time::timeout(Duration::from_millis(100), timer.sleep_until(past))
            .await
            .expect("returned at once");
    }

    #[tokio::test]
    async fn a_cancelled_wait_neither_fires_the_next_one_early_nor_blocks_it() {
        let mut timer = BootTimer::new();
        // Armed for 40 ms, cancelled at 10 ms; its expiry is then stale.
        let far = boot_now() + Duration::from_millis(40);
        let cut = tokio::time::timeout(Duration::from_millis(10), timer.sleep_until(far)).await;
        assert!(cut.is_err(), "the first wait was cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let at = boot_now() + Duration::from_millis(60);
        timer.rounds = 0;
        bounded(&mut timer, at).await;
        assert!(boot_now() >= at, "a stale expiry woke the next wait early");
        assert!(timer.rounds <= 4, "{} rounds for one wait", timer.rounds);
        assert!(timer.fd.is_some(), "fell back from the boot clock");
        // And a cancelled wait leaves the timer usable at once.
        let soon = boot_now() + Duration::from_millis(5);
        bounded(&mut timer, soon).await;
    }

    #[tokio::test]
    async fn without_a_timerfd_it_falls_back_to_tokio() {
        let mut timer = BootTimer {
            fd: None,
            rounds: 0,
        };
        let at = boot_now() + Duration::from_millis(20);
        bounded(&mut timer, at).await;
        assert!(boot_now() >= at);
    }
}
