//! PostgreSQL's lease statements: renewal (one lease, many), the takeover
//! and creation of many rows, release, the listing and the record of
//! terms. Each names the lock table through `{t}`, filled in once per schema
//! ([`Statements::naming`]), and every operator and function with its
//! schema (see `session`).

use tokio_postgres::types::Type;

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
/// (named, unnamed and through PgBouncer). The takeover and the release
/// have such twins too (`Statements::acquire_one`, `release_one`), for
/// their plans.
pub(super) const RENEW: &str = "WITH c AS (SELECT id FROM {t} \
      WHERE name OPERATOR(pg_catalog.=) $1 AND instance OPERATOR(pg_catalog.=) $2 \
        AND token OPERATOR(pg_catalog.=) $3 AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now() \
      FOR NO KEY UPDATE SKIP LOCKED) \
    UPDATE {t} l SET renewed_at = pg_catalog.now(), \
      expires_at = GREATEST(l.expires_at, pg_catalog.now() OPERATOR(pg_catalog.+) \
                                          ($4 OPERATOR(pg_catalog.*) INTERVAL '1 microsecond')) \
    FROM c WHERE l.id OPERATOR(pg_catalog.=) c.id RETURNING 1::bigint, l.token";
pub(super) const RENEW_TYPES: &[Type] = &[Type::VARCHAR, Type::VARCHAR, Type::INT8, Type::INT8];

/// [`RENEW`] for several elections in one statement: the renewed ones'
/// places in the arrays (from 1) and tokens. `SKIP LOCKED` never waits, so
/// two daemons' batches cannot deadlock on each other's rows. Binds: names,
/// instances, tokens (arrays), ttl in microseconds.
pub(super) const RENEW_MANY: &str = "\
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
pub(super) const RENEW_MANY_TYPES: &[Type] = &[
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
pub(super) const ACQUIRE_MANY: &str = "\
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
/// [`ACQUIRE_MANY`]'s elements, as it reads them from its arrays ...
const ACQUIRE_MANY_ELEMENTS: &str = "\
WITH p AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::varchar[]),
                                    pg_catalog.unnest($3::varchar[]), pg_catalog.unnest($5::varchar[]),
                                    pg_catalog.unnest($6::varchar[]))
           WITH ORDINALITY AS p(name, inst, holder, daemon, addr, n)),";

/// ... and `Statements::acquire_one`'s one, from plain binds.
const ACQUIRE_ONE_ELEMENT: &str = "\
WITH p AS (SELECT $1::varchar AS name, $2::varchar AS inst, $3::varchar AS holder,
                  $5::varchar AS daemon, $6::varchar AS addr, 1::bigint AS n),";

/// The binds of `Statements::acquire_one`: as [`ACQUIRE_MANY_TYPES`], one
/// value each.
pub(super) const ACQUIRE_ONE_TYPES: &[Type] = &[
    Type::VARCHAR,
    Type::VARCHAR,
    Type::VARCHAR,
    Type::INT8,
    Type::VARCHAR,
    Type::VARCHAR,
];

/// The most rows [`ACQUIRE_MANY`] takes over in one statement (its `LIMIT`).
pub(super) const TAKE_LIMIT: usize = 512;

pub(super) const ACQUIRE_MANY_TYPES: &[Type] = &[
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
pub(super) const CREATE_MANY: &str = "INSERT INTO {t} (name, token, expires_at) \
    SELECT c.n, (EXTRACT(EPOCH FROM pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)::bigint, \
           pg_catalog.now() OPERATOR(pg_catalog.+) (c.b OPERATOR(pg_catalog.*) INTERVAL '1 microsecond') \
      FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::bigint[])) AS c(n, b) \
    ON CONFLICT (name) DO NOTHING";
pub(super) const CREATE_MANY_TYPES: &[Type] = &[Type::VARCHAR_ARRAY, Type::INT8_ARRAY];

/// Frees the rows this instance holds and notifies the waiting replicas
/// (delivered at commit), in one round trip: the names released. A row
/// released to a successor stays blocked for its window (`crate::Successor`).
/// A presence row's release notifies nobody: no replica waits on it, and a
/// notification wakes every listening session, the server's and each
/// daemon's, just as a handover's read, release and take need the cores.
///
/// Its commit waits for neither the disk nor a synchronous standby
/// (`synchronous_commit` off for this transaction alone, set once by the
/// one-time filter before any row is written): a release lost in a crash
/// or a failover leaves the row as it was, held by the instance that
/// released it (which may take it back as its own) until it expires, which
/// is a wait and never a second leader; and whoever takes the row next
/// commits after it as the server's `synchronous_commit` says, which makes
/// the release as durable (the log is flushed and replicated in order).
/// On a busy disk the flushes were most of a handover's release part
/// (BENCHMARKS.md, "Graceful handover at its limit"). Binds: names,
/// instances, successors, windows in microseconds (0 with no successor).
pub(super) const RELEASE_MANY: &str = "\
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
SELECT r.name, (CASE WHEN pg_catalog.starts_with(r.name COLLATE pg_catalog.\"C\", '{presence}') THEN NULL
                     ELSE pg_catalog.pg_notify('leaderd', r.name) END) IS NULL
  FROM r
 WHERE (SELECT pg_catalog.set_config('synchronous_commit', 'off', true)) IS NOT NULL";
pub(super) const RELEASE_MANY_TYPES: &[Type] = &[
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::VARCHAR_ARRAY,
    Type::INT8_ARRAY,
];

/// [`RELEASE_MANY`]'s elements, as it reads them from its arrays ...
const RELEASE_MANY_ELEMENTS: &str = "\
WITH p AS (SELECT * FROM ROWS FROM (pg_catalog.unnest($1::varchar[]), pg_catalog.unnest($2::varchar[]),
                                    pg_catalog.unnest($3::varchar[]), pg_catalog.unnest($4::bigint[]))
           AS p(name, inst, succ, win)),";

/// ... and `Statements::release_one`'s one, from plain binds.
const RELEASE_ONE_ELEMENT: &str = "\
WITH p AS (SELECT $1::varchar AS name, $2::varchar AS inst, $3::varchar AS succ, $4::bigint AS win),";

/// The binds of `Statements::release_one`: as [`RELEASE_MANY_TYPES`], one
/// value each.
pub(super) const RELEASE_ONE_TYPES: &[Type] =
    &[Type::VARCHAR, Type::VARCHAR, Type::VARCHAR, Type::INT8];

/// Gives up being a row's named successor: the row, free and blocked for
/// the window only `$2` (a daemon instance) may take, is open to anyone
/// now. Matches nothing (writes nothing) unless the row is free, names
/// `$2`, carries token `$3` (the release seen: a later one, naming this
/// daemon again, is left alone) and its window is still running; a row
/// locked elsewhere is
/// skipped (`SKIP LOCKED`, as in [`RENEW`]): never a wait. The token and
/// holder stay as they are, so the record of terms has nothing to write.
pub(super) const DECLINE: &str = "\
WITH c AS (SELECT id FROM {t} \
    WHERE name OPERATOR(pg_catalog.=) $1 AND instance IS NULL \
      AND successor OPERATOR(pg_catalog.=) $2 AND token OPERATOR(pg_catalog.=) $3 \
      AND expires_at OPERATOR(pg_catalog.>) pg_catalog.now() \
    FOR NO KEY UPDATE SKIP LOCKED) \
UPDATE {t} l SET successor = NULL, expires_at = pg_catalog.now() \
  FROM c WHERE l.id OPERATOR(pg_catalog.=) c.id RETURNING l.name";
pub(super) const DECLINE_TYPES: &[Type] = &[Type::VARCHAR, Type::VARCHAR, Type::INT8];

/// The rows whose name starts with the bind (every row for `''`).
pub(super) const ELECTIONS: &str = "SELECT name, holder, token, \
    (EXTRACT(EPOCH FROM expires_at OPERATOR(pg_catalog.-) pg_catalog.now()) \
     OPERATOR(pg_catalog.*) 1000000)::bigint, instance, \
    CASE WHEN instance IS NOT NULL THEN \
      (EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) acquired_at) \
       OPERATOR(pg_catalog.*) 1000000)::bigint END, \
    CASE WHEN address_instance OPERATOR(pg_catalog.=) instance THEN address END, \
    CASE WHEN instance IS NULL THEN successor END \
    FROM {t} WHERE pg_catalog.starts_with(name COLLATE pg_catalog.\"C\", $1) ORDER BY name";

/// The takeover's and the release's path run once and undone (see
/// `warm_up`): a row of this connection's own (named after its backend, so
/// two connections never meet on one), made held, released to a successor
/// and taken over, each firing the table's triggers as a handover does;
/// then the inner block raises, and catches, its own error, which undoes
/// all of it. Only the row made is written (by its id: the table's trigger
/// may skip the insert, and then nothing is), and no other session ever
/// reads it. Set before the inner block, so that its undoing keeps them:
/// the transaction's end waits for neither the disk nor a standby (a
/// synchronous standby that is down would otherwise hold every connect,
/// for nothing kept), and a lock is given up after 100 ms (another
/// session's `LOCK TABLE`, say): the statement then fails, which is no
/// loss. `{t}`: the lock table with its schema.
pub(super) const WARM_UP: &str = "\
DO $leaderd_warm_up$
DECLARE
  n pg_catalog.text := 'leaderd-warm-up/' OPERATOR(pg_catalog.||) pg_catalog.pg_backend_pid();
  i pg_catalog.int8;
BEGIN
  PERFORM pg_catalog.set_config('synchronous_commit', 'off', true);
  PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
  BEGIN
    INSERT INTO {t} (name, holder, instance, token, acquired_at, renewed_at, expires_at,
                     address, address_instance)
    VALUES (n, 'leaderd-warm-up', 'leaderd-warm-up/1', 1, pg_catalog.now(), pg_catalog.now(),
            pg_catalog.now() OPERATOR(pg_catalog.+) INTERVAL '1 second', '', 'leaderd-warm-up/1')
    RETURNING id INTO i;
    IF i IS NOT NULL THEN
      UPDATE {t} SET holder = NULL, instance = NULL, successor = 'leaderd-warm-up',
                     address = NULL, address_instance = NULL
       WHERE id OPERATOR(pg_catalog.=) i;
      UPDATE {t} SET holder = 'leaderd-warm-up', instance = 'leaderd-warm-up/2',
                     token = token OPERATOR(pg_catalog.+) 1, successor = NULL,
                     acquired_at = pg_catalog.now(), address = '',
                     address_instance = 'leaderd-warm-up/2'
       WHERE id OPERATOR(pg_catalog.=) i;
    END IF;
    RAISE SQLSTATE 'LFW00';
  EXCEPTION WHEN SQLSTATE 'LFW00' THEN
    NULL;
  END;
END
$leaderd_warm_up$";

/// The lock-table statements with the table named with its schema
/// (`{t}` in their text filled in): made once per schema and kept for the
/// process's life, so that they are `'static` like the other statements.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) renew: &'static str,
    pub(super) renew_many: &'static str,
    pub(super) acquire_many: &'static str,
    /// [`ACQUIRE_MANY`] for one election, its binds plain values (the ttl as
    /// there). The server plans a prepared statement for the values bound at
    /// its first five uses, then, if a plan for any values looks no dearer,
    /// once for good. For arrays it never did (arrays of one election, 17 uses
    /// on one connection in the server's log): each follower's attempt and
    /// each takeover was planned afresh, 0.5–1.3 ms of a handover's take
    /// (PostgreSQL 15). With plain values the plan is the same either way, so
    /// after five uses it is made once and kept: 0.02–0.08 ms (see `warm_up`
    /// for the first five). Made from [`ACQUIRE_MANY`] (`Statements::naming`).
    pub(super) acquire_one: &'static str,
    pub(super) create_many: &'static str,
    pub(super) release_many: &'static str,
    /// [`RELEASE_MANY`] for one election, its binds plain values, for the
    /// reason `acquire_one` is: a release of one election (a handover's, a
    /// presence row's at shutdown) was planned afresh at each use,
    /// 0.2–0.3 ms.
    pub(super) release_one: &'static str,
    pub(super) decline: &'static str,
    pub(super) elections: &'static str,
    pub(super) history: &'static str,
    /// `None` where the table's name holds a `$`, which could end the
    /// block's dollar quote (the migration refuses such a schema too).
    pub(super) warm_up: Option<&'static str>,
}

impl Statements {
    /// The statements of a lease's life, with their types: renewals, the
    /// takeover and the release. A handover is the first takeover or
    /// release on many a connection; prepared there, each cost it a parse
    /// and a plan twice (see `PgStore::query`).
    pub(super) fn hot(&self) -> [(&'static str, &'static [Type]); 6] {
        [
            (self.renew, RENEW_TYPES),
            (self.renew_many, RENEW_MANY_TYPES),
            (self.acquire_many, ACQUIRE_MANY_TYPES),
            (self.acquire_one, ACQUIRE_ONE_TYPES),
            (self.release_many, RELEASE_MANY_TYPES),
            (self.release_one, RELEASE_ONE_TYPES),
        ]
    }

    /// The statements for `table` (schema-qualified, quoted).
    pub(super) fn naming(table: &str) -> &'static Statements {
        static MADE: std::sync::Mutex<Vec<(String, &'static Statements)>> =
            std::sync::Mutex::new(Vec::new());
        let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, s)) = made.iter().find(|(t, _)| t == table) {
            return s;
        }
        // The lock table's name ends with its own (`session`): the
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
                    .replace("{presence}", leaderd_core::spread::PRESENCE_PREFIX)
                    .into_boxed_str(),
            )
        };
        let s: &'static Statements = Box::leak(Box::new(Statements {
            renew: fill(RENEW),
            renew_many: fill(RENEW_MANY),
            acquire_many: fill(ACQUIRE_MANY),
            acquire_one: fill(&ACQUIRE_MANY.replacen(
                ACQUIRE_MANY_ELEMENTS,
                ACQUIRE_ONE_ELEMENT,
                1,
            )),
            create_many: fill(CREATE_MANY),
            release_many: fill(RELEASE_MANY),
            release_one: fill(&RELEASE_MANY.replacen(
                RELEASE_MANY_ELEMENTS,
                RELEASE_ONE_ELEMENT,
                1,
            )),
            decline: fill(DECLINE),
            elections: fill(ELECTIONS),
            history: fill(HISTORY),
            warm_up: (!table.contains('$')).then(|| fill(WARM_UP)),
        }));
        made.push((table.to_owned(), s));
        s
    }
}

/// The most recent terms first: of one election (`$1`, or every election
/// when NULL), at most `$2`. A term whose lease ran out and that nobody has
/// taken over since ends at that expiry (the trigger writes an end only at
/// the next takeover or release); one whose row was deleted or renamed
/// since has an `unknown` end. Every operator and function is named
/// with its schema: the daemon's role may run this with a search_path
/// where another role has made look-alikes. `{t}`/`{h}`: the lock table
/// and the history, with their schema.
pub(crate) const HISTORY: &str = "\
SELECT h.name, h.token, h.holder, h.instance, h.address, h.began_how,
       CASE WHEN h.earlier_version THEN 1::bigint ELSE 0::bigint END,
       pg_catalog.to_char(h.began_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
       (EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) h.began_at)
        OPERATOR(pg_catalog.*) 1000000)::bigint,
       pg_catalog.to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
       (EXTRACT(EPOCH FROM pg_catalog.now() OPERATOR(pg_catalog.-) e.at)
        OPERATOR(pg_catalog.*) 1000000)::bigint,
       e.how
  FROM {h} h
  LEFT JOIN {t} l ON l.name OPERATOR(pg_catalog.=) h.name AND l.token OPERATOR(pg_catalog.=) h.token
                 AND l.holder IS NOT NULL
  CROSS JOIN LATERAL (
    SELECT CASE WHEN h.ended_at IS NOT NULL THEN h.ended_at
                WHEN l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN l.expires_at END AS at,
           CASE WHEN h.ended_at IS NOT NULL THEN h.ended_how
                WHEN l.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() THEN 'expired'
                WHEN l.name IS NULL THEN 'unknown' END AS how) e
 WHERE $1::varchar IS NULL OR h.name OPERATOR(pg_catalog.=) $1::varchar
 ORDER BY h.began_at DESC, h.token DESC
 LIMIT $2";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_row_is_named_with_the_reserved_prefix() {
        assert!(WARM_UP.contains(&format!("'{}'", crate::shared::lease::WARM_UP_PREFIX)));
        assert!(Statements::naming("\"a$b\".service_leader_lock")
            .warm_up
            .is_none());
    }

    #[test]
    fn the_statements_of_one_differ_from_the_batchs_in_their_elements_only() {
        let s = Statements::naming("public.service_leader_lock");
        for (one, many, element, elements) in [
            (
                s.acquire_one,
                s.acquire_many,
                ACQUIRE_ONE_ELEMENT,
                ACQUIRE_MANY_ELEMENTS,
            ),
            (
                s.release_one,
                s.release_many,
                RELEASE_ONE_ELEMENT,
                RELEASE_MANY_ELEMENTS,
            ),
        ] {
            assert!(!one.contains("unnest"), "{one}");
            assert_eq!(one.replacen(element, elements, 1), many);
        }
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
            s.acquire_one,
            s.create_many,
            s.release_many,
            s.release_one,
            s.elections,
            s.decline,
            s.history,
            s.warm_up.expect("no $ in the name"),
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
            // A collation is looked up on the search_path too.
            assert!(
                !sql.replace("COLLATE pg_catalog.\"", "")
                    .contains("COLLATE "),
                "an unqualified collation in {sql}"
            );
        }
        assert!(std::ptr::eq(
            s,
            Statements::naming("\"s p\".service_leader_lock")
        ));
    }
}
