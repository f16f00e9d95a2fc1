//! The election runtime: one loop per election (`election`) driving the
//! lease engine, the state each shares with the rest (`shared`), the
//! daemon's elections together (`daemon`), and the parts around the loops:
//! the one connection (`link`, opened by `connector`), release wake-ups
//! (`wakeups`), the presence rows (`presence`) and who they show live
//! (`roster`, which names successors) and on which Galera nodes (`nodes`), the spread across replicas
//! (`spread`), requests to a loop (`inbox`) and the
//! wake-up that tells it of them (`signal`), the app-health gate
//! (`app_health`), whether the database answers (`reach`) and the
//! elections' failures, logged once per cause (`outages`).
//!
//! A new capability of the elections goes in a module of its own here,
//! beside the loop, not into it.

pub mod app_health;
pub mod away;
pub mod connector;
pub mod daemon;
pub mod election;
pub mod inbox;
pub mod link;
pub mod nodes;
pub mod outages;
pub mod presence;
pub mod reach;
pub mod roster;
pub mod shared;
pub mod signal;
pub mod slots;
pub mod spread;
pub mod wakeups;
