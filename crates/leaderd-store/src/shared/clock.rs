//! The host's boot clock: the "database clock" of SQLite, and the clock the
//! daemon measures its own deadlines on.

use std::time::Duration;

use leaderd_core::BootTime;
use rustix::time::{clock_gettime, ClockId};

/// Now on `CLOCK_BOOTTIME`: monotonic, never stepped by NTP or an operator,
/// and counting through suspend, so a deadline on it cannot be stretched.
pub fn boot_now() -> BootTime {
    let ts = clock_gettime(ClockId::Boottime);
    BootTime::from_since_boot(Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    ))
}

/// This boot of the host (`/proc/sys/kernel/random/boot_id`): boot-clock
/// times from another boot mean nothing. A process in its own time namespace
/// (`unshare --time`, a checkpoint-restored container) reads the boot clock
/// with an offset under the same boot id, so the namespace is part of the
/// id: its rows then look foreign to the host's processes, and the reverse.
pub fn boot_id() -> std::io::Result<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let boot = boot.trim();
    // Kernels before 5.6 have no time namespaces (and no such link).
    Ok(match std::fs::read_link("/proc/self/ns/time") {
        Ok(ns) => format!("{boot}/{}", ns.display()),
        Err(_) => boot.to_owned(),
    })
}
