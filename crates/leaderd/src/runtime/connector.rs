//! Opens the election's database connection outside any attempt's budget.
//!
//! A database far away (150 ms a round trip, another region) takes a second
//! or more to connect: TCP, TLS, authentication and, the first time, the
//! migration. Squeezed into one attempt's budget (a heartbeat) and started
//! over at every timeout, that never finishes. So connections are opened by
//! background tasks with a budget of their own ([`CONNECT_BUDGET`]), and the
//! election loop attempts as soon as one is ready; its lease is measured from
//! then, never from the start of a connect.
//!
//! A connect still under way after a heartbeat (a link that went dead, a
//! blackholed address) is not cut: another starts beside it, at most
//! [`IN_FLIGHT`] at once, and the first to finish is used. So a slow link is
//! not starved and a healed one is used at once.
//!
//! The migration (when configured) runs before a connection is handed out,
//! at every connect until the database has answered it once: one cut short
//! by a slow link is tried again, one refused (no DDL rights, say) is not:
//! `leaderd migrate` is the tool for that.
//!
//! The first connection's round trip is measured (one read of the table)
//! and held against the renew interval: where the timing cannot work at
//! all, that is said at start, with the figures. The first connection is
//! also warmed up for a takeover (PostgreSQL, see `Connection::warm_up`),
//! until the database has answered one: a reconnect is not, as the daemon
//! may lead by then, and its renewals must not wait for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaderd_core::{BootTime, Timing};
use leaderd_store::Connection;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::clock::boot_now;
use crate::settings::DatabaseSource;

/// How long one connect (and the migration before it) may take.
pub const CONNECT_BUDGET: Duration = Duration::from_secs(10);

/// Connects under way at most.
const IN_FLIGHT: usize = 2;

/// Opens connections in the background; see the module docs.
#[derive(Debug)]
pub struct Connector {
    source: DatabaseSource,
    timing: Timing,
    migration: Arc<Mutex<Migration>>,
    /// The round trip still wants measuring (see the module docs).
    measure: Arc<AtomicBool>,
    /// A connection still wants warming up (see the module docs).
    warm: Arc<AtomicBool>,
    tasks: JoinSet<Result<Connection, String>>,
    /// When the latest connect started.
    started: Option<BootTime>,
}

/// Whether the lock table still wants migrating by this process.
#[derive(Debug)]
enum Migration {
    NotWanted,
    /// Not yet answered; the last failure, so that each is logged once.
    Pending(Option<String>),
    /// Done, or refused by the database.
    Done,
}

impl Connector {
    pub fn new(source: DatabaseSource, migrate: bool, timing: Timing) -> Self {
        let migration = if migrate {
            Migration::Pending(None)
        } else {
            Migration::NotWanted
        };
        Self {
            source,
            timing,
            migration: Arc::new(Mutex::new(migration)),
            measure: Arc::new(AtomicBool::new(true)),
            warm: Arc::new(AtomicBool::new(true)),
            tasks: JoinSet::new(),
            started: None,
        }
    }

    /// Starts a connect, unless one under way is younger than a heartbeat
    /// or [`IN_FLIGHT`] are.
    pub fn start(&mut self) {
        let now = boot_now();
        if self.next_start().is_none_or(|at| now >= at) {
            self.spawn();
        }
    }

    /// Starts a connect now.
    fn spawn(&mut self) {
        self.started = Some(boot_now());
        let (source, migration) = (self.source.clone(), self.migration.clone());
        let (measure, timing) = (self.measure.clone(), self.timing);
        let warm = self.warm.clone();
        self.tasks.spawn(async move {
            let open = async {
                let mut conn = open(source, migration).await?;
                if measure.swap(false, Ordering::Relaxed) {
                    check_round_trip(&mut conn, timing).await;
                }
                if warm.load(Ordering::Relaxed) {
                    warm_up(&mut conn, &warm).await?;
                }
                Ok(conn)
            };
            tokio::time::timeout(CONNECT_BUDGET, open)
                .await
                .unwrap_or_else(|_| Err(format!("connecting timed out after {CONNECT_BUDGET:?}")))
        });
    }

    /// When [`Connector::start`] would start another connect beside those
    /// under way (`None`: now); the time never comes while [`IN_FLIGHT`]
    /// are under way.
    pub fn next_start(&self) -> Option<BootTime> {
        if self.tasks.is_empty() {
            return None;
        }
        let started = self.started?;
        if self.tasks.len() >= IN_FLIGHT {
            // Woken by one of them finishing; a heartbeat keeps the caller's
            // timer finite.
            return Some(boot_now() + self.timing.heartbeat());
        }
        Some(started + self.timing.heartbeat())
    }

    /// The next connect to finish; never resolves while none is under way.
    pub async fn finished(&mut self) -> Result<Connection, String> {
        match self.tasks.join_next().await {
            Some(Ok(result)) => result,
            Some(Err(e)) => Err(task_failed(&e)),
            None => std::future::pending().await,
        }
    }
}

/// Warms `conn` up; once the database has answered, no later connection
/// is. A failure it answered is said (the first takeover on this replica
/// may then take a few milliseconds longer) and changes nothing else; one
/// it did not answer fails the connect.
async fn warm_up(conn: &mut Connection, warm: &AtomicBool) -> Result<(), String> {
    match conn.warm_up().await {
        Ok(()) => warm.store(false, Ordering::Relaxed),
        Err(e) if e.answered() => {
            if warm.swap(false, Ordering::Relaxed) {
                info!(
                    error = %e,
                    "could not warm the connection up for a takeover; a handover to this \
                     replica may take a few milliseconds longer"
                );
            }
        }
        Err(e) => return Err(e.to_string()),
    }
    Ok(())
}

/// A connect task that panicked or was cancelled, as an attempt's error.
fn task_failed(e: &tokio::task::JoinError) -> String {
    format!("the connect task failed: {e}")
}

/// Migrates if still wanted, then opens the connection to hand out.
async fn open(
    source: DatabaseSource,
    migration: Arc<Mutex<Migration>>,
) -> Result<Connection, String> {
    let url = source.resolve()?;
    let pending = matches!(
        *migration.lock().unwrap_or_else(|e| e.into_inner()),
        Migration::Pending(_)
    );
    if pending {
        let conn = Connection::connect(&url).await.map_err(|e| e.to_string())?;
        let result = conn.migrate().await;
        let mut state = migration.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(m) => {
                if !matches!(*state, Migration::Done) {
                    info!(result = %m, "lock table checked");
                }
                *state = Migration::Done;
            }
            // Never elect there: another role could run code as this
            // user through leaderd's tables. Asked again at every connect,
            // so that a fixed database is used at once.
            Err(e @ leaderd_store::StoreError::Unsafe(_)) => {
                let e = e.to_string();
                if let Migration::Pending(last) = &mut *state {
                    if last.as_deref() != Some(e.as_str()) {
                        error!(error = %e, "refusing to use this database (docs/security.md)");
                        *last = Some(e.clone());
                    }
                }
                return Err(e);
            }
            // Keep electing: the table may exist and this user may lack
            // DDL rights; a real absence shows in the attempts.
            Err(e) if e.answered() => {
                if !matches!(*state, Migration::Done) {
                    warn!(error = %e, "could not migrate the lock table (run `leaderd migrate` with DDL rights)");
                }
                *state = Migration::Done;
            }
            Err(e) => {
                let e = e.to_string();
                if let Migration::Pending(last) = &mut *state {
                    if last.as_deref() != Some(e.as_str()) {
                        warn!(error = %e, "could not migrate the lock table; trying again at the next connect");
                        *last = Some(e);
                    }
                }
            }
        }
    }
    let mut conn = Connection::connect(&url).await.map_err(|e| e.to_string())?;
    say_galera(&conn);
    say_excess_rights(&conn);
    match conn.prepare_batches().await {
        // Answered (no table yet, say): prepared at first use instead.
        Err(e) if !e.answered() => Err(e.to_string()),
        _ => Ok(conn),
    }
}

/// Says once per process that the database is a Galera node, and what
/// that changes.
fn say_galera(conn: &Connection) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if let Some(node) = conn.galera_node() {
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            info!(
                node,
                "the database is a node of a MariaDB Galera cluster: keep every daemon and \
                 fenced app on one node, through a single-writer proxy \
                 (docs/databases.md, \"Galera clusters\")"
            );
        }
    }
}

/// Says once per process when the daemon's role may do more than it needs:
/// another role's object that it runs into (a planted operator, a table in
/// a schema earlier on its path) would run with those rights.
fn say_excess_rights(conn: &Connection) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let excess = conn.excess_rights();
    let others = conn.others_may_create();
    if (excess.is_empty() && others.is_empty())
        || SAID.swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        return;
    }
    if !excess.is_empty() {
        warn!(
            rights = excess.join("; "),
            "the daemon's database role has more rights than it needs; run the daemon as a \
             role with data rights on service_leader_lock only \
             (docs/security.md, \"Three users, each with the least it needs\")"
        );
    }
    warn_open_schema(others);
}

/// Says that roles other than its owner may create in the schema of
/// leaderd's table and fence (nothing when none may).
pub fn warn_open_schema(others: &[String]) {
    if !others.is_empty() {
        warn!(
            roles = others.join(", "),
            "other roles may create objects in the schema of service_leader_lock and \
             leaderd_fence: an app's fence call that does not name the schema and the argument \
             types may run one of theirs; install leaderd in a schema of its own \
             (docs/security.md, \"Three users, each with the least it needs\")"
        );
    }
}

/// Says so when one round trip to the database takes longer than the renew
/// interval: a lease cannot be kept with this timing.
async fn check_round_trip(conn: &mut Connection, timing: Timing) {
    let sent = boot_now();
    // Any answer, an error included (no table yet), is a round trip; the
    // presence rows are few whatever the table holds.
    let _ = conn.elections(leaderd_core::spread::PRESENCE_PREFIX).await;
    let took = boot_now().saturating_since(sent);
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if took > timing.renew_every() {
        error!(
            round_trip_ms = ms(took),
            renew_every_ms = ms(timing.renew_every()),
            renewal_budget_ms = ms(timing.renewal_budget()),
            local_lease_ms = ms(timing.local_lease()),
            "a round trip to the database takes longer than the renew interval: \
             leases will be lost; raise heartbeat and ttl"
        );
    } else {
        // The budget beside the round trip: a short lease is kept only
        // while the database's commits, under its peak load, stay within
        // it.
        info!(
            round_trip_ms = ms(took),
            renewal_budget_ms = ms(timing.renewal_budget()),
            "database round trip measured"
        );
    }
}
