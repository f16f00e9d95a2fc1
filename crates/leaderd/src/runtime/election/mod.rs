//! The election loop: drives the [`leaderd_core::Engine`] with real
//! database answers and real time, and carries out its events (logs,
//! metrics, flag file). The state it shares with the rest of the daemon is
//! in `shared`.
//!
//! One loop per election, one attempt at a time, on the daemon's one
//! connection (see `link`, which sends the loops' statements together).
//! Each attempt reads the boot clock before it is handed over (so waiting
//! for the batch shortens, never lengthens, the lease), runs under a timeout
//! no longer than what is left of the lease, and a failure drops the
//! connection so the retry uses a fresh one (cancelling a statement the
//! server may still be running). On shutdown the engine stops claiming
//! leadership first, a statement in flight may finish, then the row is
//! released on the same connection, all within a fixed budget.
//!
//! This file sets a loop up and turns it; its concerns are beside it:
//! `attempt` (attempting, and the connection side), `look` (reading the
//! row without asking for it), `turn` (giving up a named successor's turn
//! it will not take), `requests` (requests,
//! wake-ups, connects), `release` (releasing the row), `report` (logs,
//! metrics, flag file).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::BootTime;
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::error;

use crate::clock::{boot_now, BootTimer};
use crate::outputs::flag_file::{FlagFile, FlagWriter};
use crate::runtime::link::{Link, Reached};
use crate::runtime::shared::Shared;
use crate::runtime::wakeups;
use crate::settings::Settings;

mod attempt;
mod look;
mod release;
mod report;
mod requests;
mod turn;

/// How long shutdown waits for a statement already in flight, then how long
/// it may spend releasing the row: together they keep the whole shutdown
/// within the documented 2 s even when the database is gone.
const IN_FLIGHT_BUDGET: Duration = Duration::from_millis(300);
const RELEASE_BUDGET: Duration = Duration::from_millis(800);

/// How long a release on purpose may wait for a just-elected leader's
/// presence (MySQL) to be seen by the waiters; counted with the above.
const NOTICE_BUDGET: Duration = Duration::from_millis(100);

/// How long a release waits for the flag file's removal (beside the
/// [`NOTICE_BUDGET`]) before giving up the release: an fsync-heavy disk was
/// seen to take 75 ms.
const FLAG_BUDGET: Duration = Duration::from_millis(100);

/// How long shutdown waits for the presence to be let go. With the above,
/// the sessions' linger (`leaderd_core::successor::LINGER_CAP`), the HTTP
/// server's 0.3 s, the runtime's 0.1 s and the log flush's 0.1 s,
/// shutdown stays under 1.9 s.
const PRESENCE_BUDGET: Duration = Duration::from_millis(100);

/// How long after a command's deadline its reaping may take.
const CHILD_REAP_BUDGET: Duration = Duration::from_millis(200);

/// One election's loop, ready to run (see [`Election::run`]).
pub struct Election {
    lp: Loop,
    /// The wake-up presence's task (MySQL only).
    presence: Option<tokio::task::JoinHandle<()>>,
    /// Requests stop being taken when the loop ends, however it ends.
    _closed: ClosedOnDrop,
    /// Cancels the daemon's run when the election ends, set by
    /// [`Election::run`]. After `_closed` (fields drop in order): should the
    /// loop fail, its engine stops claiming leadership before the rest of
    /// the daemon hears of it.
    stop: Option<DropGuard>,
}

/// Sets up `shared`'s loop (flag file, presence) without awaiting: the
/// settings stay out of the loop's future, one of which lives per election.
pub fn start(shared: Arc<Shared>, settings: &Settings, link: Link) -> Election {
    let flag =
        settings
            .flag_file
            .clone()
            .and_then(|path| match FlagWriter::start(FlagFile::new(path)) {
                Ok(flag) => Some(flag),
                Err(e) => {
                    // No file reads as "not leader": the safe side.
                    error!(error = %e, "cannot start the flag-file writer; no flag file is kept");
                    None
                }
            });
    // A stale one from an earlier run.
    if let Some(flag) = &flag {
        flag.remove();
    }
    // Not even a task, nor its channels, where the backend needs no
    // presence (each costs kilobytes with thousands of elections); when the
    // URL cannot be read yet, the task finds out.
    let (presence, presence_task) = match settings.database.resolve() {
        Ok(url) if !leaderd_store::Presence::needed(&url) => (None, None),
        _ => {
            let (leading, leading_rx) = watch::channel(false);
            let (held_tx, held) = watch::channel(None);
            let task = tokio::spawn(wakeups::keep_presence(
                settings.database.clone(),
                link.clone(),
                shared.election.to_string(),
                leading_rx,
                held_tx,
            ));
            (Some(PresenceLink { leading, held }), Some(task))
        }
    };
    let closed = ClosedOnDrop(shared.clone());
    let lp = Loop {
        db: Db {
            link,
            reached: Reached::Nothing,
            wants_link: false,
        },
        report: Report {
            flag,
            duplicate_seen: None,
        },
        shared,
        last_error: None,
        granted: false,
        unanswered: false,
        timer: BootTimer::new(),
        presence,
    };
    Election {
        lp,
        presence: presence_task,
        _closed: closed,
        stop: None,
    }
}

impl Election {
    /// Runs the election until it is stopped ([`Shared::stop`], which the
    /// daemon does when `shutdown` fires), then releases the row: whether
    /// it freed it then. Should the loop fail (a panic), `shutdown` is
    /// cancelled on the way out: nothing may run on as if this election
    /// were led.
    ///
    /// An `async` block, not an `async fn`: the future of an `async fn`
    /// keeps its arguments twice (as passed, and as locals), and this one
    /// is a task of its own in each of thousands of elections.
    #[allow(clippy::manual_async_fn)]
    pub fn run(mut self, shutdown: CancellationToken) -> impl Future<Output = bool> + Send {
        async move {
            self.stop = Some(shutdown.drop_guard());
            // Not before the replica has joined: `presence::begin` wakes
            // the loop then, as the daemon's stop does.
            let shared = &self.lp.shared;
            while !(shared.roster.begun() || shared.is_stopping()) {
                shared.wake.taken().await;
            }
            // Whatever else woke the loop meanwhile (a release announced)
            // is heard at its first turn.
            shared.wake.notify();
            self.lp.elect().await;
            // Requests from now on (a `leaderd release` in a preStop hook)
            // are answered at once ("stopped"), not after the release below.
            self.lp.shared.control.close();
            // Boxed, as every rare path: the future of the loop's life
            // stays the size of its waiting.
            Box::pin(self.finish()).await
        }
    }

    /// After the loop: stop claiming leadership, release the row, let the
    /// presence and the flag file go. Whether the row was freed.
    async fn finish(mut self) -> bool {
        let lp = &mut self.lp;
        lp.report.step_down(&lp.shared);
        let instance = lp.shared.engine().instance().to_owned();
        let released = lp.release_row(&instance, true).await;
        // The named lock (MySQL) goes with the process anyway; letting it
        // go first wakes the others a little sooner. The flag file, if the
        // disk allows, should not outlive the process.
        // Its task ends once the loop's end of `leading` is gone.
        drop(lp.presence.take());
        let presence_gone = async {
            if let Some(presence) = self.presence {
                let _ = tokio::time::timeout(PRESENCE_BUDGET, presence).await;
            }
        };
        let _ = tokio::join!(presence_gone, lp.report.flag_removed(PRESENCE_BUDGET));
        released
    }
}

/// The loop's side of the wake-up presence (see [`wakeups::keep_presence`]).
struct PresenceLink {
    /// Whether this replica leads. Cleared only after a release of the row,
    /// so that the wake-up finds the row free.
    leading: watch::Sender<bool>,
    /// Since when the presence holds its lock.
    held: watch::Receiver<Option<tokio::time::Instant>>,
}

impl PresenceLink {
    fn set_leading(&self, leading: bool) {
        self.leading
            .send_if_modified(|l| std::mem::replace(l, leading) != leading);
    }
}

/// Closes the loop's inbox when the loop ends (or unwinds), and stops the
/// engine claiming leadership: a loop that unwound must not be kept leading
/// by the link's renewals.
struct ClosedOnDrop(Arc<Shared>);

impl Drop for ClosedOnDrop {
    fn drop(&mut self) {
        self.0.control.close();
        self.0.engine().shutdown(boot_now());
    }
}

struct Loop {
    shared: Arc<Shared>,
    db: Db,
    report: Report,
    /// The last failure, so each change of reason is logged once.
    last_error: Option<String>,
    /// The last answer was a grant (even one too late to use).
    granted: bool,
    /// Some statement went unanswered (timed out or failed after sending):
    /// it may still commit, whatever later answers say.
    unanswered: bool,
    /// The wake-up presence (MySQL's named lock), where the backend has one.
    presence: Option<PresenceLink>,
    /// Waits for the next wake-up, and, while an attempt is in flight, for
    /// the local deadline and the attempt's timeout: a leader's on the boot
    /// clock, the clock of the deadline, a follower's on tokio's (see
    /// [`BootTimer::sleep_until_exact_or_not`]).
    timer: BootTimer,
}

/// The connection side of the loop: one attempt at a time on the daemon's
/// connection, opened outside the attempts (see [`Link`]).
struct Db {
    link: Link,
    /// How far the current attempt (or release) got: once its statement
    /// was sent, its fate is unknown if no answer comes.
    reached: Reached,
    /// This loop waits for a connection, and hears how its connect ended.
    wants_link: bool,
}

/// The reporting side: logs, metrics and the flag file for each event.
struct Report {
    flag: Option<FlagWriter>,
    /// The other process last seen holding the lease under our id.
    duplicate_seen: Option<Option<String>>,
}

impl Loop {
    async fn elect(&mut self) {
        loop {
            let now = boot_now();
            self.shared.progress(now);
            let events = self.shared.events(now);
            self.report.handle(&self.shared, events);
            // A holder no longer named (by time) is announced now, as
            // `/leader` shows it (the loop wakes then; see `wakeup`).
            self.shared.publish();
            self.sync_presence();
            // Shutdown before any request still queued (a request handled
            // meanwhile, say a long release, may have let it come).
            if self.shared.is_stopping() {
                return;
            }
            // Requests first: renewals slower than the renew interval follow
            // one another without a pause, and a release or an unhealthy
            // app must not wait for them to speed up.
            if let Some(request) = self.shared.control.try_recv() {
                // Boxed, as every rare path here: the loop's own future,
                // one per election, stays small.
                Box::pin(self.on_control(request)).await;
                continue;
            }
            let due = self.shared.engine().attempt_due(now);
            // Only a loop waiting for a connection hears of connects (see
            // `on_link`); from before it looks, so none is missed.
            if due && !self.db.wants_link {
                self.db.link.mark_seen();
            }
            if due && !self.db.link.connected() {
                self.db.wants_link = true;
                self.db.link.want_connection();
            } else if due {
                // Boxed: while it waits, the loop's own future (one per
                // election) holds a pointer, not the attempt's state.
                if Box::pin(self.attempt()).await {
                    return;
                }
                continue;
            }
            if !due && self.shared.engine().look_due(now) {
                if self.db.link.connected() {
                    Box::pin(self.look()).await;
                } else {
                    self.shared.engine().on_look_failed();
                }
                continue;
            }
            let (wakeup, exact) = self.wakeup(now, due);
            // Waits for `wakeup` or a wake-up (a request, a release notice,
            // the daemon's stop). A request is taken at the top of the
            // loop; the daemon's stop at once (its step-down and release
            // come first).
            let woken = if self.db.wants_link {
                // Boxed: a wait that also hears of connects is rare (at
                // start, in an outage), and the link's wait is as large as
                // the rest of this one.
                Box::pin(self.wait_for_link(wakeup, exact)).await
            } else {
                // Here, not in a function of its own: the loop spends its
                // life in this wait, and its state is part of each
                // election's task (a function's would keep its arguments
                // again).
                let timer = pin!(self.timer.sleep_until_exact_or_not(wakeup, exact));
                self.shared.wake.or(timer).await
            };
            if woken && self.woken() {
                return;
            }
        }
    }

    /// The loop's wait, and for the connect this loop waits for: whether a
    /// wake-up came.
    async fn wait_for_link(&mut self, wakeup: BootTime, exact: bool) -> bool {
        tokio::select! {
            biased;
            () = self.shared.wake.taken() => return true,
            changed = self.db.link.changed() => self.on_link(changed),
            () = self.timer.sleep_until_exact_or_not(wakeup, exact) => {}
        }
        false
    }
}
