//! The split-brain checker: rebuilds every replica's leadership intervals
//! from the daemons' JSON transition logs and asserts that no two overlap.
//!
//! Each daemon logs `acquired leadership` (with `at_us`, `deadline_us`),
//! `renewed` (debug, with the new `deadline_us`) and `lost leadership` (with
//! `at_us` and the `deadline_us` in force), all on `CLOCK_BOOTTIME`, which
//! every process on the host shares. A replica leads from `at_us` of its
//! grant until the earlier of its loss and its last deadline; a process that
//! was killed leads at most until its last deadline.

use crate::{Daemon, Value};

/// One stretch of leadership of one replica, in boot-clock microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interval {
    pub id: String,
    pub token: i64,
    pub start: u64,
    pub end: u64,
}

/// Leadership intervals of one daemon, from its log.
pub fn intervals(daemon: &Daemon) -> Vec<Interval> {
    intervals_from(&daemon.id, &daemon.log_events())
}

/// Leadership intervals of one election of a daemon that runs several.
pub fn intervals_of(daemon: &Daemon, election: &str) -> Vec<Interval> {
    let events: Vec<Value> = daemon
        .log_events()
        .into_iter()
        .filter(|e| e["election"] == election)
        .collect();
    intervals_from(&daemon.id, &events)
}

/// Leadership intervals from the JSON log `events` of replica `id`.
pub fn intervals_from(id: &str, events: &[Value]) -> Vec<Interval> {
    let mut out = Vec::new();
    let mut open: Option<(i64, u64, u64)> = None; // token, start, deadline
    for e in events {
        let num = |k: &str| e[k].as_u64();
        match e["message"].as_str() {
            Some("acquired leadership") => {
                if let Some((token, start, deadline)) = open.take() {
                    out.push(Interval {
                        id: id.to_owned(),
                        token,
                        start,
                        end: deadline,
                    });
                }
                if let (Some(at), Some(deadline), Some(token)) =
                    (num("at_us"), num("deadline_us"), e["token"].as_i64())
                {
                    open = Some((token, at, deadline));
                }
            }
            Some("renewed") => {
                if let (Some(o), Some(deadline)) = (open.as_mut(), num("deadline_us")) {
                    o.2 = deadline;
                }
            }
            Some("lost leadership") => {
                if let Some((token, start, deadline)) = open.take() {
                    let at = num("at_us").unwrap_or(deadline);
                    out.push(Interval {
                        id: id.to_owned(),
                        token,
                        start,
                        end: at.min(deadline),
                    });
                }
            }
            _ => {}
        }
    }
    if let Some((token, start, deadline)) = open {
        out.push(Interval {
            id: id.to_owned(),
            token,
            start,
            end: deadline,
        });
    }
    out
}

/// Panics when two replicas' intervals overlap or tokens go backwards in
/// time; returns all intervals sorted by start.
pub fn assert_no_overlap(daemons: &[&Daemon]) -> Vec<Interval> {
    let mut all: Vec<Interval> = daemons.iter().flat_map(|d| intervals(d)).collect();
    check(&mut all);
    all
}

/// The check itself, on intervals from any source.
pub fn check(all: &mut [Interval]) {
    all.sort_by_key(|i| (i.start, i.end));
    for (n, a) in all.iter().enumerate() {
        for b in &all[n + 1..] {
            if b.start >= a.end {
                break;
            }
            assert!(
                a.id == b.id && a.token == b.token,
                "leadership overlaps: {a:?} and {b:?} ({} µs)",
                a.end.min(b.end) - b.start
            );
        }
    }
    for w in all.windows(2) {
        assert!(
            w[1].token >= w[0].token,
            "token went back: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(id: &str, token: i64, start: u64, end: u64) -> Interval {
        Interval {
            id: id.into(),
            token,
            start,
            end,
        }
    }

    #[test]
    fn rebuilds_intervals_from_logs() {
        let events: Vec<Value> = [
            r#"{"message":"acquired leadership","token":5,"at_us":100,"deadline_us":1000}"#,
            r#"{"message":"renewed","token":5,"deadline_us":1400}"#,
            r#"{"message":"lost leadership","token":5,"at_us":2000,"deadline_us":1400,"reason":"deadline"}"#,
            r#"{"message":"acquired leadership","token":7,"at_us":3000,"deadline_us":4000}"#,
        ]
        .iter()
        .map(|s| serde_json::from_str(s).unwrap())
        .collect();
        assert_eq!(
            intervals_from("a", &events),
            vec![iv("a", 5, 100, 1400), iv("a", 7, 3000, 4000)]
        );
    }

    #[test]
    fn accepts_handovers_and_rejects_overlaps() {
        check(&mut [
            iv("a", 1, 0, 100),
            iv("b", 2, 100, 200),
            iv("a", 3, 250, 300),
        ]);
        let r = std::panic::catch_unwind(|| check(&mut [iv("a", 1, 0, 100), iv("b", 2, 99, 200)]));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(|| check(&mut [iv("a", 5, 0, 100), iv("b", 4, 150, 200)]));
        assert!(r.is_err());
    }
}
