//! PostgreSQL: the lock table on `tokio-postgres` (pure Rust) via diesel-async.
//!
//! Clock: `now()`, the start of each autocommit statement, on the server.
//! Release wakes waiting replicas with `NOTIFY leaderd, '<election>'`.

use std::fmt;
use std::time::Duration;

use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bool, Nullable, Text};
use diesel::QueryResult;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use futures_util::StreamExt;

use crate::{Attempt, DatabaseUrl, ElectionRow, LeaseRequest, Migrated, Observed, StoreError};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations/postgres");

/// The `LISTEN`/`NOTIFY` channel; the payload is the election name.
pub const CHANNEL: &str = "leaderd";

/// Serialises concurrent migrations (`pg_advisory_lock` key).
const MIGRATION_LOCK_KEY: i64 = 0x006c_6561_6465_7264; // "leaderd" in ASCII

/// Declares a statement with fixed SQL text: diesel then prepares it once per
/// connection and reuses it (the cache is keyed by the SQL).
macro_rules! fixed_statement {
    ($ty:ident<$lt:lifetime>, $sql_type:ty) => {
        impl QueryId for $ty<'_> {
            type QueryId = ();
            const HAS_STATIC_QUERY_ID: bool = false;
        }
        impl Query for $ty<'_> {
            type SqlType = $sql_type;
        }
    };
}

const ACQUIRE_OR_RENEW_SQL: &str = "\
u AS (
  UPDATE service_leader_lock l SET
    token = CASE WHEN l.instance = p.inst AND l.expires_at > now() THEN l.token ELSE l.token + 1 END,
    acquired_at = CASE WHEN l.instance = p.inst AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
    holder = p.holder,
    instance = p.inst,
    renewed_at = now(),
    expires_at = GREATEST(l.expires_at, now() + p.ttl_us * INTERVAL '1 microsecond')
  FROM p
  WHERE l.name = p.name AND (l.expires_at <= now() OR l.instance = p.inst)
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

/// Renews when this instance holds a live lease, takes the row when it is
/// expired (bumping the token), else returns the current holder; all in one
/// round trip. A refusal matches no row in the `UPDATE`, so it writes and
/// locks nothing. The second field is the ttl in microseconds.
struct AcquireOrRenew<'a>(&'a LeaseRequest<'a>, i64);

/// Creates a missing row: free, blocked until `now + ttl` so that a holder
/// whose row was deleted steps down before anyone takes over, and with a token
/// from the clock in microseconds so tokens never go backwards.
struct CreateRow<'a> {
    election: &'a str,
    ttl_us: i64,
}

impl QueryFragment<Pg> for CreateRow<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("INSERT INTO service_leader_lock (name, token, expires_at) SELECT ");
        out.push_bind_param::<Text, str>(self.election)?;
        out.push_sql(", (EXTRACT(EPOCH FROM now()) * 1000000)::bigint, now() + ");
        out.push_bind_param::<BigInt, i64>(&self.ttl_us)?;
        out.push_sql(" * INTERVAL '1 microsecond' ON CONFLICT (name) DO NOTHING");
        Ok(())
    }
}

/// Frees the row if this instance holds it and notifies the waiting replicas
/// (delivered at commit), in one round trip.
struct Release<'a> {
    election: &'a str,
    instance: &'a str,
}

impl QueryFragment<Pg> for Release<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(
            "WITH r AS (UPDATE service_leader_lock SET holder = NULL, instance = NULL, \
             expires_at = now() WHERE name = ",
        );
        out.push_bind_param::<Text, str>(self.election)?;
        out.push_sql(" AND instance = ");
        out.push_bind_param::<Text, str>(self.instance)?;
        out.push_sql(" RETURNING name) SELECT count(pg_notify('leaderd', r.name)) FROM r");
        Ok(())
    }
}

/// A statement with no parameters.
struct Fixed<'a>(&'a str);

impl QueryFragment<Pg> for Fixed<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql(self.0);
        Ok(())
    }
}

/// `Fixed` queries are declared with their row type at the call site.
struct Rows<'a, ST>(Fixed<'a>, std::marker::PhantomData<ST>);

impl<ST> QueryFragment<Pg> for Rows<'_, ST> {
    fn walk_ast<'b>(&'b self, out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(out)
    }
}
impl<ST> QueryId for Rows<'_, ST> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}
impl<ST: 'static> Query for Rows<'_, ST> {
    type SqlType = ST;
}

fn rows<ST>(sql: &str) -> Rows<'_, ST> {
    Rows(Fixed(sql), std::marker::PhantomData)
}

fixed_statement!(
    AcquireOrRenew<'a>,
    (Bool, Nullable<Text>, Nullable<Text>, BigInt, BigInt)
);
fixed_statement!(CreateRow<'a>, ());
fixed_statement!(Release<'a>, BigInt);

impl QueryFragment<Pg> for AcquireOrRenew<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        out.push_sql("WITH p AS (SELECT ");
        out.push_bind_param::<Text, str>(self.0.election)?;
        out.push_sql("::varchar AS name, ");
        out.push_bind_param::<Text, str>(self.0.instance)?;
        out.push_sql("::varchar AS inst, ");
        out.push_bind_param::<Text, str>(self.0.holder)?;
        out.push_sql("::varchar AS holder, ");
        out.push_bind_param::<BigInt, i64>(&self.1)?;
        out.push_sql("::bigint AS ttl_us),\n");
        out.push_sql(ACQUIRE_OR_RENEW_SQL);
        Ok(())
    }
}

/// A PostgreSQL connection holding the lock-table statements.
pub struct PgStore {
    conn: AsyncPgConnection,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore").finish_non_exhaustive()
    }
}

impl PgStore {
    pub(crate) async fn connect(url: &DatabaseUrl) -> Result<Self, StoreError> {
        let conn = AsyncPgConnection::establish(url.expose())
            .await
            .map_err(StoreError::Connect)?;
        Ok(Self { conn })
    }

    pub(crate) async fn acquire_or_renew(
        &mut self,
        req: &LeaseRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        let stmt = AcquireOrRenew(req, req.ttl_us());
        let rows: Vec<AttemptRow> = stmt.load(&mut self.conn).await?;
        match rows.into_iter().next() {
            Some(row) => Ok(attempt_from_row(row)),
            None => {
                CreateRow {
                    election: req.election,
                    ttl_us: req.ttl_us(),
                }
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
        let n: i64 = Release { election, instance }
            .get_result(&mut self.conn)
            .await?;
        Ok(n > 0)
    }

    pub(crate) async fn elections(&mut self) -> Result<Vec<ElectionRow>, StoreError> {
        let rows: Vec<(String, Option<String>, i64, i64)> =
            rows::<(Text, Nullable<Text>, BigInt, BigInt)>(
                "SELECT name, holder, token, \
             (EXTRACT(EPOCH FROM expires_at - now()) * 1000000)::bigint \
             FROM service_leader_lock ORDER BY name",
            )
            .load(&mut self.conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, holder, token, remaining_us)| ElectionRow {
                name,
                holder,
                token,
                remaining_us,
            })
            .collect())
    }

    pub(crate) async fn migrate(mut self) -> Result<Migrated, StoreError> {
        if self.up_to_date().await {
            return Ok(Migrated::UpToDate);
        }
        let wrapper: diesel_async::async_connection_wrapper::AsyncConnectionWrapper<
            AsyncPgConnection,
        > = self.conn.into();
        tokio::task::spawn_blocking(move || {
            let mut conn = wrapper;
            use diesel::connection::SimpleConnection;
            conn.batch_execute(&format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})"))?;
            // Another replica may have migrated while we waited for the lock;
            // the harness re-reads what is applied, so this is a no-op then.
            let result = conn.run_pending_migrations(MIGRATIONS).map(|v| v.len());
            conn.batch_execute(&format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})"))?;
            result.map_err(|e| StoreError::Migration(e.to_string()))
        })
        .await
        .map_err(|e| StoreError::Migration(e.to_string()))?
        .map(|n| {
            if n == 0 {
                Migrated::UpToDate
            } else {
                Migrated::Applied
            }
        })
    }

    /// Whether every embedded migration is recorded as applied. Reads only,
    /// so a user with data rights alone gets `true` once the table exists.
    async fn up_to_date(&mut self) -> bool {
        let Some(latest) = latest_version(&MIGRATIONS) else {
            return true;
        };
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM __diesel_schema_migrations WHERE version = '{latest}') \
             AND to_regclass('service_leader_lock') IS NOT NULL"
        );
        matches!(
            rows::<Bool>(&sql).get_result::<bool>(&mut self.conn).await,
            Ok(true)
        )
    }
}

fn latest_version(migrations: &EmbeddedMigrations) -> Option<String> {
    use diesel::migration::MigrationSource;
    MigrationSource::<Pg>::migrations(migrations)
        .ok()?
        .iter()
        .map(|m| m.name().version().to_string())
        .max()
}

fn attempt_from_row((granted, holder, instance, token, remaining_us): AttemptRow) -> Attempt {
    if granted {
        Attempt::Granted { token }
    } else {
        Attempt::Refused(Observed {
            holder,
            instance,
            token,
            remaining_us,
        })
    }
}

/// A dedicated connection that `LISTEN`s for release notifications.
pub struct Listener {
    conn: AsyncPgConnection,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener").finish_non_exhaustive()
    }
}

impl Listener {
    /// Connects and subscribes; `None` for backends without notifications.
    pub async fn connect(url: &DatabaseUrl) -> Result<Option<Self>, StoreError> {
        if url.backend() != crate::Backend::Postgres {
            return Ok(None);
        }
        let mut conn = AsyncPgConnection::establish(url.expose())
            .await
            .map_err(StoreError::Connect)?;
        diesel::sql_query(format!("LISTEN {CHANNEL}"))
            .execute(&mut conn)
            .await?;
        Ok(Some(Self { conn }))
    }

    /// Sends a notification to itself and waits up to `within` for it.
    /// `false` means notifications are not delivered (e.g. a
    /// transaction-pooling proxy sits in between): poll instead.
    pub async fn probe(&mut self, within: Duration) -> Result<bool, StoreError> {
        let payload = format!("leaderd-probe-{}", std::process::id());
        diesel::sql_query(format!("SELECT pg_notify('{CHANNEL}', '{payload}')"))
            .execute(&mut self.conn)
            .await?;
        let wait = async {
            loop {
                match self.next().await? {
                    p if p == payload => return Ok::<bool, StoreError>(true),
                    _ => continue,
                }
            }
        };
        match tokio::time::timeout(within, wait).await {
            Ok(r) => r,
            Err(_) => Ok(false),
        }
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
