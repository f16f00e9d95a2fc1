//! Opening the SQLite file safely: only on a local file system, in WAL
//! mode with full syncs, off the async threads.

use diesel::connection::SimpleConnection;
use diesel::{Connection as _, SqliteConnection};

use crate::shared::error::StoreError;

/// Connection set-up; see [`open`] and the module docs.
pub(super) const SETUP: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;";

/// Set-up may wait for another process's this long.
pub(super) const SETUP_BUSY: &str = "PRAGMA busy_timeout = 5000;";

pub(super) fn open(path: &str) -> Result<SqliteConnection, StoreError> {
    let mut conn = SqliteConnection::establish(path).map_err(StoreError::Connect)?;
    conn.batch_execute(SETUP_BUSY)?;
    // Switching a new file to WAL needs it exclusively, and SQLite answers
    // "locked" at once (without waiting) when that could deadlock with a
    // writer, e.g. several processes creating the file together: retry.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match conn.batch_execute(SETUP) {
            Ok(()) => return Ok(conn),
            Err(e) if is_locked(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) fn is_locked(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("locked") || info.message().contains("busy"))
}

/// File systems SQLite cannot be shared on safely, by `statfs` magic: network
/// file systems, FUSE (sshfs, s3fs, gluster, virtiofs…) and cluster file
/// systems.
pub(super) const UNSAFE_FILE_SYSTEMS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517b, "SMB"),
    (0xff53_4d42, "CIFS"),
    (0xfe53_4d42, "SMB2"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9P"),
    (0x00c3_6400, "CephFS"),
    (0x5346_414f, "AFS"),
    (0x7375_7245, "Coda"),
    (0x0bd0_0bd0, "Lustre"),
    (0x0116_1970, "GFS2"),
    (0x7461_636f, "OCFS2"),
    (0x4750_4653, "GPFS"),
    (0x2003_0528, "OrangeFS"),
    (0x0000_564c, "NCP"),
];

/// The name of an unsafe file system type, `None` when local.
pub(crate) fn unsafe_file_system(f_type: i64) -> Option<&'static str> {
    UNSAFE_FILE_SYSTEMS
        .iter()
        .find(|(magic, _)| *magic == f_type)
        .map(|(_, name)| *name)
}

/// Refuses a database file on a network or FUSE file system. The file may not
/// exist yet: then its directory is checked.
pub fn check_file_system(path: &str) -> Result<(), StoreError> {
    let p = std::path::Path::new(path);
    let target = if p.exists() {
        p.to_path_buf()
    } else {
        match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        }
    };
    // A directory that does not exist is reported by SQLite when it opens.
    let Ok(st) = rustix::fs::statfs(&target) else {
        return Ok(());
    };
    #[expect(
        clippy::unnecessary_cast,
        reason = "f_type's integer type differs between architectures"
    )]
    let f_type = st.f_type as i64;
    match unsafe_file_system(f_type) {
        None => Ok(()),
        Some(fs) => Err(StoreError::UnsafeFile(format!(
            "sqlite://{path} is on a {fs} file system: SQLite's locking is not reliable \
             there, and replicas on two hosts would both lead. Keep the file on a local \
             disk (one host), or use PostgreSQL or MySQL for several hosts"
        ))),
    }
}

/// Runs blocking work (migrations, opening SQLite) off the async threads.
pub(super) async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Local(format!("blocking task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_fuse_file_systems_are_unsafe() {
        assert_eq!(unsafe_file_system(0x6969), Some("NFS"));
        assert_eq!(unsafe_file_system(0x6573_5546), Some("FUSE"));
        assert_eq!(unsafe_file_system(0xff53_4d42), Some("CIFS"));
        // ext4, xfs, btrfs, tmpfs, overlayfs
        for local in [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994, 0x794c_7630] {
            assert_eq!(unsafe_file_system(local), None, "{local:#x}");
        }
    }

    #[test]
    fn the_local_temp_dir_is_accepted() {
        let dir = std::env::temp_dir().join("leaderd-fs-check.db");
        check_file_system(dir.to_str().unwrap()).unwrap();
    }
}
