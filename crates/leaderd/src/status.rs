//! `leaderd status`: every election in the table, one line each (or JSON),
//! and beside it what an operator must know before apps fence: whether the
//! fence is installed, and which holders run a leaderd too old to tell.
//!
//! A holder that keeps no presence row runs a release from before named
//! successors (every daemon since keeps one while it holds anything); such
//! a release may also predate fenced writes, whose renewals a fenced
//! transaction blocks: that leader loses its lease while apps fence. So
//! those holders are named, and apps should not fence until none is left.
//!
//! With `--replicas` (and, in one line on stderr, beside the table) it
//! lists the live replicas from their presence and away rows: whether each
//! competes, and why not (`runtime::away`). When nobody leads, this is
//! where on-call sees that the candidates are held, draining or unhealthy.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use leaderd_core::spread::PRESENCE_PREFIX;
use leaderd_core::{read_away_note, AWAY_PREFIX};
use leaderd_store::{Connection, ElectionRow};

/// Prints the table (or JSON) on stdout and the notes on stderr.
pub async fn run(mut conn: Connection, json: bool, replicas: bool) -> anyhow::Result<()> {
    // The spread's presence rows are not elections.
    let (presence, rows): (Vec<_>, Vec<_>) = conn
        .elections("")
        .await
        .context("cannot read service_leader_lock")?
        .into_iter()
        .partition(|r| r.name.starts_with(PRESENCE_PREFIX));
    if replicas {
        return print_replicas(&live_replicas(&presence), json);
    }
    let old = without_presence(&presence, &rows);
    let galera = conn.galera_node().map(str::to_owned);
    let fence = conn
        .fence_status()
        .await
        .context("cannot tell whether leaderd_fence is installed")?
        .as_str();
    if json {
        let list: Vec<_> = rows
            .iter()
            .map(|r| {
                let holder = r.live_holder();
                serde_json::json!({
                    "election": r.name,
                    "holder": holder,
                    "leader_address": r.live_address(),
                    "token": r.token,
                    "lease_remaining_ms": if holder.is_some() { r.remaining_us / 1000 } else { 0 },
                    "successor": turn_of(r, &presence).map(|t| serde_json::json!({
                        "replica": t.replica,
                        "turn_remaining_ms": t.left_ms,
                    })),
                    "fence": fence,
                    "holder_predates_presence": holder.is_some_and(|h| old.contains(&h)),
                    "galera_node": galera,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        println!(
            "{:<30} {:<30} {:>20} {:>12}  ADDRESS",
            "ELECTION", "HOLDER", "TOKEN", "REMAINING"
        );
        for r in &rows {
            let (holder, remaining): (std::borrow::Cow<'_, str>, String) =
                match (r.live_holder(), &r.holder) {
                    (Some(h), _) => (h.into(), format!("{}ms", r.remaining_us / 1000)),
                    (None, Some(_)) => ("(expired)".into(), "-".to_owned()),
                    (None, None) => match turn_of(r, &presence) {
                        Some(t) => (
                            format!(
                                "(free, next: {})",
                                t.replica.unwrap_or("a replica not live")
                            )
                            .into(),
                            format!("{}ms", t.left_ms),
                        ),
                        None => ("(free)".into(), "-".to_owned()),
                    },
                };
            // Last: an address may be long, and the columns before it
            // stay aligned.
            println!(
                "{:<30} {:<30} {:>20} {:>12}  {}",
                printable(&r.name),
                printable(&holder),
                r.token,
                remaining,
                printable(r.live_address().unwrap_or("-"))
            );
        }
        // Beside the table, not in it: stdout stays one line per election.
        eprintln!("replicas: {}", summary(&live_replicas(&presence)));
        eprintln!("fenced writes (docs/integrating.md, \"Fenced writes\"): {fence}");
        if let Some(node) = &galera {
            eprintln!(
                "database: MariaDB Galera, node {} (docs/databases.md, \"Galera clusters\")",
                printable(node)
            );
        }
    }
    if !old.is_empty() {
        eprintln!(
            "holders without a presence row (a leaderd older than named successors, perhaps \
             older than fenced writes: upgrade them before apps fence, docs/security.md): {}",
            printable(&old.join(", "))
        );
    }
    Ok(())
}

/// Text from the table as a terminal may show it: whoever may write a row
/// chooses its name, holder and address, and a control character there
/// (an escape sequence, a carriage return) would move the cursor, retitle
/// the window or forge a line of the table. Each is shown escaped
/// (`\u{1b}`, `\r`), as `--json` shows it.
pub(crate) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.chars().any(char::is_control) {
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    } else {
        text.into()
    }
}

/// A live replica as its rows show it: its id, and why it does not
/// compete (with what was left of a hold or drain at its row's last
/// renewal) when it keeps an away row.
#[derive(Debug, PartialEq, Eq)]
struct Replica<'a> {
    id: &'a str,
    away: Option<(&'a str, Option<Duration>)>,
}

/// Every replica with a live presence or away row, by id, once each (its
/// away row first: a replica held in all its elections may still keep a
/// presence row).
fn live_replicas(rows: &[ElectionRow]) -> Vec<Replica<'_>> {
    let mut seen: BTreeMap<&str, Option<(&str, Option<Duration>)>> = BTreeMap::new();
    for r in rows {
        let Some(id) = r.live_holder() else {
            continue;
        };
        if r.name.starts_with(AWAY_PREFIX) {
            let note = r.live_address().unwrap_or("not competing");
            seen.insert(id, Some(read_away_note(note)));
        } else {
            seen.entry(id).or_insert(None);
        }
    }
    seen.into_iter()
        .map(|(id, away)| Replica { id, away })
        .collect()
}

/// `58 min`, `1 h 5 min`, `45 s`: what is left of a hold, as on-call reads it.
fn left(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        3600.. => format!("{} h {} min", s / 3600, s % 3600 / 60),
        60.. => format!("{} min", s / 60),
        _ => format!("{s} s"),
    }
}

/// One replica as the summary line shows it: `b held, 58 min left`.
fn describe(r: &Replica<'_>) -> String {
    match r.away {
        None => format!("{} competing", printable(r.id)),
        Some((why, None)) => format!("{} {}", printable(r.id), printable(why)),
        Some((why, Some(d))) => format!("{} {}, {} left", printable(r.id), printable(why), left(d)),
    }
}

/// The replicas in one line.
fn summary(replicas: &[Replica<'_>]) -> String {
    if replicas.is_empty() {
        return "none live (no daemon of this version runs on this table)".into();
    }
    replicas.iter().map(describe).collect::<Vec<_>>().join("; ")
}

/// `--replicas`: one line per replica, or JSON.
fn print_replicas(replicas: &[Replica<'_>], json: bool) -> anyhow::Result<()> {
    if json {
        let list: Vec<_> = replicas
            .iter()
            .map(|r| {
                serde_json::json!({
                    "replica": r.id,
                    "competing": r.away.is_none(),
                    "not_competing": r.away.map(|(why, _)| why),
                    "hold_remaining_ms": r.away.and_then(|(_, d)| d).map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<30} {:<10} {:<16} LEFT",
        "REPLICA", "COMPETING", "WHY NOT"
    );
    for r in replicas {
        let (competing, why, remaining) = match r.away {
            None => ("yes", "-".into(), "-".to_owned()),
            Some((why, d)) => ("no", printable(why), d.map_or("-".to_owned(), left)),
        };
        println!(
            "{:<30} {:<10} {:<16} {}",
            printable(r.id),
            competing,
            why,
            remaining
        );
    }
    Ok(())
}

/// A released row's named successor, while only it may take the row.
#[derive(Debug, PartialEq, Eq)]
struct Turn<'a> {
    /// Its id, from its presence or away row; `None` when it keeps no live
    /// one (it stopped, or stopped competing a moment ago: the presence
    /// row goes at once, the away row comes at the next round).
    replica: Option<&'a str>,
    /// What is left of its turn, by the database's clock.
    left_ms: i64,
}

/// Whose turn a free row `r` waits for, if its release named a successor
/// whose window still runs: the row is free, yet until then no other
/// replica may take it, which on-call must not read as "anyone may".
fn turn_of<'a>(r: &ElectionRow, presence: &'a [ElectionRow]) -> Option<Turn<'a>> {
    let named = r
        .successor
        .as_deref()
        .filter(|_| r.holder.is_none() && r.remaining_us > 0)?;
    let replica = presence
        .iter()
        .find(|p| p.live_holder().is_some() && p.instance.as_deref() == Some(named))
        .and_then(ElectionRow::live_holder);
    Some(Turn {
        replica,
        // Rounded up: a turn with 0.4 ms left has not ended.
        left_ms: (r.remaining_us + 999) / 1000,
    })
}

/// The live holders of `elections` that hold no live row of `presence`,
/// by id, sorted and once each.
fn without_presence<'a>(presence: &[ElectionRow], elections: &'a [ElectionRow]) -> Vec<&'a str> {
    let present: Vec<&str> = presence
        .iter()
        .filter_map(ElectionRow::live_holder)
        .collect();
    let mut old: Vec<&str> = elections
        .iter()
        .filter_map(ElectionRow::live_holder)
        .filter(|h| !present.contains(h))
        .collect();
    old.sort_unstable();
    old.dedup();
    old
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::row;

    #[test]
    fn replicas_are_listed_once_with_why_they_do_not_compete() {
        let mut held = row("leaderd-presence/away/g/slot-0", Some("b"), 500);
        held.address = Some("held 3480000".into());
        let mut unhealthy = row("leaderd-presence/away/g/slot-1", Some("c"), 500);
        unhealthy.address = Some("app_unhealthy".into());
        let rows = [
            row("leaderd-presence/g/slot-0", Some("a"), 500),
            // Held in every election, yet present: its away row counts.
            row("leaderd-presence/g/slot-1", Some("b"), 500),
            held,
            unhealthy,
            // Gone: its rows expired.
            row("leaderd-presence/away/g/slot-2", Some("d"), -5),
        ];
        let replicas = live_replicas(&rows);
        assert_eq!(
            summary(&replicas),
            "a competing; b held, 58 min left; c app_unhealthy"
        );
        assert_eq!(left(Duration::from_secs(3_900)), "1 h 5 min");
        assert_eq!(left(Duration::from_millis(45_900)), "45 s");
        assert_eq!(
            summary(&[]),
            "none live (no daemon of this version runs on this table)"
        );
    }

    #[test]
    fn a_released_row_names_whose_turn_it_is_while_it_runs() {
        let presence = [
            row("leaderd-presence/g/slot-0", Some("a"), 500),
            row("leaderd-presence/away/g/slot-1", Some("b"), 500),
            // Expired: not who it names.
            row("leaderd-presence/g/slot-2", Some("c"), -5),
        ];
        let mut released = row("jobs", None, 640_200);
        released.successor = Some("0/b".into());
        assert_eq!(
            turn_of(&released, &presence),
            Some(Turn {
                replica: Some("b"),
                left_ms: 641
            })
        );
        released.successor = Some("0/c".into());
        assert_eq!(turn_of(&released, &presence).unwrap().replica, None);
        // Its turn is over, or nobody was named, or it is held again.
        released.remaining_us = 0;
        assert_eq!(turn_of(&released, &presence), None);
        let mut unnamed = row("jobs", None, 640_000);
        unnamed.successor = None;
        assert_eq!(turn_of(&unnamed, &presence), None);
        let mut held = row("jobs", Some("a"), 640_000);
        held.successor = Some("0/b".into());
        assert_eq!(turn_of(&held, &presence), None);
    }

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(printable("jobs"), "jobs");
        assert_eq!(
            printable("a\u{1b}[2J\u{1b}]0;title\u{7}b\r\nfake  row\u{9b}"),
            "a\\u{1b}[2J\\u{1b}]0;title\\u{7}b\\r\\nfake  row\\u{9b}"
        );
    }

    #[test]
    fn holders_without_a_live_presence_row_are_named_once() {
        let elections = [
            row("jobs", Some("old"), 500),
            row("mail", Some("old"), 500),
            row("reports", Some("new"), 500),
            row("spent", Some("gone"), -5),
            row("free", None, 0),
        ];
        let presence = [
            row("leaderd-presence/g/slot-0", Some("new"), 500),
            row("leaderd-presence/g/slot-1", Some("old"), -1),
        ];
        assert_eq!(without_presence(&presence, &elections), ["old"]);
    }
}
