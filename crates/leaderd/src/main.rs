//! `leaderd`: the leader-election sidecar binary.
//!
//! This file is the edge: it parses the command line, loads and validates the
//! configuration (exit 2 on any problem), sets up logging, and runs one of
//! `run`, `migrate` or `status`. Exit codes: 0 clean, 1 fatal, 2 usage or
//! configuration. It wires the parts: `runtime` (the elections), `http` (the
//! HTTP edge) and `outputs` (flag file, metrics, logs, `exec`).

mod cli;
mod clock;
mod heap;
mod history;
mod http;
mod http_client;
mod maths;
mod outputs;
mod runtime;
mod settings;
mod signals;
mod status;
#[cfg(test)]
mod testing;

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use leaderd_store::Connection;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::{Cli, Command};
use crate::settings::{ProcessEnv, Settings};

/// How long the exit waits for the log writer (see `logging`); with the
/// shutdown's own budgets, a SIGTERM still ends the process within 2 s.
const EXIT_FLUSH: Duration = Duration::from_millis(100);

fn main() -> ExitCode {
    heap::tune();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(2),
            };
        }
    };
    let config = cli.config();
    match &cli.command {
        Some(Command::Release(release)) => {
            return http::release::run(&config, release.hold.as_deref())
        }
        Some(Command::Resume(_)) => return http::release::resume(&config),
        _ => {}
    }
    let settings = match Settings::load(&config, &ProcessEnv) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("leaderd: {e}");
            return ExitCode::from(2);
        }
    };
    let commands = match &cli.command {
        Some(Command::Exec(exec)) => match outputs::exec::commands(&settings, &exec.command) {
            Ok(commands) => Some(commands),
            Err(e) => {
                eprintln!("leaderd: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let mut settings = settings;
    if commands.is_none() && !settings.exec.is_empty() {
        settings
            .warnings
            .push("`exec` is set, but commands run only under `leaderd exec`; ignoring it".into());
    }
    outputs::logging::init(settings.log_format);
    for w in &settings.warnings {
        warn!("{w}");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command.unwrap_or(Command::Run(cli.run)) {
            Command::Run(_) | Command::Exec(_) => run(settings, commands).await,
            Command::Migrate(_) => migrate(settings).await.map(|()| 0),
            Command::Status { json, replicas, .. } => {
                let conn = connect(&settings).await?;
                status::run(conn, json, replicas).await.map(|()| 0)
            }
            Command::History(args) => {
                let conn = connect(&settings).await?;
                history::run(conn, &args).await
            }
            Command::Release(_) | Command::Resume(_) => {
                unreachable!("handled before the runtime starts")
            }
        }
    });
    // Do not wait for stray blocking tasks (a hung connect) at exit.
    runtime.shutdown_timeout(Duration::from_millis(100));
    let code = match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            error!("{}", said_once(&e));
            ExitCode::FAILURE
        }
    };
    // The last lines, unless stderr is stalled: the exit is not held up.
    outputs::logging::flush(EXIT_FLUSH);
    code
}

/// An error and its causes in one line, each said once: a library's
/// message often carries its source's (a TLS handshake's, the server's
/// own), which the chain would print again. A message that another in the
/// chain already holds is left out.
fn said_once(e: &anyhow::Error) -> String {
    let all: Vec<String> = e.chain().map(ToString::to_string).collect();
    let said_elsewhere = |i: usize| {
        all.iter().enumerate().any(|(j, other)| {
            j != i && other.contains(all[i].as_str()) && (other.len() > all[i].len() || j < i)
        })
    };
    (0..all.len())
        .filter(|&i| !said_elsewhere(i))
        .map(|i| all[i].as_str())
        .collect::<Vec<_>>()
        .join(": ")
}

/// Raises the soft limit on open files to the hard one: every HTTP
/// connection (up to `http::server::MAX_CONNECTIONS`) holds a descriptor, and
/// running out would also fail the flag file and the database connections.
fn raise_open_files_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            warn!(error = %e, "cannot raise the open-files limit");
        }
    }
}

/// Runs the daemon; with `commands` (one per election), as `exec` (see
/// `exec.rs`). Returns the exit code: 0, or under `exec` the commands' (see
/// `outputs::exec::supervise_all`).
async fn run(settings: Settings, commands: Option<Vec<Vec<OsString>>>) -> anyhow::Result<u8> {
    raise_open_files_limit();
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("cannot listen on {}", settings.listen))?;
    // `POST /release` only on loopback (see `http`).
    let release_listener = if settings.release_listen == settings.listen {
        None
    } else {
        let addr = settings.release_listen;
        let l = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("cannot listen on {addr} for POST /release (set release_listen)")
        })?;
        Some(l)
    };
    let shutdown = CancellationToken::new();
    signals::spawn_handler(shutdown.clone()).context("cannot install signal handlers")?;
    let each = settings.each_election();
    let daemon = Arc::new(runtime::daemon::Daemon::new(&each));
    info!(
        elections = %settings.elections.join(","),
        spread = settings.spread,
        id = %settings.id,
        database = %settings.database,
        listen = %listener.local_addr().map_or_else(|_| settings.listen.to_string(), |a| a.to_string()),
        release_listen = %settings.release_listen,
        timing = %settings.timing,
        "leaderd starting"
    );
    let http_stop = CancellationToken::new();
    let server = {
        let stop = http_stop.clone();
        let release_at = match &release_listener {
            None => http::ReleaseAt::Here,
            Some(_) => http::ReleaseAt::Elsewhere(settings.release_listen),
        };
        let app = http::router(daemon.clone(), release_at);
        tokio::spawn(http::server::serve(listener, app, stop))
    };
    if let Some(l) = release_listener {
        let app = http::release_router(daemon.clone());
        tokio::spawn(http::server::serve(l, app, http_stop.clone()));
    }
    if let Some(check) = settings.app_health.clone() {
        tokio::spawn(runtime::app_health::watch(
            daemon.clone(),
            check,
            settings.app_health_failures,
            shutdown.clone(),
        ));
    }
    // One connection for all; one loop per election, each releasing its
    // own row at shutdown.
    let link = runtime::link::Link::start(
        runtime::connector::Connector::new(
            settings.database.clone(),
            settings.migrate,
            settings.timing,
        ),
        daemon.all().to_vec(),
        daemon.reach().clone(),
    );
    // The loops stop with the daemon: one waiter tells them all.
    tokio::spawn(daemon.clone().stop_when(shutdown.clone()));
    // The loops' first attempts wait until this replica has joined.
    let begin = tokio::spawn(runtime::presence::begin(
        daemon.clone(),
        link.clone(),
        settings.timing.heartbeat(),
        shutdown.clone(),
    ));
    let loops: Vec<_> = daemon
        .all()
        .iter()
        .zip(&each)
        .map(|(shared, one)| {
            let (shared, shutdown, link) = (shared.clone(), shutdown.clone(), link.clone());
            tokio::spawn(runtime::election::start(shared, one, link).run(shutdown))
        })
        .collect();
    // Each loop took what it needs of its election's settings.
    drop(each);
    let waiter = tokio::spawn(runtime::wakeups::wait_for_releases(
        settings.database.clone(),
        daemon.clone(),
        settings.timing.heartbeat(),
        shutdown.clone(),
    ));
    tokio::spawn(heap::give_back(shutdown.clone()));
    // Kept until the exit (see below).
    let sessions = link.clone();
    let presence = tokio::spawn(runtime::presence::run(
        daemon.clone(),
        settings.clone(),
        link,
        shutdown.clone(),
    ));
    let code = match commands {
        None => None,
        // Here, on the main thread: see `exec` on the parent-death signal.
        Some(commands) => Some(
            outputs::exec::supervise_all(
                daemon.all(),
                commands,
                &settings.secret_env,
                settings.stop_grace,
                shutdown.clone(),
            )
            .await,
        ),
    };
    let mut failed = None;
    // One after another: `join_all` kept a node of 80 bytes per election
    // for the daemon's life.
    let each_ended = async {
        let mut ended = Vec::with_capacity(loops.len());
        for one in loops {
            ended.push(one.await);
        }
        ended
    };
    let (loops, _) = tokio::join!(each_ended, presence);
    let released = loops.iter().any(|r| matches!(r, Ok(true)));
    // The sessions' end would compete with the successor's takeover.
    tokio::time::sleep(leaderd_core::successor::exit_linger(
        settings.timing,
        released,
    ))
    .await;
    drop(sessions);
    waiter.abort();
    for election in loops {
        if let Err(e) = election {
            failed = Some(e);
        }
    }
    if let Some(e) = failed {
        return Err(e).context("an election loop failed");
    }
    // Ended with the shutdown, if not before.
    if let Err(e) = begin.await {
        return Err(e).context("the wait for this replica to join failed");
    }
    let code = code.unwrap_or(0);
    // Leadership is already given up and the row released; stop serving.
    http_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_millis(300), server).await;
    info!(exit_code = code, "stopped");
    Ok(code)
}

async fn connect(settings: &Settings) -> anyhow::Result<Connection> {
    let url = settings.database.resolve().map_err(anyhow::Error::msg)?;
    tokio::time::timeout(Duration::from_secs(10), Connection::connect(&url))
        .await
        .with_context(|| format!("timed out connecting to {url}"))?
        .with_context(|| format!("cannot connect to {url}"))
}

async fn migrate(settings: Settings) -> anyhow::Result<()> {
    let conn = connect(&settings).await?;
    let open = conn.others_may_create().to_vec();
    let result = conn.migrate().await.context("migration failed")?;
    info!(result = ?result, "service_leader_lock is ready");
    runtime::connector::warn_open_schema(&open);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_is_said_once() {
        let tls = "error performing TLS handshake: invalid peer certificate";
        let e = anyhow::anyhow!(tls.to_owned())
            .context(format!("cannot connect to the database: {tls}"))
            .context("cannot connect to postgres://h/db");
        assert_eq!(
            said_once(&e),
            format!("cannot connect to postgres://h/db: cannot connect to the database: {tls}")
        );
        let e =
            anyhow::anyhow!("migration failed: CREATE command denied").context("migration failed");
        assert_eq!(said_once(&e), "migration failed: CREATE command denied");
        let e = anyhow::anyhow!("refused").context("cannot read service_leader_lock");
        assert_eq!(said_once(&e), "cannot read service_leader_lock: refused");
    }
}
