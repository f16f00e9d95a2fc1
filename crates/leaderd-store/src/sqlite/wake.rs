//! Wake-ups on SQLite (processes on one host): a release appends the
//! election's name to a file beside the database, which the followers
//! watch with inotify and read from where they left off, so that each
//! release wakes the followers of its own election only.
//!
//! Only a wake-up: safety rests on the row and the clocks. Where a
//! follower cannot tell what was released (the file replaced, cut short
//! or unreadable, a line it cannot read, inotify's queue overflowing), it
//! wakes every election.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::shared::error::StoreError;
use crate::shared::url::DatabaseUrl;

/// Past this size, the writer that crossed it starts the file afresh (by
/// rename, so that a reader never sees it shrink under its offset): a
/// quarter of a MiB holds over a thousand releases of the longest names.
const FRESH_AFTER: u64 = 256 * 1024;

/// At most this much is read at one wake-up (the rest at the next, and
/// every election woken meanwhile).
const READ_AT_MOST: u64 = 1024 * 1024;

/// The longest line [`line`] writes: a name's 100 characters, 4 bytes
/// each at most in UTF-8, in hex.
const MAX_LINE: usize = 100 * 4 * 2;

/// The file beside the database that releases append to.
fn wake_file(db_path: &str) -> PathBuf {
    let mut name = Path::new(db_path)
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".leaderd-wake");
    Path::new(db_path).with_file_name(name)
}

/// Whether the release of row `name` is worth a wake-up: not a presence
/// row's (`leaderd_core::spread::PRESENCE_PREFIX`), which nobody waits to
/// take.
pub(super) fn wakes_anyone(name: &str) -> bool {
    !name.starts_with(leaderd_core::spread::PRESENCE_PREFIX)
}

/// One line of the file: the name in hex, so that any name (a newline in
/// it, say) is one line.
fn line(name: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in name.bytes() {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 0xf)]);
    }
    out.push(b'\n');
}

/// The name a line holds; `None` for anything not written by [`line`].
fn name_of(line: &[u8]) -> Option<String> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    if line.is_empty() || !line.len().is_multiple_of(2) {
        return None;
    }
    let bytes = line
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// Wakes the processes waiting for `elections`: one append of a line each
/// (one `write`, so that writers on the host do not interleave their
/// lines), closed at once (the close is what the watchers hear). The
/// append starts with a line break: a line left unfinished before it (a
/// writer that died half-way, an older leaderd's name) is then a line of
/// its own, not the start of this one's first name.
pub(super) fn announce_release(db_path: &str, elections: &[&str]) -> std::io::Result<()> {
    let mut lines = vec![b'\n'];
    for e in elections {
        line(e, &mut lines);
    }
    let path = wake_file(db_path);
    // The database's own mode: whoever may write the database may append
    // here (several users on one database), as SQLite does for its journal.
    let mode = std::fs::metadata(db_path).map_or(0o644, |m| m.mode() & 0o666);
    let mut file = match open_to_append(&path, mode) {
        Ok(Some(file)) => file,
        // Not a plain file, or one this process may not write: replaced by
        // one of ours, which the readers hear as a rename and wake every
        // election for.
        Ok(None) => return replace(&path, &lines, mode),
        Err(e) => return Err(e),
    };
    file.write_all(&lines)?;
    // Should another writer start the file afresh between this open and
    // this write, the lines went to a file nobody reads. No matter: the
    // readers heard that rename, which came after this release's commit,
    // and woke every election.
    let written = file.metadata()?.len();
    drop(file);
    if written > FRESH_AFTER {
        if let Err(e) = replace(&path, b"", mode) {
            // The wake-up went out; the file grows until a later writer
            // manages this.
            tracing::warn!(error = %e, path = %path.display(), "could not start the wake file afresh");
        }
    }
    Ok(())
}

/// Opens the wake file to append to, made if missing with `mode`; `None`
/// when it is there but unusable: a symbolic link (which would lead the
/// appends elsewhere), not a plain file (a FIFO nobody reads would block
/// the open), or not writable by this process.
fn open_to_append(path: &Path, mode: u32) -> std::io::Result<Option<File>> {
    let unusable = |e: &std::io::Error| {
        e.kind() == std::io::ErrorKind::PermissionDenied
            || matches!(
                e.raw_os_error(),
                Some(libc::ELOOP | libc::ENXIO | libc::EPERM | libc::EWOULDBLOCK)
            )
    };
    match open_wake_file(path, OpenOptions::new().append(true).create(true)) {
        Ok(file) => {
            if let Some(f) = &file {
                // Made just now with the umask's mode, or another's: only
                // the owner may change it, and nothing else needs it.
                let _ = f.set_permissions(std::fs::Permissions::from_mode(mode));
            }
            Ok(file)
        }
        // Someone else's file in a sticky directory refuses an open that
        // may create (the kernel's protected_regular), not a plain one.
        Err(e) if unusable(&e) => match open_wake_file(path, OpenOptions::new().append(true)) {
            Ok(file) => Ok(file),
            Err(e) if unusable(&e) => Ok(None),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// Opens the wake file with `options`, without following a symbolic link
/// or blocking on a FIFO; `None` when it is not a plain file.
fn open_wake_file(path: &Path, options: &mut OpenOptions) -> std::io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    Ok(file.metadata()?.is_file().then_some(file))
}

/// Puts a file holding `contents` (with `mode`) in `path`'s place, by
/// rename. The temporary name is this writer's own: made with
/// `create_new`, and more than the process id (processes in containers on
/// one volume may share one).
fn replace(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let mut tries = 0;
    let (tmp, mut file) = loop {
        // Only to tell writers apart; no time is judged by it.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{:x}.{nanos:x}{made:x}", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
        {
            Ok(file) => break (tmp, file),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 3 => tries += 1,
            Err(e) => return Err(e),
        }
    };
    // The umask may have taken bits from `mode`.
    let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
    let done = file
        .write_all(contents)
        .and_then(|()| std::fs::rename(&tmp, path));
    if done.is_err() {
        // Ours: made by `create_new` above.
        let _ = std::fs::remove_file(&tmp);
    }
    done
}

/// Wake-ups for processes on this host: inotify on the database's directory
/// for the wake file, read from where the last read ended.
pub struct FileWaiter {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    file: std::ffi::OsString,
    path: PathBuf,
    /// The wake file as opened, read up to its offset; `None` before it
    /// exists, or while it cannot be read.
    open: Option<File>,
    /// The file is there but cannot be read: once readable, what it holds
    /// is not all new.
    unreadable: bool,
    /// The start of a line whose end is not written yet.
    partial: Vec<u8>,
    /// Names read and not yet handed out, in the order written.
    heard: std::collections::VecDeque<String>,
}

opaque_debug!(FileWaiter);

impl FileWaiter {
    pub(crate) fn watch(url: &DatabaseUrl) -> Result<Self, StoreError> {
        use rustix::fs::inotify;
        let db = url.sqlite_path().unwrap_or_default();
        let path = wake_file(db);
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let local =
            |e: std::io::Error| StoreError::Local(format!("cannot watch {}: {e}", dir.display()));
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)
            .map_err(|e| local(e.into()))?;
        // Closes after writing (appends) and renames onto it (a fresh file,
        // or an older leaderd that rewrote it whole).
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
        // After the watch: what is appended from here on is heard, and what
        // was there before is not a release to wake for. A file that cannot
        // be read is not fatal: each change to it wakes every election.
        let open = match open_wake_file(&path, OpenOptions::new().read(true)) {
            Ok(Some(mut f)) => f.seek(SeekFrom::End(0)).ok().map(|_| f),
            _ => None,
        };
        let unreadable = open.is_none() && path.symlink_metadata().is_ok();
        Ok(Self {
            fd,
            file: path.file_name().unwrap_or_default().to_os_string(),
            path,
            open,
            unreadable,
            partial: Vec::new(),
            heard: std::collections::VecDeque::new(),
        })
    }

    /// The election of the next release announced on this host; `None`
    /// when some release cannot be told (see the module docs).
    pub(crate) async fn next(&mut self) -> Result<Option<String>, StoreError> {
        let failed = |e: std::io::Error| StoreError::Local(format!("inotify: {e}"));
        loop {
            if let Some(name) = self.heard.pop_front() {
                return Ok(Some(name));
            }
            let mut guard = self.fd.readable().await.map_err(failed)?;
            let mut touched = false;
            let mut renamed = false;
            let mut overflowed = false;
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut reader = rustix::fs::inotify::Reader::new(guard.get_inner(), &mut buf);
            loop {
                match reader.next() {
                    Ok(event) => {
                        if event
                            .events()
                            .contains(rustix::fs::inotify::ReadFlags::QUEUE_OVERFLOW)
                        {
                            overflowed = true;
                        }
                        let name = event.file_name().map(|n| n.to_bytes());
                        if name == Some(self.file.as_encoded_bytes()) {
                            touched = true;
                            renamed |= event
                                .events()
                                .contains(rustix::fs::inotify::ReadFlags::MOVED_TO);
                        }
                    }
                    Err(rustix::io::Errno::AGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    Err(e) => return Err(failed(e.into())),
                }
            }
            if touched || overflowed {
                let known = self.read_new(renamed);
                if overflowed || !known {
                    self.heard.clear();
                    return Ok(None);
                }
            }
        }
    }

    /// Reads what was appended since the last read into `heard`: whether
    /// every release since is known by name. Not when the file was put in
    /// place by a rename (started afresh, or rewritten whole by an older
    /// leaderd), deleted or replaced, nor when it held a line not written
    /// by [`announce_release`].
    fn read_new(&mut self, renamed: bool) -> bool {
        let current = std::fs::metadata(&self.path).ok();
        let same = match (&self.open, &current) {
            (Some(f), Some(now)) => f
                .metadata()
                .is_ok_and(|m| m.ino() == now.ino() && m.dev() == now.dev()),
            _ => false,
        };
        if same {
            return self.read_open() && !renamed;
        }
        // A file made where there was none holds only releases since; one
        // that replaced another may have taken lines meant for it.
        let first = self.open.is_none() && !self.unreadable && current.is_some();
        self.open = open_wake_file(&self.path, OpenOptions::new().read(true))
            .ok()
            .flatten();
        self.partial.clear();
        let readable = self.open.is_some();
        self.unreadable = !readable && self.path.symlink_metadata().is_ok();
        self.read_open() && first && readable && !renamed
    }

    /// Reads the open file from its offset; whether every line was known
    /// and the end reached.
    fn read_open(&mut self) -> bool {
        let Some(f) = &mut self.open else {
            return true;
        };
        // Cut short in place (emptied by hand, say): what it holds now is
        // read from its start, and what was cut is not known.
        let cut = match (f.metadata(), f.stream_position()) {
            (Ok(m), Ok(at)) => m.len() < at,
            _ => true,
        };
        if cut {
            self.partial.clear();
            let _ = f.seek(SeekFrom::Start(0));
        }
        let mut bytes = std::mem::take(&mut self.partial);
        let Ok(read) = f.take(READ_AT_MOST).read_to_end(&mut bytes) else {
            return false;
        };
        let mut known = (read as u64) < READ_AT_MOST;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for l in bytes[..complete]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            match name_of(l) {
                Some(name) => self.heard.push_back(name),
                None => known = false,
            }
        }
        // A line longer than any written here is not one of ours.
        if bytes.len() - complete > MAX_LINE {
            return false;
        }
        self.partial = bytes.split_off(complete);
        known && !cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_any_name_and_nothing_else_reads_as_one() {
        for name in ["e", "shard-7/ünï", "two\nlines", &"x".repeat(100)] {
            let mut out = Vec::new();
            line(name, &mut out);
            assert_eq!(out.last(), Some(&b'\n'));
            assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1, "{name:?}");
            assert_eq!(name_of(&out[..out.len() - 1]).as_deref(), Some(name));
        }
        for junk in [&b"e"[..], b"6", b"6g", b"", b"ff"] {
            assert_eq!(name_of(junk), None, "{junk:?}");
        }
    }
}
