//! The boot clock at the binary's edge: waiting for a boot-clock instant,
//! and converting one to wall-clock time for the flag file or to
//! microseconds for the logs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::Either;
use leaderd_core::BootTime;
pub use leaderd_store::boot_now;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

/// Waits for instants on `CLOCK_BOOTTIME`. tokio's timers run on
/// `CLOCK_MONOTONIC`, which stops while the host is suspended: a deadline
/// that passed during a suspend would be acted on only after its remaining
/// time had passed *again* after resume (a command under `exec` killed late,
/// the flag file and the watchers told late). A boot-clock timer fires at
/// once on resume.
///
/// Every wait of the process shares one timerfd, armed for the earliest of
/// them and read by one thread (see [`Timers`]): with thousands of
/// elections, a timerfd each (two per loop) cost two descriptors and a
/// `timerfd_settime` per wait each (13 % of a daemon's CPU at 3,000). Where
/// no timerfd can be made (a sandbox refusing the syscall) waits fall back
/// to tokio's timer.
#[derive(Debug, Default)]
pub struct BootTimer {
    /// Times round the waiting loop, for the tests.
    #[cfg(test)]
    rounds: u32,
}

impl BootTimer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns once the boot clock reads `at` or later (at once if it does
    /// already). Cancel-safe.
    pub fn sleep_until(&mut self, at: BootTime) -> BootSleep<'_> {
        BootSleep {
            timer: self,
            at,
            waiting: Waiting::Not,
        }
    }

    /// [`BootTimer::sleep_until`] when `exact`; else on tokio's timer alone,
    /// which costs far less (a wheel inside the runtime: no shared heap, no
    /// wake-up from another thread) but is late after a host suspend by up
    /// to what was left of the wait. For waits that only pace attempts (a
    /// follower's), never for a deadline.
    pub fn sleep_until_exact_or_not(
        &mut self,
        at: BootTime,
        exact: bool,
    ) -> Either<BootSleep<'_>, tokio::time::Sleep> {
        if exact {
            Either::Left(self.sleep_until(at))
        } else {
            Either::Right(tokio::time::sleep(at.saturating_since(boot_now())))
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

/// A wait for a boot-clock instant (see [`BootTimer::sleep_until`]). A
/// future of its own, not an `async fn`: an election's loop waits in one
/// all its life, inside its task, and an `async fn`'s state kept its
/// instant three times over.
pub struct BootSleep<'a> {
    /// Counts the rounds, in the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    timer: &'a mut BootTimer,
    at: BootTime,
    waiting: Waiting,
}

enum Waiting {
    /// Not yet, or the last wait ended: the clock is read again.
    Not,
    Fd(Wait),
    /// Boxed: only without a working timerfd (none could be made, or it
    /// failed; then one allocation a wait), and a tokio sleep is about three
    /// times the size of a wait.
    Fallback(Pin<Box<tokio::time::Sleep>>),
}

impl Future for BootSleep<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match &mut this.waiting {
                Waiting::Not => {}
                Waiting::Fd(wait) => std::task::ready!(Pin::new(wait).poll(cx)),
                Waiting::Fallback(sleep) => std::task::ready!(sleep.as_mut().poll(cx)),
            }
            #[cfg(test)]
            {
                this.timer.rounds += 1;
            }
            let now = boot_now();
            if now >= this.at {
                this.waiting = Waiting::Not;
                return Poll::Ready(());
            }
            this.waiting = match Timers::global() {
                Some(timers) => Waiting::Fd(Wait {
                    timers,
                    at: this.at,
                    id: None,
                }),
                None => {
                    Waiting::Fallback(Box::pin(tokio::time::sleep(this.at.saturating_since(now))))
                }
            };
        }
    }
}

/// The process's one boot-clock timerfd and the waits on it: a heap of
/// their instants, the fd armed for the earliest, and a thread that reads
/// it (blocking) and wakes whoever is due. A thread rather than a task: it
/// serves every runtime of the process (the tests have many) and costs no
/// runtime's reactor anything.
struct Timers {
    fd: OwnedFd,
    queue: Mutex<Queue>,
    /// The fd failed (arming or reading it): every wait falls back to
    /// tokio's timer from then on.
    broken: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Queue {
    /// Instants and wait ids; an id no longer in `waiting` is stale.
    heap: BinaryHeap<Reverse<(BootTime, u64)>>,
    waiting: HashMap<u64, (BootTime, Waker)>,
    next_id: u64,
    /// What the fd is armed for (it may have fired since).
    armed: Option<BootTime>,
}

impl Timers {
    /// The process's timers, made and their thread started on first use;
    /// `None` (said once) where no timerfd or thread can be made, or once
    /// the fd failed.
    fn global() -> Option<&'static Timers> {
        static TIMERS: OnceLock<Option<&'static Timers>> = OnceLock::new();
        let timers = TIMERS.get_or_init(|| {
            let Ok(fd) = timerfd_create(TimerfdClockId::Boottime, TimerfdFlags::CLOEXEC) else {
                fall_back("no boot-clock timer can be made");
                return None;
            };
            let timers: &'static Timers = Box::leak(Box::new(Timers::new(fd)));
            let spawned = std::thread::Builder::new()
                .name("leaderd-timer".into())
                .spawn(move || timers.serve());
            if spawned.is_err() {
                fall_back("the boot-clock timer thread cannot start");
                return None;
            }
            Some(timers)
        });
        (*timers).filter(|timers| !timers.is_broken())
    }

    fn new(fd: OwnedFd) -> Self {
        Timers {
            fd,
            queue: Mutex::new(Queue::default()),
            broken: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The fd cannot be trusted any more: says so once, and wakes every
    /// wait, which goes on on tokio's timer (see [`BootTimer::sleep_until`]).
    fn fail(&self, why: &str) {
        self.broken
            .store(true, std::sync::atomic::Ordering::Release);
        fall_back(why);
        let waiting = std::mem::take(&mut self.queue().waiting);
        for (_, (_, waker)) in waiting {
            waker.wake();
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks on the fd, waking the waits that are due at each expiry.
    fn serve(&self) {
        let mut expiries = [0u8; 8];
        loop {
            // A blocking read: returns at an expiry.
            match rustix::io::read(&self.fd, &mut expiries) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return self.fail("reading the boot-clock timer failed"),
            }
            let due = self.take_due(boot_now());
            for waker in due {
                waker.wake();
            }
        }
    }

    /// Removes the waits due at `now`, re-arming the fd for the next one.
    fn take_due(&self, now: BootTime) -> Vec<Waker> {
        let mut q = self.queue();
        let mut due = Vec::new();
        while let Some(&Reverse((at, id))) = q.heap.peek() {
            let stale = q.waiting.get(&id).is_none_or(|(t, _)| *t != at);
            if !stale && at > now {
                break;
            }
            q.heap.pop();
            if !stale {
                if let Some((_, waker)) = q.waiting.remove(&id) {
                    due.push(waker);
                }
            }
        }
        // Not for a cancelled wait's instant: the next live one.
        while let Some(&Reverse((at, id))) = q.heap.peek() {
            if q.waiting.get(&id).is_some_and(|(t, _)| *t == at) {
                break;
            }
            q.heap.pop();
        }
        let next = q.heap.peek().map(|&Reverse((at, _))| at);
        q.armed = next;
        let armed = arm(&self.fd, next);
        drop(q);
        if armed.is_err() {
            self.fail("arming the boot-clock timer failed");
        }
        due
    }

    /// Registers (or updates) wait `id` for `at`, arming the fd if it is the
    /// earliest; `false` once the fd failed (the wait then falls back).
    fn register(&self, id: &mut Option<u64>, at: BootTime, waker: &Waker) -> bool {
        let mut q = self.queue();
        // Under the lock: `fail` marks the fd broken before it takes the
        // waits, so a wait is either taken (and woken) or sees it broken.
        if self.is_broken() {
            return false;
        }
        let known = id.and_then(|i| q.waiting.get_mut(&i));
        if let Some((_, w)) = known {
            if !w.will_wake(waker) {
                // Dropped after the lock: a waker's drop runs foreign code.
                let old = std::mem::replace(w, waker.clone());
                drop(q);
                drop(old);
            }
            return true;
        }
        let i = q.next_id;
        q.next_id += 1;
        *id = Some(i);
        q.waiting.insert(i, (at, waker.clone()));
        q.heap.push(Reverse((at, i)));
        // Cancelled waits leave stale entries until their instant: rebuild
        // the heap when they outnumber the live ones.
        if q.heap.len() > 2 * q.waiting.len() + 1024 {
            let live: Vec<_> = q
                .waiting
                .iter()
                .map(|(&i, &(t, _))| Reverse((t, i)))
                .collect();
            q.heap = live.into();
        }
        if q.armed.is_none_or(|armed| at < armed) {
            q.armed = Some(at);
            if arm(&self.fd, Some(at)).is_err() {
                drop(q);
                self.fail("arming the boot-clock timer failed");
            }
        }
        true
    }

    fn cancel(&self, id: u64) {
        // The waker is dropped after the lock (see `register`).
        let removed = self.queue().waiting.remove(&id);
        drop(removed);
    }
}

/// One wait on [`Timers`]: ready once woken at or after `at`.
struct Wait {
    timers: &'static Timers,
    at: BootTime,
    id: Option<u64>,
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if boot_now() >= this.at {
            if let Some(id) = this.id.take() {
                this.timers.cancel(id);
            }
            return Poll::Ready(());
        }
        if this.timers.register(&mut this.id, this.at, cx.waker()) {
            Poll::Pending
        } else {
            // The fd failed: `sleep_until` goes on on tokio's timer.
            Poll::Ready(())
        }
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.timers.cancel(id);
        }
    }
}

/// Says (once per process) that waits fall back to tokio's timer, which
/// stands still while the host is suspended.
fn fall_back(why: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "{why}; waiting on CLOCK_MONOTONIC instead: after a host suspend, deadlines are acted on late"
        );
    });
}

/// Arms `fd` to expire once, at `at` on the boot clock (never zero, which
/// would disarm it: `at` is past the boot), or disarms it for `None`.
fn arm(fd: &OwnedFd, at: Option<BootTime>) -> rustix::io::Result<()> {
    let timespec = |d: Duration| Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    };
    let value = at.map_or(Duration::ZERO, |at| {
        at.since_boot().max(Duration::from_nanos(1))
    });
    let spec = Itimerspec {
        it_interval: timespec(Duration::ZERO),
        it_value: timespec(value),
    };
    timerfd_settime(fd, TimerfdTimerFlags::ABSTIME, &spec).map(|_| ())
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
        assert!(Timers::global().is_some(), "a boot-clock timerfd");
        let mut timer = BootTimer::new();
        for ms in [1, 30, 120] {
            let at = boot_now() + Duration::from_millis(ms);
            timer.rounds = 0;
            bounded(&mut timer, at).await;
            let woke = boot_now();
            assert!(woke >= at, "woke {:?} early", at.saturating_since(woke));
            let late = woke.saturating_since(at);
            assert!(late < Duration::from_millis(500), "woke {late:?} late");
            // Arm, wake, see the time: no spinning.
            assert!(timer.rounds <= 3, "{} rounds for one wait", timer.rounds);
        }
    }

    /// A follower's wait, on tokio's timer: not before its instant either.
    #[tokio::test]
    async fn a_loose_wait_wakes_at_its_instant_and_not_before() {
        let mut timer = BootTimer::new();
        for ms in [1, 30] {
            let at = boot_now() + Duration::from_millis(ms);
            tokio::time::timeout(
                Duration::from_secs(2),
                timer.sleep_until_exact_or_not(at, false),
            )
            .await
            .expect("woke");
            assert!(boot_now() >= at, "woke early");
        }
        assert_eq!(timer.rounds, 0, "the boot-clock timer was not used");
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
        // Armed for 40 ms, cancelled at 10 ms.
        let far = boot_now() + Duration::from_millis(40);
        let cut = tokio::time::timeout(Duration::from_millis(10), timer.sleep_until(far)).await;
        assert!(cut.is_err(), "the first wait was cancelled");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let at = boot_now() + Duration::from_millis(60);
        timer.rounds = 0;
        bounded(&mut timer, at).await;
        assert!(boot_now() >= at, "a stale expiry woke the next wait early");
        assert!(timer.rounds <= 4, "{} rounds for one wait", timer.rounds);
        // And a cancelled wait leaves the timer usable at once.
        let soon = boot_now() + Duration::from_millis(5);
        bounded(&mut timer, soon).await;
    }

    /// A timerfd that fails wakes every wait at once, so that each goes on
    /// on tokio's timer rather than waiting for ever.
    #[tokio::test]
    async fn a_failed_timer_releases_its_waits() {
        let fd = timerfd_create(TimerfdClockId::Boottime, TimerfdFlags::CLOEXEC).unwrap();
        let timers: &'static Timers = Box::leak(Box::new(Timers::new(fd)));
        let far = boot_now() + Duration::from_secs(3600);
        let wait = tokio::spawn(Wait {
            timers,
            at: far,
            id: None,
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!wait.is_finished(), "an hour's wait is waiting");
        timers.fail("test");
        tokio::time::timeout(Duration::from_secs(2), wait)
            .await
            .expect("released at once")
            .expect("no panic");
        // And a wait made afterwards does not register.
        let later = Wait {
            timers,
            at: far,
            id: None,
        };
        tokio::time::timeout(Duration::from_millis(100), later)
            .await
            .expect("not registered");
        assert!(timers.queue().waiting.is_empty());
    }

    /// Many waits at once, on one fd: each wakes at its own instant,
    /// whatever order they were made in and however many were cancelled
    /// meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_waits_share_the_one_timer() {
        let start = boot_now();
        let offsets = [70u64, 10, 50, 30, 90, 20, 80, 40, 60, 5];
        let waits = offsets.map(|ms| {
            tokio::spawn(async move {
                let at = start + Duration::from_millis(ms);
                BootTimer::new().sleep_until(at).await;
                (ms, boot_now())
            })
        });
        // Cancelled ones, earlier than all of them.
        for _ in 0..100 {
            let at = start + Duration::from_millis(2);
            let _ = tokio::time::timeout(Duration::ZERO, BootTimer::new().sleep_until(at)).await;
        }
        for w in waits {
            let (ms, woke) = tokio::time::timeout(Duration::from_secs(2), w)
                .await
                .expect("woke")
                .expect("no panic");
            let at = start + Duration::from_millis(ms);
            assert!(woke >= at, "{ms} ms woke early");
            assert!(
                woke.saturating_since(at) < Duration::from_millis(500),
                "{ms} ms woke late"
            );
        }
    }
}
