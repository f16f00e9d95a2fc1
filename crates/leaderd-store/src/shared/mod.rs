//! What every backend rests on, knowing none of them: the error type, the
//! lease's vocabulary, database URLs and TLS, the read-first
//! acquire-or-renew of the backends without `UPDATE … RETURNING` (`cas`),
//! diesel's fixed-text statement (`sql`), the boot clock, the record of
//! terms' row type, and the migration runner, which each backend hands its
//! plan as data. Nothing here imports a backend folder or the crate's front.

/// `Debug` for a type that wraps a live connection: its name, nothing inside
/// (drivers' own `Debug` may show connection details).
macro_rules! opaque_debug {
    ($ty:ident) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($ty)).finish_non_exhaustive()
            }
        }
    };
}

pub(crate) mod cas;
pub(crate) mod clock;
pub(crate) mod error;
pub(crate) mod history;
pub(crate) mod lease;
pub(crate) mod migrate;
pub(crate) mod sql;
pub(crate) mod tls;
pub(crate) mod url;
