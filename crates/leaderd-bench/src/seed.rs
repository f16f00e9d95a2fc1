//! The common lock-row recipe, reimplemented for comparison only: one
//! transaction of `BEGIN; SELECT … FOR UPDATE; INSERT or UPDATE; COMMIT`
//! (four round trips), expiry judged by the application's own clock, no
//! fencing, no release. Not used by leaderd.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{
    AsyncConnection, AsyncMysqlConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use leaderd_tests::Kind;

/// Round trips of one `try_lock`.
pub const ROUND_TRIPS: u64 = 4;

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Nullable<Text>)]
    owner: Option<String>,
    #[diesel(sql_type = BigInt)]
    expiry_ms: i64,
}

enum Conn {
    Pg(Box<AsyncPgConnection>),
    My(AsyncMysqlConnection),
}

pub struct Seed {
    conn: Conn,
}

fn app_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

macro_rules! on {
    ($self:expr, $c:ident => $body:expr) => {
        match &mut $self.conn {
            Conn::Pg($c) => $body,
            Conn::My($c) => $body,
        }
    };
}

impl Seed {
    pub async fn connect(kind: Kind, url: &str) -> Result<Seed> {
        Ok(Seed {
            conn: match kind {
                Kind::Postgres => Conn::Pg(Box::new(AsyncPgConnection::establish(url).await?)),
                Kind::Mysql => Conn::My(AsyncMysqlConnection::establish(url).await?),
                Kind::Sqlite => anyhow::bail!("the seed baseline runs on PostgreSQL and MariaDB"),
            },
        })
    }

    /// The seed's table, with `n` rows `e0…` already present (steady state).
    pub async fn setup(kind: Kind, url: &str, n: usize) -> Result<()> {
        let mut s = Seed::connect(kind, url).await?;
        let values: Vec<String> = (0..n).map(|i| format!("('e{i}', NULL, 0)")).collect();
        let sql = format!(
            "CREATE TABLE seed_lock (name VARCHAR(100) PRIMARY KEY, owner VARCHAR(100), expiry_ms BIGINT NOT NULL); \
             INSERT INTO seed_lock (name, owner, expiry_ms) VALUES {};",
            values.join(",")
        );
        on!(s, c => c.batch_execute(&sql).await?);
        Ok(())
    }

    /// The seed's `tryLock(name, owner, ttl)`: re-entrant for the owner,
    /// takes a free or (by this host's clock) expired lock.
    pub async fn try_lock(
        &mut self,
        kind: Kind,
        name: &str,
        owner: &str,
        ttl_ms: i64,
    ) -> Result<bool> {
        let (select, insert, update) = match kind {
            Kind::Postgres => (
                "SELECT owner, expiry_ms FROM seed_lock WHERE name = $1 FOR UPDATE",
                "INSERT INTO seed_lock (name, owner, expiry_ms) VALUES ($1, $2, $3)",
                "UPDATE seed_lock SET owner = $1, expiry_ms = $2 WHERE name = $3",
            ),
            _ => (
                "SELECT owner, expiry_ms FROM seed_lock WHERE name = ? FOR UPDATE",
                "INSERT INTO seed_lock (name, owner, expiry_ms) VALUES (?, ?, ?)",
                "UPDATE seed_lock SET owner = ?, expiry_ms = ? WHERE name = ?",
            ),
        };
        on!(self, c => {
            c.batch_execute("BEGIN").await?;
            let result: Result<bool> = async {
                let rows: Vec<Row> = diesel::sql_query(select).bind::<Text, _>(name).load(c).await?;
                let now = app_now_ms();
                let granted = match <[Row]>::first(&rows) {
                    None => {
                        diesel::sql_query(insert)
                            .bind::<Text, _>(name)
                            .bind::<Text, _>(owner)
                            .bind::<BigInt, _>(now + ttl_ms)
                            .execute(c)
                            .await?;
                        true
                    }
                    Some(r) if r.owner.as_deref() == Some(owner) || r.owner.is_none() || r.expiry_ms < now => {
                        diesel::sql_query(update)
                            .bind::<Text, _>(owner)
                            .bind::<BigInt, _>(now + ttl_ms)
                            .bind::<Text, _>(name)
                            .execute(c)
                            .await?;
                        true
                    }
                    Some(_) => false,
                };
                Ok(granted)
            }
            .await;
            match result {
                Ok(granted) => {
                    c.batch_execute("COMMIT").await?;
                    Ok(granted)
                }
                Err(e) => {
                    let _ = c.batch_execute("ROLLBACK").await;
                    Err(e)
                }
            }
        })
    }
}
