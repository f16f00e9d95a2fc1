//! SQLite: the embedded default, for one host (several processes may share
//! one file).
//!
//! SQLite has no server clock, so its "database clock" is the host's
//! `CLOCK_BOOTTIME`, shared by every process on the host and immune to
//! wall-clock changes; rows record the boot they were written in. A row from
//! another boot has times on a clock this process cannot read, so it is not
//! taken on its face: it is taken once this process has watched it stay
//! unchanged for longer than its lease (no holder anywhere has renewed it, so
//! none can still lead). That covers a reboot (one ttl's wait) and a file that
//! somehow is shared with another host.
//!
//! The file must be on a local file system: network and FUSE file systems
//! are refused (SQLite's locking is unreliable there, and two hosts would
//! each see the other's boot as foreign). The file runs in WAL mode so
//! readers never block, with `synchronous = FULL` so a committed take
//! survives a power loss (else the next take could hand out the same token),
//! and a short busy timeout for writers. Every `UPDATE` takes SQLite's write
//! lock, so followers only read (see `cas`).

use diesel::connection::SimpleConnection;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::{Connection as _, SqliteConnection};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};

use crate::cas::{CasBatch, CasOps};
use crate::history::{Term, TermParts, TermSql};
use crate::migrate;
use crate::sql::{Bind, Stmt};
use crate::{
    as_heir, boot_id, boot_now, observed, DatabaseUrl, ElectionRow, FenceStatus, LeaseRequest,
    Migrated, Observed, Release, RowParts, StoreError,
};

/// Connection set-up; see [`open`] and the module docs.
const SETUP: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;";

/// Set-up may wait for another process's this long.
const SETUP_BUSY: &str = "PRAGMA busy_timeout = 5000;";

/// The steps' work is there.
macro_rules! schema_current {
    () => {
        "SELECT (SELECT COUNT(*) FROM sqlite_master \
        WHERE (type = 'table' AND name IN ('service_leader_lock', 'service_leader_token')) \
           OR (type = 'trigger' AND name = 'service_leader_keep_token')) = 3"
    };
}

/// `BEGIN IMMEDIATE` takes the write lock first, so concurrent migrations run
/// one after another and the later ones find the work done.
const MIGRATION: migrate::Plan = migrate::Plan {
    // SQLite has no fence to install: the app's recipe needs nothing of
    // the migration.
    current: concat!(
        "SELECT (",
        schema_current!(),
        ") AND (",
        migrate::sqlite_column_present!("successor"),
        ") AND (",
        migrate::address_present!(sqlite_column_present),
        ") AND (",
        migrate::sqlite_history_current!(),
        ")"
    ),
    steps_current: schema_current!(),
    // The write lock, waited for 5 s at most by the busy timeout.
    lock: "PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE",
    try_lock: "SELECT 1",
    claim: None,
    unlock: "COMMIT",
    steps: migrate::SQLITE,
    columns: &[migrate::SQLITE_SUCCESSOR, migrate::SQLITE_ADDRESS],
    tune: None,
    legacy: "SELECT EXISTS (SELECT 1 FROM sqlite_master \
        WHERE type = 'table' AND name = '__diesel_schema_migrations')",
    retry_busy: false,
    fence: None,
    extras: &[migrate::SQLITE_HISTORY],
};

migrate::diesel_migrator!(SyncConnectionWrapper<SqliteConnection>);

/// For the lease statements the busy timeout is short: writers hold the lock
/// for microseconds, and an attempt must not outlive the lease it protects.
const STATEMENTS: &str = "PRAGMA busy_timeout = 500;";

const RENEW: &str =
    "UPDATE service_leader_lock SET renewed_at = ?, expires_at = MAX(expires_at, ?) \
    WHERE name = ? AND instance = ? AND token = ? AND boot_id = ? AND expires_at > ?";

/// The row, with the holder's address (only while the instance that wrote
/// it holds the row).
const OBSERVE: &str = "SELECT holder, instance, token, boot_id, expires_at, \
    COALESCE(renewed_at, -1), successor, \
    CASE WHEN address_instance = instance THEN address END \
    FROM service_leader_lock WHERE name = ?";

/// A compare-and-set on the row exactly as observed: any renewal, take or
/// release since then changes `expires_at` or `renewed_at`. Writes the
/// taker's address with its instance.
const TAKE: &str = "UPDATE service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, boot_id = ?, successor = NULL, \
        address = ?, address_instance = ?, \
        acquired_at = ?, renewed_at = ?, expires_at = ? \
    WHERE name = ? AND token = ? AND boot_id = ? AND expires_at = ? \
      AND COALESCE(renewed_at, -1) = ?";

/// Creates a missing row, its token above the wall clock's seed and above
/// any token a deleted row of the election carried (`WHERE true` tells
/// SQLite's parser the `ON CONFLICT` is the upsert's). Binds: name, seed,
/// name, boot id, expiry.
const CREATE: &str = "INSERT INTO service_leader_lock (name, token, boot_id, expires_at) \
    SELECT ?, MAX(?, COALESCE((SELECT token + 1 FROM service_leader_token WHERE name = ?), 0)), ?, ? \
    WHERE true ON CONFLICT (name) DO NOTHING";

/// Released to a successor, the row stays blocked for its window
/// (`crate::Successor`). `renewed_at` is the release's time, which the
/// record of terms reads as the term's end. Binds: successor, time,
/// expiry, name, instance.
const RELEASE: &str = "UPDATE service_leader_lock \
    SET holder = NULL, instance = NULL, successor = ?, renewed_at = ?, expires_at = ?, \
        address = NULL, address_instance = NULL \
    WHERE name = ? AND instance = ?";

/// The rows whose name starts with the bind (after the clock's two; every
/// row for `''`).
const ELECTIONS: &str = "SELECT name, holder, token, \
    CASE WHEN boot_id = ? THEN expires_at - ? ELSE -1 END, instance, \
    CASE WHEN instance IS NOT NULL AND boot_id = ? THEN ? - acquired_at END, \
    CASE WHEN address_instance = instance THEN address END \
    FROM service_leader_lock WHERE substr(name, 1, length(?)) = ? ORDER BY name";

/// The boot clock in microseconds: SQLite's "database clock".
fn now_us() -> i64 {
    i64::try_from(boot_now().since_boot().as_micros()).unwrap_or(i64::MAX)
}

fn open(path: &str) -> Result<SqliteConnection, StoreError> {
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

fn is_locked(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("locked") || info.message().contains("busy"))
}

/// File systems SQLite cannot be shared on safely, by `statfs` magic: network
/// file systems, FUSE (sshfs, s3fs, gluster, virtiofs…) and cluster file
/// systems.
const UNSAFE_FILE_SYSTEMS: &[(i64, &str)] = &[
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

/// The row as `OBSERVE` read it, for the compare-and-set in `take` and for
/// watching a row from another boot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SeenRow {
    token: i64,
    boot_id: String,
    expires_at: i64,
    /// -1 when never renewed.
    renewed_at: i64,
}

/// A row from another boot, and when (on our clock) we first saw it as it is.
#[derive(Debug)]
struct Foreign {
    row: SeenRow,
    since_us: i64,
}

/// The file beside the database that a release rewrites (with the
/// election's name) to wake the processes waiting on this host.
fn wake_file(db_path: &str) -> std::path::PathBuf {
    let mut name = std::path::Path::new(db_path)
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".leaderd-wake");
    std::path::Path::new(db_path).with_file_name(name)
}

/// Wakes the waiting processes: writes the wake file by rename, so watchers
/// see one complete write.
fn announce_release(db_path: &str, election: &str) -> std::io::Result<()> {
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

/// A SQLite connection holding the lock-table statements.
pub struct SqliteStore {
    conn: SyncConnectionWrapper<SqliteConnection>,
    path: String,
    boot_id: String,
    /// Per election, its row as last observed (what a take compares
    /// against).
    seen: std::collections::HashMap<String, SeenRow>,
    /// Per election, its row from another boot that has not changed since
    /// `since_us`. One per election: the daemon's elections share this
    /// connection, and one slot for all restarted every election's wait at
    /// each look at another's row, so after a reboot none was ever taken.
    foreign: std::collections::HashMap<String, Foreign>,
}

opaque_debug!(SqliteStore);

impl SqliteStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let path = url.sqlite_path().unwrap_or_default().to_owned();
        check_file_system(&path)?;
        let boot_id =
            boot_id().map_err(|e| StoreError::Local(format!("cannot read the boot id: {e}")))?;
        let p = path.clone();
        let conn = crate::run_blocking(move || {
            let mut conn = open(&p)?;
            conn.batch_execute(STATEMENTS)?;
            Ok(conn)
        })
        .await?;
        Ok(Self {
            conn: SyncConnectionWrapper::new(conn),
            path,
            boot_id,
            seen: std::collections::HashMap::new(),
            foreign: std::collections::HashMap::new(),
        })
    }

    pub(crate) async fn release(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        let released = self.release_row(item).await?;
        if released {
            self.announce(item.election);
        }
        Ok(released)
    }

    /// [`SqliteStore::release`] for several elections, in one transaction
    /// (one commit, where a commit each would wait for the disk once per
    /// election within the shutdown's budget), with one wake-up (the
    /// waiters wake every election on any: see [`FileWaiter`]).
    pub(crate) async fn release_many(
        &mut self,
        items: &[Release<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.begin().await?;
        let released = self.release_each(items).await;
        let released = self.end(released).await?;
        if let Some((item, _)) = items.iter().zip(&released).find(|(_, r)| **r) {
            self.announce(item.election);
        }
        Ok(released)
    }

    async fn release_each(&mut self, items: &[Release<'_>]) -> Result<Vec<bool>, StoreError> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            out.push(self.release_row(item).await?);
        }
        Ok(out)
    }

    async fn release_row(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        let now = now_us();
        let n = Stmt::<()>::new(
            RELEASE,
            [
                item.successor
                    .map_or(Bind::NullText, |s| Bind::Text(s.daemon)),
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(item.window_us())),
                Bind::Text(item.election),
                Bind::Text(item.instance),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    fn announce(&self, election: &str) {
        if let Err(e) = announce_release(&self.path, election) {
            // The others find the row free at their next poll.
            tracing::warn!(error = %e, "could not wake the waiting processes");
        }
    }

    /// Opens a write transaction (`BEGIN IMMEDIATE`: the write lock
    /// first, so nothing in it waits half-way). Ended by
    /// [`SqliteStore::end`]; a caller that gives up half-way drops the
    /// connection, which rolls it back.
    async fn begin(&mut self) -> Result<(), StoreError> {
        Ok(self.conn.batch_execute("BEGIN IMMEDIATE").await?)
    }

    /// Commits what [`SqliteStore::begin`] opened, or rolls it back when
    /// `result` is an error.
    async fn end<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        match result {
            Ok(value) => match self.conn.batch_execute("COMMIT").await {
                Ok(()) => Ok(value),
                Err(e) => {
                    // Never leave it open: what it wrote must not look
                    // committed to a later statement on this connection.
                    let _ = self.conn.batch_execute("ROLLBACK").await;
                    Err(e.into())
                }
            },
            Err(e) => {
                let _ = self.conn.batch_execute("ROLLBACK").await;
                Err(e)
            }
        }
    }

    /// The record of terms, newest first (`None`: not installed). Times
    /// of this boot's terms are given on the host's wall clock, from their
    /// age on the boot clock.
    pub(crate) async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        let now = now_us();
        let wall = std::time::SystemTime::now();
        let (boot, name) = (
            Bind::Text(&self.boot_id),
            election.map_or(Bind::NullText, Bind::Text),
        );
        let at = Bind::BigInt(now);
        let rows: Result<Vec<TermParts>, _> = Stmt::<TermSql>::new(
            crate::history::SQLITE,
            [
                boot,
                at,
                boot,
                at,
                boot,
                at,
                at,
                boot,
                at,
                name,
                name,
                Bind::BigInt(limit),
            ],
        )
        .load(&mut self.conn)
        .await;
        let terms = match rows {
            Err(e) if crate::history::missing_table_diesel(&e) => return Ok(None),
            rows => rows?,
        };
        let when = |ago: Option<i64>| {
            ago.and_then(|us| {
                wall.checked_sub(std::time::Duration::from_micros(us.try_into().ok()?))
            })
            .map(crate::history::rfc3339)
        };
        Ok(Some(
            terms
                .into_iter()
                .map(|parts| {
                    let mut term = Term::from(parts);
                    term.began_at = when(term.began_ago_us);
                    term.ended_at = when(term.ended_ago_us);
                    term
                })
                .collect(),
        ))
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        let now = now_us();
        let rows: Vec<RowParts> = Stmt::<(
            Text,
            Nullable<Text>,
            BigInt,
            BigInt,
            Nullable<Text>,
            Nullable<BigInt>,
            Nullable<Text>,
        )>::new(
            ELECTIONS,
            [
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
                Bind::Text(&self.boot_id),
                Bind::BigInt(now),
                Bind::Text(prefix),
                Bind::Text(prefix),
            ],
        )
        .load(&mut self.conn)
        .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        migrate::run(&mut self.conn, &MIGRATION).await
    }

    pub(crate) async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        migrate::fence_status(&mut self.conn, &MIGRATION).await
    }

    /// What is left of a row's lease by the clock this process can read.
    /// Same boot: its expiry. Another boot: at least the row's own lease
    /// length (and our ttl) after we first saw it unchanged, since any holder
    /// renews well within its lease.
    fn remaining_us(&mut self, election: &str, row: &SeenRow, ttl_us: i64, now: i64) -> i64 {
        if row.boot_id == self.boot_id {
            self.foreign.remove(election);
            return row.expires_at - now;
        }
        let since = match self.foreign.get(election) {
            Some(f) if f.row == *row => f.since_us,
            _ => {
                self.foreign.insert(
                    election.to_owned(),
                    Foreign {
                        row: row.clone(),
                        since_us: now,
                    },
                );
                now
            }
        };
        let lease = if row.renewed_at >= 0 {
            row.expires_at.saturating_sub(row.renewed_at)
        } else {
            0
        };
        let lease = lease.max(ttl_us);
        since
            .saturating_add(lease)
            .saturating_add(FOREIGN_SLACK_US + lease / 100)
            .saturating_sub(now)
    }
}

/// Waited on top of a foreign row's lease (plus 1 % of it): covers two
/// clocks running at slightly different rates.
const FOREIGN_SLACK_US: i64 = 50_000;

/// A lease request, owned, for statements run in a blocking task.
#[derive(Debug, Clone)]
struct Lease {
    election: String,
    holder: String,
    instance: String,
    ttl_us: i64,
    /// How long a row made for it stays blocked (`LeaseRequest::block_us`).
    block_us: i64,
    address: Option<String>,
}

impl Lease {
    fn of(req: &LeaseRequest<'_>) -> Self {
        Self {
            election: req.election.to_owned(),
            holder: req.holder.to_owned(),
            instance: req.instance.to_owned(),
            ttl_us: req.ttl_us(),
            block_us: req.block_us(),
            address: req.address.map(str::to_owned),
        }
    }
}

/// The lease statements, run synchronously on the connection inside one
/// blocking task: a batch of thousands costs one hand-off to the blocking
/// pool, not one per statement, and its writes one transaction (one commit,
/// one wait for the disk).
mod run {
    use diesel::sql_types::{BigInt, Nullable, Text};
    use diesel::{QueryResult, RunQueryDsl, SqliteConnection};

    use super::{now_us, Lease, SeenRow, CREATE, OBSERVE, RENEW, TAKE};
    use crate::sql::{Bind, Stmt};

    /// A row as `OBSERVE` reads it: holder, instance, address, the rest,
    /// and the successor it was released to.
    pub(super) type Seen = (
        Option<String>,
        Option<String>,
        Option<String>,
        SeenRow,
        Option<String>,
    );

    pub(super) fn renew(
        c: &mut SqliteConnection,
        boot_id: &str,
        lease: &Lease,
        token: i64,
    ) -> QueryResult<bool> {
        let now = now_us();
        let n = Stmt::<()>::new(
            RENEW,
            [
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(lease.ttl_us)),
                Bind::Text(&lease.election),
                Bind::Text(&lease.instance),
                Bind::BigInt(token),
                Bind::Text(boot_id),
                Bind::BigInt(now),
            ],
        )
        .execute(c)?;
        Ok(n > 0)
    }

    pub(super) fn observe(c: &mut SqliteConnection, election: &str) -> QueryResult<Option<Seen>> {
        type Row = (
            Option<String>,
            Option<String>,
            i64,
            String,
            i64,
            i64,
            Option<String>,
            Option<String>,
        );
        type RowSql = (
            Nullable<Text>,
            Nullable<Text>,
            BigInt,
            Text,
            BigInt,
            BigInt,
            Nullable<Text>,
            Nullable<Text>,
        );
        let rows: Vec<Row> = Stmt::<RowSql>::new(OBSERVE, [Bind::Text(election)]).load(c)?;
        Ok(rows.into_iter().next().map(
            |(holder, instance, token, boot_id, expires_at, renewed_at, successor, address)| {
                let row = SeenRow {
                    token,
                    boot_id,
                    expires_at,
                    renewed_at,
                };
                (holder, instance, address, row, successor)
            },
        ))
    }

    /// The compare-and-set on the row exactly as `seen`.
    pub(super) fn take(
        c: &mut SqliteConnection,
        boot_id: &str,
        lease: &Lease,
        seen: &SeenRow,
    ) -> QueryResult<bool> {
        let now = now_us();
        let n = Stmt::<()>::new(
            TAKE,
            [
                Bind::Text(&lease.holder),
                Bind::Text(&lease.instance),
                Bind::Text(boot_id),
                lease.address.as_deref().map_or(Bind::NullText, Bind::Text),
                Bind::Text(&lease.instance),
                Bind::BigInt(now),
                Bind::BigInt(now),
                Bind::BigInt(now.saturating_add(lease.ttl_us)),
                Bind::Text(&lease.election),
                Bind::BigInt(seen.token),
                Bind::Text(&seen.boot_id),
                Bind::BigInt(seen.expires_at),
                Bind::BigInt(seen.renewed_at),
            ],
        )
        .execute(c)?;
        Ok(n > 0)
    }

    pub(super) fn create(
        c: &mut SqliteConnection,
        boot_id: &str,
        lease: &Lease,
    ) -> QueryResult<()> {
        // The boot clock restarts at every boot, so a re-created row seeds
        // its token from the wall clock instead, and above what a deleted
        // row carried (the wall clock may have stepped back): tokens must
        // never go backwards.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        Stmt::<()>::new(
            CREATE,
            [
                Bind::Text(&lease.election),
                Bind::BigInt(seed),
                Bind::Text(&lease.election),
                Bind::Text(boot_id),
                Bind::BigInt(now_us().saturating_add(lease.block_us)),
            ],
        )
        .execute(c)?;
        Ok(())
    }

    /// `f` for each item, in one write transaction (`BEGIN IMMEDIATE`: the
    /// write lock first, so no take slips between one item's check and its
    /// write, and nothing waits half-way); one commit for all.
    pub(super) fn each<T, R>(
        c: &mut SqliteConnection,
        items: &[T],
        mut f: impl FnMut(&mut SqliteConnection, &T) -> QueryResult<R>,
    ) -> QueryResult<Vec<R>> {
        c.immediate_transaction(|c| items.iter().map(|item| f(c, item)).collect())
    }
}

impl SqliteStore {
    /// `f` run on the connection in one blocking task.
    async fn blocking<R: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut SqliteConnection, &str) -> diesel::QueryResult<R> + Send + 'static,
    ) -> Result<R, StoreError> {
        let boot_id = self.boot_id.clone();
        Ok(self.conn.spawn_blocking(move |c| f(c, &boot_id)).await?)
    }

    /// What `observe` answers for a row `run::observe` read just now; keeps
    /// the row for the take that may follow.
    fn seen(&mut self, lease: &LeaseRequest<'_>, seen: Option<run::Seen>) -> Option<Observed> {
        let now = now_us();
        let Some((holder, instance, address, row, successor)) = seen else {
            self.seen.remove(lease.election);
            return None;
        };
        let remaining_us = self.remaining_us(lease.election, &row, lease.ttl_us(), now);
        let token = row.token;
        self.seen.insert(lease.election.to_owned(), row);
        let seen = observed((holder, instance, token, remaining_us, address));
        Some(as_heir(lease, seen, successor.as_deref()))
    }

    /// The row last observed for `election`, if its token is still
    /// `seen_token` (the take's compare-and-set is on all of it).
    fn seen_for_take(&mut self, election: &str, seen_token: i64) -> Option<SeenRow> {
        self.seen.remove(election).filter(|s| s.token == seen_token)
    }
}

impl CasOps for SqliteStore {
    /// In one transaction: under `synchronous = FULL` every commit waits
    /// for the disk, and a commit per lease made hundreds of renewals late.
    async fn renew_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let items: Vec<(Lease, i64)> = items.iter().map(|(r, t)| (Lease::of(r), *t)).collect();
        self.blocking(move |c, boot| run::each(c, &items, |c, (l, t)| run::renew(c, boot, l, *t)))
            .await
    }

    async fn renew(&mut self, req: &LeaseRequest<'_>, token: i64) -> Result<bool, StoreError> {
        let lease = Lease::of(req);
        self.blocking(move |c, boot| run::renew(c, boot, &lease, token))
            .await
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let election = req.election.to_owned();
        let seen = self
            .blocking(move |c, _| run::observe(c, &election))
            .await?;
        Ok(self.seen(req, seen))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let Some(seen) = self.seen_for_take(req.election, seen_token) else {
            return Ok(false);
        };
        let lease = Lease::of(req);
        let taken = self
            .blocking(move |c, boot| run::take(c, boot, &lease, &seen))
            .await?;
        self.foreign.remove(req.election);
        Ok(taken)
    }

    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError> {
        let lease = Lease::of(req);
        self.blocking(move |c, boot| run::create(c, boot, &lease))
            .await
    }
}

/// Followers' reads in one blocking task (WAL: reads take no lock), their
/// takes in one transaction and their creates in another: a survivor that
/// must take over thousands of elections at once commits once for all of
/// them. A commit each (a disk flush each, under `synchronous = FULL`) ran
/// the batch past its budget, and every take with it, again and again.
impl CasBatch for SqliteStore {
    async fn observe_all(
        &mut self,
        reqs: &[&LeaseRequest<'_>],
    ) -> Result<Vec<Option<Observed>>, StoreError> {
        let names: Vec<String> = reqs.iter().map(|r| r.election.to_owned()).collect();
        let seen = self
            .blocking(move |c, _| names.iter().map(|n| run::observe(c, n)).collect())
            .await?;
        let seen: Vec<Option<run::Seen>> = seen;
        Ok(reqs
            .iter()
            .zip(seen)
            .map(|(req, seen)| self.seen(req, seen))
            .collect())
    }

    async fn take_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        // Only rows observed with that token are tried (the others are not
        // taken, as `take` answers alone).
        let mut tried = Vec::new();
        let mut places = Vec::new();
        for (i, (req, token)) in items.iter().enumerate() {
            if let Some(seen) = self.seen_for_take(req.election, *token) {
                tried.push((Lease::of(req), seen));
                places.push(i);
            }
        }
        let mut out = vec![false; items.len()];
        if tried.is_empty() {
            return Ok(out);
        }
        let taken = self
            .blocking(move |c, boot| run::each(c, &tried, |c, (l, s)| run::take(c, boot, l, s)))
            .await?;
        for (i, taken) in places.into_iter().zip(taken) {
            self.foreign.remove(items[i].0.election);
            out[i] = taken;
        }
        Ok(out)
    }

    async fn create_all(&mut self, reqs: &[&LeaseRequest<'_>]) -> Result<(), StoreError> {
        let leases: Vec<Lease> = reqs.iter().map(|r| Lease::of(r)).collect();
        self.blocking(move |c, boot| run::each(c, &leases, |c, l| run::create(c, boot, l)))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_migration_check_asks_every_part() {
        MIGRATION.assert_current_asks_every_check();
    }

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
