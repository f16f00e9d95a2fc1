//! `leaderd release` and `leaderd resume`: ask the daemon on this host (at
//! its release address) to step down, or to end a hold or a drain, for a
//! `preStop` hook in an image without curl and for an operator. Exit 0
//! done, 3 nothing to do (not the leader; nothing held), 1 no daemon (or
//! any other failure), 2 bad input (an election the daemon does not run,
//! too). With `--election NAME` one election, else every one the daemon
//! runs (exit 0 when any was released or resumed).

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::ConfigArgs;
use crate::http_client;
use crate::settings::{release_target, ProcessEnv};

/// Longer than any release takes: the daemon bounds its own to about 1 s,
/// plus, under `exec`, up to a ttl waiting for the command to stop.
const TIMEOUT: Duration = Duration::from_secs(600 + 5);

/// The longest reply read: without `--election`, a `/leader` body for
/// every election (about 300 bytes each, 9 MB at 30,000).
const REPLY_LIMIT: usize = 64 << 20;

/// `leaderd release [--hold D]`.
pub fn run(config: &ConfigArgs, hold: Option<&str>) -> ExitCode {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Err(code) = one_election(config, "release", &mut query) {
        return code;
    }
    if let Some(hold) = hold {
        match humantime::parse_duration(hold) {
            Ok(d) if d <= Duration::from_secs(3600) => {
                query.append_pair("hold", &format!("{}ms", d.as_millis()));
            }
            _ => {
                eprintln!("leaderd: --hold {hold:?}: expected a duration of at most 1h, e.g. 30s");
                return ExitCode::from(2);
            }
        }
    }
    ask(
        config,
        &format!("/release?{}", query.finish()),
        "not the leader",
    )
}

/// `leaderd resume`.
pub fn resume(config: &ConfigArgs) -> ExitCode {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Err(code) = one_election(config, "resume", &mut query) {
        return code;
    }
    ask(
        config,
        &format!("/resume?{}", query.finish()),
        "nothing to resume (not held, not draining)",
    )
}

/// `--election`, at most once, into the query.
fn one_election(
    config: &ConfigArgs,
    what: &str,
    query: &mut url::form_urlencoded::Serializer<'_, String>,
) -> Result<(), ExitCode> {
    match config.election.as_slice() {
        [] => Ok(()),
        [one] => {
            query.append_pair("election", one);
            Ok(())
        }
        _ => {
            eprintln!("leaderd: {what} takes one --election (none: every election)");
            Err(ExitCode::from(2))
        }
    }
}

/// Sends `POST target` to the daemon's release address; 409 means
/// `nothing` (exit 3).
fn ask(config: &ConfigArgs, target: &str, nothing: &str) -> ExitCode {
    // `release_listen`, as the daemon derives it: loopback always.
    let listen = match release_target(config, &ProcessEnv) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("leaderd: {e}");
            return ExitCode::from(2);
        }
    };
    let reply = http_client::request_blocking(
        listen,
        "POST",
        target,
        &[(crate::http::RELEASE_HEADER, "1")],
        TIMEOUT,
        REPLY_LIMIT,
    );
    if let Some(warning) = reply.as_ref().ok().and_then(|r| r.warning.as_deref()) {
        eprintln!("leaderd: warning: {warning}");
    }
    match reply {
        Ok(r) if r.status == 200 => {
            println!("{}", r.body.trim());
            ExitCode::SUCCESS
        }
        Ok(r) if r.status == 409 => {
            eprintln!("leaderd: {nothing}: {}", r.body.trim());
            ExitCode::from(3)
        }
        // An election the daemon does not run (404 naming it), or a
        // request it could not take: what was asked for is wrong, not
        // the daemon.
        Ok(r) if matches!(r.status, 400 | 404) => {
            eprintln!("leaderd: {}", refusal(&r.body));
            ExitCode::from(2)
        }
        Ok(r) => {
            eprintln!(
                "leaderd: the daemon at {listen} answered {}: {}",
                r.status,
                r.body.trim()
            );
            ExitCode::FAILURE
        }
        Err(e @ http_client::ClientError::Connect { .. }) => {
            eprintln!("leaderd: no daemon at {listen}: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("leaderd: the daemon at {listen} did not answer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The reason in a refusal's body (`{"error": "..."}`), else the body.
fn refusal(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.trim().to_owned())
}
