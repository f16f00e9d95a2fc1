//! `leaderd release`: asks the daemon on this host (at `listen`) to step
//! down, for a `preStop` hook in an image without curl. Exit 0 released, 3
//! not leader, 1 no daemon (or any other failure), 2 bad input. With
//! `--election NAME` one election steps down, else every one this daemon
//! runs (exit 0 when any led).

use std::process::ExitCode;
use std::time::Duration;

use crate::cli::ConfigArgs;
use crate::http_client;
use crate::settings::{release_target, ProcessEnv};

/// Longer than any release takes: the daemon bounds its own to about 1 s,
/// plus, under `exec`, up to a ttl waiting for the command to stop.
const TIMEOUT: Duration = Duration::from_secs(600 + 5);

pub fn run(config: &ConfigArgs, hold: Option<&str>) -> ExitCode {
    // `release_listen`, as the daemon derives it: loopback always.
    let listen = match release_target(config, &ProcessEnv) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("leaderd: {e}");
            return ExitCode::from(2);
        }
    };
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    match config.election.as_slice() {
        [] => {}
        [one] => {
            query.append_pair("election", one);
        }
        _ => {
            eprintln!("leaderd: release takes one --election (none releases them all)");
            return ExitCode::from(2);
        }
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
    let target = format!("/release?{}", query.finish());
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("leaderd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let reply = runtime.block_on(http_client::request(
        &listen.ip().to_string(),
        listen.port(),
        "POST",
        &target,
        &[(crate::http::RELEASE_HEADER, "1")],
        TIMEOUT,
    ));
    match reply {
        Ok(r) if r.status == 200 => {
            println!("{}", r.body.trim());
            ExitCode::SUCCESS
        }
        Ok(r) if r.status == 409 => {
            eprintln!("leaderd: not the leader: {}", r.body.trim());
            ExitCode::from(3)
        }
        Ok(r) => {
            eprintln!(
                "leaderd: the daemon at {listen} answered {}: {}",
                r.status,
                r.body.trim()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("leaderd: no daemon at {listen}: {e}");
            ExitCode::FAILURE
        }
    }
}
