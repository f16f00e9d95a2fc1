//! The leader flag file: exists only while this replica leads.
//!
//! Written atomically (temp file in the same directory, then rename) at every
//! grant and renewal, removed on step-down and shutdown, and a stale one is
//! removed at start. Readers must still check `expires_at_unix_ms`: after
//! SIGKILL or SIGSTOP the file can outlive the lease.
//!
//! The file system is touched only by a thread of its own ([`FlagWriter`];
//! one for every flag file of the process): a stalled or fsync-heavy disk
//! delays the files, never the election loops.
//! Only a release waits for the file's removal (bounded): the row is freed
//! for a successor only once no file says this replica leads.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tracing::{error, info};

#[derive(Debug, Clone)]
pub struct FlagFile {
    path: PathBuf,
    tmp: PathBuf,
}

#[derive(Serialize)]
struct Content<'a> {
    election: &'a str,
    id: &'a str,
    token: i64,
    expires_at_unix_ms: u64,
}

impl FlagFile {
    pub fn new(path: PathBuf) -> Self {
        let mut name = path
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(format!(".tmp.{}", std::process::id()));
        let tmp = path.with_file_name(name);
        Self { path, tmp }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Atomically replaces the file with `body` (one JSON line).
    fn write_body(&self, body: &[u8]) -> io::Result<()> {
        let mut f = std::fs::File::create(&self.tmp)?;
        f.write_all(body)?;
        f.write_all(b"\n")?;
        drop(f);
        std::fs::rename(&self.tmp, &self.path)
    }

    /// Removes the file; a missing file is fine.
    fn remove(&self) -> io::Result<()> {
        let _ = std::fs::remove_file(&self.tmp);
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// Keeps the flag file in the state last asked for, on the process's flag
/// thread (one for every flag file: a daemon of a thousand elections has a
/// thousand files, not a thousand threads). Requests never wait: a newer
/// one replaces one not yet carried out.
#[derive(Debug, Clone)]
pub struct FlagWriter {
    inner: Arc<Inner>,
    worker: &'static Worker,
}

#[derive(Debug)]
struct Inner {
    file: FlagFile,
    wanted: Mutex<Wanted>,
    /// Waiting in the thread's queue: a request while it waits needs no
    /// second place (the thread reads the latest when it comes to it).
    queued: AtomicBool,
    /// The last attempt failed (logged once per change, not per renewal).
    failing: AtomicBool,
    /// The generation last carried out, whether the file is as it asked (a
    /// failed removal leaves a file naming this replica), and whether it
    /// asked for no file.
    done: watch::Sender<(u64, bool, bool)>,
}

#[derive(Debug, Default)]
struct Wanted {
    /// The file's content, or `None` for no file.
    body: Option<Vec<u8>>,
    /// Counts requests; the thread carries out the latest.
    generation: u64,
}

/// The flag thread's queues of files with a request to carry out.
#[derive(Debug, Default)]
struct Worker {
    queue: Mutex<Queues>,
    changed: Condvar,
}

/// Removals go first: a release waits (briefly) for its file's removal,
/// and must not wait behind every other election's renewal write.
#[derive(Debug, Default)]
struct Queues {
    removals: VecDeque<Arc<Inner>>,
    writes: VecDeque<Arc<Inner>>,
}

impl Worker {
    /// The process's flag thread, started on first use.
    fn get() -> io::Result<&'static Worker> {
        static WORKER: Mutex<Option<&'static Worker>> = Mutex::new(None);
        let mut worker = WORKER.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = *worker {
            return Ok(w);
        }
        let w: &'static Worker = Box::leak(Box::default());
        std::thread::Builder::new()
            .name("leaderd-flag".into())
            .spawn(move || w.apply_forever())?;
        *worker = Some(w);
        Ok(w)
    }

    fn push(&self, inner: Arc<Inner>, removal: bool) {
        let mut queues = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if removal {
            queues.removals.push_back(inner);
        } else {
            queues.writes.push_back(inner);
        }
        self.changed.notify_one();
    }

    fn apply_forever(&self) {
        loop {
            let inner = {
                let mut queues = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let next = queues.removals.pop_front();
                    if let Some(inner) = next.or_else(|| queues.writes.pop_front()) {
                        break inner;
                    }
                    queues = self.changed.wait(queues).unwrap_or_else(|e| e.into_inner());
                }
            };
            // Before reading what is wanted: a request from here on queues
            // the file again.
            inner.queued.store(false, Ordering::SeqCst);
            inner.apply();
        }
    }
}

impl FlagWriter {
    /// A writer for `file` on the flag thread (started if need be).
    pub fn start(file: FlagFile) -> io::Result<Self> {
        let worker = Worker::get()?;
        let inner = Arc::new(Inner {
            file,
            wanted: Mutex::new(Wanted::default()),
            queued: AtomicBool::new(false),
            failing: AtomicBool::new(false),
            done: watch::Sender::new((0, true, true)),
        });
        Ok(Self { inner, worker })
    }

    /// Asks for the file to say this replica leads with `token` until
    /// `expires_at_unix_ms`.
    pub fn write(&self, election: &str, id: &str, token: i64, expires_at_unix_ms: u64) {
        let body = serde_json::to_vec(&Content {
            election,
            id,
            token,
            expires_at_unix_ms,
        })
        .expect("serialising plain fields cannot fail");
        self.want(Some(body));
    }

    /// Asks for the file to be gone.
    pub fn remove(&self) {
        self.want(None);
    }

    /// Asks for the file to be gone and waits, for at most `within`, until
    /// it is. `false` when the disk did not answer in time or the removal
    /// failed (a read-only remount, a lost permission).
    pub async fn removed(&self, within: Duration) -> bool {
        let generation = self.want(None);
        let mut done = self.inner.done.subscribe();
        let waited =
            tokio::time::timeout(within, done.wait_for(|(g, _, _)| *g >= generation)).await;
        // Only a removal that took effect: a later write carried out instead
        // leaves a file.
        matches!(waited, Ok(Ok(state)) if state.1 && state.2)
    }

    fn want(&self, body: Option<Vec<u8>>) -> u64 {
        let body_is_none = body.is_none();
        let generation = {
            let mut wanted = self.inner.wanted.lock().unwrap_or_else(|e| e.into_inner());
            wanted.body = body;
            wanted.generation += 1;
            wanted.generation
        };
        // A removal always takes a place of its own at the front, even when
        // the file already waits behind writes (carrying out a request
        // already carried out does nothing, see `Inner::apply`).
        let removal = body_is_none;
        if removal || !self.inner.queued.swap(true, Ordering::SeqCst) {
            self.worker.push(self.inner.clone(), removal);
        }
        generation
    }
}

impl Inner {
    /// Carries out the latest request, unless it already is.
    fn apply(&self) {
        let (body, generation) = {
            let wanted = self.wanted.lock().unwrap_or_else(|e| e.into_inner());
            (wanted.body.clone(), wanted.generation)
        };
        if self.done.borrow().0 >= generation {
            return;
        }
        let file = &self.file;
        let result = match &body {
            Some(body) => file.write_body(body),
            None => file.remove(),
        };
        let ok = result.is_ok();
        let was_failing = self.failing.swap(!ok, Ordering::Relaxed);
        match result {
            // Once per change, not at every renewal.
            Err(e) if !was_failing => {
                error!(path = %file.path().display(), error = %e, "cannot update the flag file");
            }
            Ok(()) if was_failing => {
                info!(path = %file.path().display(), "the flag file is updated again");
            }
            _ => {}
        }
        self.done.send_replace((generation, ok, body.is_none()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_replaces_and_remove_is_idempotent() {
        let dir = std::env::temp_dir().join(format!("leaderd-flag-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("leader");
        let flag = FlagWriter::start(FlagFile::new(path.clone())).unwrap();
        flag.write("default", "pod-a", 7, 1_000);
        flag.write("default", "pod-a", 8, 2_000);
        let read = || {
            let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
            (v["token"] == 8).then_some(v)
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let v = loop {
            if let Some(v) = read() {
                break v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the file was not written"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(v["token"], 8);
        assert_eq!(v["expires_at_unix_ms"], 2_000);
        assert_eq!(v["id"], "pod-a");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left"
        );
        assert!(flag.removed(Duration::from_secs(5)).await);
        assert!(flag.removed(Duration::from_secs(5)).await);
        assert!(!path.exists());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A daemon of many elections keeps many files on one thread, each file
    /// as asked.
    #[tokio::test]
    async fn many_files_share_one_thread() {
        let dir = std::env::temp_dir().join(format!("leaderd-flag-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let writers: Vec<FlagWriter> = (0..50)
            .map(|i| FlagWriter::start(FlagFile::new(dir.join(format!("f{i}")))).unwrap())
            .collect();
        for (token, w) in (0..).zip(&writers) {
            w.write("e", "pod-a", token, 1_000);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        for i in 0..writers.len() {
            let path = dir.join(format!("f{i}"));
            let token = loop {
                let read = std::fs::read(&path).ok();
                let v: Option<serde_json::Value> =
                    read.and_then(|b| serde_json::from_slice(&b).ok());
                if let Some(v) = v {
                    break v["token"].clone();
                }
                assert!(std::time::Instant::now() < deadline, "f{i} not written");
                std::thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(token, i);
        }
        let flag_threads = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim() == "leaderd-flag")
            .count();
        assert_eq!(flag_threads, 1);
        for w in &writers {
            assert!(w.removed(Duration::from_secs(5)).await);
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A removal that fails (a read-only remount, say; here the path is a
    /// directory) is not acknowledged: the caller must not release the row
    /// while a file may still name this replica.
    #[tokio::test]
    async fn a_failed_removal_is_not_acknowledged() {
        let dir = std::env::temp_dir().join(format!("leaderd-flag-{}", uuid::Uuid::new_v4()));
        let path = dir.join("leader");
        std::fs::create_dir_all(path.join("in-the-way")).unwrap();
        let flag = FlagWriter::start(FlagFile::new(path.clone())).unwrap();
        assert!(!flag.removed(Duration::from_secs(5)).await);
        std::fs::remove_dir_all(path.join("in-the-way")).unwrap();
        std::fs::remove_dir(&path).unwrap();
        assert!(flag.removed(Duration::from_secs(5)).await);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
