//! The host's boot clock (`CLOCK_BOOTTIME`), and converting its instants to
//! wall-clock time for the flag file.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leaderd_core::BootTime;
use rustix::time::{clock_gettime, ClockId};

/// Now, on the boot clock: monotonic, never stepped, and counting through
/// suspend, so a deadline on it cannot be stretched.
pub fn boot_now() -> BootTime {
    let ts = clock_gettime(ClockId::Boottime);
    BootTime::from_since_boot(Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    ))
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
