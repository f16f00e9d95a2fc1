//! The I/O-free heart of leaderd.
//!
//! [`Engine`] is a state machine: it is told what the database answered and
//! when (on the host's boot clock, see [`BootTime`]), and it says whether this
//! replica leads at a given instant and when to ask the database next. It never
//! reads a clock, sleeps, or touches a socket; the daemon and the stores are
//! adapters around it. That keeps every timing rule testable with
//! plain values.
//!
//! What this crate does not do: talk to a database (see `leaderd-store`), or
//! serve HTTP, write the flag file, or handle signals (see the `leaderd`
//! binary).

mod child;
mod engine;
pub mod spread;
mod standing;
pub mod successor;
mod time;

pub use child::{ChildAction, ChildTimer, StopGraceError};
pub use engine::{Attempt, Engine, Event, LossReason, Observed, Replica, StepDown, View};
pub use standing::{away_note, away_prefix, read_away_note, NotCompeting, Standing, AWAY_PREFIX};
pub use time::{BootTime, Timing, TimingError, WaveSchedule, WAVE_GROUP};

/// Longest `name` or `id`, in characters, that the lock table stores.
pub const MAX_NAME_CHARS: usize = 100;
