//! Bad surroundings for a daemon under test: every core busy with other
//! work, and a disk whose flushes are slow.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// A thread spinning on every core until dropped: the daemon shares the
/// machine with work that wants all of it.
#[derive(Debug)]
pub struct CpuHogs {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl CpuHogs {
    /// One spinning thread per core.
    pub fn every_core() -> CpuHogs {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut spins = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        spins = std::hint::black_box(spins.wrapping_add(1));
                    }
                    spins
                })
            })
            .collect();
        CpuHogs { stop, threads }
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A preload library (`LD_PRELOAD`) that adds 1 ms to every `fsync` and
/// `fdatasync` of the process, and creates the file named by
/// `SLOW_FSYNC_MARK` at its first flush (so a test can tell it was used).
/// Built with the system's C compiler into `dir`.
pub fn slow_fsync_library(dir: &Path) -> PathBuf {
    const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void slow(void) {
    static int marked;
    if (!marked) {
        const char *mark = getenv("SLOW_FSYNC_MARK");
        if (mark) { int fd = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0644); if (fd >= 0) close(fd); }
        marked = 1;
    }
    struct timespec ms = {0, 1000000};
    nanosleep(&ms, 0);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow();
    return real(fd);
}
"#;
    let source = dir.join("slow_fsync.c");
    let library = dir.join("slow_fsync.so");
    std::fs::write(&source, SOURCE).expect("write the preload source");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .status()
        .expect("run cc (a C compiler is needed for the slow-fsync tests)");
    assert!(status.success(), "building the slow-fsync library failed");
    library
}

/// A daemon's flushes made slow ([`slow_fsync_library`], built into a
/// directory) and the file that shows the library was used: one set-up for
/// every test that wants a slow disk.
#[derive(Debug)]
pub struct SlowFsync {
    library: String,
    mark: String,
}

impl SlowFsync {
    /// Builds the library into `dir`; its mark file goes there too.
    pub fn new(dir: &Path) -> SlowFsync {
        let path = |p: PathBuf| p.to_str().expect("utf-8 path").to_owned();
        SlowFsync {
            library: path(slow_fsync_library(dir)),
            mark: path(dir.join("flushed")),
        }
    }

    /// The environment to start a daemon with.
    pub fn env(&self) -> [(&str, &str); 2] {
        [
            ("LD_PRELOAD", self.library.as_str()),
            ("SLOW_FSYNC_MARK", self.mark.as_str()),
        ]
    }

    /// Panics unless a process flushed through the library.
    pub fn assert_used(&self) {
        assert!(
            Path::new(&self.mark).exists(),
            "the slow fsync was not used"
        );
    }
}
