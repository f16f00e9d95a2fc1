//! Time as the engine sees it: instants on the boot clock and the lease timing
//! derived from `heartbeat` and `ttl`.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// An instant on the host's `CLOCK_BOOTTIME`, as the time since boot.
///
/// The boot clock keeps counting while the host is suspended and is never
/// stepped by NTP or an operator, so a deadline on it cannot be stretched. The
/// engine only compares and adds these; reading the clock is the caller's job.
///
/// Nanoseconds since boot (584 years of them): 8 bytes where a `Duration`
/// takes 16, and an election keeps a dozen of these.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BootTime(u64);

/// `d` in nanoseconds, at most `u64::MAX`.
const fn nanos(d: Duration) -> u64 {
    let n = d.as_nanos();
    if n > u64::MAX as u128 {
        u64::MAX
    } else {
        n as u64
    }
}

impl BootTime {
    /// The instant `since_boot` after boot.
    pub const fn from_since_boot(since_boot: Duration) -> Self {
        Self(nanos(since_boot))
    }

    /// How long after boot this instant is.
    pub const fn since_boot(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// Nanoseconds since boot: what an atomic holds of an instant.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The instant [`BootTime::as_nanos`] gave.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// `self - earlier`, or zero when `earlier` is later.
    pub fn saturating_since(self, earlier: BootTime) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Debug for BootTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BootTime").field(&self.since_boot()).finish()
    }
}

impl Add<Duration> for BootTime {
    type Output = BootTime;
    fn add(self, rhs: Duration) -> BootTime {
        BootTime(self.0.saturating_add(nanos(rhs)))
    }
}

impl Sub<Duration> for BootTime {
    type Output = BootTime;
    fn sub(self, rhs: Duration) -> BootTime {
        BootTime(self.0.saturating_sub(nanos(rhs)))
    }
}

/// Why a `heartbeat`/`ttl` pair was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The heartbeat is too short to be a sensible database poll period.
    #[error("heartbeat must be at least {min:?}, got {got:?}")]
    HeartbeatTooShort { min: Duration, got: Duration },
    /// The lease is too short to leave anything after the safety margin.
    #[error("ttl must be at least {min:?}, got {got:?}")]
    TtlTooShort { min: Duration, got: Duration },
    /// A lease this long would block the election that long after a crash.
    #[error("ttl must be at most {max:?}, got {got:?}")]
    TtlTooLong { max: Duration, got: Duration },
    /// A lease must outlast a heartbeat: `ttl > heartbeat`.
    #[error("ttl ({ttl:?}) must exceed heartbeat ({heartbeat:?})")]
    TtlNotAboveHeartbeat { ttl: Duration, heartbeat: Duration },
}

/// The lease timing: `heartbeat`, `ttl` and what follows from them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    heartbeat: Duration,
    ttl: Duration,
}

impl Timing {
    /// Shortest accepted heartbeat: below this the daemon would mostly measure
    /// its own scheduling noise.
    pub const MIN_HEARTBEAT: Duration = Duration::from_millis(10);
    /// Shortest accepted ttl: twice the smallest safety margin, so a leader
    /// always has a usable lease.
    pub const MIN_TTL: Duration = Duration::from_millis(100);

    /// Longest accepted ttl (and so heartbeat): after a crash, nobody leads
    /// for up to one ttl; beyond this that is an outage, not a lease.
    pub const MAX_TTL: Duration = Duration::from_secs(600);

    /// Checks and builds the timing.
    pub fn new(heartbeat: Duration, ttl: Duration) -> Result<Self, TimingError> {
        if heartbeat < Self::MIN_HEARTBEAT {
            return Err(TimingError::HeartbeatTooShort {
                min: Self::MIN_HEARTBEAT,
                got: heartbeat,
            });
        }
        if ttl < Self::MIN_TTL {
            return Err(TimingError::TtlTooShort {
                min: Self::MIN_TTL,
                got: ttl,
            });
        }
        if ttl > Self::MAX_TTL {
            return Err(TimingError::TtlTooLong {
                max: Self::MAX_TTL,
                got: ttl,
            });
        }
        if ttl <= heartbeat {
            return Err(TimingError::TtlNotAboveHeartbeat { ttl, heartbeat });
        }
        Ok(Self { heartbeat, ttl })
    }

    /// Follower poll period and longest gap between a leader's renewals.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// Lease length, as granted by the database.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// A leader renews every `min(heartbeat, ttl / 3)`, so that one slow
    /// commit does not cost it the lease.
    pub fn renew_every(&self) -> Duration {
        self.heartbeat.min(self.ttl / 3)
    }

    /// Taken off the lease locally: at least 50 ms and 2 % of `ttl`, to cover
    /// the database clock running slightly fast against the host's.
    pub fn safety_margin(&self) -> Duration {
        Duration::from_millis(50).max(self.ttl / 50)
    }

    /// How long after *sending* a granted statement this replica may call
    /// itself leader.
    pub fn local_lease(&self) -> Duration {
        self.ttl - self.safety_margin()
    }

    /// Into how many groups a daemon of `elections` elections splits its
    /// leases for renewal (see [`Timing::wave_every`]): one per
    /// [`WAVE_GROUP`] elections. A renewal waits for its whole statement,
    /// and a follower's attempt for the statement ahead of it on the
    /// connection: with thousands of leases in one statement, both waited
    /// tens of milliseconds for rows not theirs.
    pub fn wave_groups(elections: usize) -> usize {
        elections.div_ceil(WAVE_GROUP).max(1)
    }

    /// How often a wave goes, each renewing one of the `groups` in turn:
    /// every lease is still renewed once a renew interval.
    pub fn wave_every(&self, groups: usize) -> Duration {
        self.renew_every() / u32::try_from(groups.max(1)).unwrap_or(u32::MAX)
    }

    /// How long a leader's renewal may take, from its send to its answer,
    /// for the leader to stay leader without a gap: `ttl − safety margin −
    /// renew interval` (docs/design.md, the renewal budget). The renewal is sent a
    /// renew interval after the one before, whose local lease then has this
    /// much left. No margin can beat it: a short lease needs a database
    /// whose commits stay within it under load.
    pub fn renewal_budget(&self) -> Duration {
        self.local_lease().saturating_sub(self.renew_every())
    }
}

/// When each group of a daemon's leases is renewed (see
/// [`Timing::wave_groups`]): one group a turn, a turn every
/// [`Timing::wave_every`], on a fixed schedule. A turn that comes late (the
/// connection was busy) delays its group by that much alone, and every
/// group whose turn has come goes at once, so no group waits more than a
/// renew interval plus that delay. Timed from each send instead, the delays
/// of all the groups' turns added up before a group came round again.
#[derive(Debug, Clone)]
pub struct WaveSchedule {
    next: BootTime,
    turn: usize,
    every: Duration,
    groups: usize,
}

impl WaveSchedule {
    /// `groups` groups, a turn every `every`, the first at `first`.
    pub fn new(first: BootTime, every: Duration, groups: usize) -> Self {
        Self {
            next: first,
            turn: 0,
            every,
            groups: groups.max(1),
        }
    }

    /// When the next turn comes.
    pub fn next(&self) -> BootTime {
        self.next
    }

    /// The groups whose turn has come by `now` (by group), taken. Behind by
    /// a whole round, every group's turn has come, and the schedule starts
    /// again from `now`.
    pub fn take_due(&mut self, now: BootTime) -> Vec<bool> {
        let mut due = vec![false; self.groups];
        let mut taken = 0;
        while taken < self.groups && self.next <= now {
            due[self.turn % self.groups] = true;
            self.turn = self.turn.wrapping_add(1);
            self.next = self.next + self.every;
            taken += 1;
        }
        if self.next <= now {
            self.next = now + self.every;
        }
        due
    }

    /// Nothing could be sent at `now` (no connection): the next turn a
    /// step from now, the turns as they were.
    pub fn put_off(&mut self, now: BootTime) {
        self.next = now + self.every;
    }

    /// Into how many groups the leases are split.
    pub fn groups(&self) -> usize {
        self.groups
    }
}

/// The elections whose leases one renewal statement carries at most: with
/// three replicas sharing them, a third of these each (measured: a
/// statement of 3,333 renewals took 30–35 ms on average on a 2-core
/// database serving three daemons of 10,000 elections; its rows cost about
/// 10 µs each under that load).
pub const WAVE_GROUP: usize = 2_000;

impl fmt::Display for Timing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "heartbeat {:?}, ttl {:?}, renew every {:?}, safety margin {:?}, renewal budget {:?}",
            self.heartbeat,
            self.ttl,
            self.renew_every(),
            self.safety_margin(),
            self.renewal_budget()
        )
    }
}

/// Plain times for the unit tests of the state machines.
#[cfg(test)]
pub(crate) mod test_times {
    use super::BootTime;
    use std::time::Duration;

    pub fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// `n` ms into a test, well after boot.
    pub fn at(n: u64) -> BootTime {
        BootTime::from_since_boot(ms(10_000 + n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn a_boot_time_keeps_its_nanoseconds_and_saturates_at_both_ends() {
        let t = BootTime::from_since_boot(Duration::new(3, 7));
        assert_eq!(t.since_boot(), Duration::new(3, 7));
        assert_eq!(
            (t + Duration::from_nanos(1)).since_boot(),
            Duration::new(3, 8)
        );
        assert_eq!(t - MS(4_000), BootTime::default());
        assert_eq!(BootTime::default().saturating_since(t), Duration::ZERO);
        assert_eq!(t.saturating_since(t - MS(1)), MS(1));
        // Past 584 years: the latest instant, never a wrap to an early one.
        let last = BootTime::from_since_boot(Duration::MAX);
        assert!(t + Duration::MAX == last && last + MS(1) == last && t < last);
        assert_eq!(format!("{t:?}"), "BootTime(3.000000007s)");
        assert_eq!(BootTime::from_nanos(t.as_nanos()), t);
        assert_eq!(t.as_nanos(), 3_000_000_007);
    }

    #[test]
    fn defaults_follow_the_spec() {
        let t = Timing::new(MS(1000), MS(1200)).unwrap();
        assert_eq!(t.renew_every(), MS(400));
        assert_eq!(t.safety_margin(), MS(50));
        assert_eq!(t.local_lease(), MS(1150));
    }

    #[test]
    fn leases_are_renewed_in_groups_of_two_thousand_elections_each_once_an_interval() {
        let t = Timing::new(MS(1000), MS(1200)).unwrap();
        assert_eq!(Timing::wave_groups(0), 1);
        assert_eq!(Timing::wave_groups(1), 1);
        assert_eq!(Timing::wave_groups(2_000), 1);
        assert_eq!(Timing::wave_groups(2_001), 2);
        assert_eq!(Timing::wave_groups(10_000), 5);
        assert_eq!(Timing::wave_groups(30_000), 15);
        assert_eq!(t.wave_every(1), MS(400));
        assert_eq!(t.wave_every(5), MS(80));
        // Every group comes round once a renew interval (a hair sooner
        // where it does not divide).
        assert!(t.wave_every(15) * 15 <= MS(400));
        assert!(t.wave_every(15) * 15 > MS(400) - Duration::from_micros(1));
    }

    #[test]
    fn each_group_comes_round_once_a_renew_interval_whatever_the_delays() {
        let at = |ms: u64| BootTime::from_since_boot(MS(ms));
        let mut w = WaveSchedule::new(at(0), MS(80), 5);
        assert_eq!(w.take_due(at(0)), [true, false, false, false, false]);
        assert_eq!(w.next(), at(80));
        // Not yet.
        assert_eq!(w.take_due(at(79)), [false; 5]);
        // A turn 30 ms late moves nothing after it.
        assert_eq!(w.take_due(at(110)), [false, true, false, false, false]);
        assert_eq!(w.next(), at(160));
        // Two turns overdue (a slow batch): both groups go together.
        assert_eq!(w.take_due(at(250)), [false, false, true, true, false]);
        assert_eq!(w.next(), at(320));
        assert_eq!(w.take_due(at(320)), [false, false, false, false, true]);
        // Group 0 again, 400 ms after its first turn.
        assert_eq!(w.take_due(at(400)), [true, false, false, false, false]);
        // Held up for more than a round: every group now, then from there.
        assert_eq!(w.take_due(at(2_000)), [true; 5]);
        assert_eq!(w.next(), at(2_080));
        // No connection: put off a step, the turns unchanged.
        w.put_off(at(2_100));
        assert_eq!(w.next(), at(2_180));
        assert_eq!(w.take_due(at(2_180)), [false, true, false, false, false]);
    }

    #[test]
    fn the_renewal_budget_is_what_a_renewal_may_take() {
        // The documented figures: the defaults, ttl 150 ms and ttl 100 ms.
        assert_eq!(
            Timing::new(MS(1000), MS(1200)).unwrap().renewal_budget(),
            MS(750)
        );
        assert_eq!(
            Timing::new(MS(50), MS(150)).unwrap().renewal_budget(),
            MS(50)
        );
        assert_eq!(
            Timing::new(MS(33), MS(100)).unwrap().renewal_budget(),
            MS(17)
        );
        // A renew interval of ttl / 3 (100 ms / 3) counts whole.
        let t = Timing::new(MS(40), MS(100)).unwrap();
        assert_eq!(t.renewal_budget(), MS(50) - MS(100) / 3);
        assert_eq!(
            Timing::new(MS(10), MS(100)).unwrap().renewal_budget(),
            MS(40)
        );
    }

    #[test]
    fn margin_is_two_percent_of_long_leases() {
        let t = Timing::new(MS(5000), MS(30_000)).unwrap();
        assert_eq!(t.safety_margin(), MS(600));
        assert_eq!(t.renew_every(), MS(5000));
    }

    #[test]
    fn rejects_bad_pairs() {
        assert!(matches!(
            Timing::new(MS(1000), MS(1000)),
            Err(TimingError::TtlNotAboveHeartbeat { .. })
        ));
        assert!(matches!(
            Timing::new(MS(1), MS(1000)),
            Err(TimingError::HeartbeatTooShort { .. })
        ));
        assert!(matches!(
            Timing::new(MS(20), MS(60)),
            Err(TimingError::TtlTooShort { .. })
        ));
        assert!(matches!(
            Timing::new(MS(1000), MS(600_001)),
            Err(TimingError::TtlTooLong { .. })
        ));
        assert!(Timing::new(MS(1000), MS(600_000)).is_ok());
        // A heartbeat is bounded through ttl > heartbeat.
        assert!(matches!(
            Timing::new(Duration::from_secs(1 << 40), MS(600_000)),
            Err(TimingError::TtlNotAboveHeartbeat { .. })
        ));
    }

    #[test]
    fn boot_time_arithmetic_saturates() {
        let a = BootTime::from_since_boot(MS(100));
        assert_eq!((a - MS(200)).since_boot(), Duration::ZERO);
        assert_eq!((a + MS(5)).saturating_since(a), MS(5));
        assert_eq!(a.saturating_since(a + MS(5)), Duration::ZERO);
    }
}
