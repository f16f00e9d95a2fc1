//! PostgreSQL: the lock table on `tokio-postgres` (pure Rust), over rustls
//! when the URL asks for TLS (see `tls`).
//!
//! Clock: `now()`, the start of each autocommit statement, on the server.
//! Acquire-or-renew is one `UPDATE … RETURNING` that also reads the holder when
//! refused. Release wakes waiting replicas with `NOTIFY leaderd, '<election>'`.
//!
//! Pooler-safe: the lock-table statements run on tokio-postgres directly and
//! the session is never `SET`. Through PgBouncer in transaction pooling each
//! statement may run on another server connection, where a named statement
//! prepared earlier does not exist (or another client's exists under the same
//! name, which could even be a different statement); diesel-async prepares
//! named statements for every query and `SET`s the time zone at connect, so
//! it is not used here at all. Statements are therefore *unnamed*
//! (`query_typed`: parse, bind and execute in one round trip) unless the
//! connection is known to be direct: the server's view of its peer is a TCP
//! socket of this very process (see [`direct`]). Then they are named and
//! prepared once (from the first statement after the check answers): the server's parse and plan of each renewal cost
//! 2.5× the throughput at 32 electors (BENCHMARKS.md). Anything unknown
//! (a Unix socket, NAT, a proxy of any kind, no `/proc`) counts as not
//! direct: slower, never wrong.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::held_off::{self, HeldOff};
use crate::history::Term;
use crate::migrate;
use crate::pg_session::{Facts, Session};
use crate::tls::{self, Verify};
use crate::url::TlsMode;
use crate::{
    observed, Attempt, DatabaseUrl, ElectionRow, FenceStatus, LeaseRequest, Migrated, Release,
    StoreError,
};

/// The `LISTEN`/`NOTIFY` channel; the payload is the election name.
pub const CHANNEL: &str = "leaderd";

/// The steps' work is there: the last step makes the trigger that keeps
/// deleted rows' tokens. It reads `pg_class` with the statement's snapshot:
/// `to_regclass` goes through the catalog cache, which taking an advisory
/// lock does not refresh, so a waiter would miss the table its predecessor
/// just created. A literal, so that [`MIGRATION`] asks it together with the
/// fence's check.
macro_rules! schema_current {
    () => {
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t \
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid \
        WHERE t.tgname OPERATOR(pg_catalog.=) 'service_leader_keep_token' \
        AND c.relname OPERATOR(pg_catalog.=) 'service_leader_lock' \
        AND c.relnamespace OPERATOR(pg_catalog.=) (SELECT n.oid FROM pg_catalog.pg_namespace n \
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()))"
    };
}

/// A superuser uses leaderd's tables and functions only while they, and
/// the schema, belong to a superuser: a trigger or policy that another
/// role put on them, or a table that role put in their place, would run
/// with the superuser's rights. When they do not, the migration runs, and
/// its guard refuses (LF010): leaderd then uses the database no further.
/// Other users are held to the guard only when they install.
macro_rules! trusted_by_a_superuser {
    () => {
        "SELECT NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r \
        WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) \
        OR (NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) c.relowner \
        WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(pg_catalog.quote_ident(pg_catalog.current_schema())) \
        AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', 'service_leader_token', \
        'service_leader_fence_key', 'service_leader_fence_gate', 'service_leader_fence_boot', \
        'service_leader_history']::pg_catalog.name[]) \
        AND NOT o.rolsuper) \
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) p.proowner \
        WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(pg_catalog.quote_ident(pg_catalog.current_schema())) \
        AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_keep_token', 'service_leader_seed_token', \
        'service_leader_token_floor', 'service_leader_take', 'service_leader_take_key', \
        'service_leader_open_transactions', 'service_leader_fenced_session', 'service_leader_record_term', \
        'leaderd_fence']::pg_catalog.name[]) \
        AND NOT o.rolsuper) \
        AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a \
        JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid \
        JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) t.typowner \
        WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(pg_catalog.quote_ident(pg_catalog.current_schema())) \
        AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', 'service_leader_token', \
        'service_leader_fence_key', 'service_leader_fence_gate', 'service_leader_fence_boot', \
        'service_leader_history']::pg_catalog.name[]) \
        AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped \
        AND t.typnamespace OPERATOR(pg_catalog.<>) pg_catalog.to_regnamespace('pg_catalog') \
        AND NOT o.rolsuper) \
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) n.nspowner \
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema() \
        AND (o.rolsuper OR (o.rolname OPERATOR(pg_catalog.=) 'pg_database_owner' \
        AND EXISTS (SELECT 1 FROM pg_catalog.pg_database d \
        JOIN pg_catalog.pg_roles dr ON dr.oid OPERATOR(pg_catalog.=) d.datdba \
        WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database() AND dr.rolsuper)))))"
    };
}

/// Whoever connects uses leaderd's objects only while their owners are
/// ones it trusts (see `pg_session::untrusted`): a role that may create in
/// the schema could make them all, with the right names, before leaderd
/// was installed there. When they are not, the migration runs, and its
/// guard refuses (LF010).
macro_rules! trusted_by_anyone {
    () => {
        concat!(
            "SELECT NOT EXISTS (",
            crate::pg_session::untrusted!(
                "(SELECT m.oid FROM pg_catalog.pg_namespace m                  WHERE m.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema())"
            ),
            ")"
        )
    };
}

/// The steps' work is there, and a superuser may trust it: asked again
/// under the lock, so that an installation that only looks current (made
/// by another role) runs the steps, whose guard then refuses it.
macro_rules! steps_current {
    () => {
        concat!(
            "SELECT (",
            schema_current!(),
            ") AND (",
            trusted_by_a_superuser!(),
            ") AND (",
            trusted_by_anyone!(),
            ")"
        )
    };
}

/// DDL is transactional here: the steps run under a transaction-level
/// advisory lock (pooler-safe, released by COMMIT or a dropped session). The
/// key is "leaderd" in ASCII.
const MIGRATION: migrate::Plan = migrate::Plan {
    current: concat!(
        "SELECT (",
        steps_current!(),
        ") AND (",
        migrate::postgres_column_present!("successor"),
        ") AND (",
        migrate::address_present!(postgres_column_present),
        ") AND (",
        migrate::postgres_fence_current!(),
        ") AND (",
        migrate::postgres_history_current!(),
        ")"
    ),
    steps_current: steps_current!(),
    // Every lock a step needs (a trigger's DDL locks the lock table) is
    // waited for 100 ms at most, for this transaction only: a lock request
    // queued behind a long transaction queues every renewal behind it, and
    // leaders lose their leases.
    lock: "BEGIN; SET LOCAL lock_timeout = '100ms'",
    // Tried, never waited for: any role that may connect can hold the key.
    try_lock: "SELECT pg_catalog.pg_try_advisory_xact_lock(30510766455353956)",
    claim: None,
    unlock: "COMMIT",
    steps: migrate::POSTGRES,
    columns: &[migrate::POSTGRES_SUCCESSOR, migrate::POSTGRES_ADDRESS],
    tune: Some(migrate::POSTGRES_FILLFACTOR),
    // Touched only when it is a plain table of this user's (or a
    // superuser's): the cleanup runs with this user's rights, and a trigger
    // or policy another role put on it would run with them.
    legacy: "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
        JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) c.relowner \
        WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(pg_catalog.format('%I.__diesel_schema_migrations', \
        pg_catalog.current_schema()))::pg_catalog.oid \
        AND c.relkind OPERATOR(pg_catalog.=) 'r' AND NOT c.relrowsecurity \
        AND (o.rolname OPERATOR(pg_catalog.=) CURRENT_USER OR o.rolsuper))",
    retry_busy: false,
    fence: Some(migrate::POSTGRES_FENCE),
    extras: &[migrate::POSTGRES_HISTORY],
};

/// One leader's renewal: the cheapest statement that does it (no read-back
/// of a holder), one round trip; answers place 1 and the token, as
/// [`RENEW_MANY`] does. Matching no row means the lease is no longer ours,
/// or the row is locked; [`ACQUIRE_MANY`] then says which. The row is locked
/// with `SKIP LOCKED` before it is written, so a statement never waits on a
/// row lock someone else holds (a waiting backend outlives the client's
/// timeout and would pile up connections). A renewal locks `FOR NO KEY
/// UPDATE` and changes no token, so nothing of an app's fenced transaction
/// (`leaderd_fence`) holds it up: renewals go on while fenced writes run,
/// and only takeovers ([`ACQUIRE_MANY`]) wait for them to end. Binds:
/// election, instance, token, ttl in microseconds.
///
/// Kept beside [`RENEW_MANY`] because the numbers say so (CHANGELOG.md,
/// 0.1.0, "Performance"): [`RENEW_MANY`] with
/// arrays of one renewed 18 % slower in `pgbench -M prepared` at 32 clients
/// (14,780 against 18,102 tps) and 26–45 % slower in the heartbeat bench
/// (named, unnamed and through PgBouncer). The other statements serve one
/// election as arrays of one: there the difference was within noise.
const RENEW: &str = "WITH c AS (SELECT id FROM {t} \
      WHERE name OPERATOR(pg_catalog.=) $1 AND instance OPERATOR(pg_catalog.=) $2 \
        AND token OPERATOR(pg_catalog.=) $3 AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now() \
      FOR NO KEY UPDATE SKIP LOCKED) \
    UPDATE {t} l SET renewed_at = pg_catalog.now(), \
      expires_at = GREATEST(l.expires_at, pg_catalog.now() OPERATOR(pg_catalog.+) \
                                          ($4 OPERATOR(pg_catalog.*) INTERVAL '1 microsecond')) \
    FROM c WHERE l.id OPERATOR(pg_catalog.=) c.id RETURNING 1::bigint, l.token";
const RENEW_TYPES: &[Type] = &[Type::VARCHAR, Type::VARCHAR, Type::INT8, Type::INT8];

/// [`RENEW`] for several elections in one statement: the renewed ones'
/// places in the arrays (from 1) and tokens. `SKIP LOCKED` never waits, so
/// two daemons' batches cannot deadlock on each other's rows. Binds: names,
/// instances, tokens (arrays), ttl in microseconds.
const RENEW_MANY: &str = "\
WITH i AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::varchar[]),
                                    pg_catalog.unnest($3::bigint[]))
           WITH ORDINALITY AS i(name, inst, token, n)),
c AS (
  SELECT l.id, i.n FROM {t} l JOIN i
      ON l.name OPERATOR(pg_catalog.=) i.name AND l.instance OPERATOR(pg_catalog.=) i.inst
     AND l.token OPERATOR(pg_catalog.=) i.token
   WHERE l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
   FOR NO KEY UPDATE OF l SKIP LOCKED
)
UPDATE {t} l SET renewed_at = pg_catalog.now(),
  expires_at = GREATEST(l.expires_at, pg_catalog.now() OPERATOR(pg_catalog.+)
                                      ($4 OPERATOR(pg_catalog.*) INTERVAL '1 microsecond'))
FROM c WHERE l.id OPERATOR(pg_catalog.=) c.id RETURNING c.n, l.token";
const RENEW_MANY_TYPES: &[Type] = &[
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8,
];

/// Acquire-or-renew, one element per election: renews when this instance
/// holds a live lease, takes the row when it is expired (bumping the token),
/// else answers the current holder; one row per election that exists,
/// granted or not, with its place in the arrays (from 1); a missing election
/// has no row. A refusal matches no row in the `UPDATE`, so it writes
/// nothing, locks nothing and consumes no sequence value; rows are locked
/// `SKIP LOCKED` as in [`RENEW`], and a skipped row reads as a refusal
/// that shows the row as it was. The rows are found by name once (`r`):
/// only a row that looks takeable is looked up again to be locked, and a
/// refusal is answered from that first read (the statement's one snapshot):
/// a third off a follower's cost per election in a batch (7.6 → 4.9 ms for
/// 2,000 refusals among 30,000 rows). A renewal (`k`) locks `FOR NO KEY
/// UPDATE`; a takeover (`t`: an expired row, ours or not) `FOR UPDATE`.
/// An app's open fenced transaction holds the takeover off: the table's
/// trigger (`service_leader_take`, installed with `leaderd_fence`) needs the
/// election's gate row (`FOR UPDATE SKIP LOCKED`), which the fence holds
/// `FOR KEY SHARE`, and skips the row (a refusal) until that ends; `FOR
/// UPDATE` is kept for the fence's fallback under REPEATABLE READ and for
/// an old version's fence (`FOR KEY SHARE` on the lease row), which `FOR
/// NO KEY UPDATE` would not wait for. After an upgrade from a fence that
/// held an advisory key, while a transaction open then lives (see the
/// fence's SQL), each row taken also holds that key
/// until the statement commits, in a lock table the server shares with
/// every session (64 × max_connections entries by default; 20,000 at once
/// ran it out of memory here, failing other sessions' statements too), so
/// at most [`TAKE_LIMIT`] rows are taken by one statement: the rest read as
/// refusals of expired rows, and `acquire_or_renew_many` sends the
/// statement again for them.
/// The rows to write carry what is written (`c`), so the
/// `UPDATE` joins nothing else: prepared and planned generically (about
/// ten rows guessed per array), a join there became a nested loop over the
/// batch for each row taken, and 5,000 expired elections taken at once
/// took 3 s (28 ms now). A row released to a named successor (`heir`: free,
/// its `successor` this daemon) is open to that daemon before it expires;
/// refused, it reads as expired to it, so that it tries again at once.
/// A takeover writes the taker's advertised address with its instance
/// (`address_instance`); a row's address is read only while that is its
/// instance (one taken by an earlier version's daemon, which writes
/// neither, reads as none).
/// Binds: names, instances, holders (arrays), ttl in microseconds, daemons,
/// addresses (arrays).
const ACQUIRE_MANY: &str = "\
WITH p AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::varchar[]),
                                    pg_catalog.unnest($3::varchar[]), pg_catalog.unnest($5::varchar[]),
                                    pg_catalog.unnest($6::varchar[]))
           WITH ORDINALITY AS p(name, inst, holder, daemon, addr, n)),
r AS (
  SELECT l.id, p.n, p.inst AS want_inst, p.holder AS want_holder, p.daemon AS want_daemon,
         p.addr AS want_addr, l.holder, l.instance, l.token, l.expires_at,
         CASE WHEN l.address_instance OPERATOR(pg_catalog.=) l.instance THEN l.address END AS address,
         (l.instance IS NULL AND l.successor OPERATOR(pg_catalog.=) p.daemon) AS heir,
         (l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() OR l.instance OPERATOR(pg_catalog.=) p.inst
          OR (l.instance IS NULL AND l.successor OPERATOR(pg_catalog.=) p.daemon)) AS open
    FROM {t} l JOIN p ON l.name OPERATOR(pg_catalog.=) p.name
),
k AS (
  SELECT l.id, r.n, r.want_inst, r.want_holder, r.want_addr
    FROM {t} l JOIN r ON l.id OPERATOR(pg_catalog.=) r.id
   WHERE r.open AND l.instance OPERATOR(pg_catalog.=) r.want_inst
     AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
   FOR NO KEY UPDATE OF l SKIP LOCKED
),
t AS (
  SELECT l.id, r.n, r.want_inst, r.want_holder, r.want_addr
    FROM {t} l JOIN r ON l.id OPERATOR(pg_catalog.=) r.id
   WHERE r.open AND (l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                     OR (l.instance IS NULL AND l.successor OPERATOR(pg_catalog.=) r.want_daemon))
   FOR UPDATE OF l SKIP LOCKED
   LIMIT 512
),
c AS (SELECT * FROM k UNION ALL SELECT * FROM t),
u AS (
  UPDATE {t} l SET
    token = CASE WHEN l.instance OPERATOR(pg_catalog.=) c.want_inst
                  AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                 THEN l.token ELSE l.token OPERATOR(pg_catalog.+) 1 END,
    acquired_at = CASE WHEN l.instance OPERATOR(pg_catalog.=) c.want_inst
                        AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
                       THEN l.acquired_at ELSE pg_catalog.now() END,
    holder = c.want_holder,
    instance = c.want_inst,
    address = c.want_addr,
    address_instance = c.want_inst,
    successor = NULL,
    renewed_at = pg_catalog.now(),
    expires_at = GREATEST(l.expires_at, pg_catalog.now() OPERATOR(pg_catalog.+)
                                        ($4 OPERATOR(pg_catalog.*) INTERVAL '1 microsecond'))
  FROM c
  WHERE l.id OPERATOR(pg_catalog.=) c.id
  RETURNING c.n, l.holder, l.instance, l.token, l.expires_at, l.address
)
SELECT TRUE, u.n, u.holder, u.instance, u.token, (EXTRACT(EPOCH FROM u.expires_at OPERATOR(pg_catalog.-) pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint, u.address
  FROM u
UNION ALL
SELECT FALSE, r.n, r.holder, r.instance, r.token,
       CASE WHEN r.heir THEN LEAST(0, (EXTRACT(EPOCH FROM r.expires_at OPERATOR(pg_catalog.-) pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint)
            ELSE (EXTRACT(EPOCH FROM r.expires_at OPERATOR(pg_catalog.-) pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint END,
       r.address
  FROM r
 WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.n OPERATOR(pg_catalog.=) r.n)";
/// The most rows [`ACQUIRE_MANY`] takes over in one statement (its `LIMIT`).
const TAKE_LIMIT: usize = 512;

const ACQUIRE_MANY_TYPES: &[Type] = &[
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::INT8,
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
];

/// Creates missing rows: free, blocked until `now + block` (one ttl, so
/// that a holder whose row was deleted steps down before anyone takes over;
/// see `LeaseRequest::block_us`), and with a token from the clock in
/// microseconds, raised above any a deleted row of the election carried by
/// the table's trigger (`service_leader_seed_token`), so tokens never go
/// backwards. Binds: names, blocks in microseconds (arrays).
const CREATE_MANY: &str = "INSERT INTO {t} (name, token, expires_at) \
    SELECT c.n, (EXTRACT(EPOCH FROM pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint, \
           pg_catalog.now() OPERATOR(pg_catalog.+) (c.b OPERATOR(pg_catalog.*) INTERVAL '1 microsecond') \
      FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::bigint[])) AS c(n, b) \
    ON CONFLICT (name) DO NOTHING";
const CREATE_MANY_TYPES: &[Type] = &[Type::VARCHAR_ARRAY, Type::INT8_ARRAY];

/// Frees the rows this instance holds and notifies the waiting replicas
/// (delivered at commit), in one round trip: the names released. A row
/// released to a successor stays blocked for its window (`crate::Successor`).
/// Binds: names, instances, successors, windows in microseconds (0 with
/// no successor).
const RELEASE_MANY: &str = "\
WITH p AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::varchar[]),
                                    pg_catalog.unnest($3::varchar[]), pg_catalog.unnest($4::bigint[]))
           AS p(name, inst, succ, win)),
r AS (
  UPDATE {t} l SET holder = NULL, instance = NULL, successor = p.succ,
         address = NULL, address_instance = NULL,
         expires_at = pg_catalog.now() OPERATOR(pg_catalog.+) (p.win OPERATOR(pg_catalog.*) INTERVAL '1 microsecond')
    FROM p WHERE l.name OPERATOR(pg_catalog.=) p.name AND l.instance OPERATOR(pg_catalog.=) p.inst
  RETURNING l.name
)
SELECT r.name, pg_catalog.pg_notify('leaderd', r.name) IS NULL FROM r";
const RELEASE_MANY_TYPES: &[Type] = &[
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::INT8_ARRAY,
];

/// The rows whose name starts with the bind (every row for `''`).
const ELECTIONS: &str = "SELECT name, holder, token, \
    (EXTRACT(EPOCH FROM expires_at OPERATOR(pg_catalog.-) pg_catalog.now()) \
     OPERATOR(pg_catalog.*) 1000000)::bigint, instance, \
    CASE WHEN instance IS NOT NULL THEN \
      (EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) acquired_at) \
       OPERATOR(pg_catalog.*) 1000000)::bigint END, \
    CASE WHEN address_instance OPERATOR(pg_catalog.=) instance THEN address END \
    FROM {t} WHERE pg_catalog.starts_with(name COLLATE \"C\", $1) ORDER BY name";

/// A tokio-postgres error with its causes: its own `Display` says only
/// "db error" or "error performing TLS handshake", leaving out the server's
/// message or why the handshake failed (unknown CA, name mismatch, no TLS).
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        source = cause.source();
    }
    text
}

/// An open tokio-postgres connection: the client, how to cancel on it, and
/// (for a [`Listener`]) the notifications it receives.
struct Opened {
    client: Client,
    cancel: CancelHandle,
    /// Who held takeovers off, as the connection heard.
    held_off: HeldOff,
    notifications: Option<mpsc::UnboundedReceiver<Result<String, tokio_postgres::Error>>>,
}

/// How long one host of a list may take to connect (TCP, TLS,
/// authentication, the session check) when the URL sets no
/// `connect_timeout`: a database 150 ms away takes about a second, and two
/// hosts that never answer still leave a third its turn within the
/// connector's budget.
const HOST_BUDGET: Duration = Duration::from_secs(4);

/// Hosts of a list seen not answering at a connect (its bound ran out, or
/// the connect was cut while on it), by host list and place, and since
/// when: tried after the others for [`STALL_MEMORY`] (see [`open`]).
static STALLED: std::sync::Mutex<Vec<(String, usize, std::time::Instant)>> =
    std::sync::Mutex::new(Vec::new());

/// How long a host that did not answer goes to the back of its list; then
/// the list's own order again (a primary that came back is preferred again).
const STALL_MEMORY: Duration = Duration::from_secs(60);

/// The places in `list` of hosts seen not answering lately.
fn stalled_hosts(list: &str) -> Vec<usize> {
    let mut stalled = STALLED.lock().unwrap_or_else(|e| e.into_inner());
    stalled.retain(|(_, _, since)| since.elapsed() < STALL_MEMORY);
    stalled
        .iter()
        .filter(|(l, _, _)| l == list)
        .map(|&(_, i, _)| i)
        .collect()
}

/// Notes whether host `i` of `list` is (still) not answering.
fn mark_stalled(list: &str, i: usize, stalled: bool) {
    let mut marks = STALLED.lock().unwrap_or_else(|e| e.into_inner());
    marks.retain(|(l, j, _)| !(l == list && *j == i));
    if stalled {
        marks.push((list.to_owned(), i, std::time::Instant::now()));
    }
}

/// Connects to the URL's hosts in order, as libpq does, except that a host
/// seen not answering in the last minute goes last: one that accepts TCP
/// and never answers would otherwise cost its bound at every connect (a
/// daemon opens three at start: the migration's, the lock table's and the
/// listener's), or the whole connect budget when its bound is longer.
/// `connect_timeout` bounds each host's whole start-up (the driver bounds
/// its TCP connect only), else [`HOST_BUDGET`] does for a list of hosts.
async fn open(url: &DatabaseUrl, listen: bool) -> Result<Opened, StoreError> {
    let config: tokio_postgres::Config = url
        .expose()
        .parse()
        .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl(e.to_string()))?;
    let hosts = url.postgres_hosts();
    let bound = match config.get_connect_timeout() {
        Some(t) if !t.is_zero() => Some(*t),
        _ if hosts.len() > 1 => Some(HOST_BUDGET),
        _ => None,
    };
    let Some(bound) = bound else {
        return open_one(url, url.expose(), listen).await;
    };
    let list: Vec<&str> = hosts.iter().map(|(h, _)| h.as_str()).collect();
    let list = list.join(",");
    let stalled = stalled_hosts(&list);
    let (answering, late): (Vec<usize>, Vec<usize>) =
        (0..hosts.len()).partition(|i| !stalled.contains(i));
    let mut failures = Vec::new();
    for i in answering.into_iter().chain(late) {
        let (host, raw) = &hosts[i];
        // Marked first: a connect cut while on this host (by the caller's
        // budget) leaves it marked.
        mark_stalled(&list, i, true);
        match tokio::time::timeout(bound, open_one(url, raw, listen)).await {
            Ok(Ok(opened)) => {
                mark_stalled(&list, i, false);
                return Ok(opened);
            }
            Ok(Err(e)) => {
                mark_stalled(&list, i, false);
                failures.push(format!("{host}: {e}"));
            }
            Err(_) => failures.push(format!("{host}: no answer within {bound:?}")),
        }
    }
    Err(StoreError::Connect(diesel::ConnectionError::BadConnection(
        failures.join("; "),
    )))
}

/// Connects with the URL's TLS (files read now) to the host(s) of `raw`
/// (the URL, or one host of its list). The connection's messages are
/// driven by a task that ends when the client is dropped; it forwards
/// notifications only when `listen`, so that a connection that never asked
/// for any (but, behind a pooler, may be handed some) stores nothing.
async fn open_one(url: &DatabaseUrl, raw: &str, listen: bool) -> Result<Opened, StoreError> {
    let mut config: tokio_postgres::Config = raw
        .parse()
        .map_err(|e: tokio_postgres::Error| StoreError::InvalidUrl(e.to_string()))?;
    let want = url.tls();
    let held_off = HeldOff::default();
    let (tx, rx) = if listen {
        let (tx, rx) = mpsc::unbounded_channel();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let failed = |e: tokio_postgres::Error| {
        StoreError::Connect(diesel::ConnectionError::BadConnection(describe(&e)))
    };
    let hosts = config.get_hosts();
    let unix_only = !hosts.is_empty()
        && hosts
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
    let tls_mode = match want.mode {
        // As libpq: no TLS over a Unix socket (the server offers none there,
        // and the channel never leaves the host), whatever `sslmode` says.
        _ if unix_only => None,
        TlsMode::Disable => None,
        TlsMode::Prefer => Some((tokio_postgres::config::SslMode::Prefer, Verify::Nothing)),
        TlsMode::Require(v) => Some((tokio_postgres::config::SslMode::Require, v)),
    };
    let (client, tls) = match tls_mode {
        None => {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(failed)?;
            tokio::spawn(drive(connection, tx, held_off.ear()));
            (client, None)
        }
        Some((ssl_mode, verify)) => {
            config.ssl_mode(ssl_mode);
            let tls = MakeRustlsConnect::new(tls::client_config(verify, &want.files)?);
            let (client, connection) = config.connect(tls.clone()).await.map_err(failed)?;
            tokio::spawn(drive(connection, tx, held_off.ear()));
            (client, Some(tls))
        }
    };
    Ok(Opened {
        held_off,
        cancel: CancelHandle {
            token: client.cancel_token(),
            tls,
        },
        client,
        notifications: rx,
    })
}

/// Polls a connection until it closes, forwarding notifications (and the
/// error that ends it) to `tx`, and the takeover trigger's notices of who
/// held a takeover off to `ear`.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: Option<mpsc::UnboundedSender<Result<String, tokio_postgres::Error>>>,
    ear: Arc<Mutex<Vec<String>>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            Some(Ok(AsyncMessage::Notification(n))) => {
                if let Some(tx) = &tx {
                    let _ = tx.send(Ok(n.payload().to_owned()));
                }
            }
            Some(Ok(AsyncMessage::Notice(n))) if n.code().code() == held_off::CODE => {
                HeldOff::hear(&ear, n.message());
            }
            // Other notices (e.g. "there is no transaction in progress"):
            // nothing to act on.
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                if let Some(tx) = &tx {
                    let _ = tx.send(Err(e));
                }
                return;
            }
            None => return,
        }
    }
}

/// What cancels a statement on one connection: its cancel token and the TLS
/// it was opened with (a cancel request is a new connection to the server;
/// none over a Unix socket).
#[derive(Clone)]
pub(crate) struct CancelHandle {
    token: tokio_postgres::CancelToken,
    tls: Option<MakeRustlsConnect>,
}

impl CancelHandle {
    pub(crate) async fn cancel(self) -> Result<(), StoreError> {
        let sent = match self.tls {
            Some(tls) => self.token.cancel_query(tls).await,
            None => self.token.cancel_query(tokio_postgres::NoTls).await,
        };
        sent.map_err(|e| StoreError::Local(format!("cancel request failed: {e}")))
    }
}

/// The lock-table statements with the table named with its schema
/// (`{t}` in their text filled in): made once per schema and kept for the
/// process's life, so that they are `'static` like the other statements.
#[derive(Debug)]
struct Statements {
    renew: &'static str,
    renew_many: &'static str,
    acquire_many: &'static str,
    create_many: &'static str,
    release_many: &'static str,
    elections: &'static str,
    history: &'static str,
}

impl Statements {
    /// The statements for `table` (schema-qualified, quoted).
    fn naming(table: &str) -> &'static Statements {
        static MADE: std::sync::Mutex<Vec<(String, &'static Statements)>> =
            std::sync::Mutex::new(Vec::new());
        let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = made.iter().find(|(t, _)| t == table) {
            return s;
        }
        // The lock table's name ends with its own (`pg_session`): the
        // record of terms is beside it, in the same schema.
        let history = format!(
            "{}service_leader_history",
            table
                .strip_suffix("service_leader_lock")
                .unwrap_or_default()
        );
        let fill = |sql: &str| -> &'static str {
            Box::leak(
                sql.replace("{t}", table)
                    .replace("{h}", &history)
                    .into_boxed_str(),
            )
        };
        let s: &'static Statements = Box::leak(Box::new(Statements {
            renew: fill(RENEW),
            renew_many: fill(RENEW_MANY),
            acquire_many: fill(ACQUIRE_MANY),
            create_many: fill(CREATE_MANY),
            release_many: fill(RELEASE_MANY),
            elections: fill(ELECTIONS),
            history: fill(crate::history::POSTGRES),
        }));
        made.push((table.to_owned(), s));
        s
    }
}

/// A PostgreSQL connection running the lock-table statements.
pub struct PgStore {
    client: Client,
    cancel: CancelHandle,
    /// Its statements, naming the lock table where this connection found it.
    stmts: &'static Statements,
    /// What this role may do beyond the daemon's needs, what of leaderd's
    /// it should not trust (while there is any, no statement is sent), and
    /// who else may create in the table's schema (see `pg_session`).
    facts: Box<Facts>,
    /// Who held this connection's takeovers off, and since when.
    held_off: Box<HeldOff>,
    /// Named statements prepared once on this connection, once it is known
    /// to be direct; `None`: unnamed statements, the pooler-safe default.
    named: Option<Vec<(&'static str, tokio_postgres::Statement)>>,
    /// Whether the connection is direct, while `pg_session` finds out.
    finding: Option<tokio::task::JoinHandle<bool>>,
}

opaque_debug!(PgStore);

impl PgStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let opened = open(url, false).await?;
        let session = Session::read(&opened.client).await?;
        Ok(Self {
            client: opened.client,
            cancel: opened.cancel,
            stmts: Statements::naming(&session.table),
            held_off: Box::new(opened.held_off),
            facts: Box::new(session.facts),
            named: None,
            finding: session.finding,
        })
    }

    /// The roles other than its owner that may create objects in the lock
    /// table's schema (`PUBLIC`: everyone).
    pub(crate) fn others_may_create(&self) -> &[String] {
        &self.facts.open_to
    }

    /// Refuses every statement on objects whose owner this user should not
    /// trust: running them could run that owner's code with this user's
    /// rights.
    fn trusted(&self) -> Result<(), StoreError> {
        if self.facts.untrusted.is_empty() {
            return Ok(());
        }
        Err(StoreError::Unsafe(format!(
            "{} belong to a role that is neither a superuser, this user, nor the schema's \
             owner, and could run code with this user's rights (another role made them): \
             not used; have the schema's owner make them (docs/security.md)",
            self.facts.untrusted.join(", ")
        )))
    }

    /// The rights this connection's role has beyond what the daemon needs,
    /// one phrase each (none: it runs as the least-privilege daemon role).
    pub(crate) fn excess_rights(&self) -> &[String] {
        &self.facts.excess
    }

    pub(crate) fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Takes the answer to whether the connection is direct once it is there.
    fn settle(&mut self) {
        use futures_util::FutureExt;
        if let Some(finding) = &mut self.finding {
            if finding.is_finished() {
                let direct = finding.now_or_never().and_then(Result::ok) == Some(true);
                self.finding = None;
                if direct {
                    self.named = Some(Vec::new());
                }
            }
        }
    }

    /// Whether statements are named and prepared once on this connection
    /// (found direct) rather than unnamed; `None` while that is being found.
    pub(crate) fn named_statements(&mut self) -> Option<bool> {
        self.settle();
        self.finding.is_none().then_some(self.named.is_some())
    }

    /// Overrides what is found at connect, for the heartbeat bench's
    /// comparison. Named statements through a transaction pooler fail, or
    /// run another client's statement of the same name.
    pub(crate) fn set_named_statements(&mut self, named: bool) {
        self.finding = None;
        match (named, self.named.is_some()) {
            (true, false) => self.named = Some(Vec::new()),
            (false, true) => self.named = None,
            _ => {}
        }
    }

    /// One statement, one round trip.
    async fn query(
        &mut self,
        sql: &'static str,
        types: &[Type],
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.settle();
        let typed = || -> Vec<(&(dyn ToSql + Sync), Type)> {
            params
                .iter()
                .zip(types)
                .map(|(p, t)| (*p, t.clone()))
                .collect()
        };
        let Some(named) = &mut self.named else {
            return Ok(self.client.query_typed(sql, &typed()).await?);
        };
        if let Some((_, stmt)) = named.iter().find(|(s, _)| *s == sql) {
            return Ok(self.client.query(stmt, params).await?);
        }
        // Not prepared yet: this call runs unnamed, and the statement is
        // prepared beside it, pipelined on the connection: still one round
        // trip.
        let now_typed = typed();
        let (rows, stmt) = tokio::join!(
            self.client.query_typed(sql, &now_typed),
            self.client.prepare_typed(sql, types)
        );
        if let Ok(stmt) = stmt {
            named.push((sql, stmt));
        }
        Ok(rows?)
    }

    /// [`PgStore::acquire_or_renew_many`] for one election.
    pub(crate) async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        let mut out = self
            .acquire_or_renew_many(std::slice::from_ref(req))
            .await?;
        out.pop()
            .unwrap_or_else(|| Err(StoreError::Local("no answer for the election".to_owned())))
    }

    /// Acquire-or-renew for several elections (distinct names, one ttl):
    /// the renewals in one statement ([`RENEW`] for one); the others, and any renewal that did
    /// not match (lost, or its row locked), in a second; missing rows are
    /// created in a third. So a leader's renewal of every election it holds is one
    /// round trip, as one election's is.
    pub(crate) async fn acquire_or_renew_many(
        &mut self,
        reqs: &[LeaseRequest<'_>],
    ) -> Result<Vec<Result<Attempt, StoreError>>, StoreError> {
        self.trusted()?;
        let mut out: Vec<Option<Result<Attempt, StoreError>>> = reqs.iter().map(|_| None).collect();
        let ttl_us = reqs.first().map_or(0, LeaseRequest::ttl_us);
        // Rows come back by their place in the arrays sent (from 1), not by
        // name: a batch may hold thousands of elections.
        let place = |sent: &[usize], n: i64| -> Result<usize, StoreError> {
            usize::try_from(n - 1)
                .ok()
                .and_then(|k| sent.get(k).copied())
                .ok_or_else(|| StoreError::Local(format!("an answer for element {n} of the batch")))
        };
        let renewing: Vec<usize> = (0..reqs.len())
            .filter(|&i| reqs[i].held_token.is_some())
            .collect();
        if !renewing.is_empty() {
            let names: Vec<&str> = renewing.iter().map(|&i| reqs[i].election).collect();
            let insts: Vec<&str> = renewing.iter().map(|&i| reqs[i].instance).collect();
            let tokens: Vec<i64> = renewing
                .iter()
                .filter_map(|&i| reqs[i].held_token)
                .collect();
            let rows = match (&names[..], &insts[..], &tokens[..]) {
                ([name], [inst], [token]) => {
                    let params: [&(dyn ToSql + Sync); 4] = [name, inst, token, &ttl_us];
                    self.query(self.stmts.renew, RENEW_TYPES, &params).await?
                }
                _ => {
                    let params: [&(dyn ToSql + Sync); 4] = [&names, &insts, &tokens, &ttl_us];
                    self.query(self.stmts.renew_many, RENEW_MANY_TYPES, &params)
                        .await?
                }
            };
            for row in rows {
                let i = place(&renewing, row.try_get(0)?)?;
                let token: i64 = row.try_get(1)?;
                // A renewal keeps the token; anything else is not our
                // statement's answer, and must not read as a grant.
                out[i] = Some(if Some(token) == reqs[i].held_token {
                    Ok(Attempt::Granted { token })
                } else {
                    Err(StoreError::Local(format!(
                        "a renewal answered token {token}, not the token held"
                    )))
                });
            }
        }
        let rest: Vec<usize> = (0..reqs.len()).filter(|&i| out[i].is_none()).collect();
        if rest.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let mut sent = rest.clone();
        let mut left: Vec<usize> = Vec::new();
        loop {
            let names: Vec<&str> = sent.iter().map(|&i| reqs[i].election).collect();
            let insts: Vec<&str> = sent.iter().map(|&i| reqs[i].instance).collect();
            let holders: Vec<&str> = sent.iter().map(|&i| reqs[i].holder).collect();
            let daemons: Vec<Option<&str>> = sent.iter().map(|&i| reqs[i].daemon).collect();
            let addresses: Vec<Option<&str>> = sent.iter().map(|&i| reqs[i].address).collect();
            let rows = self
                .query(
                    self.stmts.acquire_many,
                    ACQUIRE_MANY_TYPES,
                    &[&names, &insts, &holders, &ttl_us, &daemons, &addresses],
                )
                .await?;
            // The trigger's notices came before the answer.
            let lease = reqs.first().map_or(Duration::ZERO, |r| r.ttl);
            self.held_off.review(lease, std::time::Instant::now());
            let mut taken = 0;
            for row in rows {
                let i = place(&sent, row.try_get(1)?)?;
                let req = &reqs[i];
                let seen = observed((
                    row.try_get(2)?,
                    row.try_get(3)?,
                    row.try_get(4)?,
                    row.try_get(5)?,
                    row.try_get(6)?,
                ));
                out[i] = Some(if row.try_get::<_, bool>(0)? {
                    if seen.instance.as_deref() == Some(req.instance) {
                        if req.held_token != Some(seen.token) {
                            taken += 1;
                        }
                        Ok(Attempt::Granted { token: seen.token })
                    } else {
                        Err(StoreError::Local(
                            "a grant that does not name this instance".to_owned(),
                        ))
                    }
                } else {
                    crate::refusal(req, seen)
                });
            }
            if taken >= TAKE_LIMIT {
                // The statement took as many rows as it may at once: the
                // rows it left (refusals of expired rows) are asked for
                // again now, at most that many a statement, so each reads
                // only the rows it may take (the whole rest each time read
                // 10,000 expired rows 20 times: 0.9 s).
                left.extend(sent.iter().copied().filter(|&i| {
                    matches!(&out[i], Some(Ok(Attempt::Refused(seen))) if seen.remaining_us <= 0)
                }));
            }
            if left.is_empty() {
                break;
            }
            sent = left.drain(..left.len().min(TAKE_LIMIT)).collect();
            for &i in &sent {
                out[i] = None;
            }
        }
        let missing: Vec<usize> = rest.into_iter().filter(|&i| out[i].is_none()).collect();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|&i| reqs[i].election).collect();
            let blocks: Vec<i64> = missing.iter().map(|&i| reqs[i].block_us()).collect();
            self.query(
                self.stmts.create_many,
                CREATE_MANY_TYPES,
                &[&names, &blocks],
            )
            .await?;
            for i in missing {
                out[i] = Some(Ok(Attempt::Created));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Releases several elections in one statement (each by its instance);
    /// whether each was released.
    pub(crate) async fn release_many(
        &mut self,
        items: &[Release<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        self.trusted()?;
        let names: Vec<&str> = items.iter().map(|r| r.election).collect();
        let insts: Vec<&str> = items.iter().map(|r| r.instance).collect();
        let succs: Vec<Option<&str>> = items
            .iter()
            .map(|r| r.successor.map(|s| s.daemon))
            .collect();
        let windows: Vec<i64> = items.iter().map(Release::window_us).collect();
        let rows = self
            .query(
                self.stmts.release_many,
                RELEASE_MANY_TYPES,
                &[&names, &insts, &succs, &windows],
            )
            .await?;
        let released: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        Ok(names
            .iter()
            .map(|n| released.iter().any(|r| r == n))
            .collect())
    }

    pub(crate) async fn release(&mut self, item: &Release<'_>) -> Result<bool, StoreError> {
        Ok(self.release_many(std::slice::from_ref(item)).await? == [true])
    }

    pub(crate) async fn elections(&mut self, prefix: &str) -> Result<Vec<ElectionRow>, StoreError> {
        self.trusted()?;
        let rows = self
            .query(self.stmts.elections, &[Type::VARCHAR], &[&prefix])
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ElectionRow::from((
                    r.try_get(0)?,
                    r.try_get(1)?,
                    r.try_get(2)?,
                    r.try_get(3)?,
                    r.try_get(4)?,
                    r.try_get(5)?,
                    r.try_get(6)?,
                )))
            })
            .collect()
    }

    /// The record of terms, newest first (`None`: not installed).
    pub(crate) async fn history(
        &mut self,
        election: Option<&str>,
        limit: i64,
    ) -> Result<Option<Vec<Term>>, StoreError> {
        self.trusted()?;
        let rows = match self
            .query(
                self.stmts.history,
                &[Type::VARCHAR, Type::INT8],
                &[&election, &limit],
            )
            .await
        {
            Err(e) if crate::history::missing_table(&e) => return Ok(None),
            rows => rows?,
        };
        rows.iter()
            .map(|r| {
                Ok(Term::from((
                    r.try_get(0)?,
                    r.try_get(1)?,
                    r.try_get(2)?,
                    r.try_get(3)?,
                    r.try_get(4)?,
                    r.try_get(5)?,
                    r.try_get(6)?,
                    r.try_get(7)?,
                    r.try_get(8)?,
                    r.try_get(9)?,
                    r.try_get(10)?,
                    r.try_get(11)?,
                )))
            })
            .collect::<Result<_, StoreError>>()
            .map(Some)
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        let migrated = migrate::run(&mut self.client, &MIGRATION).await?;
        self.client.batch_execute(SETTLE_UPGRADE).await?;
        Ok(migrated)
    }

    pub(crate) async fn fence_status(&mut self) -> Result<FenceStatus, StoreError> {
        migrate::fence_status(&mut self.client, &MIGRATION).await
    }
}

/// After an upgrade from the advisory fence (versions 4 and 5), the
/// transactions open once it has committed, listed with those open while
/// it was installed (see the fence's SQL): an old fence called after the
/// installation read its list, and before its commit was seen, is on it
/// then, and a transaction begun later is not. Skips a list a takeover is
/// settling now (it lists the same), and does nothing once settled.
const SETTLE_UPGRADE: &str = "DO $settle$
DECLARE
    s pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    -- Only its owner may (a daemon's role that runs migrate does not).
    IF pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_fence_gate', s)) IS NOT NULL
       AND pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_open_transactions()', s))
           IS NOT NULL
       AND pg_catalog.has_table_privilege(pg_catalog.format('%s.service_leader_fence_gate', s), 'UPDATE')
       AND pg_catalog.has_function_privilege(
               pg_catalog.format('%s.service_leader_open_transactions()', s), 'EXECUTE') THEN
        EXECUTE pg_catalog.format('UPDATE %1$s.service_leader_fence_gate g '
            'SET old_fences = g.old_fences OPERATOR(pg_catalog.||) %1$s.service_leader_open_transactions(), '
            'settled = true WHERE g.name IN (SELECT o.name FROM %1$s.service_leader_fence_gate o '
            'WHERE o.name OPERATOR(pg_catalog.=) $1 AND NOT o.settled AND o.old_fences IS NOT NULL '
            'FOR UPDATE SKIP LOCKED)', s) USING '';
    END IF;
END $settle$";

/// The checks are unnamed statements and the lock and steps one transaction,
/// so a transaction pooler runs them all on one server connection.
impl migrate::Migrator for Client {
    async fn flag(&mut self, sql: &'static str) -> Result<bool, StoreError> {
        let rows = self.query_typed(sql, &[]).await?;
        Ok(rows
            .first()
            .map(|r| r.try_get(0))
            .transpose()?
            .unwrap_or(false))
    }

    async fn batch(&mut self, sql: &str) -> Result<(), StoreError> {
        Ok(self.batch_execute(sql).await?)
    }

    async fn execute(&mut self, sql: &'static str, text: &str) -> Result<u64, StoreError> {
        let bind = [(&text as &(dyn ToSql + Sync), Type::VARCHAR)];
        Ok(self.execute_typed(&bound_here(sql), &bind).await?)
    }

    async fn count(&mut self, sql: &'static str, text: &str) -> Result<i64, StoreError> {
        let bind = [(&text as &(dyn ToSql + Sync), Type::VARCHAR)];
        let rows = self.query_typed(&bound_here(sql), &bind).await?;
        Ok(rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0))
    }
}

/// A statement the backends share (`column = ?`, `column <> ?`,
/// `COUNT(*)`) in PostgreSQL's form: its bind `$1`, and its operators and
/// functions `pg_catalog`'s, not whatever the search_path finds (see
/// `pg_session`).
fn bound_here(sql: &str) -> String {
    sql.replace(" = ?", " OPERATOR(pg_catalog.=) $1")
        .replace(" <> ?", " OPERATOR(pg_catalog.<>) $1")
        .replace("COUNT(*)", "pg_catalog.count(*)")
}

/// What [`Listener::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// Our own notification came back.
    pub delivered: bool,
    /// Release notifications (election names) that arrived meanwhile.
    pub others: Vec<String>,
}

/// A dedicated connection that `LISTEN`s for release notifications.
pub struct Listener {
    client: Client,
    notifications: mpsc::UnboundedReceiver<Result<String, tokio_postgres::Error>>,
    /// For the probe's sender, a connection of its own.
    url: DatabaseUrl,
}

opaque_debug!(Listener);

impl Listener {
    /// Connects and subscribes.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let opened = open(url, true).await?;
        // The simple-query protocol: no prepared statement, named or not.
        opened
            .client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await?;
        Ok(Self {
            client: opened.client,
            notifications: opened.notifications.expect("opened to listen"),
            url: url.clone(),
        })
    }

    /// Sends a notification to itself and waits up to `within` for it.
    /// `delivered: false` means notifications are not delivered (e.g. a
    /// transaction-pooling proxy sits in between): poll instead.
    /// `nonce` tells our probe from other processes' (PIDs repeat across
    /// containers; the instance id does not). Real notifications that arrive
    /// meanwhile are returned, not lost.
    pub async fn probe(&mut self, within: Duration, nonce: &str) -> Result<Probe, StoreError> {
        let payload = format!("leaderd-probe-{nonce}");
        // Sent from another connection, as a release is: through a
        // transaction pooler both could run on the same server connection,
        // and the notification would come back to the listener although
        // releases never would.
        let sender = open(&self.url, false).await?;
        sender
            .client
            .query_typed(
                "SELECT pg_catalog.pg_notify($1, $2)::pg_catalog.text",
                &[(&CHANNEL, Type::TEXT), (&payload, Type::TEXT)],
            )
            .await?;
        let mut others = Vec::new();
        let wait = async {
            loop {
                match self.next().await? {
                    p if p == payload => return Ok::<(), StoreError>(()),
                    p if p.starts_with("leaderd-probe-") => continue,
                    p => others.push(p),
                }
            }
        };
        let delivered = match tokio::time::timeout(within, wait).await {
            Ok(r) => r.map(|()| true)?,
            Err(_) => false,
        };
        if !delivered {
            // Through a pooler the `LISTEN` stays on whichever server
            // connection ran it (no reset in transaction pooling): undo it,
            // as well as can be, before the listener is dropped.
            let _ = tokio::time::timeout(within, self.client.batch_execute("UNLISTEN *")).await;
        }
        Ok(Probe { delivered, others })
    }

    /// The payload (election name) of the next notification.
    pub async fn next(&mut self) -> Result<String, StoreError> {
        match self.notifications.recv().await {
            Some(Ok(payload)) => Ok(payload),
            Some(Err(e)) => Err(e.into()),
            None => Err(StoreError::Query(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ClosedConnection,
                Box::new("notification stream closed".to_owned()),
            ))),
        }
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
    fn shared_statements_take_pg_catalogs_operators() {
        assert_eq!(
            bound_here(migrate::LEGACY_OTHERS),
            "SELECT pg_catalog.count(*) FROM __diesel_schema_migrations \
             WHERE version OPERATOR(pg_catalog.<>) $1"
        );
        assert!(!bound_here(migrate::LEGACY_DELETE).contains('?'));
    }

    #[test]
    fn the_take_limit_is_the_statements() {
        assert!(ACQUIRE_MANY.contains(&format!("LIMIT {TAKE_LIMIT}\n")));
    }

    /// Every statement names the lock table through `{t}` only, and names
    /// no operator or function that the search_path could resolve.
    #[test]
    fn statements_resolve_nothing_through_the_search_path() {
        let s = Statements::naming("\"s p\".service_leader_lock");
        for sql in [
            s.renew,
            s.renew_many,
            s.acquire_many,
            s.create_many,
            s.release_many,
            s.elections,
        ] {
            assert!(!sql.contains("{t}"), "{sql}");
            let bare = sql.replace("\"s p\".service_leader_lock", "");
            assert!(!bare.contains("service_leader_lock"), "{sql}");
            let unqualified = sql
                .replace("OPERATOR(pg_catalog.", "")
                .replace("pg_catalog.", "");
            for op in [
                " = ", " <> ", " < ", " <= ", " > ", " >= ", " + ", " - ", " * ",
            ] {
                for (at, _) in unqualified.match_indices(op) {
                    // An `UPDATE … SET column = …` assigns; it compares nothing.
                    let before = unqualified[..at].trim_end();
                    let word =
                        before.rsplit(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '.');
                    let assigned = op == " = "
                        && word.clone().next().is_some_and(|w| {
                            !w.contains('.')
                                && [
                                    "renewed_at",
                                    "expires_at",
                                    "token",
                                    "acquired_at",
                                    "holder",
                                    "instance",
                                    "address",
                                    "address_instance",
                                    "successor",
                                ]
                                .contains(&w)
                        });
                    // `SELECT * FROM`: all columns, no operator.
                    let star = op == " * " && unqualified[at + op.len()..].starts_with("FROM");
                    assert!(assigned || star, "{op} at {at} in {sql}");
                }
            }
            for f in ["now()", "unnest(", "pg_notify(", "starts_with("] {
                assert!(
                    !sql.replace(&format!("pg_catalog.{f}"), "").contains(f),
                    "{f} in {sql}"
                );
            }
        }
        assert!(std::ptr::eq(
            s,
            Statements::naming("\"s p\".service_leader_lock")
        ));
    }
}
