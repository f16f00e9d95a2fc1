//! The leader flag file: exists only while this replica leads.
//!
//! Written atomically (temp file in the same directory, then rename) at every
//! grant and renewal, removed on step-down and shutdown, and a stale one is
//! removed at start. Readers must still check `expires_at_unix_ms`: after
//! SIGKILL or SIGSTOP the file can outlive the lease.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

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

    /// Atomically replaces the file with the current lease.
    pub fn write(
        &self,
        election: &str,
        id: &str,
        token: i64,
        expires_at_unix_ms: u64,
    ) -> io::Result<()> {
        let body = serde_json::to_vec(&Content {
            election,
            id,
            token,
            expires_at_unix_ms,
        })
        .map_err(io::Error::other)?;
        let mut f = std::fs::File::create(&self.tmp)?;
        f.write_all(&body)?;
        f.write_all(b"\n")?;
        drop(f);
        std::fs::rename(&self.tmp, &self.path)
    }

    /// Removes the file; a missing file is fine.
    pub fn remove(&self) -> io::Result<()> {
        let _ = std::fs::remove_file(&self.tmp);
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_replaces_and_remove_is_idempotent() {
        let dir = std::env::temp_dir().join(format!("leaderd-flag-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let flag = FlagFile::new(dir.join("leader"));
        flag.write("default", "pod-a", 7, 1_000).unwrap();
        flag.write("default", "pod-a", 8, 2_000).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(flag.path()).unwrap()).unwrap();
        assert_eq!(v["token"], 8);
        assert_eq!(v["expires_at_unix_ms"], 2_000);
        assert_eq!(v["id"], "pod-a");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temp file left"
        );
        flag.remove().unwrap();
        flag.remove().unwrap();
        assert!(!flag.path().exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
