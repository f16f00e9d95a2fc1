//! MySQL 8 / MariaDB 10.6+: the lock table on `mysql_async` (pure Rust) via
//! diesel-async.
//!
//! Clock: `UTC_TIMESTAMP(6)` into `DATETIME(6)` columns, so neither the
//! session `time_zone` nor whole-second rounding affects expiry (`NOW(6)`
//! would follow the session time zone). MySQL evaluates `SET` assignments left
//! to right, each seeing the ones before; no assignment here reads a column
//! assigned earlier in the same statement. The driver connects with
//! `CLIENT_FOUND_ROWS`, so counts are matched rows. `lock` is a reserved word;
//! nothing here is named that.

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use crate::cas::CasOps;
use crate::migrate;
use crate::sql::{Bind, Stmt};
use crate::tls::{Files, Verify};
use crate::url::TlsMode;
use crate::{observed, DatabaseUrl, ElectionRow, LeaseRequest, Migrated, Observed, StoreError};

/// A statement for both servers, with its server-side lock waits bounded
/// inside the statement itself (no session `SET`): a statement that waits on
/// a row or metadata lock outlives the client's timeout on the server, and
/// every retry would add another waiting connection. MariaDB takes
/// `SET STATEMENT … FOR` (a row-lock wait of 0 fails at once). MySQL 8 takes
/// a `SET_VAR` hint for the metadata-lock wait only: it does not accept
/// `innodb_lock_wait_timeout` there, so on MySQL a row-lock wait is bounded
/// by the server's `innodb_lock_wait_timeout` (see the README).
struct Sql {
    mariadb: &'static str,
    mysql: &'static str,
}

macro_rules! bounded {
    ($verb:literal, $rest:expr) => {
        Sql {
            mariadb: concat!(
                "SET STATEMENT innodb_lock_wait_timeout = 0, lock_wait_timeout = 1 FOR ",
                $verb,
                $rest
            ),
            mysql: concat!($verb, " /*+ SET_VAR(lock_wait_timeout = 1) */", $rest),
        }
    };
}

/// What a renewal sets (one bind: ttl µs); shared by [`RENEW`] and
/// [`renew_many_sql`].
macro_rules! renew_set {
    () => {
        "SET renewed_at = UTC_TIMESTAMP(6), \
            expires_at = GREATEST(expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) "
    };
}

/// Extends this instance's live lease, if its token is still the one it
/// holds. Binds: ttl µs, election, instance, token.
const RENEW: Sql = bounded!(
    "UPDATE",
    concat!(
        " service_leader_lock ",
        renew_set!(),
        "WHERE name = ? AND instance = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
    )
);

/// The most leases one renewal statement carries (four binds each, far
/// below the server's 65,535).
const RENEW_MANY_MAX: usize = 1024;

/// [`RENEW`] for `rows` leases at once, each matched on its own name,
/// instance and token and judged by the server's clock. Binds: ttl µs, the
/// names, then (election, instance, token) per lease. The names' own list
/// and the index hint keep it on the name index: without them the servers
/// chose to scan (and, under REPEATABLE READ, lock) the whole table once a
/// batch was a fair share of it, so one replica's renewal made the others'
/// statements busy. `rows` is a power of two (a batch is padded by
/// repeating its last lease), so a connection prepares a handful of these
/// texts, not one per batch size.
fn renew_many_sql(rows: usize, mariadb: bool) -> &'static str {
    static TEXTS: std::sync::Mutex<Vec<(usize, bool, &'static str)>> =
        std::sync::Mutex::new(Vec::new());
    let mut texts = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, _, sql)) = texts.iter().find(|(r, m, _)| (*r, *m) == (rows, mariadb)) {
        return sql;
    }
    let names = vec!["?"; rows].join(", ");
    let tuples = vec!["(?, ?, ?)"; rows].join(", ");
    let rest = format!(
        " service_leader_lock FORCE INDEX (service_leader_lock_name) {}\
         WHERE name IN ({names}) AND (name, instance, token) IN ({tuples}) \
         AND expires_at > UTC_TIMESTAMP(6)",
        renew_set!()
    );
    let sql = if mariadb {
        format!(
            "SET STATEMENT innodb_lock_wait_timeout = 0, lock_wait_timeout = 1 FOR UPDATE{rest}"
        )
    } else {
        format!("UPDATE /*+ SET_VAR(lock_wait_timeout = 1) */{rest}")
    };
    // At most two per power of two up to RENEW_MANY_MAX, for the process.
    let sql: &'static str = Box::leak(sql.into_boxed_str());
    texts.push((rows, mariadb, sql));
    sql
}

const OBSERVE: Sql = bounded!(
    "SELECT",
    " holder, instance, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
    FROM service_leader_lock WHERE name = ?"
);

const TAKE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, \
        acquired_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6), \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND token = ? AND expires_at <= UTC_TIMESTAMP(6)"
);

// A plain INSERT with a no-op on a duplicate (not INSERT IGNORE, which would
// also turn truncation into a warning). It is never behind a locking read.
const CREATE: Sql = bounded!(
    "INSERT",
    " INTO service_leader_lock (name, token, expires_at) \
    SELECT ?, GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), \
                       COALESCE((SELECT token + 1 FROM service_leader_token WHERE name = ?), 0)), \
           UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    ON DUPLICATE KEY UPDATE id = id"
);

const RELEASE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET holder = NULL, instance = NULL, expires_at = UTC_TIMESTAMP(6) \
    WHERE name = ? AND instance = ?"
);

/// The rows whose name starts with the bind (twice; every row for `''`);
/// `name` is bytes, so the prefix is counted in bytes.
const ELECTIONS: &str = "SELECT CAST(name AS CHAR), holder, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
    FROM service_leader_lock WHERE LEFT(name, LENGTH(?)) = ? ORDER BY name";

/// What the server is and how the session runs, read once at connect.
const SESSION: &str = "SELECT @@autocommit, VERSION()";

/// DDL is not transactional in MySQL: concurrent migrations are serialised
/// with a named lock (freed with the session if this one dies). Current once
/// the kept-tokens table is there, made before its trigger: a server that
/// refuses the trigger (see its step) is not asked again at every start,
/// which would also repeat the `ALTER TABLE` of the step before.
const MIGRATION: migrate::Plan = migrate::Plan {
    current: "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock' \
        AND column_name = 'name' AND data_type = 'varbinary') \
        AND EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_token')",
    lock: "DO GET_LOCK('leaderd_migrate', 30)",
    unlock: "DO RELEASE_LOCK('leaderd_migrate')",
    steps: migrate::MYSQL,
    tune: None,
    legacy: "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = '__diesel_schema_migrations')",
};

migrate::diesel_migrator!(AsyncMysqlConnection);

/// Opens a connection with the URL's TLS, as diesel-async's own `establish`
/// would otherwise (no driver-side statement cache, `CLIENT_FOUND_ROWS`).
///
/// TLS is mysql_async's, on rustls, from the URL's options; it reads the CA
/// and key files itself at each connect. `PREFERRED` is as MySQL's clients
/// do it: TLS (unverified) when the server offers it, else plain text.
/// Without `ssl-ca`, the system's CA store is given instead of the driver's
/// compiled-in Mozilla list, as on PostgreSQL.
pub(crate) async fn establish(url: &DatabaseUrl) -> Result<AsyncMysqlConnection, StoreError> {
    let opts = mysql_async::Opts::from_url(url.expose())
        .map_err(|e| StoreError::InvalidUrl(e.to_string()))?;
    let base = mysql_async::OptsBuilder::from_opts(opts)
        .stmt_cache_size(0)
        .client_found_rows(true);
    let want = url.tls();
    let connected = match want.mode {
        TlsMode::Disable => mysql_async::Conn::new(base).await,
        TlsMode::Require(verify) => {
            mysql_async::Conn::new(base.ssl_opts(ssl_opts(verify, &want.files))).await
        }
        TlsMode::Prefer => {
            let tls = base
                .clone()
                .ssl_opts(ssl_opts(Verify::Nothing, &want.files));
            match mysql_async::Conn::new(tls).await {
                Err(mysql_async::Error::Driver(
                    mysql_async::DriverError::NoClientSslFlagFromServer,
                )) => mysql_async::Conn::new(base).await,
                other => other,
            }
        }
    };
    let conn = connected
        .map_err(|e| StoreError::Connect(diesel::ConnectionError::BadConnection(e.to_string())))?;
    AsyncMysqlConnection::try_from(conn)
        .await
        .map_err(StoreError::Connect)
}

fn ssl_opts(verify: Verify, files: &Files) -> mysql_async::SslOpts {
    let mut opts = mysql_async::SslOpts::default();
    opts = match verify {
        Verify::Nothing => opts.with_danger_accept_invalid_certs(true),
        // Never parsed from a URL (see `url`): the driver's name skip does
        // not work with this rustls, so it would check the name anyway.
        Verify::Chain | Verify::Full => opts,
    };
    if verify != Verify::Nothing {
        // The driver does not name the root type; `into` finds it.
        opts = match &files.root {
            Some(path) => opts.with_root_certs(vec![path.clone().into()]),
            None => opts.with_root_certs(
                crate::tls::system_roots()
                    .into_iter()
                    .map(|der| der.to_vec().into())
                    .collect(),
            ),
        }
        .with_disable_built_in_roots(true);
    }
    if let Some((cert, key)) = &files.client {
        opts = opts.with_client_identity(Some(mysql_async::ClientIdentity::new(
            cert.clone().into(),
            key.clone().into(),
        )));
    }
    opts
}

/// A MySQL/MariaDB connection holding the lock-table statements.
pub struct MysqlStore {
    conn: AsyncMysqlConnection,
    mariadb: bool,
}

opaque_debug!(MysqlStore);

impl MysqlStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let mut conn: AsyncMysqlConnection = establish(url).await?;
        let (autocommit, version): (i64, String) = Stmt::<(BigInt, Text)>::new(SESSION, [])
            .get_result(&mut conn)
            .await?;
        if autocommit == 0 {
            // Nothing leaderd writes would ever commit: its renewals would be
            // invisible and another replica would take over a live leader.
            return Err(StoreError::Unsupported(
                "the server starts sessions with autocommit off (@@autocommit = 0, \
                 e.g. autocommit=0 or init_connect in its configuration); \
                 leaderd needs every statement to commit on its own"
                    .into(),
            ));
        }
        let mariadb = version.contains("MariaDB");
        Ok(Self { conn, mariadb })
    }

    fn sql(&self, sql: &Sql) -> &'static str {
        if self.mariadb {
            sql.mariadb
        } else {
            sql.mysql
        }
    }

    /// The renewal statement for `items` (distinct leases, one ttl); the
    /// number of rows it matched.
    async fn renew_together(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<usize, diesel::result::Error> {
        let rows = items.len().next_power_of_two();
        let padded = || (0..rows).map(|i| items[i.min(items.len() - 1)]);
        let mut binds = vec![Bind::BigInt(items[0].0.ttl_us())];
        binds.extend(padded().map(|(req, _)| Bind::Text(req.election)));
        for (req, token) in padded() {
            binds.extend([
                Bind::Text(req.election),
                Bind::Text(req.instance),
                Bind::BigInt(token),
            ]);
        }
        Stmt::<()>::new(renew_many_sql(rows, self.mariadb), binds)
            .execute(&mut self.conn)
            .await
    }

    pub(crate) async fn release(
        &mut self,
        election: &str,
        instance: &str,
    ) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&RELEASE),
            [Bind::Text(election), Bind::Text(instance)],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<(String, Option<String>, i64, i64)> =
            Stmt::<(Text, Nullable<Text>, BigInt, BigInt)>::new(
                ELECTIONS,
                [Bind::Text(prefix), Bind::Text(prefix)],
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        migrate::run(&mut self.conn, &MIGRATION).await
    }
}

/// A row-lock wait that the statement's own bound cut short (error 1205):
/// another transaction holds the row.
fn lock_busy(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("Lock wait timeout"))
}

impl CasOps for MysqlStore {
    /// One statement per [`RENEW_MANY_MAX`] leases. When one matches fewer
    /// rows than it carries, each half is sent again, down to single leases,
    /// to learn which (renewing one twice is harmless: same token, a later
    /// expiry): one lease lost costs about 2 log2(n) statements, not n. A
    /// part refused as busy (a row locked elsewhere) is answered "not
    /// renewed", so each of its leases goes alone and only the locked one is
    /// answered busy.
    async fn renew_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let mut out = vec![false; items.len()];
        let mut parts: Vec<std::ops::Range<usize>> = (0..items.len())
            .step_by(RENEW_MANY_MAX)
            .map(|start| start..(start + RENEW_MANY_MAX).min(items.len()))
            .collect();
        while let Some(part) = parts.pop() {
            match self.renew_together(&items[part.clone()]).await {
                Ok(n) if n == part.len() => out[part].fill(true),
                Ok(n) if n > 0 && part.len() > 1 => {
                    let mid = part.start + part.len() / 2;
                    parts.extend([part.start..mid, mid..part.end]);
                }
                // None of them: not renewed.
                Ok(_) => {}
                Err(e) if lock_busy(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    async fn renew(&mut self, req: &LeaseRequest<'_>, token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&RENEW),
            [
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::Text(req.instance),
                Bind::BigInt(token),
            ],
        )
        .execute(&mut self.conn)
        .await;
        match n {
            Ok(n) => Ok(n > 0),
            Err(e) if lock_busy(&e) => Err(StoreError::Busy),
            Err(e) => Err(e.into()),
        }
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let rows: Vec<(Option<String>, Option<String>, i64, i64)> =
            Stmt::<(Nullable<Text>, Nullable<Text>, BigInt, BigInt)>::new(
                self.sql(&OBSERVE),
                [Bind::Text(req.election)],
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().next().map(observed))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&TAKE),
            [
                Bind::Text(req.holder),
                Bind::Text(req.instance),
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::BigInt(seen_token),
            ],
        )
        .execute(&mut self.conn)
        .await;
        match n {
            Ok(n) => Ok(n > 0),
            // Another taker holds the row mid-take: a lost race, which the
            // caller reports as the refusal it is.
            Err(e) if lock_busy(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn create(&mut self, req: &LeaseRequest<'_>) -> Result<(), StoreError> {
        Stmt::<()>::new(
            self.sql(&CREATE),
            [
                Bind::Text(req.election),
                Bind::Text(req.election),
                Bind::BigInt(req.ttl_us()),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(())
    }
}

/// The named lock of an election: server-wide, so the database name is part
/// of it, hashed to stay within MySQL's 64 characters. Bind: election.
macro_rules! lock_name {
    () => {
        "CONCAT('leaderd:', SHA1(CONCAT(DATABASE(), '/', ?)))"
    };
}

/// Waits until a leader's named lock is freed (bind: election, then the wait
/// in milliseconds): 1 when it was, 0 on timeout.
const WAIT_FOR_LOCK: &str = concat!("SELECT GET_LOCK(", lock_name!(), ", ? / 1000)");
/// Gives back a lock won only by waking up.
const LET_GO: &str = concat!("SELECT RELEASE_LOCK(", lock_name!(), ")");
/// Whether someone (a leader) holds the lock now.
const LOCK_HELD: &str = concat!("SELECT IS_USED_LOCK(", lock_name!(), ") IS NOT NULL");
/// A leader takes the lock without waiting: 1 when it has it.
const TAKE_LOCK: &str = concat!("SELECT COALESCE(GET_LOCK(", lock_name!(), ", 0), 0)");

/// How soon a waiter looks again for a leader's lock that nobody holds: often
/// for a while after a release (a new leader takes its lock within
/// milliseconds, and a waiter that looks late misses the next release), then
/// rarely while the election has no leader.
const IDLE_SOON: std::time::Duration = std::time::Duration::from_millis(20);
const IDLE_SOON_FOR: std::time::Duration = std::time::Duration::from_secs(3);
const IDLE_LATER: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a leader's lock must have been held for the waiters (looking
/// every [`IDLE_SOON`]) to be waiting on it: two looks and a round trip.
pub(crate) const NOTICED_WITHIN: std::time::Duration =
    std::time::Duration::from_millis(2 * IDLE_SOON.as_millis() as u64 + 10);

/// Gives the election's named lock back (a no-op when this session does not
/// hold it).
async fn let_go(conn: &mut AsyncMysqlConnection, election: &str) -> Result<(), StoreError> {
    Stmt::<Nullable<BigInt>>::new(LET_GO, [Bind::Text(election)])
        .get_result::<Option<i64>>(conn)
        .await?;
    Ok(())
}

/// Wake-ups without polling: while it leads, a leader holds a named lock on
/// its connection to the lock table ([`MysqlStore::hold_wake_lock`]); a follower waits for that lock with
/// `GET_LOCK`, which returns the moment the leader frees it (a release, or
/// its session ending) and gives it straight back. Only a wake-up: the lock
/// says nothing about who leads.
pub struct LockWaiter {
    conn: AsyncMysqlConnection,
    election: String,
    /// The longest single server-side wait, so that a vanished client's wait
    /// ends soon on the server too.
    wait: std::time::Duration,
}

opaque_debug!(LockWaiter);

impl LockWaiter {
    pub(crate) async fn connect(
        url: &DatabaseUrl,
        election: &str,
        wait: std::time::Duration,
    ) -> Result<Self, StoreError> {
        Ok(Self {
            conn: establish(url).await?,
            election: election.to_owned(),
            wait,
        })
    }

    /// Returns when a leader's lock was freed.
    pub(crate) async fn next(&mut self) -> Result<String, StoreError> {
        let wait_ms = i64::try_from(self.wait.as_millis()).unwrap_or(i64::MAX);
        // When a leader was last seen holding the lock: its lock is looked
        // for often for a while after it goes (see `IDLE_SOON`).
        let mut woke = tokio::time::Instant::now();
        loop {
            let held: bool =
                Stmt::<diesel::sql_types::Bool>::new(LOCK_HELD, [Bind::Text(&self.election)])
                    .get_result(&mut self.conn)
                    .await?;
            if !held {
                // No leader holds it (yet).
                let idle = if woke.elapsed() < IDLE_SOON_FOR {
                    IDLE_SOON
                } else {
                    IDLE_LATER
                };
                tokio::time::sleep(idle).await;
                continue;
            }
            woke = tokio::time::Instant::now();
            let got: Option<i64> = Stmt::<Nullable<BigInt>>::new(
                WAIT_FOR_LOCK,
                [Bind::Text(&self.election), Bind::BigInt(wait_ms)],
            )
            .get_result(&mut self.conn)
            .await?;
            if got == Some(1) {
                // Let go at once: nobody must find a follower holding it.
                let_go(&mut self.conn, &self.election).await?;
                return Ok(self.election.clone());
            }
        }
    }
}

/// Which named locks of the table's elections are held now: one statement
/// whatever their number (a plain read; the row's name gives the lock's).
const LOCKS_HELD: &str = concat!(
    "SELECT name, IS_USED_LOCK(",
    "CONCAT('leaderd:', SHA1(CONCAT(DATABASE(), '/', name)))",
    ") IS NOT NULL FROM service_leader_lock"
);

/// Wake-ups for several elections on one connection: `GET_LOCK` waits for
/// one lock per session, so instead the leaders' locks are all looked at
/// together every [`IDLE_SOON`] (longer beyond 200 elections), and each one
/// seen held and then free is a release (or a leader gone).
pub struct LocksWatcher {
    conn: AsyncMysqlConnection,
    /// The locks held at the last look.
    held: std::collections::HashSet<String>,
    /// Freed ones not yet returned.
    freed: std::collections::VecDeque<String>,
    every: std::time::Duration,
}

opaque_debug!(LocksWatcher);

impl LocksWatcher {
    pub(crate) async fn connect(url: &DatabaseUrl, elections: usize) -> Result<Self, StoreError> {
        // Each look reads every row: keep the reads per second bounded.
        let every = IDLE_SOON * u32::try_from(elections.div_ceil(200).max(1)).unwrap_or(u32::MAX);
        Ok(Self {
            conn: establish(url).await?,
            held: std::collections::HashSet::new(),
            freed: std::collections::VecDeque::new(),
            every,
        })
    }

    /// The next election whose leader's lock was freed.
    pub(crate) async fn next(&mut self) -> Result<String, StoreError> {
        loop {
            if let Some(name) = self.freed.pop_front() {
                return Ok(name);
            }
            let rows: Vec<(String, bool)> =
                Stmt::<(Text, diesel::sql_types::Bool)>::new(LOCKS_HELD, [])
                    .load(&mut self.conn)
                    .await?;
            let held: std::collections::HashSet<String> = rows
                .into_iter()
                .filter_map(|(name, held)| held.then_some(name))
                .collect();
            self.freed.extend(self.held.difference(&held).cloned());
            self.held = held;
            if self.freed.is_empty() {
                tokio::time::sleep(self.every).await;
            }
        }
    }
}

impl MysqlStore {
    /// Takes the election's named lock (see [`LockWaiter`]) without
    /// waiting; whether this session holds it now (a follower that just
    /// woke may hold it for an instant: try again).
    pub(crate) async fn hold_wake_lock(&mut self, election: &str) -> Result<bool, StoreError> {
        let got: i64 = Stmt::<BigInt>::new(TAKE_LOCK, [Bind::Text(election)])
            .get_result(&mut self.conn)
            .await?;
        Ok(got == 1)
    }

    /// Frees the election's named lock, waking one waiter (who wakes the
    /// next).
    pub(crate) async fn free_wake_lock(&mut self, election: &str) -> Result<(), StoreError> {
        let_go(&mut self.conn, election).await
    }
}
