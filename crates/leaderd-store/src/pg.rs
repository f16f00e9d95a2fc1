//! PostgreSQL: the lock table on `tokio-postgres` (pure Rust) via diesel-async.
//!
//! Clock: `now()`, the start of each autocommit statement, on the server.
//! Acquire-or-renew is one `UPDATE … RETURNING` that also reads the holder when
//! refused. Release wakes waiting replicas with `NOTIFY leaderd, '<election>'`.

use std::time::Duration;

use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt;

use crate::migrate;
use crate::sql::{Bind, Stmt};
use crate::{observed, Attempt, DatabaseUrl, ElectionRow, LeaseRequest, Migrated, StoreError};

/// The `LISTEN`/`NOTIFY` channel; the payload is the election name.
pub const CHANNEL: &str = "leaderd";

/// DDL is transactional here: the steps run under a transaction-level
/// advisory lock (pooler-safe, released by COMMIT or a dropped session). The
/// key is "leaderd" in ASCII. The check reads `pg_class` with the statement's
/// snapshot: `to_regclass` goes through the catalog cache, which taking an
/// advisory lock does not refresh, so a waiter would miss the table its
/// predecessor just created.
const MIGRATION: migrate::Plan = migrate::Plan {
    current: "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class \
        WHERE relname = 'service_leader_lock' AND relnamespace = \
        (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = current_schema()))",
    lock: "BEGIN; SELECT pg_advisory_xact_lock(30510766455353956)",
    unlock: "COMMIT",
    steps: migrate::POSTGRES,
    legacy: "SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL",
};

migrate::migrate_with!(AsyncPgConnection);

/// Renews when this instance holds a live lease, takes the row when it is
/// expired (bumping the token), else returns the current holder: one round
/// trip. A refusal matches no row in the `UPDATE`, so it writes nothing,
/// locks nothing and consumes no sequence value. The row is locked with
/// `SKIP LOCKED` before it is written, so a statement never waits on a row
/// lock someone else holds (a waiting backend outlives the client's timeout
/// and would pile up connections); a skipped row reads as a refusal that
/// shows the row as it was. Binds: election, instance, holder, ttl in
/// microseconds.
const ACQUIRE_OR_RENEW: &str = "\
WITH p AS (SELECT ?::varchar AS name, ?::varchar AS inst, ?::varchar AS holder, ?::bigint AS ttl_us),
c AS (
  SELECT l.id FROM service_leader_lock l, p
   WHERE l.name = p.name AND (l.expires_at <= now() OR l.instance = p.inst)
   FOR UPDATE OF l SKIP LOCKED
),
u AS (
  UPDATE service_leader_lock l SET
    token = CASE WHEN l.instance = p.inst AND l.expires_at > now() THEN l.token ELSE l.token + 1 END,
    acquired_at = CASE WHEN l.instance = p.inst AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
    holder = p.holder,
    instance = p.inst,
    renewed_at = now(),
    expires_at = GREATEST(l.expires_at, now() + p.ttl_us * INTERVAL '1 microsecond')
  FROM p, c
  WHERE l.id = c.id
  RETURNING l.holder, l.instance, l.token, l.expires_at
)
SELECT TRUE, u.holder, u.instance, u.token,
       (EXTRACT(EPOCH FROM u.expires_at - now()) * 1000000)::bigint
  FROM u
UNION ALL
SELECT FALSE, l.holder, l.instance, l.token,
       (EXTRACT(EPOCH FROM l.expires_at - now()) * 1000000)::bigint
  FROM service_leader_lock l, p
 WHERE l.name = p.name AND NOT EXISTS (SELECT 1 FROM u)";

type AttemptRow = (bool, Option<String>, Option<String>, i64, i64);

/// A leader's renewal: the cheapest statement that does it (no read-back of a
/// holder), one round trip; `SKIP LOCKED` as above. Matching no row means the
/// lease is no longer ours, or the row is locked; the full statement above
/// then says which. Binds: election, instance, token, ttl in microseconds.
const RENEW: &str = "WITH c AS (SELECT id FROM service_leader_lock \
      WHERE name = ? AND instance = ? AND token = ? AND expires_at > now() \
      FOR UPDATE SKIP LOCKED) \
    UPDATE service_leader_lock l SET renewed_at = now(), \
      expires_at = GREATEST(l.expires_at, now() + ? * INTERVAL '1 microsecond') \
    FROM c WHERE l.id = c.id RETURNING l.token";

/// Creates a missing row: free, blocked until `now + ttl` so that a holder
/// whose row was deleted steps down before anyone takes over, and with a token
/// from the clock in microseconds so tokens never go backwards.
const CREATE: &str = "INSERT INTO service_leader_lock (name, token, expires_at) \
    SELECT ?, (EXTRACT(EPOCH FROM now()) * 1000000)::bigint, now() + ? * INTERVAL '1 microsecond' \
    ON CONFLICT (name) DO NOTHING";

/// Frees the row if this instance holds it and notifies the waiting replicas
/// (delivered at commit), in one round trip.
const RELEASE: &str = "WITH r AS (UPDATE service_leader_lock SET holder = NULL, instance = NULL, \
    expires_at = now() WHERE name = ? AND instance = ? RETURNING name) \
    SELECT count(pg_notify('leaderd', r.name)) FROM r";

const ELECTIONS: &str = "SELECT name, holder, token, \
    (EXTRACT(EPOCH FROM expires_at - now()) * 1000000)::bigint \
    FROM service_leader_lock ORDER BY name";

/// A PostgreSQL connection holding the lock-table statements.
pub struct PgStore {
    conn: AsyncPgConnection,
}

opaque_debug!(PgStore);

impl PgStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let conn: AsyncPgConnection = crate::establish(url).await?;
        Ok(Self { conn })
    }

    pub(crate) fn cancel_token(&self) -> tokio_postgres::CancelToken {
        self.conn.cancel_token()
    }

    pub(crate) async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        if let Some(held) = req.held_token {
            let renewed: Vec<i64> = Stmt::<BigInt>::new(
                RENEW,
                [
                    Bind::Text(req.election),
                    Bind::Text(req.instance),
                    Bind::BigInt(held),
                    Bind::BigInt(req.ttl_us()),
                ],
            )
            .load(&mut self.conn)
            .await?;
            if let Some(token) = renewed.into_iter().next() {
                return Ok(Attempt::Granted { token });
            }
        }
        let binds = [
            Bind::Text(req.election),
            Bind::Text(req.instance),
            Bind::Text(req.holder),
            Bind::BigInt(req.ttl_us()),
        ];
        let rows: Vec<AttemptRow> =
            Stmt::<(Bool, Nullable<Text>, Nullable<Text>, BigInt, BigInt)>::new(
                ACQUIRE_OR_RENEW,
                binds,
            )
            .load(&mut self.conn)
            .await?;
        match rows.into_iter().next() {
            Some((true, _, _, token, _)) => Ok(Attempt::Granted { token }),
            Some((false, holder, instance, token, remaining_us)) => {
                let seen = observed((holder, instance, token, remaining_us));
                crate::refusal(req, seen)
            }
            None => {
                Stmt::<()>::new(
                    CREATE,
                    [Bind::Text(req.election), Bind::BigInt(req.ttl_us())],
                )
                .execute(&mut self.conn)
                .await?;
                Ok(Attempt::Created)
            }
        }
    }

    pub(crate) async fn release(
        &mut self,
        election: &str,
        instance: &str,
    ) -> Result<bool, StoreError> {
        let n: i64 = Stmt::<BigInt>::new(RELEASE, [Bind::Text(election), Bind::Text(instance)])
            .get_result(&mut self.conn)
            .await?;
        Ok(n > 0)
    }

    pub(crate) async fn elections(&mut self) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<(String, Option<String>, i64, i64)> =
            Stmt::<(Text, Nullable<Text>, BigInt, BigInt)>::new(ELECTIONS, [])
                .load(&mut self.conn)
                .await?;
        Ok(rows.into_iter().map(ElectionRow::from).collect())
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        migrate_with(&mut self.conn, &MIGRATION).await
    }
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
    conn: AsyncPgConnection,
}

opaque_debug!(Listener);

impl Listener {
    /// Connects and subscribes.
    pub async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let mut conn: AsyncPgConnection = crate::establish(url).await?;
        diesel::sql_query(format!("LISTEN {CHANNEL}"))
            .execute(&mut conn)
            .await?;
        Ok(Self { conn })
    }

    /// Sends a notification to itself and waits up to `within` for it.
    /// `delivered: false` means notifications are not delivered (e.g. a
    /// transaction-pooling proxy sits in between): poll instead.
    /// `nonce` tells our probe from other processes' (PIDs repeat across
    /// containers; the instance id does not). Real notifications that arrive
    /// meanwhile are returned, not lost.
    pub async fn probe(&mut self, within: Duration, nonce: &str) -> Result<Probe, StoreError> {
        let payload = format!("leaderd-probe-{nonce}");
        diesel::sql_query("SELECT pg_notify($1, $2)")
            .bind::<Text, _>(CHANNEL)
            .bind::<Text, _>(&payload)
            .execute(&mut self.conn)
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
        Ok(Probe { delivered, others })
    }

    /// The payload (election name) of the next notification.
    pub async fn next(&mut self) -> Result<String, StoreError> {
        let mut stream = std::pin::pin!(self.conn.notifications_stream());
        match stream.next().await {
            Some(Ok(n)) => Ok(n.payload),
            Some(Err(e)) => Err(e.into()),
            None => Err(StoreError::Query(diesel::result::Error::DatabaseError(
                diesel::result::DatabaseErrorKind::ClosedConnection,
                Box::new("notification stream closed".to_owned()),
            ))),
        }
    }
}
