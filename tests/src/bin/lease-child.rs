//! A command for `leaderd exec` tests: it records its life in a shared log
//! and proves that no two of its kind ever run at once.
//!
//! `lease-child DIR`: takes an exclusive, non-blocking `flock` on
//! `DIR/lease.lock` (the kernel drops it the instant the process dies, however
//! it dies), then appends `start ID TOKEN PID BOOT_US` to `DIR/lives.log`, or
//! `overlap ID TOKEN PID BOOT_US` and exits 99 when another one holds the
//! lock. It then waits; when the file `DIR/exit-now` appears it takes it
//! (rename, so only one child does) and exits with status 3 by itself.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{flock, FlockOperation};

fn boot_us() -> u64 {
    leaderd_tests::sse::boot_us()
}

fn record(dir: &Path, what: &str) {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "-".into());
    let line = format!(
        "{what} {} {} {} {}\n",
        var("LEADERD_ID"),
        var("LEADERD_TOKEN"),
        std::process::id(),
        boot_us()
    );
    // One write of a short line to an O_APPEND file: lines never interleave.
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("lives.log"))
        .expect("lives.log");
    log.write_all(line.as_bytes()).expect("write lives.log");
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: lease-child DIR");
    let dir = Path::new(&dir);
    let lock = File::create(dir.join("lease.lock")).expect("lease.lock");
    if flock(&lock, FlockOperation::NonBlockingLockExclusive).is_err() {
        record(dir, "overlap");
        std::process::exit(99);
    }
    record(dir, "start");
    loop {
        let claimed = dir.join(format!("exit-now.{}", std::process::id()));
        if std::fs::rename(dir.join("exit-now"), &claimed).is_ok() {
            record(dir, "exit");
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
