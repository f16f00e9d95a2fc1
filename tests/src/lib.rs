//! Test harness for leaderd: throwaway databases on the real servers, real
//! `leaderd` processes, and waiting on conditions with deadlines.
//!
//! Servers are found through `TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); each test gets its own fresh
//! database, dropped when the test ends.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

pub mod app;
pub mod certs;
pub mod checker;
pub mod galera;
pub mod mariadbserver;
pub mod pgbouncer;
pub mod pgserver;
pub mod proxy;
pub mod replicas;
pub mod sqlstate;
pub mod sse;
pub mod store;
pub mod surroundings;
pub mod traps;

pub use serde_json::Value;

/// The admin URL of the PostgreSQL server the tests use.
pub fn postgres_admin_url() -> String {
    std::env::var("TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The admin URL of the MySQL/MariaDB server the tests use.
pub fn mysql_admin_url() -> String {
    std::env::var("TEST_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// Runs a future to completion on a private runtime in its own thread, so it
/// works from sync tests, async tests and `Drop` alike.
pub fn block_on<F, T>(f: F) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("test runtime")
            .block_on(f)
    })
    .join()
    .expect("test helper thread panicked")
}

/// Runs SQL statements on a PostgreSQL `url`, panicking on failure.
pub fn pg_exec(url: &str, statements: &[&str]) {
    exec(Kind::Postgres, url, statements);
}

/// Runs one SQL statement on the MySQL/MariaDB admin URL, panicking on
/// failure.
pub fn mysql_exec(sql: &str) {
    exec(Kind::Mysql, &mysql_admin_url(), &[sql]);
}

/// A plain PostgreSQL session on `url` (an app's, a role's), its
/// connection driven in the background; panics naming why it cannot connect.
pub async fn pg_session(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(conn);
    client
}

/// Drops PostgreSQL roles a test made, and what they own in the database
/// of `url`; best effort (a test's end must not panic twice).
pub fn drop_pg_roles(url: &str, roles: &[String]) {
    let (url, roles) = (url.to_owned(), roles.to_vec());
    let _ = std::panic::catch_unwind(move || {
        for r in &roles {
            let _ = std::panic::catch_unwind(|| {
                pg_exec(
                    &url,
                    &[
                        &format!("ALTER ROLE {r} NOSUPERUSER"),
                        &format!("DROP OWNED BY {r}"),
                    ],
                )
            });
            pg_exec(
                &postgres_admin_url(),
                &[&format!("DROP ROLE IF EXISTS {r}")],
            );
        }
    });
}

/// A PostgreSQL login role made for one test (an app's, a daemon's), named
/// `leaderd_<what>_<random>`; dropped with what it owns in the database it
/// was made for when the value is.
#[derive(Debug)]
pub struct PgRole {
    pub name: String,
    admin: String,
}

impl PgRole {
    pub fn new(db: &TempDb, what: &str) -> PgRole {
        let name = format!(
            "leaderd_{what}_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        db.exec(&[&format!("CREATE ROLE {name} LOGIN")]);
        PgRole {
            name,
            admin: db.url.clone(),
        }
    }
}

impl Drop for PgRole {
    fn drop(&mut self) {
        drop_pg_roles(&self.admin, std::slice::from_ref(&self.name));
    }
}

/// Drops MySQL/MariaDB users a test made; best effort.
pub fn drop_mysql_users(users: &[String]) {
    let users = users.to_vec();
    let _ = std::panic::catch_unwind(move || {
        for u in users {
            mysql_exec(&format!("DROP USER IF EXISTS '{u}'@'%'"));
        }
    });
}

/// Runs SQL statements on `url`, panicking on failure.
fn exec(kind: Kind, url: &str, statements: &[&str]) {
    let url = url.to_owned();
    let statements: Vec<String> = statements.iter().map(|s| s.to_string()).collect();
    block_on(async move {
        use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};
        match kind {
            Kind::Postgres => {
                let mut conn = AsyncPgConnection::establish(&url)
                    .await
                    .expect("connect to test PostgreSQL");
                for sql in statements {
                    diesel::sql_query(&sql)
                        .execute(&mut conn)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
            Kind::Mysql => {
                let mut conn = AsyncMysqlConnection::establish(&url)
                    .await
                    .expect("connect to test MariaDB");
                for sql in statements {
                    conn.batch_execute(&sql)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
            Kind::Sqlite => {
                use diesel::connection::SimpleConnection;
                use diesel::Connection;
                let path = url.trim_start_matches("sqlite://");
                let mut conn = diesel::SqliteConnection::establish(path).expect("open test SQLite");
                conn.batch_execute("PRAGMA busy_timeout = 5000")
                    .expect("busy timeout");
                for sql in statements {
                    conn.batch_execute(&sql)
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
        }
    })
}

/// The database families under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    Mysql,
    Sqlite,
}

/// A PostgreSQL `url` (its host, port, database and parameters) logging
/// in as `role`.
fn postgres_url_as(url: &str, role: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    format!("postgres://{role}@{host}")
}

/// A fresh database (PostgreSQL or MariaDB database, or SQLite file), dropped
/// at the end of the test.
#[derive(Debug)]
pub struct TempDb {
    /// The URL leaderd is given (with any TLS parameters).
    pub url: String,
    /// The URL the harness itself uses (the driver's own parameters only).
    plain: String,
    /// The pooler `url` goes through, if any; it goes with the database.
    bouncer: Option<pgbouncer::PgBouncer>,
    pub kind: Kind,
    name: String,
    admin: String,
    _dir: Option<Scratch>,
}

impl TempDb {
    pub fn postgres() -> TempDb {
        Self::server(Kind::Postgres, postgres_admin_url())
    }

    pub fn mysql() -> TempDb {
        Self::server(Kind::Mysql, mysql_admin_url())
    }

    pub fn sqlite() -> TempDb {
        let dir = Scratch::new();
        let url = format!("sqlite://{}", dir.path("leaderd.db").display());
        TempDb {
            bouncer: None,
            plain: url.clone(),
            url,
            kind: Kind::Sqlite,
            name: String::new(),
            admin: String::new(),
            _dir: Some(dir),
        }
    }

    /// A fresh database on the local PostgreSQL, which leaderd reaches with
    /// these URL parameters (e.g. `sslmode=require`).
    pub fn postgres_with(params: &str) -> TempDb {
        Self::server(Kind::Postgres, postgres_admin_url()).with_params(params)
    }

    /// A fresh database on the MySQL/MariaDB server of `admin` (whose query,
    /// if any, holds mysql_async's own parameters for the harness).
    pub fn mysql_on(admin: &str, params: &str) -> TempDb {
        Self::server(Kind::Mysql, admin.to_owned()).with_params(params)
    }

    /// A fresh PostgreSQL database that leaderd reaches through its own
    /// PgBouncer in transaction pooling with `pool_size` server connections
    /// (the harness still connects directly).
    pub fn postgres_through_pgbouncer(pool_size: u32) -> TempDb {
        let mut db = Self::postgres();
        let bouncer = pgbouncer::PgBouncer::start(pool_size);
        db.url = format!("postgres://postgres@127.0.0.1:{}/{}", bouncer.port, db.name);
        db.bouncer = Some(bouncer);
        db
    }

    /// The PgBouncer in front of this database, if any.
    pub fn pgbouncer(&self) -> Option<&pgbouncer::PgBouncer> {
        self.bouncer.as_ref()
    }

    fn with_params(mut self, params: &str) -> TempDb {
        let path = self.url.split('?').next().unwrap_or_default().to_owned();
        self.url = if params.is_empty() {
            path
        } else {
            format!("{path}?{params}")
        };
        self
    }

    fn server(kind: Kind, admin: String) -> TempDb {
        let name = format!("leaderd_t_{}", uuid::Uuid::new_v4().simple());
        exec(kind, &admin, &[&format!("CREATE DATABASE {name}")]);
        let (admin_path, query) = match admin.split_once('?') {
            Some((p, q)) => (p, format!("?{q}")),
            None => (admin.as_str(), String::new()),
        };
        let base = admin_path.rsplit_once('/').map_or(admin_path, |(b, _)| b);
        TempDb {
            url: format!("{base}/{name}"),
            plain: format!("{base}/{name}{query}"),
            bouncer: None,
            kind,
            name,
            admin,
            _dir: None,
        }
    }

    /// The database's name on its server (empty for SQLite).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs SQL statements on this database.
    pub fn exec(&self, statements: &[&str]) {
        exec(self.kind, &self.plain, statements);
    }

    /// The value of one SQL expression (or scalar subquery) as text.
    pub fn scalar(&self, expr: &str) -> String {
        let cast = match self.kind {
            Kind::Postgres => format!("SELECT ({expr})::text AS v"),
            Kind::Mysql => format!("SELECT CAST(({expr}) AS CHAR) AS v"),
            Kind::Sqlite => format!("SELECT CAST(({expr}) AS TEXT) AS v"),
        };
        let (kind, url) = (self.kind, self.plain.clone());
        block_on(async move {
            use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
            #[derive(diesel::QueryableByName)]
            struct V {
                #[diesel(sql_type = diesel::sql_types::Text)]
                v: String,
            }
            let rows: Vec<V> = match kind {
                Kind::Postgres => {
                    let mut c = AsyncPgConnection::establish(&url).await.unwrap();
                    diesel::sql_query(&cast).load(&mut c).await
                }
                Kind::Mysql => {
                    let mut c = AsyncMysqlConnection::establish(&url).await.unwrap();
                    diesel::sql_query(&cast).load(&mut c).await
                }
                Kind::Sqlite => {
                    use diesel::Connection;
                    let path = url.trim_start_matches("sqlite://");
                    let mut c = diesel::SqliteConnection::establish(path).unwrap();
                    diesel::RunQueryDsl::load(diesel::sql_query(&cast), &mut c)
                }
            }
            .unwrap_or_else(|e| panic!("{cast}: {e}"));
            rows.into_iter().next().map(|r| r.v).unwrap_or_default()
        })
    }

    /// Whether a table of this name exists in this database.
    pub fn has_table(&self, table: &str) -> bool {
        let sql = match self.kind {
            Kind::Postgres => format!("to_regclass('{table}') IS NOT NULL"),
            Kind::Mysql => format!(
                "SELECT COUNT(*) > 0 FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
            Kind::Sqlite => format!(
                "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = '{table}'"
            ),
        };
        matches!(self.scalar(&sql).as_str(), "true" | "1")
    }

    /// This database's URL on the server itself (not through a pooler),
    /// logging in as `role`.
    pub fn direct_url_as(&self, role: &str) -> String {
        postgres_url_as(&self.plain, role)
    }

    /// This database's URL logging in as another role.
    pub fn url_as(&self, role: &str) -> String {
        postgres_url_as(&self.url, role)
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        let sql = match self.kind {
            Kind::Postgres => format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            Kind::Mysql => {
                // As PostgreSQL's FORCE: a session left in a transaction
                // (a test's app that failed mid-way) holds a metadata lock
                // that DROP DATABASE would wait on for ever.
                let (admin, name) = (self.admin.clone(), self.name.clone());
                let _ = std::panic::catch_unwind(|| kill_sessions_in(&admin, &name));
                format!("DROP DATABASE IF EXISTS {}", self.name)
            }
            Kind::Sqlite => return,
        };
        let (kind, admin) = (self.kind, self.admin.clone());
        let _ = std::panic::catch_unwind(|| exec(kind, &admin, &[&sql]));
    }
}

/// Ends every idle MySQL/MariaDB session using database `name` (one left
/// in a transaction holds its locks while it sleeps). Idle ones only: while
/// a statement runs, the process list may name another database as its
/// own (MariaDB shows the database whose triggers a statement is loading,
/// as a look at `information_schema` does), and another test's session
/// would be killed mid-statement.
fn kill_sessions_in(admin: &str, name: &str) {
    let (admin, name) = (admin.to_owned(), name.to_owned());
    block_on(async move {
        use mysql_async::prelude::Queryable;
        let Ok(mut c) = mysql_async::Conn::from_url(&admin).await else {
            return;
        };
        let ids: Vec<u64> = c
            .exec(
                "SELECT id FROM information_schema.processlist \
                 WHERE db = ? AND command = 'Sleep' AND id <> CONNECTION_ID()",
                (name,),
            )
            .await
            .unwrap_or_default();
        for id in ids {
            let _ = c.query_drop(format!("KILL {id}")).await;
        }
        let _ = c.disconnect().await;
    });
}

/// A scratch directory, removed at the end of the test.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Gives the directory to `owner` (`user:group`) when running as root,
    /// as a server the harness starts as that user needs; says whether it
    /// did (whether this process is root).
    pub fn chown_if_root(&self, owner: &str) -> bool {
        let root = rustix::process::geteuid().is_root();
        if root {
            let ok = Command::new("chown")
                .args(["-R", owner])
                .arg(&self.0)
                .status()
                .expect("chown");
            assert!(ok.success());
        }
        root
    }

    pub fn new() -> Scratch {
        Self::under(&std::env::temp_dir())
    }

    /// A scratch directory in memory (`/dev/shm`, where there is one), as
    /// the shipped manifests keep the flag file (an `emptyDir` of medium
    /// `Memory`): on this machine's ext4, removing a flag file rewritten
    /// every renewal took about 0.3 ms, on tmpfs 0.03 ms, and a handover
    /// waits for that removal.
    pub fn in_memory() -> Scratch {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            Self::under(shm)
        } else {
            // A figure measured here is not one of memory: say so.
            eprintln!("no /dev/shm: the scratch files are on the disk");
            Self::new()
        }
    }

    fn under(parent: &Path) -> Scratch {
        let dir = parent.join(format!("leaderd-test-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Process-level tests measure failover in milliseconds; running them one at
/// a time keeps two cores from turning contention into flakes.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls `f` every few milliseconds until it returns `Some`, or panics after
/// `within` with `what` in the message.
pub fn wait_for<T>(within: Duration, what: &str, f: impl FnMut() -> Option<T>) -> T {
    try_wait_for(within, f)
        .unwrap_or_else(|| panic!("timed out after {within:?} waiting for {what}"))
}

/// [`wait_for`] for a caller that has something to do on a timeout (a
/// bench counts it, or prints logs): `None` after `within`.
pub fn try_wait_for<T>(within: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The `leaderd` binary under test: `$LEADERD_BIN`, else the one cargo built
/// beside this executable (or beside its `deps/` folder).
pub fn leaderd_bin() -> PathBuf {
    if let Ok(p) = std::env::var("LEADERD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // Beside a binary (the bench), or one level up from a test in deps/.
    let beside = exe.parent().expect("exe dir");
    let bin = [beside, beside.parent().unwrap_or(beside)]
        .iter()
        .map(|d| d.join("leaderd"))
        .find(|p| p.exists())
        .unwrap_or_else(|| beside.join("leaderd"));
    assert!(
        bin.exists(),
        "{} not found: build it first (`cargo build -p leaderd`) or set LEADERD_BIN",
        bin.display()
    );
    bin
}

/// A free TCP port on loopback (bound then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// `n` free ports, all different: each is held while the next is chosen
/// (ports chosen one after another, each freed at once, may repeat).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("free port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("bound").port())
        .collect()
}

/// The elections an `/elections` body says this replica leads.
pub fn led_in(body: &str) -> Option<Vec<String>> {
    let list: Vec<Value> = serde_json::from_str(body).ok()?;
    Some(
        list.iter()
            .filter(|v| v["is_leader"] == true)
            .filter_map(|v| v["election"].as_str().map(str::to_owned))
            .collect(),
    )
}

/// A plain HTTP/1.1 GET on loopback: status and body, or `None` when nothing
/// answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s =
        TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((status, body))
}

/// Waits up to `within` until something accepts TCP connections on
/// `127.0.0.1:port` (a server the harness started).
pub fn wait_for_port(port: u16, within: Duration, what: &str) {
    wait_for(within, &format!("{what} to accept connections"), || {
        TcpStream::connect(("127.0.0.1", port)).ok().map(|_| ())
    });
}

/// utime + stime of process `pid`, in clock ticks.
pub fn cpu_ticks(pid: i32) -> Option<u64> {
    stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The first process whose command is `name` (as `/proc/PID/comm` says).
pub fn pid_of(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == name).then_some(pid)
    })
}

/// [`cpu_ticks`] of one thread `tid` of process `pid` (e.g. the server
/// thread that serves one session).
pub fn thread_cpu_ticks(pid: i32, tid: i32) -> Option<u64> {
    stat_ticks(&std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

fn stat_ticks(stat: &str) -> Option<u64> {
    // After the command name in parentheses: utime and stime are fields 14
    // and 15 of the whole line.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `kB` field of `/proc/<pid>/status`, e.g. `VmRSS:`.
pub fn status_kib(pid: i32, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Sends raw bytes and returns whatever came back (for junk-request tests).
pub fn http_raw(port: u16, bytes: &[u8]) -> String {
    http_raw_from(std::net::Ipv4Addr::LOCALHOST, port, bytes)
}

/// [`http_raw`] from the source address `from` (any of 127.0.0.0/8, as a
/// mesh's inbound forwarding uses 127.0.0.6).
pub fn http_raw_from(from: std::net::Ipv4Addr, port: u16, bytes: &[u8]) -> String {
    let connect = async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind((from, 0).into())?;
        socket.connect(([127, 0, 0, 1], port).into()).await
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    let Ok(s) = runtime.block_on(connect).and_then(|s| s.into_std()) else {
        return String::new();
    };
    let mut s: TcpStream = s;
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// One real `leaderd run` process.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    pub id: String,
    pub port: u16,
    pub flag: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts `leaderd run` for `id` against `url`, with its flag file and log
    /// in `dir`, plus `extra` arguments. The environment is cleared of
    /// anything that could configure it behind the test's back.
    pub fn start(url: &str, id: &str, dir: &Scratch, extra: &[&str]) -> Daemon {
        Self::launch(url, id, dir, id, extra).start()
    }

    /// Prepares `leaderd run` like [`Daemon::start`], with files named after
    /// `stem` (two processes may share an `id`), for a test to adjust first.
    pub fn launch(url: &str, id: &str, dir: &Scratch, stem: &str, extra: &[&str]) -> Launch {
        let port = free_port();
        let flag = dir.path(&format!("{stem}.flag"));
        let log = dir.path(&format!("{stem}.log"));
        let mut cmd = Command::new(leaderd_bin());
        let mut args: Vec<String> = vec![
            "--database-url".into(),
            url.into(),
            "--id".into(),
            id.into(),
        ];
        args.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
        args.extend([
            "--flag-file".into(),
            flag.to_str().expect("utf-8 path").into(),
        ]);
        args.extend(["--log-format".into(), "json".into()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        scrub_env(&mut cmd);
        // Renewals (with their deadlines) are logged at debug; the
        // split-brain checker needs them.
        cmd.env("RUST_LOG", "info,leaderd::runtime::election=debug");
        Launch {
            cmd,
            args,
            command: None,
            undrained: false,
            id: id.to_owned(),
            port,
            flag,
            log,
        }
    }
}

/// A `leaderd run` command, prepared but not started.
#[derive(Debug)]
pub struct Launch {
    cmd: Command,
    args: Vec<String>,
    /// Under `exec`: the command to run while leading (every election's
    /// unless `--exec` gives one its own; none when each has its own).
    command: Option<Vec<String>>,
    /// stderr on a pipe that nobody reads (see [`Launch::stderr_undrained`]).
    undrained: bool,
    id: String,
    port: u16,
    flag: PathBuf,
    log: PathBuf,
}

impl Launch {
    /// Adds an environment variable (e.g. libfaketime's).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// [`Launch::env`] for each pair.
    pub fn envs(mut self, pairs: &[(&str, &str)]) -> Self {
        self.cmd.envs(pairs.iter().copied());
        self
    }

    /// Runs `leaderd exec … -- command` instead of `leaderd run`.
    pub fn exec(mut self, command: &[&str]) -> Self {
        self.command = Some(command.iter().map(|a| a.to_string()).collect());
        self
    }

    /// Runs `leaderd exec --exec NAME=CMD …`: each election its own command.
    pub fn exec_each(mut self, commands: &[(&str, String)]) -> Self {
        for (name, command) in commands {
            self.args
                .extend(["--exec".into(), format!("{name}={command}")]);
        }
        self.command.get_or_insert_with(Vec::new);
        self
    }

    /// Listens on every address (`0.0.0.0`, as in Kubernetes) rather than on
    /// loopback, on a port whose next one is free too.
    pub fn listen_everywhere(mut self) -> Self {
        // `POST /release` then goes on loopback at the next port (leaderd's
        // default): pick a port whose next one is free too (a busy one made
        // the daemon exit at start, one CI run in many).
        let port = loop {
            let p = free_port();
            if p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                break p;
            }
        };
        let loopback = format!("127.0.0.1:{}", self.port);
        for a in &mut self.args {
            if *a == loopback {
                *a = format!("0.0.0.0:{port}");
            }
        }
        self.port = port;
        self
    }

    /// Runs these elections (`--election` for each), with a flag file per
    /// election: `{stem}-{election}.flag`.
    pub fn elections(mut self, names: &[&str]) -> Self {
        let one = self.flag.to_str().expect("utf-8 path").to_owned();
        let each = one.replace(".flag", "-{election}.flag");
        for a in &mut self.args {
            if *a == one {
                *a = each.clone();
            }
        }
        for name in names {
            self.args.extend(["--election".into(), (*name).into()]);
        }
        self
    }

    /// Keeps no flag file (a bench with many elections would measure the
    /// disk).
    pub fn without_flag_file(mut self) -> Self {
        if let Some(i) = self.args.iter().position(|a| a == "--flag-file") {
            self.args.drain(i..i + 2);
        }
        self
    }

    /// Puts stderr on a pipe that nobody reads, as a stalled log collector
    /// leaves it: once the pipe is full, every write to it blocks. The log
    /// file stays empty.
    pub fn stderr_undrained(mut self) -> Self {
        self.undrained = true;
        self
    }

    /// Starts it and waits until it serves HTTP.
    pub fn start(self) -> Daemon {
        let Launch {
            mut cmd,
            args,
            command,
            undrained,
            id,
            port,
            flag,
            log,
        } = self;
        match command {
            None => cmd.arg("run").args(args),
            Some(c) if c.is_empty() => cmd.arg("exec").args(args),
            Some(c) => cmd.arg("exec").args(args).arg("--").args(c),
        };
        let log_file = std::fs::File::create(&log).expect("log file");
        // The read end of an undrained pipe stays open in `Child::stderr`.
        let stderr = if undrained {
            Stdio::piped()
        } else {
            log_file.into()
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn leaderd");
        let d = Daemon {
            child,
            id,
            port,
            flag,
            log,
        };
        wait_for(
            Duration::from_secs(10),
            &format!("{} to serve HTTP", d.id),
            || http_get(d.port, "/healthz").map(|_| ()),
        );
        d
    }
}

impl Daemon {
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    /// `GET /leader`: status and parsed body.
    pub fn leader(&self) -> Option<(u16, Value)> {
        self.leader_of("")
    }

    /// `GET /leader{query}` (e.g. `?election=jobs`): status and parsed body.
    pub fn leader_of(&self, query: &str) -> Option<(u16, Value)> {
        let (status, body) = http_get(self.port, &format!("/leader{query}"))?;
        Some((status, serde_json::from_str(&body).ok()?))
    }

    /// The token this daemon leads under (`/leader{query}` answering 200).
    pub fn token_held(&self, query: &str) -> Option<i64> {
        let (status, body) = self.leader_of(query)?;
        (status == 200).then(|| body["token"].as_i64())?
    }

    /// `POST /release{query}` (e.g. `?hold=3s`); panics unless it answers
    /// 200.
    pub fn release(&self, query: &str) {
        let request =
            format!("POST /release{query} HTTP/1.1\r\nHost: x\r\nLeaderd-Release: 1\r\nConnection: close\r\n\r\n");
        let reply = http_raw(self.port, request.as_bytes());
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }

    /// `GET /elections`: the elections this daemon leads now, by name;
    /// `None` when it does not answer.
    pub fn leading(&self) -> Option<Vec<String>> {
        let (200, body) = http_get(self.port, "/elections")? else {
            return None;
        };
        led_in(&body)
    }

    /// Whether `/leader` answers 200 now.
    pub fn is_leader(&self) -> bool {
        matches!(self.leader(), Some((200, _)))
    }

    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).expect("pid");
        let _ = rustix::process::kill_process(pid, sig);
    }

    pub fn sigkill(&self) {
        self.signal(rustix::process::Signal::KILL);
    }

    pub fn sigterm(&self) {
        self.signal(rustix::process::Signal::TERM);
    }

    /// Waits up to `within` for the process to exit.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Fills an undrained stderr pipe to the brim from outside (a writer of
    /// its own, through `/proc/<pid>/fd/2`): from here on every write the
    /// daemon makes to stderr blocks, however little it logs.
    pub fn fill_stderr(&self) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        assert!(
            self.child.stderr.is_some(),
            "stderr is not an undrained pipe"
        );
        let mut pipe = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open(format!("/proc/{}/fd/2", self.pid()))
            .expect("open the daemon's stderr");
        let chunk = [b'.'; 4096];
        loop {
            match pipe.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("filling stderr: {e}"),
            }
        }
    }

    /// Bytes waiting unread in an undrained stderr pipe (0 otherwise).
    pub fn stderr_unread(&self) -> u64 {
        self.child
            .stderr
            .as_ref()
            .and_then(|e| rustix::io::ioctl_fionread(e).ok())
            .unwrap_or(0)
    }

    /// Everything the daemon logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's JSON log lines.
    pub fn log_events(&self) -> Vec<Value> {
        self.log_text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The daemon's JSON log lines with this `message`, in order.
    pub fn logged(&self, message: &str) -> Vec<Value> {
        let mut events = self.log_events();
        events.retain(|e| e["message"] == message);
        events
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the daemons lead `counts` elections each (in any order),
/// every one of `elections` elections led by exactly one of them; how long
/// that took.
pub fn wait_counts(
    ds: &[&Daemon],
    counts: &[usize],
    elections: usize,
    within: Duration,
    what: &str,
) -> Duration {
    let started = Instant::now();
    let mut want = counts.to_vec();
    want.sort_unstable();
    wait_for(within, what, || {
        let leading: Vec<Vec<String>> = ds.iter().map(|d| d.leading()).collect::<Option<_>>()?;
        let mut got: Vec<usize> = leading.iter().map(Vec::len).collect();
        got.sort_unstable();
        let mut all: Vec<&String> = leading.iter().flatten().collect();
        all.sort_unstable();
        all.dedup();
        (got == want && all.len() == elections).then_some(())
    });
    started.elapsed()
}

/// Stops `daemons[leader]` with SIGTERM, as a rolling update does: it must
/// exit 0 within 5 s and another of `daemons` lead within 10 s. Returns the
/// stopped daemon (taken out of `daemons`) and the new leader's place.
pub fn hand_over_by_sigterm(daemons: &mut Vec<Daemon>, leader: usize) -> (Daemon, usize) {
    let mut stopped = daemons.remove(leader);
    stopped.sigterm();
    assert_eq!(
        stopped
            .wait_exit(Duration::from_secs(5))
            .and_then(|s| s.code()),
        Some(0),
        "{} did not exit cleanly on SIGTERM",
        stopped.id
    );
    let refs: Vec<&Daemon> = daemons.iter().collect();
    let next = wait_single_leader(&refs, Duration::from_secs(10));
    (stopped, next)
}

/// Checks handover times: every one within `within` but at most one,
/// which must still be within a ttl plus a heartbeat (the bound of a lost
/// wake-up). A single slow round is a commit stalled on a loaded machine
/// (seen once in CI at 1.47 s, and at 0.2-0.5 s per round under an
/// fsync-heavy disk hog); a broken wake-up slows most rounds, and fails.
pub fn check_handovers(what: &str, took: &[Duration], within: Duration) {
    let slow: Vec<&Duration> = took.iter().filter(|t| **t > within).collect();
    let worst = took.iter().max().expect("rounds ran");
    assert!(
        slow.len() <= 1 && *worst <= Duration::from_millis(2200),
        "{what} handovers took {took:?}"
    );
    eprintln!("{what} handovers: {took:?}");
}

/// Waits until exactly one of `daemons` answers 200 on `/leader` and returns
/// its index.
pub fn wait_single_leader(daemons: &[&Daemon], within: Duration) -> usize {
    wait_for(within, "exactly one leader", || single_leader(daemons))
}

/// The index of the one daemon of `daemons` that leads now (`/leader` 200),
/// if exactly one does.
pub fn single_leader<D: std::borrow::Borrow<Daemon>>(daemons: &[D]) -> Option<usize> {
    let leaders: Vec<usize> = (0..daemons.len())
        .filter(|&i| daemons[i].borrow().is_leader())
        .collect();
    let [leader] = leaders[..] else { return None };
    Some(leader)
}

/// Prints the daemons' logs to stderr: a failed run's evidence.
pub fn print_logs<'a>(daemons: impl IntoIterator<Item = &'a Daemon>) {
    for d in daemons {
        eprintln!("----- log of {} -----\n{}", d.id, d.log_text());
    }
}

/// Waits until exactly one of `daemons` leads and every one of them names
/// it, with its token, in `/leader` (a fresh follower knows the leader only
/// after its first refusal); returns its index.
pub fn wait_agreed_leader(daemons: &[&Daemon], within: Duration) -> usize {
    wait_for(within, "one leader that every replica names", || {
        let views: Vec<(u16, Value)> = daemons.iter().map(|d| d.leader()).collect::<Option<_>>()?;
        let leaders: Vec<usize> = (0..views.len()).filter(|&i| views[i].0 == 200).collect();
        let [leader] = leaders[..] else { return None };
        let (id, token) = (&views[leader].1["leader"], &views[leader].1["token"]);
        views
            .iter()
            .all(|(_, v)| v["leader"] == *id && v["token"] == *token)
            .then_some(leader)
    })
}

/// [`run_cli`], killed (and the test failed) when it has not exited
/// within `within`.
pub fn run_cli_within(args: &[&str], within: Duration) -> (i32, String, String) {
    let mut cmd = Command::new(leaderd_bin());
    scrub_env(&mut cmd);
    let dir = Scratch::new();
    let (out, err) = (dir.path("out"), dir.path("err"));
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("run leaderd");
    let deadline = Instant::now() + within;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`leaderd {}` still running after {within:?}",
                args.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    (status.code().unwrap_or(-1), read(&out), read(&err))
}

/// Runs `leaderd` with `args` to completion: exit code, stdout, stderr.
pub fn run_cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(leaderd_bin());
    scrub_env(&mut cmd);
    let out = cmd
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run leaderd");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Removes from `cmd`'s environment everything that could configure leaderd
/// behind a test's back.
pub fn scrub_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("LEADERD_")
            || k == "DATABASE_URL"
            || k == "KUBERNETES_SERVICE_HOST"
            || k == "RUST_LOG"
        {
            cmd.env_remove(&*k);
        }
    }
}

/// A transaction on its own connection that holds a write lock on the lock
/// row (`SELECT … FOR UPDATE`; on SQLite `BEGIN IMMEDIATE`, the whole file)
/// until dropped.
#[derive(Debug)]
pub struct RowLock {
    release: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TempDb {
    /// Locks the row of `election` in another transaction.
    pub fn lock_row(&self, election: &str) -> RowLock {
        self.hold(&format!(
            "SELECT * FROM service_leader_lock WHERE name = '{election}' FOR UPDATE"
        ))
    }

    /// Runs `sql` in a transaction on a connection of its own, left open
    /// (with whatever locks `sql` took) until the guard is dropped. On
    /// SQLite the transaction is `BEGIN IMMEDIATE` (`sql` is not run).
    pub fn hold(&self, sql: &str) -> RowLock {
        let (kind, url) = (self.kind, self.plain.clone());
        let select = sql.to_owned();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            block_on(async move {
                use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};
                match kind {
                    Kind::Postgres => {
                        let mut c = AsyncPgConnection::establish(&url).await.unwrap();
                        c.batch_execute("BEGIN").await.unwrap();
                        c.batch_execute(&select).await.unwrap();
                        locked_tx.send(()).unwrap();
                        let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
                        c.batch_execute("ROLLBACK").await.unwrap();
                    }
                    Kind::Mysql => {
                        let mut c = AsyncMysqlConnection::establish(&url).await.unwrap();
                        c.batch_execute("START TRANSACTION").await.unwrap();
                        c.batch_execute(&select).await.unwrap();
                        locked_tx.send(()).unwrap();
                        let _ = tokio::task::spawn_blocking(move || release_rx.recv()).await;
                        c.batch_execute("ROLLBACK").await.unwrap();
                    }
                    Kind::Sqlite => {
                        use diesel::connection::SimpleConnection;
                        use diesel::Connection;
                        let path = url.trim_start_matches("sqlite://").to_owned();
                        let mut c = diesel::SqliteConnection::establish(&path).unwrap();
                        c.batch_execute("BEGIN IMMEDIATE").unwrap();
                        locked_tx.send(()).unwrap();
                        let _ = release_rx.recv();
                        c.batch_execute("ROLLBACK").unwrap();
                    }
                }
            })
        });
        locked_rx.recv().expect("row locked");
        RowLock {
            release: Some(release_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for RowLock {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
