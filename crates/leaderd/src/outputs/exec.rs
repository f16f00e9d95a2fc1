//! `leaderd exec -- CMD`: runs CMD only while this replica leads.
//!
//! With several elections each gets its own command (`--exec NAME=CMD`, or
//! the one after `--` for every election without one), supervised on its
//! own lease exactly as a single one is; see [`supervise_all`].
//!
//! This is the adapter around [`ChildTimer`], which decides when a child
//! starts, gets SIGTERM and gets SIGKILL; here the child is spawned (in its
//! own process group, with `LEADERD_ELECTION`, `LEADERD_ID` and
//! `LEADERD_TOKEN`), signalled and reaped. The election loop does not
//! release the row on purpose while a child is alive (see
//! [`Shared::set_child_running`]), so a successor never overlaps it.
//!
//! The command counts as running until its whole process group is gone:
//! leaderd is a child subreaper, so what the command started in the
//! background is re-parented here when the command exits, signalled with the
//! group, and reaped before the gate opens.
//!
//! The child also gets a parent-death signal (SIGKILL), so it dies with
//! leaderd even when leaderd is killed. Linux sends it when the *thread*
//! that forked the child exits, so children are forked on the main thread,
//! which lives as long as the process: [`supervise`] must be awaited on the
//! runtime's `block_on` future, never spawned onto a pool thread.

use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::{ChildAction, ChildTimer};
use rustix::process::{kill_process_group, Pid, Signal};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::clock::{boot_now, BootTimer};
use crate::runtime::shared::Shared;
use crate::settings::Settings;

/// What ended a run of `exec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The child ended the run, or was running at shutdown: its status.
    Child(ExitStatus),
    /// The command could not be started: 127 not found, else 126, as shells
    /// answer.
    NotStarted(u8),
    /// Shut down with no child running.
    Idle,
    /// The command could not be waited for.
    Failed,
}

impl Outcome {
    /// The exit code leaderd exits with: the child's, 128 + signal when it
    /// was killed by one.
    pub fn code(self) -> u8 {
        use std::os::unix::process::ExitStatusExt;
        match self {
            Outcome::Child(s) => match (s.code(), s.signal()) {
                (Some(c), _) => u8::try_from(c).unwrap_or(1),
                (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
                (None, None) => 1,
            },
            Outcome::NotStarted(code) => code,
            Outcome::Idle => 0,
            Outcome::Failed => 1,
        }
    }
}

/// Every election's command, in the configured order: its own (`exec`
/// setting) or else `default` (the words after `--`). `Err` names the
/// elections left without one.
pub fn commands(settings: &Settings, default: &[OsString]) -> Result<Vec<Vec<OsString>>, String> {
    let mut missing = Vec::new();
    let commands = settings
        .elections
        .iter()
        .map(|election| {
            let own = settings.exec.iter().find(|(name, _)| name == election);
            match own {
                Some((_, words)) => words.iter().map(OsString::from).collect(),
                None => {
                    if default.is_empty() {
                        missing.push(election.as_str());
                    }
                    default.to_vec()
                }
            }
        })
        .collect();
    match missing.as_slice() {
        [] => Ok(commands),
        [one] if settings.elections.len() == 1 => Err(format!(
            "exec needs a command: `leaderd exec -- CMD [ARGS…]` (or --exec {one}=CMD)"
        )),
        _ => Err(format!(
            "exec needs a command for every election, and none is given for: {} \
             (give --exec NAME=CMD for each, or one command after `--` for all)",
            missing.join(", ")
        )),
    }
}

/// Supervises every election's command at once (see [`supervise`]); awaited
/// on the main thread as that is. The exit code: that of the command that
/// ended the run (exited by itself or could not start; the first in the
/// configured order should several), else the first non-zero one (commands
/// stopped by a signal to leaderd), else 0.
pub async fn supervise_all(
    elections: &[Arc<Shared>],
    commands: Vec<Vec<OsString>>,
    hidden_env: &[&str],
    stop_grace: Duration,
    shutdown: CancellationToken,
) -> u8 {
    let runs = elections.iter().zip(commands).map(|(shared, command)| {
        supervise(
            shared.clone(),
            command,
            hidden_env,
            stop_grace,
            shutdown.clone(),
        )
    });
    // Polled here, on this task: never spawned (see the module docs).
    let ends = futures_util::future::join_all(runs).await;
    exit_code(&ends)
}

/// The run's exit code from every command's end (see [`supervise_all`]).
fn exit_code(ends: &[End]) -> u8 {
    let ended = ends.iter().find(|e| e.ended_run);
    ended
        .map(|e| e.outcome.code())
        .or_else(|| ends.iter().map(|e| e.outcome.code()).find(|&c| c != 0))
        .unwrap_or(0)
}

/// How one command's supervision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct End {
    pub outcome: Outcome,
    /// This command ended the run (exited by itself, could not start or be
    /// waited for), rather than being stopped by it.
    pub ended_run: bool,
}

/// How often what is left of a command's process group is looked at, once
/// the command's own process has exited.
const GROUP_POLL: Duration = Duration::from_millis(10);

/// Starts and stops `command` with leadership until `shutdown`, and until
/// the child is gone. Cancels `shutdown` itself when the child exits by
/// itself (or cannot start), which ends the run. Await it on the main thread
/// (see the module docs).
pub async fn supervise(
    shared: Arc<Shared>,
    command: Vec<OsString>,
    hidden_env: &[&str],
    stop_grace: Duration,
    shutdown: CancellationToken,
) -> End {
    // Processes the command starts are re-parented to leaderd when it exits
    // before them, so that what is left of its group can be stopped and
    // reaped before the row is released.
    if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
        warn!(error = %e, "cannot become a subreaper; processes the command leaves behind are not waited for");
    }
    let mut timer = ChildTimer::new(stop_grace);
    let mut clock = BootTimer::new();
    let mut changes = shared.subscribe();
    let mut running: Option<Running> = None;
    let mut outcome = Outcome::Idle;
    let mut ended_run = false;
    loop {
        if let Some(r) = running.as_ref().filter(|r| r.child.is_none()) {
            if !group_alive(r.pgid) {
                running = None;
                timer.gone();
                shared.set_child_running(false);
            }
        }
        if shutdown.is_cancelled() {
            timer.stop();
            if running.is_none() {
                return End { outcome, ended_run };
            }
        }
        changes.mark_unchanged();
        let action = timer.next(boot_now(), shared.lease_for_child());
        // `lease_for_child` closed the gate in case of a start; reopen it
        // unless a child runs (or is about to).
        let starting = matches!(action, ChildAction::Start { .. });
        shared.set_child_running(starting || running.is_some());
        let until = match action {
            ChildAction::Start { token } => {
                match spawn(&shared, &command, hidden_env, token) {
                    Ok(r) => running = Some(r),
                    Err(code) => {
                        shared.set_child_running(false);
                        timer.exited();
                        timer.gone();
                        outcome = Outcome::NotStarted(code);
                        ended_run = true;
                        shutdown.cancel();
                    }
                }
                continue;
            }
            ChildAction::Term => {
                signal(running.as_ref(), Signal::TERM, "SIGTERM");
                continue;
            }
            ChildAction::Kill => {
                signal(running.as_ref(), Signal::KILL, "SIGKILL");
                continue;
            }
            ChildAction::Wait(until) => until,
        };
        let mut wake_at = until;
        if running.as_ref().is_some_and(|r| r.child.is_none()) {
            let poll = boot_now() + GROUP_POLL;
            wake_at = Some(wake_at.map_or(poll, |t| t.min(poll)));
        }
        tokio::select! {
            status = wait(&mut running) => {
                let r = running.as_mut().expect("waited on a child");
                r.child = None;
                let by_itself = timer.exited();
                let status = match status {
                    Ok(s) => s,
                    Err(e) => {
                        // Cannot happen for a child we spawned; stop the run
                        // (its group is stopped like any other) rather than
                        // lose track of one.
                        error!(error = %e, "cannot wait for the command");
                        outcome = Outcome::Failed;
                        ended_run = true;
                        shutdown.cancel();
                        continue;
                    }
                };
                info!(
                    election = %shared.election,
                    token = r.token,
                    pid = r.pgid.as_raw_nonzero().get(),
                    %status,
                    by_itself,
                    at_us = crate::clock::micros(boot_now()),
                    "the command exited"
                );
                if by_itself || shutdown.is_cancelled() {
                    outcome = Outcome::Child(status);
                }
                if by_itself {
                    info!(election = %shared.election, "the command exited by itself; stepping down and exiting");
                    ended_run = true;
                    shutdown.cancel();
                }
            }
            _ = changes.changed() => {}
            () = clock.sleep_until_some(wake_at) => {}
            () = shutdown.cancelled(), if !shutdown.is_cancelled() => {}
        }
    }
}

/// A command and what it was started for.
#[derive(Debug)]
struct Running {
    /// Its own process, until reaped; its group may outlive it.
    child: Option<Child>,
    /// Its process group, led by its own process (so, its pid).
    pgid: Pid,
    token: i64,
}

async fn wait(running: &mut Option<Running>) -> std::io::Result<ExitStatus> {
    match running.as_mut().and_then(|r| r.child.as_mut()) {
        Some(c) => c.wait().await,
        None => std::future::pending().await,
    }
}

/// Reaps members of `pgid` that died after being re-parented here, and says
/// whether any is left. Only called once the group's leader was reaped by
/// tokio: before that, this could take its exit status.
fn group_alive(pgid: Pid) -> bool {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG;
    while let Ok(Some(_)) = waitid(WaitId::Pgid(Some(pgid)), options) {}
    // While any member lives (even unreaped), the group id cannot be reused.
    rustix::process::test_kill_process_group(pgid).is_ok()
}

/// Signals the command's process group (what it started too); a stopped
/// group is continued after SIGTERM so that it can act on it.
fn signal(running: Option<&Running>, sig: Signal, name: &str) {
    let Some(r) = running else { return };
    // Signal first, log after: a blocked log writer must not delay a kill.
    // The group cannot have been reused while any member lives (see
    // `group_alive`), and an empty group is simply not found.
    let sent = kill_process_group(r.pgid, sig);
    if sig == Signal::TERM {
        let _ = kill_process_group(r.pgid, Signal::CONT);
    }
    let pid = r.pgid.as_raw_nonzero().get();
    match sent {
        Ok(()) => info!(token = r.token, pid, signal = name, "stopping the command"),
        Err(e) => warn!(pid, signal = name, error = %e, "cannot signal the command"),
    }
}

/// Starts the command for the term with `token`, without the variables in
/// `hidden_env`; on failure, the exit code a shell would give.
fn spawn(
    shared: &Shared,
    command: &[OsString],
    hidden_env: &[&str],
    token: i64,
) -> Result<Running, u8> {
    let (program, args) = command
        .split_first()
        .expect("`commands` gives every election a non-empty command");
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LEADERD_ELECTION", &*shared.election)
        .env("LEADERD_ID", &*shared.id)
        .env("LEADERD_TOKEN", token.to_string())
        // Its own group: signals reach its children too, and a Ctrl-C in a
        // terminal reaches leaderd only, which stops the child in order.
        .process_group(0)
        // In its own group it must not read the terminal (SIGTTIN).
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // The command needs no password of leaderd's.
    for name in hidden_env {
        cmd.env_remove(name);
    }
    die_with_parent(&mut cmd);
    match cmd.spawn() {
        Ok(child) => {
            let pid = child
                .id()
                .and_then(|id| Pid::from_raw(i32::try_from(id).ok()?))
                .expect("a child just spawned has a pid");
            info!(
                election = %shared.election,
                id = %shared.id,
                token,
                pid = pid.as_raw_nonzero().get(),
                at_us = crate::clock::micros(boot_now()),
                "started the command"
            );
            Ok(Running {
                child: Some(child),
                pgid: pid,
                token,
            })
        }
        Err(e) => {
            error!(command = ?program, error = %e, "cannot start the command");
            Err(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            })
        }
    }
}

/// Sets the parent-death signal in the forked child, before it execs.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs between fork and exec, where only
    // async-signal-safe calls are allowed; it makes two raw system calls
    // (prctl, getppid) and allocates nothing on success.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // leaderd may have died before the prctl: then nobody would
            // kill this child.
            if rustix::process::getppid() != Some(parent) {
                // No allocation here, between fork and exec.
                return Err(std::io::Error::from_raw_os_error(
                    rustix::io::Errno::SRCH.raw_os_error(),
                ));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn settings(argv: &[&str]) -> Settings {
        use clap::Parser;
        let cli =
            crate::cli::Cli::try_parse_from(std::iter::once("leaderd").chain(argv.iter().copied()))
                .unwrap();
        Settings::load(&cli.config(), &crate::settings::ProcessEnv).unwrap()
    }

    fn os(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn each_election_gets_its_own_command_or_the_default() {
        let s = settings(&[
            "exec",
            "--election",
            "a",
            "--election",
            "b",
            "--exec",
            "b=run b",
        ]);
        assert_eq!(
            commands(&s, &os(&["all"])).unwrap(),
            [os(&["all"]), os(&["run", "b"])]
        );
        let msg = commands(&s, &[]).unwrap_err();
        assert!(
            msg.contains("none is given for: a") && msg.contains("--exec NAME=CMD"),
            "{msg}"
        );
        let one = settings(&["--election", "solo"]);
        let msg = commands(&one, &[]).unwrap_err();
        assert!(msg.contains("leaderd exec -- CMD"), "{msg}");
        assert_eq!(commands(&one, &os(&["x"])).unwrap(), [os(&["x"])]);
    }

    #[test]
    fn the_command_that_ended_the_run_gives_the_exit_code() {
        let child = |code: i32| Outcome::Child(ExitStatus::from_raw(code << 8));
        let end = |outcome, ended_run| End { outcome, ended_run };
        // b exited by itself with 0; a was stopped for it (143).
        let stopped = Outcome::Child(ExitStatus::from_raw(15));
        assert_eq!(exit_code(&[end(stopped, false), end(child(0), true)]), 0);
        assert_eq!(exit_code(&[end(child(4), false), end(child(3), true)]), 3);
        // Stopped by a signal to leaderd: the first non-zero status.
        assert_eq!(
            exit_code(&[end(Outcome::Idle, false), end(stopped, false)]),
            143
        );
        assert_eq!(exit_code(&[end(Outcome::Idle, false)]), 0);
        assert_eq!(
            exit_code(&[end(Outcome::NotStarted(127), true), end(stopped, false)]),
            127
        );
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(Outcome::Child(ExitStatus::from_raw(3 << 8)).code(), 3);
        // Killed by SIGTERM (15).
        assert_eq!(Outcome::Child(ExitStatus::from_raw(15)).code(), 143);
        assert_eq!(Outcome::NotStarted(127).code(), 127);
        assert_eq!(Outcome::Idle.code(), 0);
    }
}
