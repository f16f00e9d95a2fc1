//! MySQL 8 and MariaDB 10.6+, Galera clusters included: the lock table on
//! `mysql_async` (pure Rust) via diesel-async.
//!
//! - `store`: a connection running the lease's statements (and the module
//!   docs on clocks and counts);
//! - `statements`: the SQL of the lease (the takeover `TAKE`/`TAKE_ALL`,
//!   renewal, creation), the release and the listings, each one `Sql` with
//!   a MariaDB text and a MySQL 8 text, bounded in its own lock waits;
//! - `lease`: acquire-or-renew by reading first, alone and in batches;
//! - `release`: freeing rows, alone and in batches;
//! - `connect`: opening a connection (TLS, the server's kind);
//! - `wake`: the named locks a leader holds and followers wait on;
//! - `galera`: wake-ups across the nodes of a Galera cluster;
//! - `plan`: the migration plans over `migrations/mysql/`;
//! - `scratch` (tests only): scratch databases on the local MariaDB.

mod connect;
mod galera;
mod lease;
mod plan;
mod release;
#[cfg(test)]
mod scratch;
mod statements;
mod store;
mod wake;

pub(crate) use galera::{connect_if_galera, RowsWatcher};
pub(crate) use store::MysqlStore;
pub(crate) use wake::{LockWaiter, LocksWatcher, NOTICED_WITHIN};
