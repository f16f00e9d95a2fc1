//! The lease state machine: when this process may call itself leader.
//!
//! Rules it enforces:
//! - a grant makes this replica leader until `sent_at + ttl - margin`, where
//!   `sent_at` was read *before* the statement went out;
//! - "am I leader" is computed from that deadline at the instant asked;
//! - a refusal (someone else holds the row, or the row is gone) ends
//!   leadership at once; a failed attempt does not, but is retried at once and
//!   then with a backoff capped at one heartbeat, while the deadline allows;
//! - followers attempt when the holder's lease ends by the database's answer,
//!   on a release notification, and at least once per heartbeat;
//! - a replica that stepped down on purpose (a release request, an unhealthy
//!   app) competes again, if at all, as a new instance: its release statement
//!   may still be in flight, and must never free a later lease of its own
//!   (that replica would lead on a row the database calls free). It does not
//!   attempt until its hold ends, nor at all while its app is unhealthy;
//! - a follower told to yield (see `spread`) attempts a free or expiring row
//!   one heartbeat late, so that a replica below its share takes it first,
//!   and still takes it if nobody does; a release notice is not put off (the
//!   release names who may take the row first, and it may be this replica);
//! - a draining replica (released as a whole, with a hold) comes three
//!   heartbeats late to a free row it does not lead: after any replica that
//!   is to take it (a spread hand-over's holds off two heartbeats), yet an
//!   election nobody else takes is not left leaderless for the whole hold;
//! - a replica that may not ask for a row whose successor is about to take
//!   it (it has just released it, or comes late) looks at it instead, with
//!   reads that take nothing, so it names the new leader as soon as the
//!   others do;
//! - a named successor that would not take the row within its window
//!   (held off it, draining) gives its turn up, so the others need not
//!   wait the window out ([`Engine::gives_turn_up`]).

use std::sync::Arc;
use std::time::Duration;

use crate::time::{BootTime, Timing};

/// What the database reported about the row when it refused an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The holder's configured `id`, `None` when the row is free.
    pub holder: Option<String>,
    /// The holder's instance id, `None` when the row is free.
    pub instance: Option<String>,
    /// The row's fencing token.
    pub token: i64,
    /// What is left of the holder's lease by the database's clock (negative
    /// when it has already expired).
    pub remaining_us: i64,
    /// Where the holder's app can be reached (its `advertise`), `None` when
    /// it set none.
    pub address: Option<String>,
}

/// The database's answer to one acquire-or-renew attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// This instance holds the lease; `token` is its fencing token.
    Granted { token: i64 },
    /// Someone else holds it (or it is free but still blocked).
    Refused(Observed),
    /// The row did not exist; the store created it, free and blocked for one
    /// ttl by the database's clock.
    Created,
}

/// Why leadership ended; the names are the `reason` field of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossReason {
    /// The local deadline passed without a successful renewal in time.
    Deadline,
    /// The deadline passed while renewals were failing.
    RenewFailed,
    /// The database says another instance holds the lease.
    Taken,
    /// The database says nobody holds it (released, or the row vanished).
    Released,
    /// This process is shutting down.
    Shutdown,
    /// The database's lease ran out before the local deadline (its clock ran
    /// ahead) and this replica took the row again under a new token: the old
    /// term ended, a new one began.
    Lapsed,
}

impl LossReason {
    /// The value logged as `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::Deadline => "deadline",
            LossReason::RenewFailed => "renew_failed",
            LossReason::Taken => "taken",
            LossReason::Released => "released",
            LossReason::Shutdown => "shutdown",
            LossReason::Lapsed => "lapsed",
        }
    }
}

/// Something the adapters must act on (log, count, write or remove the flag
/// file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// This replica became leader.
    Acquired { token: i64 },
    /// This replica's lease was renewed; its local deadline moved.
    Renewed { token: i64 },
    /// This replica stopped being leader; `deadline` was the local
    /// deadline of the lease that ended (for the logs).
    Lost {
        token: i64,
        reason: LossReason,
        deadline: BootTime,
    },
    /// The row carries this replica's `id` with another instance: two
    /// processes were started with the same `id`.
    DuplicateId { instance: Option<String> },
}

/// A snapshot for `/leader`, `/` and the metrics, computed at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub is_leader: bool,
    /// The last known holder; never this replica's own id unless it leads.
    pub leader: Option<String>,
    /// The fencing token of `leader`.
    pub token: Option<i64>,
    /// Where `leader`'s app can be reached, as it advertised it: a hint to
    /// reach the leader, not a proof that it leads.
    pub leader_address: Option<String>,
    /// The local deadline when leading, else the holder's remaining lease as
    /// last observed.
    pub lease_remaining: Option<Duration>,
    /// Whether this replica competes, else why not (see [`crate::standing::Standing`]).
    pub standing: crate::standing::Standing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Follower,
    Leader { token: i64, deadline: BootTime },
    ShutDown,
}

/// What the last answer said about someone else holding the row.
#[derive(Debug, Clone)]
struct OtherHolder {
    holder: String,
    token: i64,
    address: Option<String>,
    /// When the holder's lease ends, by the database's answer, on our clock.
    until: BootTime,
    /// Another process holds it under this replica's id (see
    /// [`Engine::duplicate_held`]).
    duplicate: bool,
}

/// Who this replica is, the same in all its elections: their engines share
/// one (64 bytes an engine otherwise, in each of thousands of elections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    timing: Timing,
    id: Arc<str>,
    /// This replica's own `advertise`: reported while it leads, and
    /// written to the row with its takeovers.
    address: Option<Arc<str>>,
}

impl Replica {
    pub fn new(timing: Timing, id: impl Into<Arc<str>>, address: Option<&str>) -> Self {
        Self {
            timing,
            id: id.into(),
            address: address.map(Arc::from),
        }
    }

    pub fn id(&self) -> &Arc<str> {
        &self.id
    }
}

/// The election state of one replica. See the module docs for its rules.
#[derive(Debug)]
pub struct Engine {
    /// Shared by the daemon's elections: one copy, not one each.
    replica: Arc<Replica>,
    /// Shared with the requests that carry it (one per attempt and
    /// renewal): a count, not a copy each.
    instance: Arc<str>,
    role: Role,
    other: Option<OtherHolder>,
    next_attempt: BootTime,
    /// Failed attempts in a row, for the backoff.
    failures: u32,
    /// Refusals in a row that showed an expired row (lost races, or a row
    /// another transaction keeps locked), for their backoff.
    expired_refusals: u32,
    /// A release notice came and no holder has been seen since: while the
    /// row waits for a named successor, watch for its take (see
    /// [`TAKE_WATCH`]). Not at a new row's first block, which no release
    /// precedes.
    watching_take: bool,
    /// Until when this replica looks at the row, read-only, every
    /// [`TAKE_WATCH`] (see [`Engine::look_due`]); `None`: no looks.
    look_until: Option<BootTime>,
    /// When the next look is due, while looking.
    next_look: BootTime,
    /// Until when looks come every [`TAKE_WATCH`] (a heartbeat from a
    /// release); after that, at a poll's pace.
    look_fast_until: BootTime,
    /// No attempt before this instant (after a release on request).
    hold_until: Option<BootTime>,
    /// When the last attempt that a release notice asked for was due (see
    /// [`NOTICE_EVERY`]).
    noticed_at: Option<BootTime>,
    /// Whether this replica competes (its app is healthy).
    competing: bool,
    /// Whether a free row is left to others for a heartbeat (see `spread`).
    yielding: bool,
    /// Until when this replica drains (see [`Engine::drain`]).
    draining_until: Option<BootTime>,
    /// Instances this replica used before (see [`Engine::release`]): a row
    /// that carries one of them is ours, not a duplicate id's. A boxed
    /// slice, made anew at each (rare) release: 8 bytes less than a `Vec`
    /// in each of thousands of elections.
    past_instances: Box<[Arc<str>]>,
    /// The lease is renewed by the daemon's renewal waves, not by this
    /// election's own attempts (see [`Engine::on_wave_renewal`]); only
    /// meaningful while leading.
    in_waves: bool,
}

/// How many past instances are remembered; older ones have long expired.
const PAST_INSTANCES: usize = 8;

/// A step-down on purpose: the loss to report, and the instance whose lease
/// the caller must now release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepDown {
    pub event: Event,
    pub released_instance: String,
}

/// Retry a refused attempt whose holder had already expired (a race with a
/// concurrent taker) after this long, rather than spinning; doubling while it
/// repeats (the row may be locked by someone else for a while), up to a
/// heartbeat.
const RACE_RETRY: Duration = Duration::from_millis(10);
/// Arrive this much after the holder's expiry so that a database clock running
/// a hair slower than ours still finds it expired.
const EXPIRY_SLACK: Duration = Duration::from_millis(1);
/// While a released row waits for the successor its release named, a
/// follower asks again this often, so that it names the new leader within
/// this of the take, not a heartbeat later. Only after a release notice,
/// during the handover's window, and each ask is a refused attempt: it
/// writes and locks nothing.
pub const TAKE_WATCH: Duration = Duration::from_millis(10);
/// Release notices ask for an attempt at most this often. Anyone who may
/// connect can send one (PostgreSQL's `NOTIFY` needs no right), as often as
/// it likes: an attempt for each would have every follower read the table
/// at the sender's pace (an attempt is three or four index reads). A real
/// release within this of another notice (rare, but for such a flood) is
/// answered at most this late.
pub const NOTICE_EVERY: Duration = Duration::from_millis(50);
/// Backoff after the second consecutive failure; doubles up to a heartbeat.
const FIRST_BACKOFF: Duration = Duration::from_millis(25);
/// How many heartbeats late a draining replica comes to a free row: later
/// than a yielding one (one) and than a spread hand-over's own hold (two).
const DRAIN_LATE_HEARTBEATS: u32 = 3;

impl Engine {
    /// A follower that attempts at once.
    pub fn new(
        timing: Timing,
        id: impl Into<Arc<str>>,
        instance: impl Into<Arc<str>>,
        now: BootTime,
    ) -> Self {
        Self::of(Arc::new(Replica::new(timing, id, None)), instance, now)
    }

    /// [`Engine::new`] for `replica`, shared with its other elections.
    pub fn of(replica: Arc<Replica>, instance: impl Into<Arc<str>>, now: BootTime) -> Self {
        Self {
            replica,
            instance: instance.into(),
            role: Role::Follower,
            other: None,
            next_attempt: now,
            failures: 0,
            expired_refusals: 0,
            watching_take: false,
            look_until: None,
            next_look: now,
            look_fast_until: now,
            hold_until: None,
            noticed_at: None,
            competing: true,
            yielding: false,
            draining_until: None,
            past_instances: Box::default(),
            in_waves: false,
        }
    }

    /// Reports `address` as this replica's own while it leads.
    pub fn with_address(mut self, address: Option<&str>) -> Self {
        Arc::make_mut(&mut self.replica).address = address.map(Arc::from);
        self
    }

    /// This replica's own `advertise`, for its attempts to write.
    pub fn address(&self) -> Option<&Arc<str>> {
        self.replica.address.as_ref()
    }

    pub fn timing(&self) -> &Timing {
        &self.replica.timing
    }

    pub fn id(&self) -> &str {
        &self.replica.id
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// [`Engine::instance`], for a request to keep without copying it.
    pub fn instance_shared(&self) -> &Arc<str> {
        &self.instance
    }

    /// Whether this replica leads at `now`: before its local deadline and not
    /// shut down. Computed, never stored.
    pub fn is_leader(&self, now: BootTime) -> bool {
        matches!(self.role, Role::Leader { deadline, .. } if now < deadline)
    }

    /// The fencing token and deadline while leading at `now`.
    pub fn lease(&self, now: BootTime) -> Option<(i64, BootTime)> {
        match self.role {
            Role::Leader { token, deadline } if now < deadline => Some((token, deadline)),
            _ => None,
        }
    }

    /// Another replica's id while its lease, by the last answer, is live at
    /// `now` or ended less than a heartbeat ago (never this replica's own
    /// id, as in [`Engine::view`]). The spread counts what each replica
    /// leads from these: one per election, without reading the table. The
    /// heartbeat's grace is the follower's next answer, due a heartbeat
    /// after the last: a lease renewed on time shows 0.8–1.2 s left (by
    /// default), so without it a sighting lapsed for part of most
    /// heartbeats, and longer with answers delayed under load. A replica
    /// then counted half of what the others led, and elections went back
    /// and forth between two replicas each above their share.
    pub fn other_holder(&self, now: BootTime) -> Option<&str> {
        if self.is_leader(now) {
            return None;
        }
        let grace = self.replica.timing.heartbeat();
        self.other
            .as_ref()
            .filter(|o| now < o.until + grace && *o.holder != *self.replica.id)
            .map(|o| o.holder.as_str())
    }

    /// Whether another process held the lease under this replica's id, live
    /// at `now`, at the last answer: two replicas were given one id. A
    /// restart within its old leases sees its former self for at most a
    /// lease; a second process with the id, for as long as it holds.
    pub fn duplicate_held(&self, now: BootTime) -> bool {
        self.other
            .as_ref()
            .is_some_and(|o| o.duplicate && now < o.until)
    }

    /// The snapshot served over HTTP at `now`.
    pub fn view(&self, now: BootTime) -> View {
        let (is_leader, leader, token, until) = self.reported(now);
        let leader_address = if is_leader {
            self.replica.address.as_deref().map(str::to_owned)
        } else {
            leader
                .and(self.other.as_ref())
                .and_then(|o| o.address.clone())
        };
        View {
            is_leader,
            leader: leader.map(str::to_owned),
            token,
            leader_address,
            lease_remaining: until.map(|until| until.saturating_since(now)),
            standing: self.standing(now),
        }
    }

    /// The parts of [`Engine::view`] whose changes are announced (leading,
    /// the leader, the token), borrowed: the loop compares them at every
    /// turn, and a `View` costs an allocation.
    pub fn leadership(&self, now: BootTime) -> (bool, Option<&str>, Option<i64>) {
        let (is_leader, leader, token, _) = self.reported(now);
        (is_leader, leader, token)
    }

    /// Whether this replica leads at `now`, who leads, with which token, and
    /// until when (this replica's local deadline, or the other holder's
    /// lease as last seen).
    fn reported(&self, now: BootTime) -> (bool, Option<&str>, Option<i64>, Option<BootTime>) {
        if let Some((token, deadline)) = self.lease(now) {
            return (true, Some(&self.replica.id), Some(token), Some(deadline));
        }
        match &self.other {
            // Never name ourselves while not leading: the row may carry our id
            // from another process, or our own lapsed lease. Nor a holder
            // we have no fresh word of (see `known_until`).
            Some(o) if *o.holder != *self.replica.id && now < self.known_until(o) => {
                (false, Some(&o.holder), Some(o.token), Some(o.until))
            }
            _ => (false, None, None, None),
        }
    }

    /// Until when `o`, the holder last seen, is still named. A replica that
    /// asks keeps naming it until a renew interval past its next ask (or
    /// past the lease's end, if later), time enough for the answer: the
    /// name does not blink at each end of a lease the holder renews, even
    /// for a replica that asks late on purpose (yielding, draining). One
    /// that does not ask (its app unhealthy), or whose asks fail (the
    /// database out of reach), names it until a renew interval past the
    /// end of the lease it saw, not for as long as that lasts.
    fn known_until(&self, o: &OtherHolder) -> BootTime {
        // Held off asking (a release's hold, up to an hour) until past the
        // end of the lease seen: it cannot learn of a renewal in time, and
        // names the holder only as long as one that does not ask (its
        // looks, at a poll's pace, keep the name fresh meanwhile). A
        // replica that only comes late (draining, yielding) still asks
        // within a few heartbeats, and keeps the name until then.
        let held_past = self.hold_until.is_some_and(|h| h > o.until);
        if self.competing && self.failures == 0 && !held_past {
            // An ask may take up to its bound, a heartbeat, to be answered.
            self.next_attempt.max(o.until) + self.replica.timing.heartbeat()
        } else {
            o.until + self.replica.timing.renew_every()
        }
    }

    /// When the loop must wake up next: the next attempt (not before a hold
    /// ends), or the local deadline if that comes first (to step down on
    /// time). A replica that does not compete wakes once per heartbeat.
    pub fn next_wakeup(&self) -> BootTime {
        let attempt = match self.hold_until {
            Some(h) => self.next_attempt.max(h),
            None => self.next_attempt,
        };
        match self.role {
            // Renewed by the waves: only the deadline is this loop's.
            Role::Leader { deadline, .. } if self.in_waves => deadline,
            Role::Leader { deadline, .. } => attempt.min(deadline),
            _ if self.look_until.is_some() => attempt.min(self.next_look),
            _ => attempt,
        }
    }

    /// When the holder named at `now` stops being named (see
    /// `known_until`), if it is named: the loop wakes then to announce it
    /// to watchers, as `/leader` shows it at once.
    pub fn naming_until(&self, now: BootTime) -> Option<BootTime> {
        let (false, Some(_), _, _) = self.reported(now) else {
            return None;
        };
        self.other.as_ref().map(|o| self.known_until(o))
    }

    /// Whether a look is due at `now`: a read of the row that takes
    /// nothing, every [`TAKE_WATCH`] for a heartbeat, by a replica that may
    /// not ask for the row now (it has just released it, or comes late:
    /// yielding, draining) yet should name the successor that takes it as
    /// soon as the others do. Ends at the first holder seen, unless this
    /// replica will not ask before that holder's lease ends (see
    /// [`Engine::on_look`]).
    pub fn look_due(&self, now: BootTime) -> bool {
        self.role == Role::Follower
            && self.look_until.is_some_and(|until| now < until)
            && now >= self.next_look
    }

    /// Feeds a look's answer, read at `received_at`: the row (`None` when
    /// there is none). A live holder is named from now on, and the looks
    /// end, unless this replica will not ask before that holder's lease
    /// ends (held, draining): then it goes on looking at a poll's pace
    /// (when the lease seen ends, at least once a heartbeat) until it asks
    /// again, and names the holder only while it knows the lease. Else the
    /// next look comes in [`TAKE_WATCH`], if still within their heartbeat.
    pub fn on_look(&mut self, received_at: BootTime, seen: Option<Observed>) {
        if let Some(seen) = seen.filter(|s| s.remaining_us > 0) {
            if let Some(holder) = seen.holder {
                let remaining = Duration::from_micros(seen.remaining_us.unsigned_abs());
                let until = received_at + remaining;
                // A look tells no instance: what the attempts told of this
                // holder stands.
                let duplicate = self
                    .other
                    .as_ref()
                    .is_some_and(|o| o.duplicate && o.holder == holder);
                self.other = Some(OtherHolder {
                    holder,
                    token: seen.token,
                    address: seen.address,
                    until,
                    duplicate,
                });
                let asks_at = self.next_wakeup_to_ask();
                if asks_at > until {
                    self.look_until = Some(asks_at);
                    self.next_look =
                        received_at + remaining.min(self.replica.timing.heartbeat()) + EXPIRY_SLACK;
                } else {
                    self.look_until = None;
                }
                return;
            }
        }
        // Nobody holds the row now: a holder named before is not named
        // any more (an attempt's refusal does the same).
        self.other = None;
        let pace = if received_at < self.look_fast_until {
            TAKE_WATCH
        } else {
            self.replica.timing.heartbeat()
        };
        self.next_look = received_at + pace;
        if self.look_until.is_some_and(|until| self.next_look >= until) {
            self.look_until = None;
        }
    }

    /// Another election's look is being read (the daemon's looks go one at
    /// a time): this one is tried again in [`TAKE_WATCH`], its window
    /// unchanged.
    pub fn look_later(&mut self, now: BootTime) {
        self.next_look = now + TAKE_WATCH;
    }

    /// A look failed (no connection, a timeout): no more looks; the next
    /// attempt, as scheduled, says who leads.
    pub fn on_look_failed(&mut self) {
        self.look_until = None;
    }

    /// When this replica next asks, its hold included.
    fn next_wakeup_to_ask(&self) -> BootTime {
        match self.hold_until {
            Some(h) => self.next_attempt.max(h),
            None => self.next_attempt,
        }
    }

    /// Looks for a heartbeat from `now` (see [`Engine::look_due`]): also
    /// after a release that took a while (under `exec`, waiting for the
    /// command to stop), so the looks are not spent before the row is free.
    pub fn look_for_take(&mut self, now: BootTime) {
        self.look_fast_until = now + self.replica.timing.heartbeat();
        self.look_until = Some(self.look_fast_until);
        self.next_look = now + TAKE_WATCH;
    }

    /// One look at `at`, unless one is due or under way at `now`: not a
    /// take watch, which reads the row every [`TAKE_WATCH`] for a heartbeat
    /// at each notice. At most one a notice slot (`at`, see
    /// [`NOTICE_EVERY`]), as a follower's attempts: notices come by the
    /// hundred when every app fails at once, or from anyone who may
    /// connect (PostgreSQL's `NOTIFY`).
    fn look_once(&mut self, now: BootTime, at: BootTime) {
        // Not put off by the next notice: in a flood it would never come.
        if self.look_until.is_some_and(|until| now < until) {
            return;
        }
        self.next_look = at;
        self.look_until = Some(at + TAKE_WATCH);
    }

    /// Whether an attempt is due at `now` (a lease the waves renew is
    /// never due here: see [`Engine::on_wave_renewal`]).
    pub fn attempt_due(&self, now: BootTime) -> bool {
        self.role != Role::ShutDown
            && !self.renewed_in_waves()
            && self.competing
            && now >= self.next_attempt
            && self.hold_until.is_none_or(|h| now >= h)
    }

    /// Whether this replica competes (its app passes its health check).
    pub fn competing(&self) -> bool {
        self.competing
    }

    /// Whether this replica competes at `now`, else why not, and what is
    /// left of its hold or drain (see [`crate::standing::Standing`]).
    pub fn standing(&self, now: BootTime) -> crate::standing::Standing {
        crate::standing::standing(
            now,
            self.role == Role::ShutDown,
            self.competing,
            self.hold_until,
            self.draining_until,
        )
    }

    /// Ends a hold and a drain at once (`leaderd resume`): the replica asks
    /// at its next turn. Whether there was one to end at `now`.
    pub fn resume(&mut self, now: BootTime) -> bool {
        let ended = self.hold_until.is_some_and(|h| now < h) || self.draining(now);
        self.hold_until = None;
        self.draining_until = None;
        if ended {
            self.next_attempt = self.next_attempt.min(now);
        }
        ended
    }

    /// Steps down on purpose and holds off attempting for `hold`, so that
    /// another replica takes over; from now on this replica is
    /// `fresh_instance` (see the module docs). `None` (and no hold) when it
    /// does not lead at `now`.
    pub fn release(
        &mut self,
        now: BootTime,
        hold: Duration,
        fresh_instance: impl Into<Arc<str>>,
    ) -> Option<StepDown> {
        let Role::Leader { token, deadline } = self.role else {
            return None;
        };
        if now >= deadline {
            return None;
        }
        self.role = Role::Follower;
        self.hold(now, hold);
        // Its successor takes within milliseconds: named at once here too.
        self.look_for_take(now);
        let released_instance = std::mem::replace(&mut self.instance, fresh_instance.into());
        let kept = self.past_instances.len().min(PAST_INSTANCES - 1);
        let older = &self.past_instances[self.past_instances.len() - kept..];
        self.past_instances = older
            .iter()
            .cloned()
            .chain([released_instance.clone()])
            .collect();
        Some(StepDown {
            event: Event::Lost {
                token,
                reason: LossReason::Released,
                deadline,
            },
            released_instance: released_instance.to_string(),
        })
    }

    /// Does not attempt for `hold` from `now`; never shortens a hold already
    /// asked for. A release that took a while (under `exec`, waiting for
    /// the command) re-arms its hold once the row is free, so that the
    /// others, not this replica, take it.
    pub fn hold(&mut self, now: BootTime, hold: Duration) {
        let until = self.hold_until.map_or(now + hold, |h| h.max(now + hold));
        self.hold_until = Some(until);
        self.next_attempt = self.next_attempt.max(until);
    }

    /// The app's health changed. An unhealthy app's replica steps down (as
    /// [`Engine::release`] with no hold) and stops competing until the app
    /// passes again, when it attempts at once.
    pub fn set_competing(
        &mut self,
        now: BootTime,
        competing: bool,
        fresh_instance: impl Into<Arc<str>>,
    ) -> Option<StepDown> {
        if self.competing == competing {
            return None;
        }
        self.competing = competing;
        if competing {
            self.next_attempt = self.next_attempt.min(now);
            return None;
        }
        // No hold of its own: it competes again when the app passes (an
        // operator's hold, if any, still applies).
        self.release(now, Duration::ZERO, fresh_instance)
    }

    /// Feeds the answer to a renewal of the lease of token `held` that the
    /// daemon sent among its others (a renewal wave: one statement a renew
    /// interval for all the leases a daemon holds, so that a leader of
    /// thousands of elections is not woken for each). While the lease
    /// lasts after a grant, the waves renew it, and this election's own
    /// attempts wait (see [`Engine::attempt_due`]) until a wave fails it
    /// ([`Engine::on_wave_failure`]) or the lease ends.
    ///
    /// A grant renews only the lease it was sent for, live at
    /// `received_at`: the wave runs beside the election's loop, which may
    /// have stepped down at the deadline meanwhile and then been told not
    /// to lead (an unhealthy app, a release that found nothing to release).
    /// Any other grant (that lease ended, or a new token: it had lapsed in
    /// the database) only makes this election's own attempt due at once,
    /// which heeds all of that and reports the new term itself. A refusal
    /// ends the lease as [`Engine::on_attempt`] does.
    pub fn on_wave_renewal(
        &mut self,
        sent_at: BootTime,
        received_at: BootTime,
        held: i64,
        answer: Attempt,
    ) -> Vec<Event> {
        if self.role == Role::ShutDown {
            return Vec::new();
        }
        let live = self
            .lease(received_at)
            .is_some_and(|(token, _)| token == held);
        match answer {
            Attempt::Granted { token } if live && token == held => {
                let events = self.on_attempt(sent_at, received_at, answer);
                self.in_waves = true;
                events
            }
            Attempt::Granted { .. } => {
                self.in_waves = false;
                self.next_attempt = self.next_attempt.min(received_at);
                Vec::new()
            }
            refused => self.on_attempt(sent_at, received_at, refused),
        }
    }

    /// A wave's renewal of this lease failed at `now` (or found no
    /// connection): as [`Engine::on_failure`], and this election's own
    /// attempts renew it again, at once.
    pub fn on_wave_failure(&mut self, now: BootTime) -> Option<Event> {
        self.in_waves = false;
        self.on_failure(now)
    }

    /// Whether the lease held is renewed by the waves, not by this
    /// election's own attempts.
    pub fn renewed_in_waves(&self) -> bool {
        self.in_waves && matches!(self.role, Role::Leader { .. })
    }

    /// Whether to leave free rows to others for a heartbeat (see `spread`).
    /// Ending a yield attempts at once: what was put off is due.
    pub fn set_yielding(&mut self, now: BootTime, yielding: bool) {
        if self.yielding && !yielding {
            self.next_attempt = self.next_attempt.min(now);
        }
        self.yielding = yielding;
        self.stop_watching_take(now);
    }

    /// A replica that now comes late (yielding, draining) stops watching
    /// for a successor's take: its next ask, due within [`TAKE_WATCH`],
    /// could land just past the window and be granted the row it leaves
    /// to others. It comes late instead, as after any answer.
    fn stop_watching_take(&mut self, now: BootTime) {
        let late = self.yield_delay(now);
        if self.watching_take && !late.is_zero() {
            self.watching_take = false;
            self.next_attempt = self.next_attempt.max(now + late);
            self.look_for_take(now);
        }
    }

    /// The whole replica drains until `now + hold` (a release with a hold
    /// that names no election, e.g. a `preStop` hook): a row it does not
    /// lead is attempted [`DRAIN_LATE_HEARTBEATS`] late when it will be
    /// free by then, so that the others take it first and a spread's
    /// hand-over never lands here, while an election nobody else takes
    /// still gets a leader. Never shortens a drain already asked for.
    pub fn drain(&mut self, now: BootTime, hold: Duration) {
        let until = now + hold;
        self.draining_until = Some(self.draining_until.map_or(until, |d| d.max(until)));
        // Polls go on as scheduled (a held row is only read): the drained
        // replica keeps knowing who leads; only free rows wait.
        self.stop_watching_take(now);
    }

    /// Whether this replica drains at `now` (see [`Engine::drain`]): it
    /// must not take a row released to it as a successor either (a release
    /// may have named it from a look taken just before it began to drain).
    pub fn draining(&self, now: BootTime) -> bool {
        self.draining_until.is_some_and(|until| now < until)
    }

    /// Whether this replica, at `now` the named successor of its free row
    /// with `window_left` of the window only it may take, gives that turn
    /// up: it would not take the row before the window ends (held past it,
    /// draining, its app failing), and every other replica would wait the
    /// window out for nothing. A replica held off one of several
    /// elections keeps its presence for the others, so a release of that
    /// one may name it.
    pub fn gives_turn_up(&self, now: BootTime, window_left: Duration) -> bool {
        self.role == Role::Follower
            && (!self.competing
                || self.draining(now)
                || self.hold_until.is_some_and(|h| h >= now + window_left))
    }

    /// How much later than it otherwise would a follower attempts, at
    /// `now`, a row that will be free by then.
    fn yield_delay(&self, now: BootTime) -> Duration {
        if self.draining(now) {
            self.replica.timing.heartbeat() * DRAIN_LATE_HEARTBEATS
        } else if self.yielding {
            self.replica.timing.heartbeat()
        } else {
            Duration::ZERO
        }
    }

    /// Client-side timeout for an attempt sent at `now`: for a leader's
    /// renewal, the local lease it would grant (counted from `now`, so an
    /// answer later than that could not be used anyway), else one heartbeat.
    ///
    /// A renewal is not cut when the lease in force runs out meanwhile (the
    /// caller steps down then, by [`Engine::poll`]): on a busy database, a
    /// statement cut early loses its place in the queue and is sent again
    /// behind everyone, and the lease is lost for good. Safety does not
    /// change: a grant's deadline still counts from before its send.
    pub fn attempt_timeout(&self, now: BootTime) -> Duration {
        match self.lease(now) {
            Some(_) => self.replica.timing.local_lease(),
            None => self.replica.timing.heartbeat(),
        }
    }

    /// Steps down if the local deadline passed by `now`.
    pub fn poll(&mut self, now: BootTime) -> Option<Event> {
        if self.look_until.is_some_and(|until| now >= until) {
            self.look_until = None;
        }
        if !self.competing && self.next_attempt <= now {
            // Not competing: nothing to attempt; look again in a heartbeat.
            self.next_attempt = now + self.replica.timing.heartbeat();
        }
        match self.role {
            Role::Leader { token, deadline } if now >= deadline => {
                self.role = Role::Follower;
                self.next_attempt = self.next_attempt.min(now);
                let reason = if self.failures > 0 {
                    LossReason::RenewFailed
                } else {
                    LossReason::Deadline
                };
                Some(Event::Lost {
                    token,
                    reason,
                    deadline,
                })
            }
            _ => None,
        }
    }

    /// A release notification for this election arrived: attempt at once,
    /// yielding or not. A graceful release names its successor in the row,
    /// and only that replica can take it for a window: a yield here would
    /// cost a named successor that yields (its view of the shares differs
    /// from the releaser's) the whole window. Any other replica is refused,
    /// writing nothing, and comes after the window, late if yielding (see
    /// [`Engine::on_attempt`]). A draining replica still comes late: its
    /// attempts name no daemon, so it is never the successor.
    pub fn on_release_notice(&mut self, now: BootTime) {
        if !self.is_leader(now) {
            let late = if self.draining(now) {
                self.yield_delay(now)
            } else {
                Duration::ZERO
            };
            // One attempt per NOTICE_EVERY: a notice inside the current
            // slot is served by the attempt at its end, already asked for
            // (the mark is never more than one slot ahead: a flood cannot
            // put wake-ups off past its own end).
            let due = match self.noticed_at {
                Some(mark) if now < mark => mark,
                Some(mark) if now < mark + NOTICE_EVERY => mark + NOTICE_EVERY,
                _ => now,
            };
            self.noticed_at = Some(due);
            self.next_attempt = self.next_attempt.min(due + late);
            self.watching_take = true;
            // Held (it released with a hold) or late: it may not ask, so
            // it looks for the successor's take (a look a TAKE_WATCH at
            // most, however many notices come).
            if !late.is_zero() || self.hold_until.is_some_and(|h| h > now) {
                self.look_for_take(now);
            } else if !self.competing {
                // Out of the running (its app fails): one look, to give up
                // a turn the release named it to from a look taken before
                // it stopped competing (see `gives_turn_up`).
                self.look_once(now, due);
            }
        }
    }

    /// Feeds the answer to an attempt sent at `sent_at` (read before taking a
    /// connection) and received at `received_at`.
    pub fn on_attempt(
        &mut self,
        sent_at: BootTime,
        received_at: BootTime,
        answer: Attempt,
    ) -> Vec<Event> {
        if self.role == Role::ShutDown {
            return Vec::new();
        }
        // This election's own answer: its own attempts renew from here,
        // until a wave takes the lease up again.
        self.in_waves = false;
        let mut events = Vec::new();
        // A deadline that passed while the statement was in flight ends the
        // old lease first, whatever the answer says.
        events.extend(self.poll(received_at));
        self.failures = 0;
        let expired_refusals = std::mem::take(&mut self.expired_refusals);
        let watching_take = std::mem::take(&mut self.watching_take);
        match answer {
            Attempt::Granted { token } => {
                let deadline = sent_at + self.replica.timing.local_lease();
                self.other = None;
                self.look_until = None;
                self.next_attempt = sent_at + self.replica.timing.renew_every();
                if received_at >= deadline {
                    // Too late to use: stay follower and try again now. The row
                    // is still ours in the database, so the next grant keeps
                    // the token.
                    self.next_attempt = received_at;
                    return events;
                }
                let was = self.role;
                self.role = Role::Leader { token, deadline };
                match was {
                    Role::Leader { token: old, .. } if old == token => {
                        events.push(Event::Renewed { token });
                    }
                    Role::Leader {
                        token: old,
                        deadline: old_deadline,
                    } => {
                        // The database gave us a new token: our old lease had
                        // lapsed there. Report the change of term.
                        events.push(Event::Lost {
                            token: old,
                            reason: LossReason::Lapsed,
                            deadline: old_deadline,
                        });
                        events.push(Event::Acquired { token });
                    }
                    _ => events.push(Event::Acquired { token }),
                }
            }
            Attempt::Refused(seen) => {
                if let Role::Leader { token, deadline } = self.role {
                    self.role = Role::Follower;
                    let reason = if seen.holder.is_some() {
                        LossReason::Taken
                    } else {
                        LossReason::Released
                    };
                    events.push(Event::Lost {
                        token,
                        reason,
                        deadline,
                    });
                }
                let ours = |i: &String| {
                    **i == *self.instance || self.past_instances.iter().any(|p| **p == **i)
                };
                let duplicate = seen.holder.as_deref() == Some(&*self.replica.id)
                    && !seen.instance.as_ref().is_some_and(ours);
                if duplicate {
                    events.push(Event::DuplicateId {
                        instance: seen.instance.clone(),
                    });
                }
                let remaining = Duration::from_micros(seen.remaining_us.max(0).unsigned_abs());
                let wait = if seen.remaining_us <= 0 {
                    self.expired_refusals = expired_refusals.saturating_add(1);
                    RACE_RETRY.saturating_mul(1 << expired_refusals.min(16))
                } else {
                    remaining + EXPIRY_SLACK
                };
                // Free by the next attempt (a heartbeat at most from now,
                // and the row frees within `remaining`: not `wait`, whose
                // slack would let a row freed just under a heartbeat away,
                // as a successor's window leaves it, be taken on time): a
                // yielding or draining replica comes late.
                let late = if remaining <= self.replica.timing.heartbeat() {
                    self.yield_delay(received_at)
                } else {
                    Duration::ZERO
                };
                // Released to a named successor (free, blocked): watch for
                // its take, then come as before once the window ends.
                // Not a replica that comes late (yielding, draining): an ask
                // that lands just after the window would be granted the row
                // it leaves to others; it looks instead (reads that take
                // nothing).
                let waits_for_take = watching_take && seen.holder.is_none() && wait > TAKE_WATCH;
                let watch = waits_for_take && late.is_zero();
                self.watching_take = watch;
                if waits_for_take && !watch {
                    self.look_for_take(received_at);
                } else if seen.holder.is_some() {
                    self.look_until = None;
                }
                self.next_attempt = if watch {
                    received_at + TAKE_WATCH
                } else {
                    received_at + wait.min(self.replica.timing.heartbeat()) + late
                };
                self.other = match seen.holder {
                    Some(holder) if seen.remaining_us > 0 => Some(OtherHolder {
                        holder,
                        token: seen.token,
                        address: seen.address,
                        until: received_at + remaining,
                        duplicate,
                    }),
                    _ => None,
                };
            }
            Attempt::Created => {
                if let Role::Leader { token, deadline } = self.role {
                    self.role = Role::Follower;
                    events.push(Event::Lost {
                        token,
                        reason: LossReason::Released,
                        deadline,
                    });
                }
                self.other = None;
                self.next_attempt = received_at
                    + self.timing().ttl().min(self.timing().heartbeat())
                    + self.yield_delay(received_at);
            }
        }
        events
    }

    /// An attempt failed (connection lost, timeout, SQL error). Leadership
    /// continues until the deadline; the retry is immediate the first time,
    /// then backs off, capped at one heartbeat.
    pub fn on_failure(&mut self, now: BootTime) -> Option<Event> {
        if self.role == Role::ShutDown {
            return None;
        }
        self.failures = self.failures.saturating_add(1);
        let event = self.poll(now);
        let backoff = match self.failures {
            0 | 1 => Duration::ZERO,
            n => FIRST_BACKOFF
                .saturating_mul(1 << (n - 2).min(16))
                .min(self.replica.timing.heartbeat()),
        };
        self.next_attempt = now + backoff;
        event
    }

    /// Stops claiming leadership, for good. Returns the loss to report when
    /// this replica was leading.
    pub fn shutdown(&mut self, now: BootTime) -> Option<Event> {
        let event = match self.role {
            Role::Leader { token, deadline } if now < deadline => Some(Event::Lost {
                token,
                reason: LossReason::Shutdown,
                deadline,
            }),
            _ => None,
        };
        self.role = Role::ShutDown;
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::test_times::{at, ms};

    fn engine() -> Engine {
        Engine::new(
            Timing::new(ms(1000), ms(1200)).unwrap(),
            "pod-a",
            "inst-a",
            at(0),
        )
    }

    /// Refused: the row is free, blocked for `remaining_ms` (released to a
    /// named successor).
    fn released(token: i64, remaining_ms: i64) -> Attempt {
        Attempt::Refused(Observed {
            holder: None,
            instance: None,
            token,
            remaining_us: remaining_ms * 1000,
            address: None,
        })
    }

    fn refused_at(holder: &str, token: i64, remaining_ms: i64, address: &str) -> Attempt {
        match refused(holder, token, remaining_ms) {
            Attempt::Refused(seen) => Attempt::Refused(Observed {
                address: Some(address.into()),
                ..seen
            }),
            other => other,
        }
    }

    fn refused(holder: &str, token: i64, remaining_ms: i64) -> Attempt {
        Attempt::Refused(Observed {
            holder: Some(holder.into()),
            instance: Some(format!("inst-of-{holder}")),
            token,
            remaining_us: remaining_ms * 1000,
            address: None,
        })
    }

    /// Notices sent by anyone, 500 a second for a second: a follower asks
    /// for the row at most once a NOTICE_EVERY, and the first notice still
    /// gets its attempt at once.
    #[test]
    fn a_flood_of_release_notices_asks_at_a_fixed_rate() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), refused("pod-b", 4, 800_000));
        let mut attempts = 0;
        let mut first = None;
        for ms in (10..1010).step_by(2) {
            e.on_release_notice(at(ms));
            // The loop attempts whenever one is due, answered at once.
            if e.attempt_due(at(ms)) {
                attempts += 1;
                first.get_or_insert(ms);
                e.on_attempt(at(ms), at(ms), refused("pod-b", 4, 800_000));
            }
        }
        assert_eq!(first, Some(10), "the first notice waits for nothing");
        let most = 1000 / NOTICE_EVERY.as_millis() + 1;
        assert!(
            (1..=most as usize).contains(&attempts),
            "{attempts} attempts, at most {most}"
        );
        // The flood over, a real release's notice is answered at once.
        e.on_attempt(at(1100), at(1101), refused("pod-b", 4, 800_000));
        e.on_release_notice(at(1150));
        assert!(e.attempt_due(at(1150)), "wake-ups put off after a flood");
    }

    #[test]
    fn a_follower_names_the_successor_within_a_take_watch_of_its_take() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        // b releases to c: woken, refused, the row free for c's window.
        e.on_release_notice(at(100));
        assert!(e.attempt_due(at(100)));
        e.on_attempt(at(100), at(103), released(4, 1000));
        assert_eq!(e.view(at(104)).leader, None);
        assert!(e.attempt_due(at(103) + TAKE_WATCH));
        // c took it in between: named at the next ask, then polled as usual.
        e.on_attempt(at(113), at(115), refused("pod-c", 5, 1200));
        let v = e.view(at(116));
        assert_eq!((v.leader.as_deref(), v.token), (Some("pod-c"), Some(5)));
        assert!(!e.attempt_due(at(1114)));
        assert!(e.attempt_due(at(1115)));
        // A new row's first block is not a handover: no release came, so
        // it is polled as usual.
        let mut fresh = engine();
        fresh.on_attempt(at(0), at(5), released(0, 1000));
        assert!(!fresh.attempt_due(at(5) + TAKE_WATCH));
        assert!(fresh.attempt_due(at(1006)));
    }

    /// A replica that led and released at 100 ms, held for 5 s.
    fn released_at_100() -> Engine {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 4 });
        e.release(at(100), Duration::from_secs(5), "inst-2")
            .unwrap();
        e
    }

    /// The row as a look reads it.
    fn row(attempt: Attempt) -> Option<Observed> {
        match attempt {
            Attempt::Refused(seen) => Some(seen),
            _ => None,
        }
    }

    #[test]
    fn a_releaser_looks_for_its_successors_take_and_names_it_without_asking() {
        let mut e = released_at_100();
        // Held for 5 s: no ask, but a look every take watch.
        assert!(!e.look_due(at(105)));
        assert!(e.look_due(at(100) + TAKE_WATCH));
        assert_eq!(e.next_wakeup(), at(100) + TAKE_WATCH);
        assert!(!e.attempt_due(at(110)));
        // Free, waiting for the successor: look again.
        e.on_look(at(112), row(released(4, 990)));
        assert_eq!(e.view(at(112)).leader, None);
        assert!(!e.look_due(at(121)));
        assert!(e.look_due(at(122)));
        // Taken: named, with its address, and no more looks.
        e.on_look(at(124), row(refused_at("pod-c", 5, 1200, "http://c:8080")));
        let v = e.view(at(125));
        assert_eq!(
            (v.leader.as_deref(), v.token, v.leader_address.as_deref()),
            (Some("pod-c"), Some(5), Some("http://c:8080"))
        );
        assert!(!v.is_leader);
        assert!(!e.look_due(at(140)));
        assert!(!e.attempt_due(at(140)), "the hold still holds");
        // Held past that lease: it looks again at a poll's pace, and names
        // pod-c only while it knows the lease (pod-c stops renewing).
        assert!(!e.look_due(at(1124)));
        assert!(e.look_due(at(1125)));
        e.on_look(at(1126), row(refused("pod-c", 5, 1200)));
        assert_eq!(e.view(at(2300)).leader.as_deref(), Some("pod-c"));
        assert!(e.look_due(at(2127)));
        e.on_look(at(2127), row(refused("pod-c", 5, 199)));
        e.on_look(at(2327), row(refused("pod-c", 5, -1)));
        let dead = at(2326) + e.timing().renew_every();
        assert_eq!(e.view(dead).leader, None, "named past the lease seen");
        assert!(!e.look_due(at(2327) + TAKE_WATCH), "looks at a poll's pace");
        assert!(e.look_due(at(3327)));
        // A look never names this replica, whatever the row says.
        let mut e = released_at_100();
        e.on_look(at(112), row(refused("pod-a", 5, 1200)));
        assert_eq!(e.view(at(113)).leader, None);
    }

    #[test]
    fn a_held_replica_looks_at_a_release_notice_and_drops_a_holder_it_sees_gone() {
        let mut e = released_at_100();
        e.on_look(at(112), row(refused("pod-c", 5, 1200)));
        assert_eq!(e.view(at(113)).leader.as_deref(), Some("pod-c"));
        // pod-c releases in turn: still held, this replica looks at once.
        e.on_release_notice(at(500));
        assert!(e.look_due(at(500) + TAKE_WATCH));
        assert!(!e.attempt_due(at(510)));
        // The row free: pod-c is not named any more.
        e.on_look(at(511), row(released(5, 990)));
        assert_eq!(e.view(at(512)).leader, None);
        // A turn given to another election's look: tried again in a take
        // watch, still looking.
        e.look_later(at(521));
        assert!(!e.look_due(at(530)));
        assert!(e.look_due(at(531)));
    }

    #[test]
    fn a_replica_out_of_the_running_looks_once_a_notice_slot() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        assert!(e.set_competing(at(10), false, "inst-2").is_none());
        e.on_release_notice(at(100));
        assert!(!e.attempt_due(at(100)));
        assert!(e.look_due(at(100)), "at once: the release has committed");
        e.on_look(at(101), row(released(5, 990)));
        assert!(!e.look_due(at(101) + TAKE_WATCH), "one look, not a watch");
        // A flood of notices: one look a notice slot at most.
        let mut looks = 0;
        let mut now = at(102);
        while now < at(102) + NOTICE_EVERY * 10 {
            e.on_release_notice(now);
            if e.look_due(now) {
                e.on_look(now, row(released(5, 990)));
                looks += 1;
            }
            now = now + ms(1);
        }
        assert!(
            (9..=10).contains(&looks),
            "{looks} looks in 10 notice slots"
        );
        // A holder seen: named, and no more looks (it asks nothing).
        e.on_release_notice(at(5000));
        e.on_look(at(5001), row(refused("pod-c", 6, 1200)));
        assert_eq!(e.view(at(5002)).leader.as_deref(), Some("pod-c"));
        assert!(!e.look_due(at(5012)));
        assert!(!e.look_due(at(6000)));
        // One that competes asks instead.
        let mut asks = engine();
        asks.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        asks.on_release_notice(at(100));
        assert!(asks.attempt_due(at(100)));
        assert!(!asks.look_due(at(100) + TAKE_WATCH));
    }

    #[test]
    fn looks_last_a_heartbeat_and_end_at_a_failure_or_a_shutdown() {
        let mut e = released_at_100();
        let mut now = at(100);
        let mut looks = 0;
        while e.look_due(now + TAKE_WATCH) {
            now = now + TAKE_WATCH;
            e.on_look(now, row(released(4, 990)));
            looks += 1;
        }
        assert_eq!(looks, 99, "one every take watch for a heartbeat");
        assert!(!e.look_due(at(1100) + TAKE_WATCH));
        let mut failed = released_at_100();
        failed.on_look_failed();
        assert!(!failed.look_due(at(110)));
        let mut down = released_at_100();
        down.shutdown(at(101));
        assert!(!down.look_due(at(110)));
    }

    #[test]
    fn a_named_successor_gives_its_turn_up_only_when_it_would_not_take_it() {
        let window = ms(900);
        // Held for 5 s from 100: past any window before then.
        let held = released_at_100();
        assert!(held.gives_turn_up(at(200), window));
        assert!(
            held.gives_turn_up(at(5100) - window, window),
            "held to the window's end"
        );
        assert!(
            !held.gives_turn_up(at(5101) - window, window),
            "the hold ends within the window: it takes the row then"
        );
        assert!(!held.gives_turn_up(at(5200), window), "the hold is over");
        // A follower that asks at once takes it.
        let mut free = engine();
        free.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        assert!(!free.gives_turn_up(at(100), window));
        // Draining, or its app failing: it takes no row named to it.
        let mut drained = engine();
        drained.drain(at(50), Duration::from_secs(10));
        assert!(drained.gives_turn_up(at(100), window));
        assert!(
            !drained.gives_turn_up(at(10_050), window),
            "the drain is over"
        );
        let mut failing = engine();
        assert!(failing.set_competing(at(10), false, "inst-2").is_none());
        assert!(failing.gives_turn_up(at(100), window));
        // Leading (a stale look), or shut down: nothing to give up.
        let mut leader = engine();
        leader.on_attempt(at(0), at(5), Attempt::Granted { token: 4 });
        assert!(!leader.gives_turn_up(at(100), window));
        let mut down = released_at_100();
        down.shutdown(at(150));
        assert!(!down.gives_turn_up(at(200), window));
    }

    #[test]
    fn a_late_follower_looks_for_the_take_where_others_ask() {
        // Draining: a release notice brings a look, not an ask.
        let mut e = engine();
        e.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        e.drain(at(50), Duration::from_secs(10));
        e.on_release_notice(at(100));
        assert!(!e.attempt_due(at(100) + TAKE_WATCH));
        assert!(e.look_due(at(100) + TAKE_WATCH));
        // Yielding: asked at the notice, refused (the row waits for
        // another replica): looks, and asks only after the window, late.
        let mut y = engine();
        y.set_yielding(at(0), true);
        y.on_attempt(at(0), at(5), refused("pod-b", 4, 5000));
        y.on_release_notice(at(100));
        y.on_attempt(at(100), at(103), released(4, 990));
        assert!(!y.attempt_due(at(103) + TAKE_WATCH));
        assert!(y.look_due(at(103) + TAKE_WATCH));
        y.on_look(at(115), row(refused("pod-c", 5, 1200)));
        assert_eq!(y.view(at(116)).leader.as_deref(), Some("pod-c"));
        // Watching when the yield began: it stops asking, and looks.
        let mut w = engine();
        w.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        w.on_release_notice(at(100));
        w.on_attempt(at(100), at(103), released(4, 990));
        w.set_yielding(at(104), true);
        assert!(!w.attempt_due(at(103) + TAKE_WATCH));
        assert!(w.look_due(at(104) + TAKE_WATCH));
        // A replica that asks (not late) watches by asking, not looking.
        let mut a = engine();
        a.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        a.on_release_notice(at(100));
        a.on_attempt(at(100), at(103), released(4, 990));
        assert!(a.attempt_due(at(103) + TAKE_WATCH));
        assert!(!a.look_due(at(103) + TAKE_WATCH));
    }

    #[test]
    fn the_loop_wakes_when_a_holder_stops_being_named() {
        let mut e = engine();
        // Not asking (app unhealthy): named until a renew interval after
        // the lease seen ends.
        e.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        e.set_competing(at(10), false, "inst-2");
        let until = e.naming_until(at(10)).expect("named");
        assert_eq!(until, at(805) + e.timing().renew_every());
        assert_eq!(e.view(until).leader, None);
        assert!(e.view(at(804)).leader.is_some());
        assert_eq!(e.naming_until(until), None);
        // Leading, or naming nobody: nothing to wake for.
        let mut l = engine();
        assert_eq!(l.naming_until(at(0)), None);
        l.on_attempt(at(0), at(5), Attempt::Granted { token: 1 });
        assert_eq!(l.naming_until(at(6)), None);
    }

    #[test]
    fn a_yielding_follower_comes_a_heartbeat_late_to_a_free_row_and_still_comes() {
        let mut e = engine();
        e.set_yielding(at(0), true);
        // Held for 300 ms more: attempt at its expiry plus a heartbeat.
        e.on_attempt(at(0), at(10), refused("pod-b", 4, 300));
        assert!(!e.attempt_due(at(1310)));
        assert!(e.attempt_due(at(1311)));
        // Held for longer than a heartbeat: poll as usual, not late.
        e.on_attempt(at(1311), at(1320), refused("pod-b", 4, 5000));
        assert!(e.attempt_due(at(2320)));
        // Released: a notice brings the attempt forward all the same (the
        // release may name this replica its successor, for a window).
        e.on_attempt(at(2320), at(2330), refused("pod-b", 4, 5000));
        e.on_release_notice(at(2400));
        assert!(e.attempt_due(at(2400)));
        // Released to another replica: free, blocked for what is left of
        // its window (990 ms): the window's end plus a heartbeat, late. A
        // yielding replica does not watch for the take: an ask landing
        // just past the window (15 ms left here) would take the row.
        e.on_attempt(at(2400), at(2410), released(4, 990));
        assert!(!e.attempt_due(at(4400)));
        assert!(e.attempt_due(at(4401)));
        e.on_release_notice(at(4401));
        e.on_attempt(at(4401), at(4402), released(4, 15));
        assert!(!e.attempt_due(at(4402) + TAKE_WATCH));
        // Expired, lost a race: retried late, not in 10 ms.
        e.on_attempt(at(4401), at(4410), refused("pod-b", 4, -5));
        assert!(!e.attempt_due(at(4500)));
        assert!(e.attempt_due(at(5420)));
    }

    #[test]
    fn a_draining_follower_keeps_naming_a_renewing_holder_until_it_asks() {
        let mut e = engine();
        e.drain(at(0), Duration::from_secs(30));
        // 800 ms left: asked again three heartbeats after it ends, and
        // named until that ask is answered (no blink while it renews).
        e.on_attempt(at(0), at(5), refused("pod-b", 4, 800));
        assert_eq!(e.view(at(2000)).leader.as_deref(), Some("pod-b"));
        assert!(e.attempt_due(at(3806)));
    }

    #[test]
    fn a_draining_follower_comes_three_heartbeats_late_until_the_drain_ends() {
        let mut e = engine();
        e.on_attempt(at(0), at(10), refused("pod-b", 4, 300));
        assert!(e.attempt_due(at(311)));
        // Drained for 10 s at 100 ms: the poll already due stays due (it
        // reads who leads); what it finds free waits.
        e.drain(at(100), Duration::from_secs(10));
        assert!(e.attempt_due(at(3100)));
        // A row held for 300 ms more (a hand-over's holder, say): its
        // expiry plus three heartbeats, after the yielding (one) and the
        // releasing replica (two).
        e.on_attempt(at(3100), at(3110), refused("pod-c", 5, 300));
        assert!(!e.attempt_due(at(6410)));
        assert!(e.attempt_due(at(6411)));
        // A release notice does not bring it forward.
        e.on_attempt(at(6411), at(6420), refused("pod-c", 5, 5000));
        e.on_release_notice(at(6500));
        assert!(!e.attempt_due(at(7419)));
        // Past the drain (10.1 s): on time again.
        e.on_attempt(at(10_200), at(10_210), refused("pod-c", 5, 300));
        assert!(e.attempt_due(at(10_511)));
        // A shorter drain asked later does not end it sooner.
        let mut e = engine();
        e.drain(at(0), Duration::from_secs(10));
        e.drain(at(0), Duration::from_secs(1));
        e.on_attempt(at(2000), at(2010), refused("pod-b", 4, 300));
        assert!(!e.attempt_due(at(2311)));
    }

    #[test]
    fn a_draining_follower_comes_late_to_a_row_freed_just_under_a_heartbeat_away() {
        // Released to another replica: free, blocked for a window of one
        // heartbeat, seen a moment after the release (999.6 ms left). The
        // slack of the wait put it past a heartbeat, and the follower came
        // on time, at the window's end.
        for remaining_us in [999_600, 1_000_000] {
            let mut e = engine();
            e.drain(at(0), Duration::from_secs(60));
            let seen = Attempt::Refused(Observed {
                holder: None,
                instance: None,
                token: 5,
                remaining_us,
                address: None,
            });
            e.on_attempt(at(100), at(101), seen);
            assert!(!e.attempt_due(at(101 + 1000 + 2999)), "{remaining_us}");
            assert!(e.attempt_due(at(101 + 1000 + 3000)), "{remaining_us}");
        }
    }

    #[test]
    fn ending_a_yield_attempts_at_once_and_a_leader_is_not_slowed() {
        let mut e = engine();
        e.set_yielding(at(0), true);
        e.on_attempt(at(0), at(10), refused("pod-b", 4, 300));
        e.set_yielding(at(50), false);
        assert!(e.attempt_due(at(50)));
        // A leader renews on its schedule whatever the yield.
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.set_yielding(at(6), true);
        assert!(e.attempt_due(at(400)));
    }

    #[test]
    fn the_other_holder_counts_for_a_heartbeat_past_its_lease_and_never_ourselves() {
        let mut e = engine();
        assert_eq!(e.other_holder(at(0)), None);
        e.on_attempt(at(0), at(10), refused("pod-b", 4, 300));
        assert_eq!(e.other_holder(at(309)), Some("pod-b"));
        // Counted for a heartbeat past its lease: the next answer is due.
        let heartbeat = e.timing().heartbeat().as_millis() as u64;
        assert_eq!(e.other_holder(at(309 + heartbeat)), Some("pod-b"));
        assert_eq!(e.other_holder(at(310 + heartbeat)), None, "no answer since");
        // Our own id held by another process is not another replica.
        e.on_attempt(at(1400), at(1410), refused("pod-a", 5, 900));
        assert_eq!(e.other_holder(at(1420)), None);
        // Leading: nobody else holds it.
        e.on_attempt(at(1500), at(1505), Attempt::Granted { token: 6 });
        assert_eq!(e.other_holder(at(1506)), None);
    }

    #[test]
    fn a_replica_that_starts_to_come_late_while_watching_a_take_stops_watching() {
        for late in ["drain", "yield"] {
            let mut e = engine();
            e.on_release_notice(at(0));
            e.on_attempt(at(0), at(1), released(4, 10));
            assert!(e.attempt_due(at(1) + TAKE_WATCH), "{late}: watching");
            match late {
                "drain" => e.drain(at(5), Duration::from_secs(30)),
                _ => e.set_yielding(at(5), true),
            }
            // Its ask would land just past the 10 ms window: not now.
            assert!(!e.attempt_due(at(1) + TAKE_WATCH), "{late}");
            assert!(!e.attempt_due(at(500)), "{late}");
        }
    }

    #[test]
    fn a_holder_whose_lease_ended_is_not_reported_past_a_renew_interval() {
        let mut e = engine();
        e.on_attempt(at(0), at(10), refused_at("pod-b", 4, 300, "http://b:8080"));
        let v = e.view(at(309));
        assert_eq!(v.leader.as_deref(), Some("pod-b"));
        assert_eq!(v.leader_address.as_deref(), Some("http://b:8080"));
        // Not asked again (the app unhealthy, say): still named while the
        // answer to an ask at its end would be on its way...
        e.set_competing(at(320), false, "inst-a-2");
        let renew_every = e.timing().renew_every();
        let end = at(310) + renew_every;
        assert_eq!(
            e.view(end - Duration::from_millis(1)).leader.as_deref(),
            Some("pod-b")
        );
        // ...then neither it nor its address.
        let v = e.view(end);
        assert_eq!((v.leader, v.leader_address, v.token), (None, None, None));
        assert_eq!(e.leadership(end), (false, None, None));
        // A replica that asks late on purpose (yielding: a heartbeat after
        // the lease's end) names the holder until its ask is answered.
        let mut y = engine();
        y.set_yielding(at(0), true);
        y.on_attempt(at(0), at(10), refused("pod-b", 4, 300));
        assert!(!y.attempt_due(at(1310)));
        assert_eq!(y.view(at(1310)).leader.as_deref(), Some("pod-b"));
        // An ask slower than a renew interval (up to its bound, a
        // heartbeat) does not blank the name of a holder that renews.
        let mut s = engine();
        s.on_attempt(at(0), at(10), refused("pod-b", 7, 1000));
        assert!(s.attempt_due(at(1011)));
        assert_eq!(s.leadership(at(1500)), (false, Some("pod-b"), Some(7)));
    }

    #[test]
    fn a_lease_renewed_in_waves_is_not_renewed_by_the_election_itself() {
        let mut e = engine();
        let lease = e.timing().local_lease();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        // Its own renewal is due at the renew interval, as before...
        assert!(e.attempt_due(at(400)));
        assert_eq!(e.next_wakeup(), at(400));
        // ...until a wave renews it: then only its deadline wakes it.
        let events = e.on_wave_renewal(at(300), at(310), 7, Attempt::Granted { token: 7 });
        assert_eq!(events, vec![Event::Renewed { token: 7 }]);
        assert!(e.renewed_in_waves());
        assert_eq!(e.lease(at(310)), Some((7, at(300) + lease)));
        assert!(!e.attempt_due(at(300) + lease - ms(1)));
        assert_eq!(e.next_wakeup(), at(300) + lease);
        // No wave came: it steps down at that deadline all the same.
        assert!(matches!(
            e.poll(at(300) + lease),
            Some(Event::Lost { token: 7, reason: LossReason::Deadline, deadline }) if deadline == at(300) + lease
        ));
        assert!(!e.renewed_in_waves());
        assert!(e.attempt_due(at(300) + lease));
    }

    #[test]
    fn a_failed_wave_hands_the_renewals_back_to_the_election_at_once() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.on_wave_renewal(at(400), at(405), 7, Attempt::Granted { token: 7 });
        assert!(!e.attempt_due(at(800)));
        assert_eq!(e.on_wave_failure(at(800)), None, "the lease still stands");
        assert!(e.is_leader(at(800)));
        assert!(!e.renewed_in_waves());
        assert!(e.attempt_due(at(800)), "retried at once");
        // Its own renewal's answer leaves it with the election until a wave
        // renews it again.
        e.on_attempt(at(800), at(805), Attempt::Granted { token: 7 });
        assert!(!e.renewed_in_waves());
        assert!(e.attempt_due(at(1200)));
    }

    #[test]
    fn a_wave_that_finds_the_lease_taken_ends_it_and_the_waves() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        let events = e.on_wave_renewal(at(400), at(405), 7, refused("pod-b", 8, 1000));
        assert!(matches!(
            events.as_slice(),
            [Event::Lost {
                token: 7,
                reason: LossReason::Taken,
                ..
            }]
        ));
        assert!(!e.renewed_in_waves());
        // A follower again: its own attempts, on the holder's schedule.
        assert!(!e.attempt_due(at(406)));
        assert!(e.attempt_due(at(1406)));
    }

    #[test]
    fn a_late_wave_grant_never_makes_a_leader_of_an_election_that_stepped_down() {
        // The wave's renewal, sent at 400, is answered after the deadline
        // (1150) that the loop stepped down at; meanwhile the app went
        // unhealthy, which found nothing to release.
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        assert!(matches!(e.poll(at(1150)), Some(Event::Lost { .. })));
        assert_eq!(e.set_competing(at(1200), false, "inst-a2"), None);
        let events = e.on_wave_renewal(at(400), at(1300), 7, Attempt::Granted { token: 7 });
        assert_eq!(events, vec![]);
        assert!(!e.is_leader(at(1300)));
        assert!(!e.attempt_due(at(1300)), "not competing");
        // Competing, the grant only makes its own attempt due at once.
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.poll(at(1150));
        assert_eq!(
            e.on_wave_renewal(at(400), at(1300), 7, Attempt::Granted { token: 7 }),
            vec![]
        );
        assert!(!e.is_leader(at(1300)));
        assert!(e.attempt_due(at(1300)));
    }

    #[test]
    fn a_wave_grant_of_a_new_term_is_left_to_the_election_to_report() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.on_wave_renewal(at(400), at(405), 7, Attempt::Granted { token: 7 });
        // The lease had lapsed in the database: a new token.
        assert_eq!(
            e.on_wave_renewal(at(800), at(805), 7, Attempt::Granted { token: 9 }),
            vec![]
        );
        assert!(!e.renewed_in_waves());
        assert!(e.attempt_due(at(805)));
        // Its own attempt reports the change of term.
        assert_eq!(
            e.on_attempt(at(806), at(810), Attempt::Granted { token: 9 }),
            vec![
                Event::Lost {
                    token: 7,
                    reason: LossReason::Lapsed,
                    deadline: at(400) + e.timing().local_lease(),
                },
                Event::Acquired { token: 9 }
            ]
        );
    }

    #[test]
    fn a_wave_answer_after_shutdown_changes_nothing() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.shutdown(at(300));
        assert_eq!(
            e.on_wave_renewal(at(200), at(305), 7, Attempt::Granted { token: 7 }),
            vec![]
        );
        assert!(!e.is_leader(at(305)));
    }

    #[test]
    fn a_lease_taken_again_by_the_election_is_not_left_to_the_waves() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.on_wave_renewal(at(400), at(405), 7, Attempt::Granted { token: 7 });
        let lease = e.timing().local_lease();
        e.poll(at(400) + lease);
        // Taken again by its own attempt: it renews it itself until a wave
        // does.
        e.on_attempt(at(2000), at(2005), Attempt::Granted { token: 9 });
        assert!(!e.renewed_in_waves());
        assert!(e.attempt_due(at(2400)));
    }

    #[test]
    fn starts_as_follower_that_attempts_at_once() {
        let e = engine();
        assert!(!e.is_leader(at(0)));
        assert!(e.attempt_due(at(0)));
        assert_eq!(e.view(at(0)).leader, None);
    }

    #[test]
    fn grant_makes_leader_until_sent_time_plus_local_lease() {
        let mut e = engine();
        let ev = e.on_attempt(at(0), at(30), Attempt::Granted { token: 7 });
        assert_eq!(ev, vec![Event::Acquired { token: 7 }]);
        // Deadline counts from when the statement was sent, not received.
        assert!(e.is_leader(at(1149)));
        assert!(!e.is_leader(at(1150)));
        let v = e.view(at(150));
        assert!(v.is_leader);
        assert_eq!(v.leader.as_deref(), Some("pod-a"));
        assert_eq!(v.token, Some(7));
        assert_eq!(v.lease_remaining, Some(ms(1000)));
        // Renewal is due every min(heartbeat, ttl / 3) from the send time.
        assert!(!e.attempt_due(at(399)));
        assert!(e.attempt_due(at(400)));
        // A renewal may run until the lease it would grant is of no use.
        assert_eq!(e.attempt_timeout(at(400)), ms(1150));
        assert_eq!(e.attempt_timeout(at(1149)), ms(1150));
        // A follower's attempt: one heartbeat.
        assert_eq!(e.attempt_timeout(at(1150)), ms(1000));
    }

    /// A renewal still in flight when the lease in force runs out: the
    /// replica steps down at the deadline, and the late grant (within its
    /// own lease) makes it leader again under the same token.
    #[test]
    fn a_renewal_slower_than_the_lease_left_steps_down_then_renews() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        assert_eq!(e.attempt_timeout(at(400)), ms(1150));
        // Sent at 400; the deadline at 1150 passes before the answer.
        assert_eq!(
            e.poll(at(1150)),
            Some(Event::Lost {
                token: 7,
                reason: LossReason::Deadline,
                deadline: at(1150),
            })
        );
        assert!(!e.is_leader(at(1150)));
        let ev = e.on_attempt(at(400), at(1200), Attempt::Granted { token: 7 });
        assert_eq!(ev, vec![Event::Acquired { token: 7 }]);
        assert!(e.is_leader(at(1549)));
        assert!(!e.is_leader(at(1550)));
    }

    #[test]
    fn renewal_keeps_token_and_moves_deadline() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        let ev = e.on_attempt(at(400), at(405), Attempt::Granted { token: 7 });
        assert_eq!(ev, vec![Event::Renewed { token: 7 }]);
        assert!(e.is_leader(at(1549)));
        assert!(!e.is_leader(at(1550)));
    }

    #[test]
    fn refusal_names_the_holder_and_wakes_at_its_expiry() {
        let mut e = engine();
        let ev = e.on_attempt(at(0), at(10), refused("pod-b", 3, 700));
        assert!(ev.is_empty());
        assert!(!e.is_leader(at(10)));
        let v = e.view(at(110));
        assert_eq!(v.leader.as_deref(), Some("pod-b"));
        assert_eq!(v.token, Some(3));
        assert_eq!(v.lease_remaining, Some(ms(600)));
        // Not on a fixed 1 s grid: right after the holder's lease ends.
        assert_eq!(e.next_wakeup(), at(711));
        // And never later than one heartbeat.
        e.on_attempt(at(711), at(720), refused("pod-b", 3, 5000));
        assert_eq!(e.next_wakeup(), at(1720));
    }

    #[test]
    fn refusal_of_an_expired_row_retries_soon_without_spinning() {
        let mut e = engine();
        e.on_attempt(at(0), at(1), refused("pod-b", 3, -5));
        assert_eq!(e.next_wakeup(), at(11));
        assert_eq!(e.view(at(2)).leader, None);
    }

    #[test]
    fn repeated_refusals_of_an_expired_row_back_off_to_a_heartbeat() {
        let mut e = engine();
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..10 {
            e.on_attempt(at(now), at(now), refused("pod-b", 3, -5));
            let next = e.next_wakeup().saturating_since(at(now));
            waits.push(next.as_millis());
            now += u64::try_from(next.as_millis()).unwrap();
        }
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        // Any other answer starts over.
        e.on_attempt(at(now), at(now), refused("pod-b", 3, 500));
        e.on_attempt(at(now + 501), at(now + 501), refused("pod-b", 3, -5));
        assert_eq!(e.next_wakeup(), at(now + 511));
    }

    #[test]
    fn takeover_after_expiry_reports_the_new_token() {
        let mut e = engine();
        e.on_attempt(at(0), at(10), refused("pod-b", 3, 100));
        let ev = e.on_attempt(at(111), at(115), Attempt::Granted { token: 4 });
        assert_eq!(ev, vec![Event::Acquired { token: 4 }]);
        assert_eq!(e.view(at(120)).token, Some(4));
    }

    #[test]
    fn leader_that_is_refused_steps_down_at_once() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        let ev = e.on_attempt(at(400), at(405), refused("pod-b", 8, 1100));
        assert_eq!(
            ev,
            vec![Event::Lost {
                token: 7,
                reason: LossReason::Taken,
                deadline: at(1150),
            }]
        );
        assert!(!e.is_leader(at(405)));
    }

    #[test]
    fn deadline_passes_without_renewal() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        assert_eq!(e.next_wakeup(), at(400));
        assert_eq!(e.poll(at(1149)), None);
        assert_eq!(
            e.poll(at(1150)),
            Some(Event::Lost {
                token: 7,
                reason: LossReason::Deadline,
                deadline: at(1150),
            })
        );
        assert_eq!(e.poll(at(1200)), None);
    }

    #[test]
    fn paused_process_is_not_leader_the_instant_it_resumes() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        // Nothing ran (SIGSTOP) for 3 s: no poll, no renewal. The answer at
        // resume time still says "not leader".
        assert!(!e.is_leader(at(3000)));
        assert!(!e.view(at(3000)).is_leader);
        assert_eq!(e.view(at(3000)).leader, None);
    }

    #[test]
    fn renewal_that_arrives_too_late_does_not_make_a_leader() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        // Sent at 400, answer arrives at 1600: past the deadline of that
        // attempt (400 + 1150 = 1550).
        let ev = e.on_attempt(at(400), at(1600), Attempt::Granted { token: 7 });
        assert_eq!(
            ev,
            vec![Event::Lost {
                token: 7,
                reason: LossReason::Deadline,
                deadline: at(1150),
            }]
        );
        assert!(!e.is_leader(at(1600)));
        assert!(e.attempt_due(at(1600)));
    }

    #[test]
    fn failed_renewals_retry_at_once_then_back_off_until_the_deadline() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        assert_eq!(e.on_failure(at(410)), None);
        assert!(
            e.is_leader(at(410)),
            "a failure alone does not end leadership"
        );
        assert_eq!(e.next_wakeup(), at(410));
        assert_eq!(e.on_failure(at(420)), None);
        assert_eq!(e.next_wakeup(), at(445));
        assert_eq!(e.on_failure(at(450)), None);
        assert_eq!(e.next_wakeup(), at(500));
        assert_eq!(
            e.on_failure(at(1150)),
            Some(Event::Lost {
                token: 7,
                reason: LossReason::RenewFailed,
                deadline: at(1150),
            })
        );
    }

    #[test]
    fn backoff_is_capped_at_one_heartbeat() {
        let mut e = engine();
        for i in 0..40 {
            e.on_failure(at(i * 1000));
        }
        assert_eq!(e.next_wakeup(), at(39_000 + 1000));
    }

    #[test]
    fn tokens_grow_through_successive_terms() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.on_attempt(at(400), at(405), refused("pod-b", 8, 1200));
        let ev = e.on_attempt(at(1606), at(1610), Attempt::Granted { token: 9 });
        assert_eq!(ev, vec![Event::Acquired { token: 9 }]);
    }

    #[test]
    fn new_token_while_leading_reports_a_change_of_term() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        let ev = e.on_attempt(at(400), at(405), Attempt::Granted { token: 9 });
        assert_eq!(
            ev,
            vec![
                Event::Lost {
                    token: 7,
                    reason: LossReason::Lapsed,
                    deadline: at(1150),
                },
                Event::Acquired { token: 9 }
            ]
        );
    }

    #[test]
    fn duplicate_id_is_reported_and_never_named() {
        let mut e = engine();
        let ev = e.on_attempt(
            at(0),
            at(5),
            Attempt::Refused(Observed {
                holder: Some("pod-a".into()),
                instance: Some("other".into()),
                token: 3,
                remaining_us: 900_000,
                address: None,
            }),
        );
        assert_eq!(
            ev,
            vec![Event::DuplicateId {
                instance: Some("other".into())
            }]
        );
        assert_eq!(e.view(at(10)).leader, None);
        // Held by the other process until its lease ends (5 ms + 900 ms).
        assert!(e.duplicate_held(at(10)));
        assert!(e.duplicate_held(at(904)));
        assert!(!e.duplicate_held(at(905)));
        // A look names no instance: what the attempt told of the same
        // holder stands; another holder ends it.
        let look = |holder: &str| Observed {
            holder: Some(holder.into()),
            instance: None,
            token: 3,
            remaining_us: 900_000,
            address: None,
        };
        e.on_look(at(500), Some(look("pod-a")));
        assert!(e.duplicate_held(at(1300)));
        e.on_look(at(600), Some(look("pod-b")));
        assert!(!e.duplicate_held(at(700)));
    }

    #[test]
    fn the_last_eight_released_instances_are_ours_and_older_ones_are_not() {
        let mut e = engine();
        // Led and released nine times: inst-a, then r1 … r8 given up.
        for n in 1..=9 {
            let t = at(n * 10);
            e.on_attempt(t, t, Attempt::Granted { token: n as i64 });
            assert!(e.release(t + ms(1), ms(0), format!("r{n}")).is_some());
        }
        let seen_with = |instance: &str| {
            Attempt::Refused(Observed {
                holder: Some("pod-a".into()),
                instance: Some(instance.into()),
                token: 9,
                remaining_us: 900_000,
                address: None,
            })
        };
        let duplicate = |e: &mut Engine, instance: &str| {
            e.on_attempt(at(200), at(201), seen_with(instance))
                .iter()
                .any(|ev| matches!(ev, Event::DuplicateId { .. }))
        };
        for ours in ["r1", "r2", "r8", "r9"] {
            assert!(!duplicate(&mut e, ours), "{ours} is ours");
        }
        assert!(
            duplicate(&mut e, "inst-a"),
            "the ninth one back is forgotten"
        );
    }

    #[test]
    fn own_lapsed_lease_and_other_holders_are_not_duplicates() {
        let mut e = engine();
        let instance = e.instance().to_owned();
        for (holder, instance) in [("pod-a", instance), ("pod-b", "other".to_owned())] {
            e.on_attempt(
                at(0),
                at(5),
                Attempt::Refused(Observed {
                    holder: Some(holder.into()),
                    instance: Some(instance),
                    token: 3,
                    remaining_us: 900_000,
                    address: None,
                }),
            );
            assert!(!e.duplicate_held(at(10)), "{holder}");
        }
    }

    #[test]
    fn missing_row_steps_a_leader_down_and_waits() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        let ev = e.on_attempt(at(400), at(405), Attempt::Created);
        assert_eq!(
            ev,
            vec![Event::Lost {
                token: 7,
                reason: LossReason::Released,
                deadline: at(1150),
            }]
        );
        assert_eq!(e.next_wakeup(), at(1405));
    }

    #[test]
    fn release_notice_wakes_a_follower_only() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), refused("pod-b", 3, 1000));
        e.on_release_notice(at(100));
        assert!(e.attempt_due(at(100)));
        let mut l = engine();
        l.on_attempt(at(0), at(5), Attempt::Granted { token: 1 });
        l.on_release_notice(at(100));
        assert!(!l.attempt_due(at(100)));
    }

    #[test]
    fn release_steps_down_and_holds_off_attempting() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        assert_eq!(
            e.release(at(100), ms(2000), "inst-a2"),
            Some(StepDown {
                event: Event::Lost {
                    token: 7,
                    reason: LossReason::Released,
                    deadline: at(1150),
                },
                released_instance: "inst-a".into()
            })
        );
        assert!(!e.is_leader(at(100)));
        // Competes again as a new instance; its old one is not a duplicate.
        assert_eq!(e.instance(), "inst-a2");
        let own_old_row = Attempt::Refused(Observed {
            holder: Some("pod-a".into()),
            instance: Some("inst-a".into()),
            token: 7,
            remaining_us: 900_000,
            address: None,
        });
        assert!(e.on_attempt(at(150), at(151), own_old_row).is_empty());
        // Neither the schedule nor a release notice brings it back early.
        e.on_release_notice(at(200));
        assert!(!e.attempt_due(at(2099)));
        // It looks for the take meanwhile (reads that take nothing).
        assert_eq!(e.next_wakeup(), at(200) + TAKE_WATCH);
        assert!(e.attempt_due(at(2100)));
        // A follower has nothing to release.
        let mut f = engine();
        assert_eq!(f.release(at(0), ms(2000), "x"), None);
        assert_eq!(f.instance(), "inst-a");
        assert!(f.attempt_due(at(0)));
    }

    #[test]
    fn a_hold_rearmed_after_a_slow_release_counts_from_then() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.release(at(100), ms(2000), "inst-a2");
        // The row was freed only at 3000 (the command took that long).
        e.hold(at(3000), ms(2000));
        assert!(!e.attempt_due(at(4999)));
        assert!(e.attempt_due(at(5000)));
        // Never shorter than the hold in force.
        e.hold(at(3000), ms(10));
        assert!(!e.attempt_due(at(4999)));
    }

    #[test]
    fn an_app_health_change_keeps_an_operators_hold() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.release(at(100), ms(60_000), "inst-a2");
        e.set_competing(at(200), false, "unused");
        e.set_competing(at(300), true, "unused");
        assert!(!e.attempt_due(at(30_000)), "the hold was wiped");
        assert!(e.attempt_due(at(60_100)));
    }

    #[test]
    fn an_unhealthy_app_stops_competing_until_it_recovers() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        let step_down = e.set_competing(at(100), false, "inst-a2").unwrap();
        assert_eq!(
            step_down.event,
            Event::Lost {
                token: 7,
                reason: LossReason::Released,
                deadline: at(1150),
            }
        );
        assert_eq!(step_down.released_instance, "inst-a");
        assert_eq!(e.set_competing(at(110), false, "unused"), None);
        for t in [100, 500, 5000] {
            e.poll(at(t));
            assert!(!e.attempt_due(at(t)));
            // As the loop does: a look due is made (the row, free).
            if e.look_due(at(t)) {
                e.on_look(at(t), None);
            }
            assert!(e.next_wakeup() > at(t), "no busy loop while idle");
        }
        assert_eq!(e.set_competing(at(6000), true, "unused"), None);
        assert!(e.attempt_due(at(6000)));
        // A follower whose app was never healthy never attempts.
        let mut f = engine();
        f.set_competing(at(0), false, "unused");
        f.poll(at(0));
        assert!(!f.attempt_due(at(0)));
    }

    #[test]
    fn a_hold_or_a_drain_is_told_and_resume_ends_both_at_once() {
        use crate::standing::NotCompeting;
        let mut e = engine();
        assert!(e.standing(at(0)).competing());
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        e.release(at(100), ms(3_600_000), "inst-a2");
        e.drain(at(100), ms(3_600_000));
        let held = e.standing(at(1100));
        assert_eq!(held.not_competing, Some(NotCompeting::Held));
        assert_eq!(held.hold_remaining, Some(ms(3_599_000)));
        assert!(!e.attempt_due(at(1100)));
        assert!(e.resume(at(1100)));
        assert!(e.standing(at(1100)).competing());
        assert!(e.attempt_due(at(1100)), "asks at its next turn");
        assert!(!e.resume(at(1200)), "nothing left to end");
        // Resume does not make an unhealthy app's replica compete.
        e.set_competing(at(1300), false, "unused");
        e.hold(at(1300), ms(60_000));
        assert!(e.resume(at(1400)));
        assert_eq!(
            e.standing(at(1400)).not_competing,
            Some(NotCompeting::AppUnhealthy)
        );
        assert!(!e.attempt_due(at(1400)));
        // A drain alone.
        let mut f = engine();
        f.drain(at(0), ms(5000));
        assert_eq!(
            f.standing(at(1000)).not_competing,
            Some(NotCompeting::Draining)
        );
        assert!(f.resume(at(1000)));
        assert!(!f.draining(at(1000)));
    }

    #[test]
    fn shutdown_stops_leading_for_good() {
        let mut e = engine();
        e.on_attempt(at(0), at(5), Attempt::Granted { token: 7 });
        assert_eq!(
            e.shutdown(at(10)),
            Some(Event::Lost {
                token: 7,
                reason: LossReason::Shutdown,
                deadline: at(1150),
            })
        );
        assert!(!e.is_leader(at(11)));
        assert!(!e.attempt_due(at(5000)));
        assert!(e
            .on_attempt(at(11), at(12), Attempt::Granted { token: 7 })
            .is_empty());
        assert!(!e.is_leader(at(13)));
    }
}
