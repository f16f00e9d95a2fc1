//! The wake-up adapters beside the election loops: a task that waits for
//! releases and pokes the loop of the election released, and (MySQL) a task
//! per election that holds the leader's named lock, on the daemon's
//! connection to the lock table, while this replica leads. Wake-ups only:
//! the loop attempts when poked, and safety rests on the row and the clocks.

use std::sync::Arc;
use std::time::Duration;

use leaderd_store::{Presence, Released, Waiter, WakeLock};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::clock::boot_now;
use crate::runtime::daemon::Daemon;
use crate::runtime::link::{Link, State};
use crate::settings::DatabaseSource;

/// Whether the backend needs a presence (MySQL's named lock), which also
/// says whether its release waiter is per election. The backend cannot
/// change under a running daemon; a URL file that is not readable yet (a
/// Secret mounted late) is waited for.
async fn presence_needed(source: &DatabaseSource) -> bool {
    loop {
        match source.resolve() {
            Ok(url) => return Presence::needed(&url),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Wakes each election's loop when a release of it is announced: one
/// waiter for every election (one `LISTEN` connection, one connection
/// looking at MySQL's named locks, one file watch). At start it checks that
/// PostgreSQL notifications arrive at all; when they do not (a
/// transaction-pooling proxy drops them silently) it gives up and the loops
/// rely on polling, which they do anyway.
pub async fn wait_for_releases(
    source: DatabaseSource,
    daemon: Arc<Daemon>,
    heartbeat: Duration,
    shutdown: CancellationToken,
) {
    let notify = |name: &str| {
        if let Some(i) = daemon.position(name) {
            daemon.all()[i].notice_release();
        }
    };
    // The daemon's names, shared: a count each, not a copy.
    let elections: Vec<Arc<str>> = daemon.all().iter().map(|s| s.election.clone()).collect();
    let nonce = uuid::Uuid::new_v4().to_string();
    let mut backoff = Duration::from_millis(100);
    let mut checked = false;
    while !shutdown.is_cancelled() {
        let result: Result<(), String> = async {
            let url = source.resolve()?;
            let mut waiter = Waiter::connect(&url, &elections, heartbeat)
                .await
                .map_err(|e| e.to_string())?;
            if !checked {
                let probe = waiter
                    .probe(Duration::from_secs(2), &nonce)
                    .await
                    .map_err(|e| e.to_string())?;
                for name in &probe.others {
                    notify(name);
                }
                if !probe.delivered {
                    // Expected behind a transaction pooler (PgBouncer): not
                    // a fault, and polling keeps every guarantee.
                    info!("release notifications are not delivered (transaction-pooling proxy?); polling only");
                    daemon.roster().set_listening();
                    return Ok(());
                }
                debug!("release wake-ups work");
                checked = true;
            }
            // Listening from here on: this replica may be named.
            daemon.roster().set_listening();
            backoff = Duration::from_millis(100);
            // A leader holds its own election's wake-up; no release of it
            // is worth looking for. Found by index: with thousands of
            // elections, a search by name per election per look cost a core.
            let wanted = |name: &str| {
                daemon
                    .position(name)
                    .is_some_and(|i| !daemon.all()[i].is_leader(boot_now()))
            };
            loop {
                match waiter.next(&wanted).await.map_err(|e| e.to_string())? {
                    Released::Election(name) => notify(&name),
                    // Wake all: a woken follower's attempt is a cheap
                    // refusal.
                    Released::Unknown => daemon.all().iter().for_each(|s| s.notice_release()),
                }
            }
        }
        .await;
        match result {
            Ok(()) => return,
            Err(e) => debug!(error = %e, "release waiter failed; reconnecting"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(heartbeat.max(Duration::from_secs(1)));
    }
}

/// Holds the election's named lock while `leading` is true (MySQL/MariaDB;
/// returns at once on the other backends, which need none), on the
/// daemon's connection to the lock table (the [`Link`]'s), and says in
/// `held` since when it holds it. Ends when the loop drops its end of
/// `leading` (whatever it said last: a loop that panicked drops it still
/// saying true), letting the lock go.
pub async fn keep_presence(
    source: DatabaseSource,
    link: Link,
    election: String,
    mut leading: watch::Receiver<bool>,
    held: watch::Sender<Option<Instant>>,
) {
    if !presence_needed(&source).await {
        return;
    }
    let mut state = link.state();
    // `wait_for` still answers from the last value once the loop's end is
    // gone: without this, a `true` left there would take and free the
    // lock over and over.
    let closed = |leading: &watch::Receiver<bool>| leading.has_changed().is_err();
    loop {
        if closed(&leading) || leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        let kept: Result<(), String> = async {
            // A follower that just woke holds the lock for an instant.
            let mut taken_on = None;
            let mut busy = Busy::default();
            while *leading.borrow() && !closed(&leading) {
                let (lock, generation) = link.hold_wake_lock(&election).await?;
                if let WakeLock::Busy(holder) = lock {
                    busy.seen(&election, holder, Instant::now());
                } else {
                    held.send_replace(Some(Instant::now()));
                    taken_on = Some(generation);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let Some(generation) = taken_on else {
                return Ok(());
            };
            // Until it stops leading, or the connection it was taken on is
            // dropped (a statement on it timed out or failed unanswered,
            // or a wake-up lock's failed), when the lock is taken again on
            // the next one.
            let lost = |s: &State| !s.connected || s.generation != generation;
            tokio::select! {
                _ = leading.wait_for(|l| !*l) => {}
                _ = state.wait_for(lost) => {}
            }
            held.send_replace(None);
            link.free_wake_lock(&election, generation).await
        }
        .await;
        held.send_replace(None);
        if let Err(e) = kept {
            debug!(error = %e, "leader presence failed; trying again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How long a leader's wake-up lock may be someone else's before it says
/// so: a follower that just woke holds it for an instant, nothing longer.
const BUSY_FOR: Duration = Duration::from_secs(1);

/// A leader's wake-up lock held by another connection: anyone who may
/// connect can take a named lock, and while someone does, this leader's
/// releases wake nobody (the others come at their poll, up to a heartbeat
/// later). Said once per leadership, after [`BUSY_FOR`].
#[derive(Debug, Default)]
struct Busy {
    since: Option<Instant>,
    said: bool,
}

impl Busy {
    fn seen(&mut self, election: &str, holder: Option<u64>, now: Instant) {
        let since = *self.since.get_or_insert(now);
        if !self.said && now.saturating_duration_since(since) >= BUSY_FOR {
            self.said = true;
            warn!(
                election,
                connection = holder,
                "another connection holds this leader's wake-up lock (a named lock anyone who \
                 may connect can take): graceful handovers of this election wake the other \
                 replicas only at their poll, up to a heartbeat later; end that connection \
                 (docs/operations.md, \"A wake-up lock held by another connection\")"
            );
        }
    }
}

/// Waits, at most `budget`, until the leader's presence has been held long
/// enough for the waiters to be waiting on it ([`Presence::NOTICED_WITHIN`]):
/// a leader released moments after it was elected would otherwise wake
/// nobody. At once where no presence is kept (its task has ended) or it has
/// long been held.
pub async fn presence_noticed(held: &mut watch::Receiver<Option<Instant>>, budget: Duration) {
    let noticed = async {
        loop {
            let since = *held.borrow_and_update();
            let change = match since {
                Some(t) if t.elapsed() >= Presence::NOTICED_WITHIN => return,
                Some(t) => tokio::select! {
                    () = tokio::time::sleep_until(t + Presence::NOTICED_WITHIN) => return,
                    r = held.changed() => r,
                },
                None => held.changed().await,
            };
            if change.is_err() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(budget, noticed).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_millis(300);

    #[test]
    fn a_wake_up_lock_held_elsewhere_is_said_once_past_an_instant() {
        let mut busy = Busy::default();
        let t0 = Instant::now();
        busy.seen("e", Some(7), t0);
        busy.seen("e", Some(7), t0 + BUSY_FOR / 2);
        assert!(
            !busy.said,
            "a follower that just woke holds it for an instant"
        );
        busy.seen("e", Some(7), t0 + BUSY_FOR);
        assert!(busy.said);
    }

    /// How long `presence_noticed` took with `held` as given.
    async fn noticed_after(rx: &mut watch::Receiver<Option<Instant>>) -> Duration {
        let started = Instant::now();
        presence_noticed(rx, BUDGET).await;
        started.elapsed()
    }

    // On tokio's paused clock: the waits are exact, whatever the load.
    #[tokio::test(start_paused = true)]
    async fn no_presence_kept_or_one_long_held_means_no_wait() {
        let (tx, mut rx) = watch::channel(None);
        drop(tx);
        assert_eq!(noticed_after(&mut rx).await, Duration::ZERO);
        let (_tx, mut rx) = watch::channel(Some(Instant::now() - Duration::from_secs(1)));
        assert_eq!(noticed_after(&mut rx).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_just_taken_is_kept_until_the_waiters_have_seen_it() {
        let (_tx, mut rx) = watch::channel(Some(Instant::now()));
        assert_eq!(noticed_after(&mut rx).await, Presence::NOTICED_WITHIN);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_taken_while_waiting_is_waited_for_and_a_lock_never_taken_is_not_forever() {
        let (tx, mut rx) = watch::channel(None);
        let taker = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            tx.send_replace(Some(Instant::now()));
            tx
        });
        assert_eq!(
            noticed_after(&mut rx).await,
            Duration::from_millis(30) + Presence::NOTICED_WITHIN
        );
        let _tx = taker.await.unwrap();
        let (_tx, mut rx) = watch::channel(None);
        assert_eq!(noticed_after(&mut rx).await, BUDGET);
    }
}
