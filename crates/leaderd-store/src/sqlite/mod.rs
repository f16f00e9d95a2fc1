//! SQLite: the embedded default, for one host.
//!
//! - `store`: a connection running the lease's statements (and the module
//!   docs on the boot clock and rows of another boot);
//! - `statements`: the SQL of the lease, the release and the listings;
//! - `lease`: acquire-or-renew by reading first, run off the async threads;
//! - `open`: opening the file safely (local file systems only, WAL);
//! - `wake`: the file releases append to, which followers watch;
//! - `plan`: the migration plan over `migrations/sqlite/`.

mod lease;
mod open;
mod plan;
mod statements;
mod store;
mod wake;

pub use open::check_file_system;
pub(crate) use store::SqliteStore;
pub(crate) use wake::FileWaiter;
