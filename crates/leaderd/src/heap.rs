//! The process's allocator: how glibc's malloc is set up at start, and the
//! freed memory it is asked to give back while the daemon runs. Both are
//! about RSS with thousands of elections; neither changes what any
//! election does.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How often freed heap is given back (see [`give_back`]).
pub const GIVE_BACK_EVERY: Duration = Duration::from_secs(10);

/// One malloc arena for the process, set before any thread starts. glibc
/// gives each thread that allocates an arena of its own; with thousands of
/// elections, what one thread frees and another allocated stays spread
/// over several, and the daemon's RSS with it (1,000 elections: 16.0 MiB
/// against 14.6 with one; BENCHMARKS.md, "Memory per election"). A daemon
/// spends little of its time allocating, so the lock they share costs
/// nothing measurable.
///
/// The `mmap` threshold stays at glibc's default, 128 KiB: by default glibc
/// raises it to the size of any large block freed, and from then on keeps
/// the renewal waves' buffers (hundreds of KiB each, made and freed every
/// renew interval) in the heap, resident between waves (10,000 elections:
/// 41 against 48 MiB).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() {
    // SAFETY: mallopt only sets a tunable of the allocator; it is called
    // before any other thread exists. Its answer (0 when refused) changes
    // nothing that matters: the defaults work, only larger.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

/// Gives the pages of the heap's free space back to the system every
/// [`GIVE_BACK_EVERY`] until `shutdown`. glibc returns only the free space
/// at the heap's top by itself; what was freed below live blocks stays
/// resident. With thousands of elections most of that is the start's: every
/// election's first attempt is in flight at once (its state, its reply
/// channel), then freed between the blocks that stay (1,000 elections:
/// 1.44 MB free in a 4.37 MB heap). Periodically rather than once: what
/// is freed later, say after a failover that had every follower attempt
/// at once, lands the same way.
pub async fn give_back(shutdown: CancellationToken) {
    let mut every = tokio::time::interval(GIVE_BACK_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Not at start: the first tick is at once.
    every.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let started = std::time::Instant::now();
        let returned = trim();
        debug!(
            returned,
            took_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "gave freed heap back to the system"
        );
    }
}

/// `malloc_trim(0)`: whether any memory was returned. It walks the free
/// chunks under the arena's lock (one arena, see [`tune`]), so every
/// allocation of every thread waits for it meanwhile, a step-down's logs
/// and flag file included: with 10,000 elections it took 1.2 ms the first
/// time (the start's free space) and 0.27–0.43 ms after (BENCHMARKS.md),
/// against a safety margin of 50 ms at least. No leadership is claimed
/// longer for it: "leader" is read from the deadline when asked.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim() -> bool {
    // SAFETY: malloc_trim only returns free pages to the system; it takes
    // the allocator's own locks and is safe to call from any thread.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}
