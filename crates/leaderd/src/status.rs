//! `leaderd status`: every election in the table, one line each (or JSON),
//! and beside it what an operator must know before apps fence: whether the
//! fence is installed, and which holders run a leaderd too old to tell.
//!
//! A holder that keeps no presence row runs a release from before named
//! successors (every daemon since keeps one while it holds anything); such
//! a release may also predate fenced writes, whose renewals a fenced
//! transaction blocks: that leader loses its lease while apps fence. So
//! those holders are named, and apps should not fence until none is left.

use anyhow::Context;
use leaderd_core::spread::PRESENCE_PREFIX;
use leaderd_store::{Connection, ElectionRow};

/// Prints the table (or JSON) on stdout and the notes on stderr.
pub async fn run(mut conn: Connection, json: bool) -> anyhow::Result<()> {
    // The spread's presence rows are not elections.
    let (presence, rows): (Vec<_>, Vec<_>) = conn
        .elections("")
        .await
        .context("cannot read service_leader_lock")?
        .into_iter()
        .partition(|r| r.name.starts_with(PRESENCE_PREFIX));
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
            let (holder, remaining) = match (r.live_holder(), &r.holder) {
                (Some(h), _) => (h, format!("{}ms", r.remaining_us / 1000)),
                (None, Some(_)) => ("(expired)", "-".to_owned()),
                (None, None) => ("(free)", "-".to_owned()),
            };
            // Last: an address may be long, and the columns before it
            // stay aligned.
            println!(
                "{:<30} {:<30} {:>20} {:>12}  {}",
                printable(&r.name),
                printable(holder),
                r.token,
                remaining,
                printable(r.live_address().unwrap_or("-"))
            );
        }
        // Beside the table, not in it: stdout stays one line per election.
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
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
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

    fn row(name: &str, holder: Option<&str>, remaining_us: i64) -> ElectionRow {
        ElectionRow {
            name: name.to_owned(),
            holder: holder.map(str::to_owned),
            token: 1,
            remaining_us,
            instance: holder.map(|h| format!("0/{h}")),
            held_us: 0,
            address: None,
        }
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
