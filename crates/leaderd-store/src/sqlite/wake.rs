//! Wake-ups on SQLite (processes on one host): a release rewrites a file
//! beside the database, which the followers watch with inotify.

use crate::shared::error::StoreError;
use crate::shared::url::DatabaseUrl;

/// The file beside the database that a release rewrites (with the
/// election's name) to wake the processes waiting on this host.
pub(super) fn wake_file(db_path: &str) -> std::path::PathBuf {
    let mut name = std::path::Path::new(db_path)
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".leaderd-wake");
    std::path::Path::new(db_path).with_file_name(name)
}

/// Whether the release of row `name` is worth a wake-up: not a presence
/// row's (`leaderd_core::spread::PRESENCE_PREFIX`), which nobody waits to
/// take. Here every wake-up wakes every election of every process (the file
/// names only the last release), and a follower woken for nothing spends
/// its attempt on it: the lease released a moment later (a replica that
/// drains or stops typically lets its presence go a moment before its
/// lease: the two tasks race) was taken 50 ms late, the
/// wake-ups' pace (`Engine::on_release_notice`).
pub(super) fn wakes_anyone(name: &str) -> bool {
    !name.starts_with(leaderd_core::spread::PRESENCE_PREFIX)
}

/// Wakes the waiting processes: writes the wake file by rename, so watchers
/// see one complete write.
pub(super) fn announce_release(db_path: &str, election: &str) -> std::io::Result<()> {
    let file = wake_file(db_path);
    let mut tmp = file.clone().into_os_string();
    tmp.push(format!(".{}", std::process::id()));
    std::fs::write(&tmp, election)?;
    std::fs::rename(&tmp, &file)
}

/// Wake-ups for processes on this host: inotify on the database's directory,
/// for the wake file a release rewrites. Only a wake-up: safety rests on the
/// row and the clocks.
pub struct FileWaiter {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    file: std::ffi::OsString,
    path: std::path::PathBuf,
}

opaque_debug!(FileWaiter);

impl FileWaiter {
    pub(crate) fn watch(url: &DatabaseUrl) -> Result<Self, StoreError> {
        use rustix::fs::inotify;
        let db = url.sqlite_path().unwrap_or_default();
        let path = wake_file(db);
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let local =
            |e: std::io::Error| StoreError::Local(format!("cannot watch {}: {e}", dir.display()));
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)
            .map_err(|e| local(e.into()))?;
        inotify::add_watch(
            &fd,
            &dir,
            inotify::WatchFlags::CLOSE_WRITE | inotify::WatchFlags::MOVED_TO,
        )
        .map_err(|e| local(e.into()))?;
        #[expect(
            deprecated,
            reason = "an OwnedFd keeps one descriptor for its whole life, which is all that \
                      `register`'s safety contract asks; `new` is its safe spelling here"
        )]
        let fd = tokio::io::unix::AsyncFd::new(fd).map_err(local)?;
        Ok(Self {
            fd,
            file: path.file_name().unwrap_or_default().to_os_string(),
            path,
        })
    }

    /// The election named by the next release announced on this host.
    pub(crate) async fn next(&mut self) -> Result<String, StoreError> {
        let failed = |e: std::io::Error| StoreError::Local(format!("inotify: {e}"));
        loop {
            let mut guard = self.fd.readable().await.map_err(failed)?;
            let mut woke = false;
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut reader = rustix::fs::inotify::Reader::new(guard.get_inner(), &mut buf);
            loop {
                match reader.next() {
                    Ok(event) => {
                        let name = event.file_name().map(|n| n.to_bytes());
                        if name == Some(self.file.as_encoded_bytes()) {
                            woke = true;
                        }
                    }
                    Err(rustix::io::Errno::AGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) => return Err(failed(e.into())),
                }
            }
            if woke {
                if let Ok(election) = std::fs::read_to_string(&self.path) {
                    return Ok(election);
                }
            }
        }
    }
}
