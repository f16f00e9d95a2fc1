//! PostgreSQL: the lock table on `tokio-postgres` (pure Rust), over rustls
//! when the URL asks for TLS.
//!
//! - `store`: a connection running the lease's statements (and the module
//!   docs on pooler safety and named statements);
//! - `statements`: the SQL of the lease, the release and the listings;
//! - `lease`: acquire-or-renew, for one election and for many;
//! - `connect`: opening a connection (host lists, bounds, cancel requests);
//! - `from_row`: rows read into the shared row types;
//! - `session`: what a connection learns once at connect (the table's
//!   schema, a direct connection, rights beyond the daemon's needs);
//! - `listener`: the followers' wake-ups (`LISTEN`/`NOTIFY`);
//! - `held_off`: takeovers an app's fenced transaction held off;
//! - `plan`: the migration plan over `migrations/postgres/`;
//! - `warm_up`: a new connection's session readied for a takeover.

mod connect;
mod from_row;
mod held_off;
mod lease;
mod listener;
mod plan;
mod session;
mod statements;
mod store;
mod warm_up;

pub(crate) use connect::CancelHandle;
pub use held_off::warned_total as takeovers_held_off_total;
pub use listener::{Listener, Probe};
pub(crate) use store::PgStore;
