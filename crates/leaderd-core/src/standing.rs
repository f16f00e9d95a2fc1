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

/// Where a replica that competes in none of its elections keeps a row of
/// its own, so that `leaderd status` on any host shows it and why: under
/// the presence rows (an election may not be named so), yet apart from
/// every group's (`spread::PRESENCE_PREFIX` + group), which name
/// successors and share elections. The group's part follows, then a slot.
pub const AWAY_PREFIX: &str = "leaderd-presence/away/";

/// The away rows' prefix of the group whose presence rows start with
/// `group_prefix`.
pub fn away_prefix(group_prefix: &str) -> String {
    let group = group_prefix
        .strip_prefix(crate::spread::PRESENCE_PREFIX)
        .unwrap_or(group_prefix);
    format!("{AWAY_PREFIX}{group}")
}

/// What an away row's address column says: the reason, then what is left
/// of a hold or a drain in milliseconds (as of the row's last renewal).
pub fn away_note(standing: &Standing) -> Option<String> {
    let why = standing.not_competing?.as_str();
    Some(match standing.hold_remaining {
        Some(left) => format!("{why} {}", left.as_millis()),
        None => why.to_owned(),
    })
}

/// An away row's note read back: the reason as written, and what was left.
/// Text another version wrote is kept as it is, with nothing left.
pub fn read_away_note(note: &str) -> (&str, Option<Duration>) {
    match note.split_once(' ') {
        Some((why, ms)) => match ms.parse() {
            Ok(ms) => (why, Some(Duration::from_millis(ms))),
            Err(_) => (note, None),
        },
        None => (note, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_away_note_reads_back_as_written() {
        let held = Standing {
            not_competing: Some(NotCompeting::Held),
            hold_remaining: Some(Duration::from_millis(3_480_000)),
        };
        let note = away_note(&held).unwrap();
        assert_eq!(note, "held 3480000");
        assert_eq!(
            read_away_note(&note),
            ("held", Some(Duration::from_secs(3_480)))
        );
        let unhealthy = Standing {
            not_competing: Some(NotCompeting::AppUnhealthy),
            hold_remaining: None,
        };
        assert_eq!(
            read_away_note(&away_note(&unhealthy).unwrap()),
            ("app_unhealthy", None)
        );
        assert_eq!(
            away_note(&Standing {
                not_competing: None,
                hold_remaining: None
            }),
            None
        );
        assert_eq!(read_away_note("held soon"), ("held soon", None));
        let p = away_prefix("leaderd-presence/0123456789abcdef/");
        assert_eq!(p, "leaderd-presence/away/0123456789abcdef/");
        assert!(p.starts_with(crate::spread::PRESENCE_PREFIX));
        // Never a group's own prefix: a group's hash is hex.
        assert!(!p.starts_with("leaderd-presence/0123456789abcdef/"));
    }

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
