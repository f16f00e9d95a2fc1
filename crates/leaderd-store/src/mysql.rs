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

use crate::cas::{CasBatch, CasOps};
use crate::history::{Term, TermParts, TermSql};
use crate::migrate;
use crate::sql::{Bind, Stmt};
use crate::tls::{Files, Verify};
use crate::url::TlsMode;
use crate::{
    as_heir, observed, DatabaseUrl, ElectionRow, FenceStatus, LeaseRequest, Migrated, Observed,
    Release, RowParts, StoreError, WakeLock,
};

/// [`OBSERVE`]'s row: holder, instance, token, remaining µs, address,
/// successor.
type SeenRow = (
    Option<String>,
    Option<String>,
    i64,
    i64,
    Option<String>,
    Option<String>,
);
type SeenSql = (
    Nullable<Text>,
    Nullable<Text>,
    BigInt,
    BigInt,
    Nullable<Text>,
    Nullable<Text>,
);

/// A statement for both servers, with its server-side lock waits bounded
/// inside the statement itself (no session `SET`): a statement that waits on
/// a row or metadata lock outlives the client's timeout on the server, and
/// every retry would add another waiting connection. MariaDB takes
/// `SET STATEMENT … FOR` (a row-lock wait of 0 fails at once). MySQL 8 takes
/// a `SET_VAR` hint for the metadata-lock wait only: it does not accept
/// `innodb_lock_wait_timeout` there, so on MySQL a row-lock wait is bounded
/// by the server's `innodb_lock_wait_timeout` (docs/databases.md).
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
/// [`RENEW_ALL`].
macro_rules! renew_set {
    ($l:literal) => {
        concat!(
            "SET ",
            $l,
            "renewed_at = UTC_TIMESTAMP(6), ",
            $l,
            "expires_at = GREATEST(",
            $l,
            "expires_at, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND) "
        )
    };
}

/// Extends this instance's live lease, if its token is still the one it
/// holds. Binds: ttl µs, election, instance, token.
const RENEW: Sql = bounded!(
    "UPDATE",
    concat!(
        " service_leader_lock ",
        renew_set!(""),
        "WHERE name = ? AND instance = ? AND token = ? AND expires_at > UTC_TIMESTAMP(6)"
    )
);

/// The most leases one renewal statement carries: their JSON is about 100
/// bytes each, 1.6 MB in all, well within `max_allowed_packet` (16 MiB by
/// default on MariaDB 10.11, 64 MiB on MySQL 8). More go in several.
const RENEW_MANY_MAX: usize = 16_384;

/// [`RENEW`] for several leases at once, each matched on its own name,
/// instance and token and judged by the server's clock. Binds: a JSON array
/// of `[name, instance, token]`, sorted by name (two statements lock rows
/// in one order), then ttl µs. One text whatever the number, prepared once
/// per connection. The names drive the join (`STRAIGHT_JOIN`) and the index
/// hint keeps each lookup on the name index: the table first, as MariaDB
/// chose below about 100 rows whatever the hint, scanned and, under
/// REPEATABLE READ, locked every row, so one replica's renewal made the
/// others' statements busy (333 of 3,000 renewals of another lease
/// refused in a review's test).
const RENEW_ALL: Sql = bounded!(
    "UPDATE",
    concat!(
        " (SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', \
            inst VARCHAR(64) PATH '$[1]', tok BIGINT PATH '$[2]')) AS x) AS j \
        STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) \
          ON l.name = j.n AND l.instance = j.inst AND l.token = j.tok ",
        renew_set!("l."),
        "WHERE l.expires_at > UTC_TIMESTAMP(6)"
    )
);

/// The row, with the holder's address (only while the instance that wrote
/// it holds the row) and the successor it was released to (see
/// `crate::as_heir`).
const OBSERVE: Sql = bounded!(
    "SELECT",
    " holder, instance, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), \
    IF(address_instance = instance, address, NULL), successor \
    FROM service_leader_lock WHERE name = ?"
);

/// Takes the row if it is expired, or released to this daemon (its
/// successor window), and its token is the one seen; writes the taker's
/// address with its instance. Binds: holder, instance, address, instance,
/// ttl µs, name, token seen, daemon.
const TAKE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET token = token + 1, holder = ?, instance = ?, successor = NULL, \
        address = ?, address_instance = ?, \
        acquired_at = UTC_TIMESTAMP(6), renewed_at = UTC_TIMESTAMP(6), \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND token = ? \
      AND (expires_at <= UTC_TIMESTAMP(6) OR (instance IS NULL AND successor = ?))"
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

/// [`OBSERVE`] for several elections in one statement: the rows that exist,
/// each with its place in the JSON array of names (bind), from 1. A plain
/// read (no lock); the names drive it, one index lookup each.
const OBSERVE_ALL: Sql = bounded!(
    "SELECT",
    " j.i, l.holder, l.instance, l.token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), l.expires_at), \
    IF(l.address_instance = l.instance, l.address, NULL), l.successor \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(100) PATH '$')) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) ON l.name = j.n"
);

/// The most rows one takeover statement carries: a row's JSON is at most
/// about 1.5 KB (an address of 255 characters is up to 1 KB of UTF-8), so
/// 6 MB for 4,096, well within `max_allowed_packet` (16 MiB by default on
/// MariaDB 10.11). More go in several, in name order.
const TAKE_MANY_MAX: usize = 4_096;

/// [`TAKE`] for several expired rows in one statement, each on the token
/// seen. Binds: a JSON array of `[name, holder, instance, token seen,
/// daemon, address]`,
/// sorted by name so that two takers lock rows in one order, then ttl µs.
/// The matched-row count says whether all were taken. Joined as
/// [`RENEW_ALL`] is, for the same reason.
const TAKE_ALL: Sql = bounded!(
    "UPDATE",
    " (SELECT * FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', \
        h VARCHAR(100) PATH '$[1]', inst VARCHAR(64) PATH '$[2]', tok BIGINT PATH '$[3]', \
        d VARCHAR(64) PATH '$[4]', a VARCHAR(255) PATH '$[5]')) AS x) AS j \
    STRAIGHT_JOIN service_leader_lock l FORCE INDEX (service_leader_lock_name) \
      ON l.name = j.n AND l.token = j.tok \
    SET l.token = l.token + 1, l.holder = j.h, l.instance = j.inst, l.successor = NULL, \
        l.address = j.a, l.address_instance = j.inst, \
        l.acquired_at = UTC_TIMESTAMP(6), l.renewed_at = UTC_TIMESTAMP(6), \
        l.expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE l.expires_at <= UTC_TIMESTAMP(6) OR (l.instance IS NULL AND l.successor = j.d)"
);

/// [`CREATE`] for several missing rows in one statement. Binds: a JSON
/// array of `[name, block µs]` (see `LeaseRequest::block_us`).
const CREATE_ALL: Sql = bounded!(
    "INSERT",
    " INTO service_leader_lock (name, token, expires_at) \
    SELECT j.n, GREATEST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)), \
                COALESCE((SELECT t.token + 1 FROM service_leader_token t WHERE t.name = j.n), 0)), \
           UTC_TIMESTAMP(6) + INTERVAL j.b MICROSECOND \
    FROM JSON_TABLE(?, '$[*]' COLUMNS (n VARCHAR(100) PATH '$[0]', b BIGINT PATH '$[1]')) AS j \
    ON DUPLICATE KEY UPDATE id = id"
);

/// Frees the row if `instance` holds it; released to a successor, it stays
/// blocked for the window (`crate::Successor`). Binds: successor, window µs
/// (0 with none), name, instance.
const RELEASE: Sql = bounded!(
    "UPDATE",
    " service_leader_lock \
    SET holder = NULL, instance = NULL, successor = ?, address = NULL, address_instance = NULL, \
        expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
    WHERE name = ? AND instance = ?"
);

/// The rows whose name starts with the bind (twice; every row for `''`);
/// `name` is bytes, so the prefix is counted in bytes.
///
/// A range on the name's index (bind the prefix twice): every name that
/// starts with the prefix sorts from it up to it followed by byte 0xFF,
/// which UTF-8 never holds. A `LEFT(name, …) = ?` read every row of the
/// table, other apps' elections too, at every look of the spread.
const ELECTIONS: &str = "SELECT CAST(name AS CHAR), holder, token, \
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at), instance, \
    IF(instance IS NULL, NULL, TIMESTAMPDIFF(MICROSECOND, acquired_at, UTC_TIMESTAMP(6))), \
    IF(address_instance = instance, address, NULL) \
    FROM service_leader_lock WHERE name >= ? AND name < CONCAT(?, X'FF') ORDER BY name";

/// What the server is and how the session runs, read once at connect.
const SESSION: &str = "SELECT @@autocommit, VERSION()";

/// The steps' work is there once the kept-tokens table is (its trigger is
/// made apart from the steps, best effort: `migrate::MYSQL_KEPT_TOKENS`). A
/// literal, so that [`MIGRATION`] asks it together with the fence's and the
/// trigger's checks.
macro_rules! schema_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock' \
        AND column_name = 'name' AND data_type = 'varbinary') \
        AND EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = 'service_leader_token')"
    };
}

/// DDL is not transactional in MySQL: concurrent migrations are serialised
/// with a named lock (freed with the session if this one dies).
const MIGRATION: migrate::Plan = migrate::Plan {
    current: concat!(
        "SELECT (",
        schema_current!(),
        ") AND (",
        migrate::mysql_column_present!("successor"),
        ") AND (",
        migrate::address_present!(mysql_column_present),
        ") AND (",
        migrate::mysql_fence_current!(),
        ") AND (",
        migrate::mysql_kept_tokens_current!(),
        ") AND (",
        migrate::mysql_history_current!(),
        ")"
    ),
    steps_current: schema_current!(),
    // Every metadata lock a step needs (its DDL locks the lock table) is
    // waited for as briefly as the server allows, on this connection (used
    // for the migration only): a request queued behind a long transaction
    // queues every renewal behind it. MariaDB: 0, no wait at all, and the
    // steps are tried again for 100 ms (`retry_busy`); MySQL's least is 1 s.
    lock: "SET SESSION lock_wait_timeout = IF(VERSION() LIKE '%MariaDB%', 0, 1), \
        innodb_lock_wait_timeout = 1",
    // Tried, never waited for on the server: anyone may hold the name.
    try_lock: "SELECT COALESCE(GET_LOCK('leaderd_migrate', 0), 0) = 1",
    claim: None,
    unlock: "DO RELEASE_LOCK('leaderd_migrate')",
    steps: migrate::MYSQL,
    columns: &[migrate::MYSQL_SUCCESSOR, migrate::MYSQL_ADDRESS],
    tune: None,
    // A base table only: a view could call a function as this user.
    legacy: "SELECT EXISTS (SELECT 1 FROM information_schema.tables \
        WHERE table_schema = DATABASE() AND table_name = '__diesel_schema_migrations' \
        AND table_type = 'BASE TABLE')",
    retry_busy: true,
    fence: Some(migrate::MYSQL_FENCE),
    extras: &[migrate::MYSQL_KEPT_TOKENS, migrate::MYSQL_HISTORY],
};

/// MariaDB's plan: the same steps, its own way of installing the fence.
const MIGRATION_MARIADB: migrate::Plan = migrate::Plan {
    fence: Some(migrate::MARIADB_FENCE),
    ..MIGRATION
};

/// How long a Galera migration's claim lasts: a migration that died
/// holding it postpones the others' for at most this long.
macro_rules! galera_claim_seconds {
    () => {
        "30"
    };
}

/// MariaDB in a Galera cluster: `GET_LOCK` is each node's own, so
/// migrations on two nodes ran together (one failed on a column the other
/// had just added, and two `CREATE TRIGGER`s at once left a node's
/// replication waiting on a metadata lock for good). The migration claims
/// a row instead: committed writes are certified across the cluster, so of
/// two claims made at once on two nodes one commits and the other is
/// refused. A claim lasts [`galera_claim_seconds`] by the server's clock,
/// is renewed at each try of its owner (a session's random id), and is
/// deleted when the migration ends.
const MIGRATION_GALERA: migrate::Plan = migrate::Plan {
    claim: Some(concat!(
        "CREATE TABLE IF NOT EXISTS service_leader_migration (\
            id INT NOT NULL PRIMARY KEY, owner VARCHAR(36) NOT NULL, \
            until DATETIME(6) NOT NULL) ENGINE = InnoDB; \
        SET @leaderd_claim = COALESCE(@leaderd_claim, UUID()); \
        INSERT INTO service_leader_migration (id, owner, until) \
        VALUES (1, @leaderd_claim, UTC_TIMESTAMP(6) + INTERVAL ",
        galera_claim_seconds!(),
        " SECOND) \
        ON DUPLICATE KEY UPDATE \
            owner = IF(until < UTC_TIMESTAMP(6), VALUES(owner), owner), \
            until = IF(owner = VALUES(owner), VALUES(until), until)"
    )),
    try_lock: "SELECT EXISTS (SELECT 1 FROM service_leader_migration \
        WHERE id = 1 AND owner = @leaderd_claim)",
    unlock: "DELETE FROM service_leader_migration WHERE id = 1 AND owner = @leaderd_claim",
    ..MIGRATION_MARIADB
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
    /// The node's name when the server is a node of a MariaDB Galera
    /// cluster (`@@wsrep_on`).
    galera_node: Option<String>,
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
        if !has_json_table(&version, mariadb) {
            // Every batch statement reads its rows from `JSON_TABLE`.
            return Err(StoreError::Unsupported(format!(
                "the server is {version}; leaderd needs MySQL 8.0.4 or later, or MariaDB \
                 10.6 or later (JSON_TABLE)"
            )));
        }
        let galera_node = galera_node(&mut conn, &version).await;
        Ok(Self {
            conn,
            mariadb,
            galera_node,
        })
    }

    /// The Galera node this connection is on, if the server is one.
    pub(crate) fn galera_node(&self) -> Option<&str> {
        self.galera_node.as_deref()
    }

    /// Runs each batch statement once on nothing (`[]`: no row read,
    /// locked or written), and the plain ones a lone lease uses, so that
    /// each is prepared at connect, outside any attempt's budget: a
    /// statement's first use costs a round trip more (its prepare), and
    /// 120 ms away the first batches after a connect ran their leases past
    /// the deadline (led, lost and led again for a second or more). One
    /// text each whatever the batch's size.
    pub(crate) async fn prepare_batches(&mut self) -> Result<(), StoreError> {
        // The plain statements a lone lease uses, on a `NULL` name (never
        // equal to anything: the server sees an impossible `WHERE` and
        // reads nothing). Not `CREATE` (an `INSERT`): one alone goes in
        // `CREATE_ALL` too.
        Stmt::<SeenSql>::new(self.sql(&OBSERVE), [Bind::NullText])
            .load::<SeenRow>(&mut self.conn)
            .await?;
        let ttl = Bind::BigInt(0);
        Stmt::<()>::new(
            self.sql(&RENEW),
            [ttl, Bind::NullText, Bind::Text(""), Bind::BigInt(0)],
        )
        .execute(&mut self.conn)
        .await?;
        Stmt::<()>::new(
            self.sql(&TAKE),
            [
                Bind::Text(""),
                Bind::Text(""),
                Bind::NullText,
                Bind::Text(""),
                ttl,
                Bind::NullText,
                Bind::BigInt(0),
                Bind::NullText,
            ],
        )
        .execute(&mut self.conn)
        .await?;
        self.observe_all(&[]).await?;
        for sql in [&RENEW_ALL, &TAKE_ALL] {
            Stmt::<()>::new(self.sql(sql), [Bind::Text("[]"), Bind::BigInt(0)])
                .execute(&mut self.conn)
                .await?;
        }
        Stmt::<()>::new(self.sql(&CREATE_ALL), [Bind::Text("[]")])
            .execute(&mut self.conn)
            .await?;
        self.hold_wake_locks(&[]).await?;
        self.free_wake_locks(&[]).await
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
        let mut rows: Vec<(&str, &str, i64)> = items
            .iter()
            .map(|(req, token)| (req.election, req.instance, *token))
            .collect();
        rows.sort_unstable_by_key(|r| r.0.as_bytes());
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        Stmt::<()>::new(
            self.sql(&RENEW_ALL),
            [Bind::Text(&rows), Bind::BigInt(items[0].0.ttl_us())],
        )
        .execute(&mut self.conn)
        .await
    }

    pub(crate) async fn release(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&RELEASE),
            [
                item.successor
                    .map_or(Bind::NullText, |s| Bind::Text(s.daemon)),
                Bind::BigInt(item.window_us()),
                Bind::Text(item.election),
                Bind::Text(item.instance),
            ],
        )
        .execute(&mut self.conn)
        .await?;
        Ok(n > 0)
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<RowParts> =
            Stmt::<(
                Text,
                Nullable<Text>,
                BigInt,
                BigInt,
                Nullable<Text>,
                Nullable<BigInt>,
                Nullable<Text>,
            )>::new(ELECTIONS, [Bind::Text(prefix), Bind::Text(prefix)])
            .load(&mut self.conn)
            .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    /// The record of terms, newest first (`None`: not installed).
    pub(crate) async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        let name = election.map_or(Bind::NullText, Bind::Text);
        let rows: Result<Vec<TermParts>, _> =
            Stmt::<TermSql>::new(crate::history::MYSQL, [name, name, Bind::BigInt(limit)])
                .load(&mut self.conn)
                .await;
        match rows {
            Err(e) if crate::history::missing_table_diesel(&e) => Ok(None),
            rows => Ok(Some(rows?.into_iter().map(Term::from).collect())),
        }
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        let plan = if self.galera_node.is_some() {
            &MIGRATION_GALERA
        } else {
            self.plan()
        };
        migrate::run(&mut self.conn, plan).await
    }

    pub(crate) async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        let plan = self.plan();
        migrate::fence_status(&mut self.conn, plan).await
    }

    fn plan(&self) -> &'static migrate::Plan {
        if self.mariadb {
            &MIGRATION_MARIADB
        } else {
            &MIGRATION
        }
    }
}

/// The node's name when this server (its `VERSION()`) is a MariaDB node of
/// a Galera cluster (`@@wsrep_on`); `None` otherwise (MySQL, Percona
/// included, is not asked), and on a server built without wsrep, which has
/// no such variable.
pub(crate) async fn galera_node(conn: &mut AsyncMysqlConnection, version: &str) -> Option<String> {
    if !version.contains("MariaDB") {
        return None;
    }
    let (on, name): (i64, String) =
        Stmt::<(BigInt, Text)>::new("SELECT @@wsrep_on + 0, COALESCE(@@wsrep_node_name, '')", [])
            .get_result(conn)
            .await
            .ok()?;
    (on != 0).then_some(name)
}

/// A row-lock wait that the statement's own bound cut short (error 1205):
/// another transaction holds the row. Or a deadlock (1213, MySQL, whose
/// statements wait for row locks; see [`Sql`]): the statement was rolled
/// back, as after a lock wait.
fn lock_busy(e: &diesel::result::Error) -> bool {
    matches!(e, diesel::result::Error::DatabaseError(_, info)
        if info.message().contains("Lock wait timeout") || info.message().contains("Deadlock found"))
}

/// A row lock held elsewhere ([`lock_busy`]) is [`StoreError::Busy`], the
/// row's own answer: on a renewal, another session's lock on the lease row;
/// on a create, the election's fence row, locked by an app's open fenced
/// transaction (its trigger writes it).
fn busy_or(e: diesel::result::Error) -> StoreError {
    if lock_busy(&e) {
        StoreError::Busy
    } else {
        e.into()
    }
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
        .await
        .map_err(busy_or)?;
        Ok(n > 0)
    }

    async fn observe(&mut self, req: &LeaseRequest<'_>) -> Result<Option<Observed>, StoreError> {
        let rows: Vec<SeenRow> =
            Stmt::<SeenSql>::new(self.sql(&OBSERVE), [Bind::Text(req.election)])
                .load(&mut self.conn)
                .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|(h, i, t, r, a, s)| as_heir(req, observed((h, i, t, r, a)), s.as_deref())))
    }

    async fn take(&mut self, req: &LeaseRequest<'_>, seen_token: i64) -> Result<bool, StoreError> {
        let n = Stmt::<()>::new(
            self.sql(&TAKE),
            [
                Bind::Text(req.holder),
                Bind::Text(req.instance),
                req.address.map_or(Bind::NullText, Bind::Text),
                Bind::Text(req.instance),
                Bind::BigInt(req.ttl_us()),
                Bind::Text(req.election),
                Bind::BigInt(seen_token),
                req.daemon.map_or(Bind::NullText, Bind::Text),
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
                Bind::BigInt(req.block_us()),
            ],
        )
        .execute(&mut self.conn)
        .await
        .map_err(busy_or)?;
        Ok(())
    }
}

impl CasBatch for MysqlStore {
    /// One statement for all: a server 150 ms away would otherwise spend a
    /// round trip per election, and a handful of followers' attempts ran
    /// past their budget (cut, and retried, for ever).
    async fn observe_all(
        &mut self,
        reqs: &[&LeaseRequest<'_>],
    ) -> Result<Vec<Option<Observed>>, StoreError> {
        if let [req] = reqs {
            return Ok(vec![self.observe(req).await?]);
        }
        let names: Vec<&str> = reqs.iter().map(|r| r.election).collect();
        let names = names_json(&names);
        // Place, then the row as `observed` takes it, and its successor.
        type Row = (
            i64,
            Option<String>,
            Option<String>,
            i64,
            i64,
            Option<String>,
            Option<String>,
        );
        type RowSql = (
            BigInt,
            Nullable<Text>,
            Nullable<Text>,
            BigInt,
            BigInt,
            Nullable<Text>,
            Nullable<Text>,
        );
        let rows: Vec<Row> = Stmt::<RowSql>::new(self.sql(&OBSERVE_ALL), [Bind::Text(&names)])
            .load(&mut self.conn)
            .await?;
        let mut out = vec![None; reqs.len()];
        for (place, holder, instance, token, remaining_us, address, successor) in rows {
            let Some(i) = usize::try_from(place - 1).ok().filter(|&i| i < reqs.len()) else {
                continue;
            };
            out[i] = Some(as_heir(
                reqs[i],
                observed((holder, instance, token, remaining_us, address)),
                successor.as_deref(),
            ));
        }
        Ok(out)
    }

    /// One statement for all. When it matched fewer rows than it carries
    /// (another replica took one first), the rows are read again, and one
    /// now on this request's instance with the next token is renewed
    /// before it is counted as taken: this statement may not be what put
    /// it there (an earlier one of this instance, given up on but still
    /// running on the server, may have, with an expiry counted from its own
    /// start, long past), while the renewal's expiry counts from now. When
    /// a row was locked elsewhere (the statement refused whole), those still
    /// open go alone, as before batches: only the locked one is refused.
    async fn take_all(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        if items.len() <= TAKE_MANY_MAX {
            return self.take_part(items).await;
        }
        // In name order across the parts too, as each part locks its rows.
        let mut order: Vec<usize> = (0..items.len()).collect();
        order.sort_unstable_by_key(|&i| items[i].0.election.as_bytes());
        let mut out = vec![false; items.len()];
        for part in order.chunks(TAKE_MANY_MAX) {
            let chunk: Vec<(&LeaseRequest<'_>, i64)> = part.iter().map(|&i| items[i]).collect();
            for (&i, took) in part.iter().zip(self.take_part(&chunk).await?) {
                out[i] = took;
            }
        }
        Ok(out)
    }

    async fn create_all(&mut self, reqs: &[&LeaseRequest<'_>]) -> Result<(), StoreError> {
        let rows: Vec<(&str, i64)> = reqs.iter().map(|r| (r.election, r.block_us())).collect();
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        Stmt::<()>::new(self.sql(&CREATE_ALL), [Bind::Text(&rows)])
            .execute(&mut self.conn)
            .await
            .map_err(busy_or)?;
        Ok(())
    }
}

impl MysqlStore {
    /// [`CasOps::take_all`] for at most [`TAKE_MANY_MAX`] rows: one
    /// statement.
    async fn take_part(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        if let [(req, seen)] = items {
            return Ok(vec![self.take(req, *seen).await?]);
        }
        type TakeRow<'a> = (
            &'a str,
            &'a str,
            &'a str,
            i64,
            Option<&'a str>,
            Option<&'a str>,
        );
        let mut rows: Vec<TakeRow<'_>> = items
            .iter()
            .map(|(req, seen)| {
                let r = req;
                (r.election, r.holder, r.instance, *seen, r.daemon, r.address)
            })
            .collect();
        rows.sort_unstable_by_key(|r| r.0.as_bytes());
        let rows = serde_json::to_string(&rows).expect("strings serialize");
        let n = Stmt::<()>::new(
            self.sql(&TAKE_ALL),
            [Bind::Text(&rows), Bind::BigInt(items[0].0.ttl_us())],
        )
        .execute(&mut self.conn)
        .await;
        match n {
            Ok(n) if n == items.len() => return Ok(vec![true; items.len()]),
            Ok(_) => {}
            Err(e) if lock_busy(&e) => return self.take_each_still_open(items).await,
            Err(e) => return Err(e.into()),
        }
        let reqs: Vec<&LeaseRequest<'_>> = items.iter().map(|(r, _)| *r).collect();
        let now = self.observe_all(&reqs).await?;
        let ours: Vec<(&LeaseRequest<'_>, i64)> = items
            .iter()
            .zip(&now)
            .filter(|((req, seen), row)| {
                row.as_ref().is_some_and(|o| {
                    o.instance.as_deref() == Some(req.instance) && o.token == seen + 1
                })
            })
            .map(|((req, seen), _)| (*req, seen + 1))
            .collect();
        let renewed = if ours.is_empty() {
            Vec::new()
        } else {
            self.renew_all(&ours).await?
        };
        let confirmed: std::collections::HashSet<&str> = ours
            .iter()
            .zip(renewed)
            .filter_map(|((req, _), ok)| ok.then_some(req.election))
            .collect();
        Ok(items
            .iter()
            .map(|(req, _)| confirmed.contains(req.election))
            .collect())
    }
}

/// The named lock of an election: server-wide, so the database name is part
/// of it, hashed to stay within MySQL's 64 characters. Bind: election.
macro_rules! lock_name {
    () => {
        lock_name!("?")
    };
    ($name:literal) => {
        concat!(
            "CONCAT('leaderd:', SHA1(CONCAT(DATABASE(), '/', ",
            $name,
            ")))"
        )
    };
}

/// The rows `j.n` of a JSON array of election names (bind), in order.
macro_rules! names_of_json {
    () => {
        " FROM JSON_TABLE(?, '$[*]' COLUMNS (i FOR ORDINALITY, n VARCHAR(100) PATH '$')) AS j \
         ORDER BY j.i"
    };
}

/// Waits until a leader's named lock is freed (bind: election, then the wait
/// in milliseconds): 1 when it was, 0 on timeout.
const WAIT_FOR_LOCK: &str = concat!("SELECT GET_LOCK(", lock_name!(), ", ? / 1000)");
/// Gives back a lock won only by waking up.
const LET_GO: &str = concat!("SELECT RELEASE_LOCK(", lock_name!(), ")");
/// Whether someone (a leader) holds the lock now.
const LOCK_HELD: &str = concat!("SELECT IS_USED_LOCK(", lock_name!(), ") IS NOT NULL");
/// A leader takes its elections' locks without waiting, all in one
/// statement: for each, 0 when it holds it now, else the connection that
/// does (anyone who may connect can take a named lock), or -1 when the
/// server did not say. Idempotent: a lock this session holds already is
/// not taken again (a session counts a lock taken twice, and one free
/// would leave it held). Bind: the names, a JSON array.
const TAKE_LOCKS: &str = concat!(
    "SELECT IF(IS_USED_LOCK(",
    lock_name!("j.n"),
    ") <=> CONNECTION_ID() OR COALESCE(GET_LOCK(",
    lock_name!("j.n"),
    ", 0), 0) = 1, 0, COALESCE(IS_USED_LOCK(",
    lock_name!("j.n"),
    "), -1))",
    names_of_json!()
);
/// Frees the leader's locks of those elections (bind: the names, a JSON
/// array), each waking one waiter.
const LET_GO_ALL: &str = concat!(
    "SELECT RELEASE_LOCK(",
    lock_name!("j.n"),
    ")",
    names_of_json!()
);

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
/// its connection to the lock table ([`MysqlStore::hold_wake_locks`]); a
/// follower waits for that lock with `GET_LOCK`, which returns the moment
/// the leader frees it (a release, or its session ending) and gives it
/// straight back. Only a wake-up: the lock says nothing about who leads.
pub struct LockWaiter {
    conn: AsyncMysqlConnection,
    election: String,
    /// The longest single server-side wait, so that a vanished client's wait
    /// ends soon on the server too.
    wait: std::time::Duration,
}

opaque_debug!(LockWaiter);

impl LockWaiter {
    pub(crate) fn new(
        conn: AsyncMysqlConnection,
        election: &str,
        wait: std::time::Duration,
    ) -> Self {
        Self {
            conn,
            election: election.to_owned(),
            wait,
        }
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

/// Which named locks of the daemon's own elections are held now (bind:
/// their names, a JSON array): one statement whatever their number, and no
/// table read at all. Reading the lock table for the names read every row
/// of it at every look, other apps' elections too: with 20,000 rows, one
/// idle daemon kept MariaDB at a third of a core.
const LOCKS_HELD: &str = concat!(
    "SELECT j.n, IS_USED_LOCK(",
    lock_name!("j.n"),
    ") IS NOT NULL",
    names_of_json!()
);

/// Wake-ups for several elections on one connection: `GET_LOCK` waits for
/// one lock per session, so instead the leaders' locks are all looked at
/// together every [`IDLE_SOON`] (longer beyond 200 elections), and each one
/// seen held and then free is a release (or a leader gone). Only the
/// elections this daemon does not lead are looked at: an idle daemon that
/// leads all of its own sends nothing.
pub struct LocksWatcher {
    conn: AsyncMysqlConnection,
    /// The elections watched.
    elections: Vec<String>,
    /// The locks held at the last look.
    held: std::collections::HashSet<String>,
    /// Freed ones not yet returned.
    freed: std::collections::VecDeque<String>,
    every: std::time::Duration,
}

opaque_debug!(LocksWatcher);

impl LocksWatcher {
    pub(crate) fn new(conn: AsyncMysqlConnection, elections: &[String]) -> Self {
        // Each look asks for every election's lock: keep the looks per
        // second bounded.
        let every =
            IDLE_SOON * u32::try_from(elections.len().div_ceil(200).max(1)).unwrap_or(u32::MAX);
        Self {
            conn,
            elections: elections.to_vec(),
            held: std::collections::HashSet::new(),
            freed: std::collections::VecDeque::new(),
            every,
        }
    }

    /// The next election whose leader's lock was freed, among those
    /// `wanted` at each look (none wanted: no statement at all).
    pub(crate) async fn next(
        &mut self,
        wanted: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<String, StoreError> {
        loop {
            if let Some(name) = self.freed.pop_front() {
                return Ok(name);
            }
            let looked = wanted_of(&self.elections, wanted);
            let held: std::collections::HashSet<String> = if looked.is_empty() {
                std::collections::HashSet::new()
            } else {
                let names = names_json(&looked);
                let rows: Vec<(String, bool)> =
                    Stmt::<(Text, diesel::sql_types::Bool)>::new(LOCKS_HELD, [Bind::Text(&names)])
                        .load(&mut self.conn)
                        .await?;
                rows.into_iter()
                    .filter_map(|(name, held)| held.then_some(name))
                    .collect()
            };
            // Seen held, looked at again, and free now: released. One not
            // looked at (led here meanwhile) is forgotten, not released.
            let looked: std::collections::HashSet<&str> = looked.into_iter().collect();
            self.freed.extend(
                self.held
                    .iter()
                    .filter(|e| looked.contains(e.as_str()) && !held.contains(*e))
                    .cloned(),
            );
            self.held = held;
            if self.freed.is_empty() {
                tokio::time::sleep(self.every).await;
            }
        }
    }
}

impl MysqlStore {
    /// Takes the elections' named locks (see [`LockWaiter`]) without
    /// waiting, in one statement; whether this session holds each now, or
    /// who does (a follower that just woke may hold one for an instant:
    /// try again).
    pub(crate) async fn hold_wake_locks(
        &mut self,
        elections: &[&str],
    ) -> Result<Vec<WakeLock>, StoreError> {
        let names = names_json(elections);
        let got: Vec<i64> = Stmt::<BigInt>::new(TAKE_LOCKS, [Bind::Text(&names)])
            .load(&mut self.conn)
            .await?;
        // One row per name, in order (one missing reads as not held).
        Ok((0..elections.len())
            .map(|i| match got.get(i) {
                Some(0) => WakeLock::Held,
                Some(&id) => WakeLock::Busy(u64::try_from(id).ok()),
                None => WakeLock::Busy(None),
            })
            .collect())
    }

    /// Frees the elections' named locks, in one statement, each waking one
    /// waiter (who wakes the next).
    pub(crate) async fn free_wake_locks(&mut self, elections: &[&str]) -> Result<(), StoreError> {
        let names = names_json(elections);
        Stmt::<Nullable<BigInt>>::new(LET_GO_ALL, [Bind::Text(&names)])
            .load::<Option<i64>>(&mut self.conn)
            .await?;
        Ok(())
    }
}

impl MysqlStore {
    /// After a batch take refused whole (a row locked elsewhere, or a
    /// metadata lock): the rows read again in one statement, and only those
    /// still expired on the token seen taken, one by one (a rival taker
    /// that caused the refusal has usually taken the rest by now).
    async fn take_each_still_open(
        &mut self,
        items: &[(&LeaseRequest<'_>, i64)],
    ) -> Result<Vec<bool>, StoreError> {
        let reqs: Vec<&LeaseRequest<'_>> = items.iter().map(|(r, _)| *r).collect();
        let now = self.observe_all(&reqs).await?;
        let mut out = Vec::with_capacity(items.len());
        for ((req, seen), row) in items.iter().zip(now) {
            let open = row.is_some_and(|o| o.token == *seen && o.remaining_us <= 0);
            out.push(open && self.take(req, *seen).await?);
        }
        Ok(out)
    }
}

/// Whether a server of this `VERSION()` has `JSON_TABLE` (MySQL 8.0.4,
/// MariaDB 10.6). A version that does not parse is given the benefit of the
/// doubt: its statements say so themselves.
fn has_json_table(version: &str, mariadb: bool) -> bool {
    // MariaDB's handshake puts "5.5.5-" before its version (for old
    // clients); the server's VERSION() may carry it through a proxy.
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), patch) = (parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    let patch = patch.flatten().unwrap_or(0);
    if mariadb {
        (major, minor) >= (10, 6)
    } else {
        (major, minor, patch) >= (8, 0, 4)
    }
}

/// The elections of `elections` that `wanted` says to look at now (a
/// release waiter's look, see `wake`).
pub(crate) fn wanted_of<'a>(
    elections: &'a [String],
    wanted: &(dyn Fn(&str) -> bool + Sync),
) -> Vec<&'a str> {
    elections
        .iter()
        .map(String::as_str)
        .filter(|e| wanted(e))
        .collect()
}

/// Names as a JSON array, for `JSON_TABLE`: one bind, one statement text,
/// whatever their number.
pub(crate) fn names_json(elections: &[&str]) -> String {
    serde_json::to_string(elections).expect("strings serialize")
}

#[cfg(test)]
mod tests {
    //! Against the local MariaDB (127.0.0.1:3306, `root`, no password), in
    //! a database of its own.
    use super::*;
    use diesel_async::SimpleAsyncConnection;

    #[test]
    fn the_migration_check_asks_every_part() {
        MIGRATION.assert_current_asks_every_check();
        MIGRATION_MARIADB.assert_current_asks_every_check();
    }

    async fn scratch() -> (String, AsyncMysqlConnection) {
        let admin = DatabaseUrl::parse("mysql://root@127.0.0.1:3306/test").unwrap();
        let mut conn = establish(&admin).await.expect("the local MariaDB");
        let name = format!("leaderd_unit_{}", uuid::Uuid::new_v4().simple());
        conn.batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        (name, conn)
    }

    #[test]
    fn json_table_is_there_from_mysql_8_0_4_and_mariadb_10_6() {
        for (version, mariadb, has) in [
            ("10.11.19-MariaDB-0+deb12u1", true, true),
            ("10.6.0-MariaDB", true, true),
            ("10.5.23-MariaDB-0+deb11u1", true, false),
            ("5.5.5-10.4.34-MariaDB", true, false),
            ("5.5.5-10.11.2-MariaDB", true, true),
            ("8.0.36", false, true),
            ("8.0.4-rc-log", false, true),
            ("8.0.3", false, false),
            ("5.7.44-log", false, false),
            ("9.1.0", false, true),
            ("something else", false, true),
        ] {
            assert_eq!(has_json_table(version, mariadb), has, "{version}");
        }
    }

    /// A migrated scratch database: its URL, a connection to run SQL on
    /// it, and a connection to drop it with.
    async fn migrated() -> (DatabaseUrl, AsyncMysqlConnection, Dropper) {
        let (name, admin) = scratch().await;
        let url = DatabaseUrl::parse(&format!("mysql://root@127.0.0.1:3306/{name}")).unwrap();
        MysqlStore::connect(&url)
            .await
            .unwrap()
            .migrate()
            .await
            .unwrap();
        let sql = establish(&url).await.unwrap();
        (url, sql, Dropper(Some((name, admin))))
    }

    /// Drops the scratch database at the end of a test.
    struct Dropper(Option<(String, AsyncMysqlConnection)>);

    impl Dropper {
        async fn drop_now(mut self) {
            if let Some((name, mut admin)) = self.0.take() {
                let _ = admin.batch_execute(&format!("DROP DATABASE {name}")).await;
            }
        }
    }

    fn req<'a>(election: &'a str, holder: &'a str, instance: &'a str) -> LeaseRequest<'a> {
        LeaseRequest {
            election,
            holder,
            instance,
            ttl: std::time::Duration::from_secs(30),
            held_token: None,
            daemon: None,
            address: None,
        }
    }

    /// Requests for elections e1, e2 and e3.
    fn three<'a>(holder: &'a str, instance: &'a str) -> [LeaseRequest<'a>; 3] {
        ["e1", "e2", "e3"].map(|e| req(e, holder, instance))
    }

    /// Rows created expired at once (a ttl of zero blocks them for nothing),
    /// and the tokens they were seen with.
    async fn expired_rows(a: &mut MysqlStore, reqs: &[&LeaseRequest<'_>]) -> Vec<i64> {
        let at_once: Vec<LeaseRequest<'_>> = reqs
            .iter()
            .map(|r| LeaseRequest {
                ttl: std::time::Duration::ZERO,
                ..**r
            })
            .collect();
        a.create_all(&at_once.iter().collect::<Vec<_>>())
            .await
            .unwrap();
        a.observe_all(reqs)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.expect("created").token)
            .collect()
    }

    /// More expired rows than one takeover statement carries, with long
    /// multi-byte addresses: all taken, each answer in its request's place
    /// (the parts go in name order, not the requests').
    #[tokio::test]
    async fn a_takeover_of_more_rows_than_a_statement_carries_goes_in_parts() {
        let (url, _sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let address = "日".repeat(crate::MAX_ADDRESS_CHARS);
        // Names in reverse order, so the parts' order is not the requests'.
        let names: Vec<String> = (0..TAKE_MANY_MAX + 3)
            .rev()
            .map(|i| format!("e{i:05}"))
            .collect();
        let reqs: Vec<LeaseRequest<'_>> = names
            .iter()
            .map(|n| LeaseRequest {
                address: Some(&address),
                ..req(n, "a", "ia")
            })
            .collect();
        let refs: Vec<&LeaseRequest<'_>> = reqs.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        // One row is taken by another first: answered false, in its place.
        let mut b = MysqlStore::connect(&url).await.unwrap();
        let stolen = 7;
        assert!(b
            .take(&req(&names[stolen], "b", "ib"), seen[stolen])
            .await
            .unwrap());
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen).collect();
        let took = a.take_all(&items).await.unwrap();
        assert_eq!(took.len(), items.len());
        for (i, t) in took.iter().enumerate() {
            assert_eq!(*t, i != stolen, "{}", names[i]);
        }
        let now = a.observe_all(&refs).await.unwrap();
        for (i, row) in now.iter().enumerate() {
            let row = row.as_ref().expect("the row");
            let holder = if i == stolen { "ib" } else { "ia" };
            assert_eq!(row.instance.as_deref(), Some(holder), "{}", names[i]);
            if i != stolen {
                assert_eq!(row.address.as_deref(), Some(address.as_str()));
            }
        }
        dropper.drop_now().await;
    }

    /// A batch take that loses one row to another taker between its read
    /// and its write learns which ones it took by reading them again: its
    /// own instance with the next token, and still live (renewed).
    #[tokio::test]
    async fn a_batch_take_that_loses_a_race_says_which_rows_it_took() {
        let (url, _sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let mut b = MysqlStore::connect(&url).await.unwrap();
        let ours = three("a", "ia");
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        // B takes e2 between A's read and A's take.
        assert!(b.take(&req("e2", "b", "ib"), seen[1]).await.unwrap());
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen.clone()).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true, false, true]);
        let now = a.observe_all(&refs).await.unwrap();
        let holders: Vec<(Option<String>, i64, bool)> = now
            .into_iter()
            .map(|o| {
                o.map(|o| (o.instance, o.token, o.remaining_us > 0))
                    .unwrap()
            })
            .collect();
        assert_eq!(
            holders,
            [
                (Some("ia".to_owned()), seen[0] + 1, true),
                (Some("ib".to_owned()), seen[1] + 1, true),
                (Some("ia".to_owned()), seen[2] + 1, true),
            ]
        );
        dropper.drop_now().await;
    }

    /// A row locked elsewhere (an operator's `SELECT … FOR UPDATE`) refuses
    /// the whole batch take on MariaDB (a lock wait of 0): the rows then go
    /// one by one, and only the locked one is not taken.
    #[tokio::test]
    async fn a_locked_row_costs_a_batch_take_that_row_only() {
        let (url, mut sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let ours = three("a", "ia");
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        sql.batch_execute("BEGIN; SELECT * FROM service_leader_lock WHERE name = 'e2' FOR UPDATE")
            .await
            .unwrap();
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true, false, true]);
        sql.batch_execute("ROLLBACK").await.unwrap();
        let rows: Vec<(Option<String>, i64)> = a
            .observe_all(&refs)
            .await
            .unwrap()
            .into_iter()
            .map(|o| o.map(|o| (o.instance, o.token)).unwrap())
            .collect();
        let ia = Some("ia".to_owned());
        let want = [
            (ia.clone(), items[0].1 + 1),
            (None, items[1].1),
            (ia, items[2].1 + 1),
        ];
        assert_eq!(rows, want);
        dropper.drop_now().await;
    }

    /// A row found on this instance with the next token after a partial
    /// take may have been put there by an earlier statement of this
    /// instance, given up on but still run by the server later, with an
    /// expiry counted from that statement's start: already past. Counted as
    /// taken, it would be led while another replica may take it. It is
    /// not; the next attempt takes it with a new token.
    #[tokio::test]
    async fn a_row_left_expired_by_an_earlier_take_is_not_counted_as_taken() {
        let (url, mut sql, dropper) = migrated().await;
        let mut a = MysqlStore::connect(&url).await.unwrap();
        let ours = [req("e1", "a", "ia"), req("e2", "a", "ia")];
        let refs: Vec<&LeaseRequest<'_>> = ours.iter().collect();
        let seen = expired_rows(&mut a, &refs).await;
        // What the earlier statement did to e2: taken, long expired.
        sql.batch_execute(&format!(
            "UPDATE service_leader_lock SET token = {}, holder = 'a', instance = 'ia', \
             expires_at = UTC_TIMESTAMP(6) - INTERVAL 2 SECOND WHERE name = 'e2'",
            seen[1] + 1
        ))
        .await
        .unwrap();
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen.clone()).collect();
        assert_eq!(a.take_all(&items).await.unwrap(), [true, false]);
        let e2 = a.observe_all(&refs[1..]).await.unwrap().remove(0).unwrap();
        assert!(e2.remaining_us <= 0, "e2 was renewed: {e2:?}");
        // The next attempt's take: a new token.
        assert_eq!(a.take_all(&[(refs[1], e2.token)]).await.unwrap(), [true]);
        let e2 = a.observe_all(&refs[1..]).await.unwrap().remove(0).unwrap();
        assert_eq!((e2.token, e2.remaining_us > 0), (seen[1] + 2, true));
        dropper.drop_now().await;
    }

    /// The batch statements look up the rows they name and lock nothing
    /// else, on a table of a few rows too (where the servers would rather
    /// scan it, locking every row): another replica's renewal of its own
    /// row never finds it locked (a lock wait of 0 refuses at once on
    /// MariaDB). Also the no-op runs at connect.
    #[tokio::test]
    async fn batch_statements_lock_only_the_rows_they_match() {
        let (url, mut sql, dropper) = migrated().await;
        let mut b = MysqlStore::connect(&url).await.unwrap();
        let names = ["e1", "e2", "e3", "e4", "e5"];
        let rows: Vec<LeaseRequest<'_>> = names.iter().map(|n| req(n, "b", "ib")).collect();
        let refs: Vec<&LeaseRequest<'_>> = rows.iter().collect();
        let seen = expired_rows(&mut b, &refs).await;
        let items: Vec<(&LeaseRequest<'_>, i64)> = refs.iter().copied().zip(seen.clone()).collect();
        assert_eq!(b.take_all(&items[1..]).await.unwrap(), [true; 4]);
        sql.batch_execute("ANALYZE TABLE service_leader_lock")
            .await
            .unwrap();
        let literal = |text: &str, json: &str| {
            text.replacen('?', &format!("'{json}'"), 1)
                .replacen('?', "1000000", 1)
        };
        let held_open = [
            literal(RENEW_ALL.mariadb, r#"[["e1","ia",1]]"#),
            literal(RENEW_ALL.mariadb, "[]"),
            literal(
                TAKE_ALL.mariadb,
                &format!(r#"[["e1","a","ia",{}]]"#, seen[0]),
            ),
            literal(TAKE_ALL.mariadb, "[]"),
        ];
        for statement in held_open {
            sql.batch_execute(&format!("BEGIN; {statement}"))
                .await
                .unwrap();
            let e5 = LeaseRequest {
                held_token: Some(seen[4] + 1),
                ..rows[4]
            };
            assert!(
                b.renew(&e5, seen[4] + 1).await.unwrap(),
                "e5's renewal behind {statement}"
            );
            sql.batch_execute("ROLLBACK").await.unwrap();
        }
        dropper.drop_now().await;
    }
}
