//! Converting boot-clock instants: to wall-clock time for the flag file, to
//! microseconds for the logs.

use std::time::{SystemTime, UNIX_EPOCH};

use leaderd_core::BootTime;
pub use leaderd_store::boot_now;

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
