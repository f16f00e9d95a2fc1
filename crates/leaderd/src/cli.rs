//! Command line: subcommands and the flags that override every other source.
//!
//! Flags are kept as raw strings here; `settings` parses and validates them
//! together with the other layers so every error names its key.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "leaderd",
    version,
    about = "Leader-election sidecar: one replica leads, judged by the database's clock.",
    long_about = "Leader-election sidecar. Every replica of an app runs leaderd beside it; they \
                  compete for one row of `service_leader_lock` in the app's database, and each tells \
                  its app whether it leads: GET /leader (200 leader, 503 not), a flag file, metrics."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub config: ConfigArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar daemon in the foreground (the default).
    Run,
    /// Create or upgrade the lock table, then exit.
    Migrate,
    /// Show every election in the table: holder, token, lease remaining.
    Status {
        /// Print JSON instead of one line per election.
        #[arg(long)]
        json: bool,
    },
    /// Run the election as `run` does, and COMMAND only while leading:
    /// started at each gain of leadership, stopped before the lease ends.
    /// Exits with the command's status when it exits by itself.
    Exec {
        /// The command and its arguments, after `--`: every election's,
        /// unless `--exec NAME=CMD` gives one its own.
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<std::ffi::OsString>,
    },
    /// Ask the local daemon (at its release address) to step down: exit 0 released,
    /// 3 not leader, 1 no daemon.
    Release {
        /// Do not attempt again for this long [default: 2 × heartbeat; at most 1h]
        #[arg(long, value_name = "DURATION")]
        hold: Option<String>,
    },
}

/// Every configuration key as a flag. See the README for their meaning.
#[derive(Debug, Args, Default)]
pub struct ConfigArgs {
    /// Config file (TOML or YAML, by extension).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// postgres://…, mysql://… or sqlite://PATH [default: sqlite://leaderd.db]
    #[arg(long, global = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// Read the database URL from this file (re-read at every reconnect).
    #[arg(long, global = true, value_name = "PATH")]
    pub database_url_file: Option<String>,
    /// The election (lock row) name, 1–100 characters; repeat it to run
    /// several elections [default: default]. `release`: the one to release
    /// [default: all]
    #[arg(long, global = true, value_name = "NAME")]
    pub election: Vec<String>,
    /// This replica's name [default: $POD_NAME, $HOSTNAME, host name, random UUID]
    #[arg(long, global = true)]
    pub id: Option<String>,
    /// Follower poll period and longest gap between renewals [default: 1s]
    #[arg(long, global = true, value_name = "DURATION")]
    pub heartbeat: Option<String>,
    /// Lease length; must exceed heartbeat [default: 1.2s]
    #[arg(long, global = true, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// HTTP listen address [default: 127.0.0.1:4040]
    #[arg(long, global = true, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Loopback address that serves POST /release [default: --listen when it
    /// is loopback, else 127.0.0.1 on the next port]
    #[arg(long, global = true, value_name = "ADDR")]
    pub release_listen: Option<String>,
    /// Path of the leader flag file [default: none]
    #[arg(long, global = true, value_name = "PATH")]
    pub flag_file: Option<String>,
    /// Create the table at start if missing (the default).
    #[arg(long, global = true, conflicts_with = "no_migrate")]
    pub migrate: bool,
    /// Do not create the table at start.
    #[arg(long, global = true)]
    pub no_migrate: bool,
    /// text or json [default: text]
    #[arg(long, global = true, value_name = "FORMAT")]
    pub log_format: Option<String>,
    /// The app's health URL (http://HOST:PORT/PATH), checked every heartbeat;
    /// while it fails, step down and do not compete [default: none]
    #[arg(long, global = true, value_name = "URL")]
    pub app_health: Option<String>,
    /// Consecutive failed checks before stepping down [default: 3]
    #[arg(long, global = true, value_name = "N")]
    pub app_health_failures: Option<String>,
    /// Preference as a successor at handovers: higher first, then the
    /// replica that started last [default: 0]
    #[arg(long, global = true, value_name = "N", allow_negative_numbers = true)]
    pub priority: Option<String>,
    /// Spread several elections across the live replicas (the default).
    #[arg(long, global = true, conflicts_with = "no_spread")]
    pub spread: bool,
    /// Do not spread: every replica takes any free election.
    #[arg(long, global = true)]
    pub no_spread: bool,
    /// exec only: the command of election NAME, split into words as a shell
    /// would (nothing expanded); repeat it once per election [default: the
    /// command after `--`, for every election]
    #[arg(long, global = true, value_name = "NAME=CMD")]
    pub exec: Vec<String>,
    /// exec only: SIGTERM the command this long before the local deadline
    /// when renewals fail [default: ttl / 4]
    #[arg(long, global = true, value_name = "DURATION")]
    pub stop_grace: Option<String>,
}
