//! Why a replica does not compete for an election, and for how long: what
//! `/leader`, the watch stream, the metrics and the presence rows report
//! (a replica's account of itself when nobody leads), decided from the
//! engine's state at an instant.

use std::time::Duration;

use crate::time::BootTime;

/// Why a replica does not ask for an election's row now. The names are the
/// `not_competing` values of `/leader` and the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCompeting {
    /// The daemon is stopping: it asks for nothing again.
    ShuttingDown,
    /// The app fails its health check (`app_health`): it competes again
    /// once the app passes.
    AppUnhealthy,
    /// Released with a hold (`leaderd release --hold`, `POST /release`):
    /// it asks again when the hold ends, or at `leaderd resume`.
    Held,
    /// The whole replica drains (a release that named no election, such as
    /// a `preStop` hook): it leaves rows to the others, and takes a free
    /// one only when nobody else has for a while, until the drain ends or
    /// `leaderd resume`.
    Draining,
}

impl NotCompeting {
    /// The value reported as `not_competing`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotCompeting::ShuttingDown => "shutting_down",
            NotCompeting::AppUnhealthy => "app_unhealthy",
            NotCompeting::Held => "held",
            NotCompeting::Draining => "draining",
        }
    }
}

/// A replica's standing in an election at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// `None` while it competes.
    pub not_competing: Option<NotCompeting>,
    /// What is left of its hold, or of its drain when it drains: it asks
    /// again then (if nothing else keeps it out).
    pub hold_remaining: Option<Duration>,
}

impl Standing {
    pub fn competing(&self) -> bool {
        self.not_competing.is_none()
    }
}

/// The standing at `now` of a replica that is `shut_down` or not, whose app
/// passes (`app_healthy`), held until `hold_until`, draining until
/// `draining_until`. The first reason that applies, in that order: the one
/// that lasts longest, or needs someone to act.
pub(crate) fn standing(
    now: BootTime,
    shut_down: bool,
    app_healthy: bool,
    hold_until: Option<BootTime>,
    draining_until: Option<BootTime>,
) -> Standing {
    let left =
        |until: Option<BootTime>| until.filter(|u| now < *u).map(|u| u.saturating_since(now));
    let (hold, drain) = (left(hold_until), left(draining_until));
    let not_competing = if shut_down {
        Some(NotCompeting::ShuttingDown)
    } else if !app_healthy {
        Some(NotCompeting::AppUnhealthy)
    } else if hold.is_some() {
        Some(NotCompeting::Held)
    } else if drain.is_some() {
        Some(NotCompeting::Draining)
    } else {
        None
    };
    Standing {
        not_competing,
        hold_remaining: hold.or(drain),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> BootTime {
        BootTime::from_since_boot(Duration::from_millis(ms))
    }

    #[test]
    fn the_reason_that_applies_first_and_what_is_left_of_a_hold() {
        let now = at(10_000);
        let free = standing(now, false, true, None, None);
        assert!(free.competing());
        assert_eq!(free.hold_remaining, None);
        // A hold that ended is no reason.
        assert!(standing(now, false, true, Some(at(9_000)), None).competing());
        let held = standing(now, false, true, Some(at(70_000)), Some(at(40_000)));
        assert_eq!(held.not_competing, Some(NotCompeting::Held));
        assert_eq!(held.hold_remaining, Some(Duration::from_secs(60)));
        let draining = standing(now, false, true, Some(at(9_000)), Some(at(12_500)));
        assert_eq!(draining.not_competing, Some(NotCompeting::Draining));
        assert_eq!(draining.hold_remaining, Some(Duration::from_millis(2_500)));
        // An unhealthy app comes before a hold: the hold's end changes
        // nothing while it lasts.
        let unhealthy = standing(now, false, false, Some(at(70_000)), None);
        assert_eq!(unhealthy.not_competing, Some(NotCompeting::AppUnhealthy));
        assert_eq!(unhealthy.hold_remaining, Some(Duration::from_secs(60)));
        assert_eq!(
            standing(now, true, false, None, None).not_competing,
            Some(NotCompeting::ShuttingDown)
        );
        assert_eq!(NotCompeting::AppUnhealthy.as_str(), "app_unhealthy");
    }
}
