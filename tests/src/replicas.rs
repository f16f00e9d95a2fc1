//! A set of replicas of leaderd on one database, as the fault, `exec` and
//! bench scenarios run them: each optionally behind a fault proxy of its
//! own, replaced in place by a new process (a new instance), and their logs
//! printed when a test fails.

use std::time::Duration;

use crate::checker::assert_no_overlap;
use crate::proxy::{upstream, FaultProxy};
use crate::{wait_for, Daemon, Launch, Scratch};

/// How each replica's process is prepared from a plain `leaderd run`
/// (`leaderd exec -- …`, extra flags).
type Adjust = Box<dyn Fn(Launch) -> Launch>;

pub struct Replicas {
    pub daemons: Vec<Daemon>,
    /// One per replica, each replica talking to the database through its
    /// own; empty when started [`Replicas::direct`].
    pub proxies: Vec<FaultProxy>,
    pub dir: Scratch,
    url: String,
    /// Processes started so far: each one's files get a name of their own,
    /// so an old process's log stays readable.
    starts: usize,
    adjust: Adjust,
}

impl Replicas {
    /// `n` replicas named `{prefix}{i}`, each behind its own fault proxy,
    /// each process made by `adjust` from a plain `leaderd run`.
    pub fn proxied(
        url: &str,
        n: usize,
        prefix: &str,
        adjust: impl Fn(Launch) -> Launch + 'static,
    ) -> Replicas {
        Self::start(url, n, prefix, true, Box::new(adjust))
    }

    /// As [`Replicas::proxied`], every replica straight to the database.
    pub fn direct(
        url: &str,
        n: usize,
        prefix: &str,
        adjust: impl Fn(Launch) -> Launch + 'static,
    ) -> Replicas {
        Self::start(url, n, prefix, false, Box::new(adjust))
    }

    fn start(url: &str, n: usize, prefix: &str, proxied: bool, adjust: Adjust) -> Replicas {
        let mut r = Replicas {
            daemons: Vec::new(),
            proxies: Vec::new(),
            dir: Scratch::new(),
            url: url.to_owned(),
            starts: 0,
            adjust,
        };
        for i in 0..n {
            if proxied {
                r.proxies.push(FaultProxy::start(upstream(url)));
            }
            let d = r.launch(i, &format!("{prefix}{i}"));
            r.daemons.push(d);
        }
        r
    }

    /// A new process for replica `i` (through its proxy, if it has one).
    fn launch(&mut self, i: usize, id: &str) -> Daemon {
        self.starts += 1;
        let url = match self.proxies.get(i) {
            Some(p) => p.url(&self.url),
            None => self.url.clone(),
        };
        let stem = format!("{id}-{}", self.starts);
        (self.adjust)(Daemon::launch(&url, id, &self.dir, &stem, &[])).start()
    }

    /// Replaces replica `i` with a new process under `id` (the old one,
    /// if still running, is dropped: killed).
    pub fn restart(&mut self, i: usize, id: &str) {
        self.daemons[i] = self.launch(i, id);
    }

    /// Replica `i` started again under its id.
    pub fn restart_same(&mut self, i: usize) {
        let id = self.daemons[i].id.clone();
        self.restart(i, &id);
    }

    /// The replica running under `id`.
    pub fn index(&self, id: &str) -> usize {
        self.daemons
            .iter()
            .position(|d| d.id == id)
            .expect("a replica")
    }

    /// The token replica `i` leads its (first) election under, if it leads.
    pub fn token(&self, i: usize) -> Option<i64> {
        self.daemons[i].token_held("")
    }

    /// Waits for exactly one leader among the replicas.
    pub fn leader(&self, within: Duration) -> usize {
        wait_for(within, "a single leader", || {
            let leaders: Vec<usize> = (0..self.daemons.len())
                .filter(|&i| self.daemons[i].is_leader())
                .collect();
            (leaders.len() == 1).then(|| leaders[0])
        })
    }

    /// Waits for a leader other than `not`.
    pub fn new_leader(&self, not: usize, within: Duration) -> usize {
        wait_for(within, "a new leader", || {
            (0..self.daemons.len()).find(|&i| i != not && self.daemons[i].is_leader())
        })
    }

    /// Checks from the logs that no two replicas ever led at once; the
    /// number of terms seen.
    pub fn check(&self) -> usize {
        let refs: Vec<&Daemon> = self.daemons.iter().collect();
        assert_no_overlap(&refs).len()
    }
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.daemons.iter().map(|d| d.id.as_str()).collect();
        f.debug_struct("Replicas")
            .field("ids", &ids)
            .field("proxied", &!self.proxies.is_empty())
            .finish()
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        // A failed scenario is only as useful as what the daemons said.
        if std::thread::panicking() {
            crate::print_logs(&self.daemons);
        }
    }
}
