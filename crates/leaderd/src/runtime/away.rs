//! The away row: a replica that competes in none of its elections (its app
//! fails its health check, it is held, it drains) keeps a row that says so
//! and why, so that `leaderd status` on any host shows where the
//! candidates went when nobody leads. A presence row says the opposite (a
//! replica waiting to be named), and such a replica keeps none.
//!
//! The row is leased like a presence row (judged by the database's clock,
//! gone a ttl after its replica), in a slot under
//! [`leaderd_core::AWAY_PREFIX`] and the group's hash; its address column
//! holds the note ([`leaderd_core::away_note`]: the reason, and what is
//! left of a hold or drain as of its last renewal). The presence task
//! keeps it at each of its rounds.

use leaderd_core::{away_note, away_prefix, Attempt, NotCompeting, Standing};
use tracing::debug;

use crate::clock::boot_now;
use crate::runtime::daemon::Daemon;
use crate::runtime::link::{Link, Request};
use crate::runtime::slots::free_slot;
use crate::settings::Settings;

/// This replica's away row, while it keeps one.
#[derive(Debug, Default)]
pub struct Away {
    /// The slot held or to take next.
    name: Option<String>,
    /// The row's token while this instance holds it.
    token: Option<i64>,
}

impl Away {
    /// Keeps the row while the replica competes in none of its elections
    /// (renewed with the note as it is now), and lets it go once it
    /// competes in one, or stops.
    pub async fn round(
        &mut self,
        link: &Link,
        daemon: &Daemon,
        settings: &Settings,
    ) -> Result<(), String> {
        let note = away(daemon).as_ref().and_then(away_note);
        let Some(note) = note else {
            if self.token.is_some() {
                self.leave(link, daemon).await;
            }
            return Ok(());
        };
        let instance = daemon.roster().daemon().to_string();
        if self.token.is_none() {
            let prefix = away_prefix(daemon.roster().prefix());
            let rows = link.read(&prefix).await?;
            self.name = Some(free_slot(&prefix, &rows, &instance));
        }
        let Some(name) = self.name.clone() else {
            return Ok(());
        };
        for _ in 0..2 {
            let req = Request {
                election: name.as_str().into(),
                holder: settings.id.as_str().into(),
                instance: instance.as_str().into(),
                ttl: settings.timing.ttl(),
                held_token: self.token,
                daemon: None,
                address: Some(note.as_str().into()),
            };
            let until = boot_now() + settings.timing.heartbeat();
            self.token = match link.attempt(req, until).await.map_err(|f| f.reason)? {
                Attempt::Granted { token } => Some(token),
                Attempt::Refused(_) => None,
                // Made just now (free): taken at once.
                Attempt::Created => continue,
            };
            break;
        }
        Ok(())
    }

    /// Frees the row, if this instance holds it (shutdown, or competing
    /// again); within the presence release's budget, as the caller bounds.
    pub async fn leave(&mut self, link: &Link, daemon: &Daemon) {
        self.token = None;
        let Some(name) = &self.name else {
            return;
        };
        let released = link.release(name, daemon.roster().daemon(), None).await;
        debug!(released = ?released, "away row let go");
    }
}

/// The replica's standing when it competes in none of its elections (the
/// first election's: with several, a hold or a drain is mostly the same
/// for all), else `None`. A replica shutting down keeps no row: it goes.
fn away(daemon: &Daemon) -> Option<Standing> {
    let now = boot_now();
    let mut standings = daemon.all().iter().map(|s| s.engine().standing(now));
    let first = standings.next()?;
    let away = !first.competing() && standings.all(|s| !s.competing());
    (away && first.not_competing != Some(NotCompeting::ShuttingDown)).then_some(first)
}
