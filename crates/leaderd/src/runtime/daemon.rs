//! The daemon's elections: one [`Shared`] per configured election, in the
//! configured order, and what is answered for all of them together
//! (`/healthz`, `/readyz`, `/metrics`, `GET /elections`).
//!
//! Each election keeps its own row, token, deadline and metric series; the
//! HTTP handlers pick one by name (`?election=NAME`), or the first when no
//! name is given, so a daemon with one election answers as it always did.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaderd_core::{BootTime, Replica};
use tokio_util::sync::CancellationToken;

use crate::clock::boot_now;
use crate::outputs::metrics::{DaemonMetrics, Daemonwide, Scraped};
use crate::runtime::outages::Outages;
use crate::runtime::reach::Reach;
use crate::runtime::roster::Roster;
use crate::runtime::shared::Shared;
use crate::settings::{ElectionMetrics, Settings};

#[derive(Debug)]
pub struct Daemon {
    elections: Vec<Arc<Shared>>,
    /// The elections' places, ordered by name: a lookup by name (a release
    /// announced, an HTTP request) is a binary search, not a walk over
    /// thousands of names, and costs 4 bytes an election.
    by_name: Vec<u32>,
    /// The other live replicas, for naming successors.
    roster: Arc<Roster>,
    /// Its elections' timings and its own counters (see `metrics`).
    metrics: Arc<DaemonMetrics>,
    /// Until when the replica drains (see [`Daemon::drain`]).
    draining_until: Mutex<Option<BootTime>>,
    /// Whether the database answers the daemon's connection.
    reach: Arc<Reach>,
    /// Which series `/metrics` serves per election.
    election_metrics: ElectionMetrics,
}

/// No election of that name runs here: the message names it and the ones
/// that do.
#[derive(Debug, thiserror::Error)]
#[error("unknown election {name:?} (this daemon runs: {known})")]
pub struct UnknownElection {
    name: String,
    known: String,
}

impl Daemon {
    /// The elections of `each`, one election's settings each (see
    /// [`Settings::each_election`]), in that order.
    pub fn new(each: &[Settings]) -> Self {
        let roster = Arc::new(Roster::new(&each[0]));
        let metrics = Arc::new(DaemonMetrics::default());
        let outages = Arc::new(Outages::default());
        let replica = Arc::new(Replica::new(
            each[0].timing,
            each[0].id.as_str(),
            each[0].advertise.as_deref(),
        ));
        let elections: Vec<Arc<Shared>> = each
            .iter()
            .map(|one| {
                let (roster, metrics) = (roster.clone(), metrics.clone());
                Arc::new(Shared::new(
                    one,
                    replica.clone(),
                    roster,
                    metrics,
                    outages.clone(),
                ))
            })
            .collect();
        let mut by_name: Vec<u32> = (0..elections.len())
            .map(|i| u32::try_from(i).expect("fewer than 2^32 elections"))
            .collect();
        by_name.sort_unstable_by(|&a, &b| {
            elections[a as usize]
                .election
                .cmp(&elections[b as usize].election)
        });
        Self {
            elections,
            by_name,
            roster,
            metrics,
            draining_until: Mutex::new(None),
            reach: Arc::new(Reach::new(&each[0].timing)),
            election_metrics: each[0].election_metrics,
        }
    }

    /// The whole replica was released with `hold` (a `preStop` hook, an
    /// operator): until it ends the replica counts as absent for the
    /// spread, which then gives it nothing, and its loops leave the
    /// elections they do not lead to the others (`Engine::drain`;
    /// a replica released with a hold is draining). Never
    /// shortens a drain already asked for.
    pub fn drain(&self, hold: Duration) {
        let until = boot_now() + hold;
        let mut draining = self
            .draining_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *draining = Some(draining.map_or(until, |was| was.max(until)));
        self.roster.nudge();
    }

    /// Ends the replica's drain (`leaderd resume`): whether there was one.
    pub fn resume(&self) -> bool {
        let mut draining = self
            .draining_until
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let was = draining.take().is_some_and(|until| boot_now() < until);
        drop(draining);
        if was {
            self.roster.nudge();
        }
        was
    }

    /// Whether the replica drains at `now`.
    pub fn draining(&self, now: BootTime) -> bool {
        self.draining_until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|until| now < until)
    }

    /// Who else is live, and who is named at a release.
    pub fn roster(&self) -> &Arc<Roster> {
        &self.roster
    }

    /// Every election, in the configured order (never empty).
    pub fn all(&self) -> &[Arc<Shared>] {
        &self.elections
    }

    /// Stops every election's loop once `shutdown` is cancelled (see
    /// [`Shared::stop`]): one waiter for the daemon, not one per loop.
    pub async fn stop_when(self: Arc<Self>, shutdown: CancellationToken) {
        shutdown.cancelled().await;
        for election in &self.elections {
            election.stop();
        }
    }

    /// The first election: what is answered when no name is given.
    pub fn first(&self) -> &Arc<Shared> {
        &self.elections[0]
    }

    /// The place of the election called `name` in [`Daemon::all`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name
            .binary_search_by(|&i| self.elections[i as usize].election.as_ref().cmp(name))
            .ok()
            .map(|at| self.by_name[at] as usize)
    }

    /// The election called `name`, or the first when `None`.
    pub fn find(&self, name: Option<&str>) -> Result<&Arc<Shared>, UnknownElection> {
        let Some(name) = name else {
            return Ok(self.first());
        };
        self.position(name)
            .map(|i| &self.elections[i])
            .ok_or_else(|| UnknownElection {
                name: name.to_owned(),
                known: self
                    .elections
                    .iter()
                    .map(|s| s.election.as_ref())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Every election's loop makes progress.
    pub fn healthy(&self) -> bool {
        self.elections.iter().all(|s| s.healthy())
    }

    /// The database answered the daemon's connection lately, whether or
    /// not this replica competes (see `reach`).
    pub fn db_up(&self) -> bool {
        self.reach.up(boot_now())
    }

    /// What the daemon's connection records its answers in.
    pub fn reach(&self) -> &Arc<Reach> {
        &self.reach
    }

    /// The daemon's own metrics (the attempts' timings, the app's health).
    pub fn metrics(&self) -> &DaemonMetrics {
        &self.metrics
    }

    /// Prometheus text: the daemon's series once, each election's beside
    /// them (a name must not appear twice in one scrape).
    pub fn render_metrics(&self) -> String {
        let scraped: Vec<_> = self
            .elections
            .iter()
            .map(|shared| {
                let (view, duplicate) = shared.scraped();
                Scraped {
                    election: &shared.election,
                    metrics: &shared.metrics,
                    view,
                    duplicate,
                }
            })
            .collect();
        // One timing for every election of a daemon (see `Settings`).
        let timing = self.first().timing();
        let daemon = Daemonwide {
            metrics: &self.metrics,
            renew_every: timing.renew_every(),
            renewal_budget: timing.renewal_budget(),
            db_up: self.db_up(),
            election_metrics: self.election_metrics,
        };
        crate::outputs::metrics::render(&daemon, &scraped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn daemon_of(elections: &[&str]) -> Daemon {
        let mut argv = vec!["leaderd", "--id", "pod-a"];
        for e in elections {
            argv.extend(["--election", e]);
        }
        let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(argv).unwrap();
        let settings =
            crate::settings::Settings::load(&cli.config(), &crate::settings::ProcessEnv).unwrap();
        Daemon::new(&settings.each_election())
    }

    /// Found by name whatever the configured order; the configured order
    /// is kept for everything listed.
    #[test]
    fn each_election_is_found_by_name() {
        let names = ["zeta", "alpha", "mid", "alpha-2", "b"];
        let daemon = daemon_of(&names);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(daemon.position(name), Some(i), "{name}");
            assert_eq!(daemon.find(Some(name)).unwrap().election.as_ref(), *name);
        }
        assert_eq!(daemon.find(None).unwrap().election.as_ref(), "zeta");
        for unknown in ["", "alph", "alpha-", "zz", "a"] {
            assert_eq!(daemon.position(unknown), None, "{unknown}");
        }
        let err = daemon.find(Some("nope")).unwrap_err().to_string();
        assert!(err.contains("zeta, alpha, mid, alpha-2, b"), "{err}");
    }

    /// The shutdown reaches every election, whether its loop waits already
    /// or looks later; a command's end does not pass for it.
    #[tokio::test]
    async fn the_shutdown_stops_every_election() {
        let daemon = Arc::new(daemon_of(&["a", "b", "c"]));
        let a = daemon.all()[0].clone();
        let waiting = tokio::spawn(async move { a.stopped().await });
        tokio::task::yield_now().await;
        daemon.all()[0].set_child_running(true);
        daemon.all()[0].set_child_running(false);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "stopped by a command's end");
        assert!(daemon.all().iter().all(|e| !e.is_stopping()));
        let shutdown = CancellationToken::new();
        let stopping = tokio::spawn(daemon.clone().stop_when(shutdown.clone()));
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("a waiting loop is told")
            .unwrap();
        stopping.await.unwrap();
        for e in daemon.all() {
            assert!(e.is_stopping(), "{}", e.election);
            tokio::time::timeout(Duration::from_secs(5), e.stopped())
                .await
                .expect("a later wait ends at once");
        }
    }
}
