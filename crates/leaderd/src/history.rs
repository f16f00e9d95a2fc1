//! `leaderd history`: the record of terms the database keeps (one entry per
//! change of holder, written by its own triggers, whichever daemon made the
//! change), oldest first, one line each (or JSON). What an incident review
//! asks: which replica held token N, and why leadership moved when it did.

use anyhow::Context;
use leaderd_store::{Connection, Term};

use crate::cli::HistoryArgs;
use crate::status::printable;

/// Prints the terms on stdout; 0 when the record is there (even empty), an
/// error naming the cause when it is not installed or cannot be read.
pub async fn run(mut conn: Connection, args: &HistoryArgs) -> anyhow::Result<u8> {
    let terms = conn
        .history(args.election.as_deref(), i64::from(args.limit))
        .await
        .context(
            "cannot read service_leader_history (the daemon's database user needs SELECT on \
             it: docs/operations.md, \"A record of terms\")",
        )?;
    let Some(mut terms) = terms else {
        anyhow::bail!(
            "this database keeps no record of terms: service_leader_history is missing. \
             `leaderd migrate`, run once as the lock table's owner, installs it; terms are \
             recorded from then on"
        );
    };
    // Newest last, as a log reads.
    terms.reverse();
    if args.json {
        let list: Vec<_> = terms.iter().map(as_json).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    println!(
        "{:<24} {:>20} {:<24} {:<27} {:<28} {:<27} {:<9} ADDRESS",
        "ELECTION", "TOKEN", "HOLDER", "BEGAN (UTC)", "HOW", "ENDED (UTC)", "END"
    );
    for t in &terms {
        println!(
            "{:<24} {:>20} {:<24} {:<27} {:<28} {:<27} {:<9} {}",
            printable(&t.election),
            t.token,
            printable(t.holder.as_deref().unwrap_or("-")),
            t.began_at.as_deref().unwrap_or("(an earlier boot)"),
            how(t),
            t.ended_at.as_deref().unwrap_or("-"),
            t.ended_how.as_deref().unwrap_or("(holding)"),
            printable(t.address.as_deref().unwrap_or("-")),
        );
    }
    if terms.is_empty() {
        eprintln!(
            "no terms recorded{}: nobody has taken the lease since the record was installed",
            args.election
                .as_deref()
                .map(|e| format!(" for election {}", printable(e)))
                .unwrap_or_default()
        );
    }
    Ok(0)
}

/// How a term began, and whether an earlier version's daemon took it.
fn how(t: &Term) -> String {
    if t.earlier_version {
        format!("{} (earlier version)", t.began_how)
    } else {
        t.began_how.clone()
    }
}

fn as_json(t: &Term) -> serde_json::Value {
    serde_json::json!({
        "election": t.election,
        "token": t.token,
        "holder": t.holder,
        "instance": t.instance,
        "address": t.address,
        "began_at": t.began_at,
        "began_ago_ms": t.began_ago_us.map(|us| us / 1000),
        "began_how": t.began_how,
        "earlier_version": t.earlier_version,
        "ended_at": t.ended_at,
        "ended_ago_ms": t.ended_ago_us.map(|us| us / 1000),
        "ended_how": t.ended_how,
    })
}
