//! Command line: subcommands and the flags that override every other source.
//!
//! Each subcommand takes only the flags it reads, so its `--help` lists
//! nothing it would ignore. Flags are kept as raw strings here; `settings`
//! parses and validates them together with the other layers (environment,
//! config file) so every error names its key.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "leaderd",
    version,
    about = "Leader-election sidecar: one replica leads, judged by the database's clock.",
    long_about = "Leader-election sidecar. Every replica of an app runs leaderd beside it; they \
                  compete for one row of `service_leader_lock` in the app's database, and each tells \
                  its app whether it leads: GET /leader (200 leader, 503 not), a flag file, metrics.\n\n\
                  Without a subcommand, runs the daemon (as `leaderd run`) with the flags below."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The daemon's flags, for `leaderd [FLAGS]` without a subcommand.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar daemon in the foreground (the default).
    Run(RunArgs),
    /// Create or upgrade the lock table, then exit.
    Migrate(SourceArgs),
    /// Show every election in the table: holder, token, lease remaining.
    Status {
        /// Print JSON instead of one line per election.
        #[arg(long)]
        json: bool,
        /// List the live replicas instead of the elections: whether each
        /// competes, and why not (held, draining, app unhealthy).
        #[arg(long)]
        replicas: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// List the changes of holder the database recorded, newest last:
    /// token, holder, when and how each term began and ended.
    History(HistoryArgs),
    /// Run the election as `run` does, and COMMAND only while leading:
    /// started at each gain of leadership, stopped before the lease ends.
    /// Exits with the command's status when it exits by itself.
    Exec(ExecArgs),
    /// Ask the local daemon (at its release address) to step down: exit 0 released,
    /// 3 not leader, 1 no daemon.
    Release(ReleaseArgs),
    /// Ask the local daemon (at its release address) to end a hold or a
    /// drain and compete at once: exit 0 resumed, 3 nothing to resume, 1 no
    /// daemon.
    Resume(LocalDaemonArgs),
}

/// `leaderd history`'s flags.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Only this election's terms [default: every election's].
    #[arg(long, value_name = "NAME", value_parser = election_name)]
    pub election: Option<String>,
    /// The most recent terms to list (each election keeps its last 100).
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub limit: u32,
    /// Print JSON instead of one line per term.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub source: SourceArgs,
}

/// An election's name as the table holds them: 1 to 100 characters.
fn election_name(name: &str) -> Result<String, String> {
    match name.chars().count() {
        1..=100 => Ok(name.to_owned()),
        _ => Err("an election's name has 1 to 100 characters".to_owned()),
    }
}

/// Where the database and the other settings come from, and how to log:
/// what every subcommand that talks to the database reads.
#[derive(Debug, Args, Default, Clone)]
pub struct SourceArgs {
    /// Config file (TOML or YAML, by extension).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// postgres://…, mysql://… or sqlite://PATH [default: sqlite://leaderd.db]
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// Read the database URL from this file (re-read at every reconnect).
    #[arg(long, value_name = "PATH")]
    pub database_url_file: Option<String>,
    /// text or json [default: text]
    #[arg(long, value_name = "FORMAT")]
    pub log_format: Option<String>,
}

/// The daemon's flags (`run`, and `exec` with its own beside them).
#[derive(Debug, Args, Default, Clone)]
pub struct RunArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The election (lock row) name, 1–100 characters; repeat it to run
    /// several elections [default: default]
    #[arg(long, value_name = "NAME")]
    pub election: Vec<String>,
    /// This replica's name [default: $POD_NAME, $HOSTNAME, host name, random UUID]
    #[arg(long)]
    pub id: Option<String>,
    /// Follower poll period and longest gap between renewals [default: 1s]
    #[arg(long, value_name = "DURATION")]
    pub heartbeat: Option<String>,
    /// Lease length; must exceed heartbeat [default: 1.2s]
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// HTTP listen address [default: 127.0.0.1:4040]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Loopback address that serves POST /release [default: --listen when it
    /// is loopback, else 127.0.0.1 on the next port]
    #[arg(long, value_name = "ADDR")]
    pub release_listen: Option<String>,
    /// Path of the leader flag file [default: none]
    #[arg(long, value_name = "PATH")]
    pub flag_file: Option<String>,
    /// Create the table at start if missing (the default).
    #[arg(long, conflicts_with = "no_migrate")]
    pub migrate: bool,
    /// Do not create the table at start.
    #[arg(long)]
    pub no_migrate: bool,
    /// The app's health URL (http://HOST:PORT/PATH), checked every heartbeat;
    /// while it fails, step down and do not compete [default: none]
    #[arg(long, value_name = "URL")]
    pub app_health: Option<String>,
    /// Consecutive failed checks before stepping down [default: 3]
    #[arg(long, value_name = "N")]
    pub app_health_failures: Option<String>,
    /// Preference as a successor at handovers: higher first, then the
    /// replica that started last [default: 0]
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub priority: Option<String>,
    /// Where this replica's app can be reached (e.g. http://10.0.0.7:8080),
    /// reported to every replica as `leader_address` while it leads
    /// [default: none]
    #[arg(long, value_name = "ADDRESS")]
    pub advertise: Option<String>,
    /// Spread several elections across the live replicas (the default).
    #[arg(long, conflicts_with = "no_spread")]
    pub spread: bool,
    /// Do not spread: every replica takes any free election.
    #[arg(long)]
    pub no_spread: bool,
    /// Series per election on /metrics: all, or is_leader alone (for
    /// thousands of elections) [default: all]
    #[arg(long, value_name = "WHICH")]
    pub election_metrics: Option<String>,
}

/// `exec`: the daemon's flags and the commands it runs.
#[derive(Debug, Args, Default, Clone)]
pub struct ExecArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// The command of election NAME, split into words as a shell would
    /// (nothing expanded); repeat it once per election [default: the
    /// command after `--`, for every election]
    #[arg(long, value_name = "NAME=CMD")]
    pub exec: Vec<String>,
    /// SIGTERM the command this long before the local deadline when
    /// renewals fail [default: ttl / 4]
    #[arg(long, value_name = "DURATION")]
    pub stop_grace: Option<String>,
    /// The command and its arguments, after `--`: every election's,
    /// unless `--exec NAME=CMD` gives one its own.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// `release`: it talks to the daemon on this host and reads nothing else, so
/// it works in an app container with no other leaderd configuration.
#[derive(Debug, Args, Default, Clone)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub daemon: LocalDaemonArgs,
    /// Do not attempt again for this long [default: 2 × heartbeat; at most 1h]
    #[arg(long, value_name = "DURATION")]
    pub hold: Option<String>,
}

/// Where the local daemon serves `POST /release` and `POST /resume`, and
/// which of its elections to ask about.
#[derive(Debug, Args, Default, Clone)]
pub struct LocalDaemonArgs {
    /// Config file (TOML or YAML, by extension); only `listen` and
    /// `release_listen` are read from it.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The daemon's HTTP listen address, from which its release address is
    /// derived as the daemon derives it [default: 127.0.0.1:4040]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The daemon's release address, when it sets one [default: from --listen]
    #[arg(long, value_name = "ADDR")]
    pub release_listen: Option<String>,
    /// The election [default: every one the daemon runs]
    #[arg(long, value_name = "NAME")]
    pub election: Vec<String>,
}

/// Every flag a subcommand may set, as `settings` reads them: unset ones
/// fall through to the environment, the config file and the defaults.
#[derive(Debug, Default, Clone)]
pub struct ConfigArgs {
    pub config: Option<PathBuf>,
    pub database_url: Option<String>,
    pub database_url_file: Option<String>,
    pub log_format: Option<String>,
    pub election: Vec<String>,
    pub id: Option<String>,
    pub heartbeat: Option<String>,
    pub ttl: Option<String>,
    pub listen: Option<String>,
    pub release_listen: Option<String>,
    pub flag_file: Option<String>,
    pub migrate: bool,
    pub no_migrate: bool,
    pub app_health: Option<String>,
    pub app_health_failures: Option<String>,
    pub priority: Option<String>,
    pub advertise: Option<String>,
    pub spread: bool,
    pub no_spread: bool,
    pub election_metrics: Option<String>,
    pub exec: Vec<String>,
    pub stop_grace: Option<String>,
}

impl Cli {
    /// The flags as `settings` reads them. Daemon flags written before the
    /// subcommand (`leaderd --id a exec -- CMD`) count too; the
    /// subcommand's own win.
    pub fn config(&self) -> ConfigArgs {
        let top = ConfigArgs::from(&self.run);
        let own = match &self.command {
            None => return top,
            Some(Command::Run(run)) => ConfigArgs::from(run),
            Some(Command::Exec(exec)) => ConfigArgs {
                exec: exec.exec.clone(),
                stop_grace: exec.stop_grace.clone(),
                ..ConfigArgs::from(&exec.run)
            },
            Some(Command::Migrate(source))
            | Some(Command::Status { source, .. })
            | Some(Command::History(HistoryArgs { source, .. })) => ConfigArgs::from(source),
            Some(Command::Release(ReleaseArgs { daemon: d, .. }) | Command::Resume(d)) => {
                ConfigArgs {
                    config: d.config.clone(),
                    listen: d.listen.clone(),
                    release_listen: d.release_listen.clone(),
                    election: d.election.clone(),
                    ..ConfigArgs::default()
                }
            }
        };
        own.over(top)
    }
}

impl From<&SourceArgs> for ConfigArgs {
    fn from(s: &SourceArgs) -> Self {
        ConfigArgs {
            config: s.config.clone(),
            database_url: s.database_url.clone(),
            database_url_file: s.database_url_file.clone(),
            log_format: s.log_format.clone(),
            ..ConfigArgs::default()
        }
    }
}

impl From<&RunArgs> for ConfigArgs {
    fn from(r: &RunArgs) -> Self {
        ConfigArgs {
            election: r.election.clone(),
            id: r.id.clone(),
            heartbeat: r.heartbeat.clone(),
            ttl: r.ttl.clone(),
            listen: r.listen.clone(),
            release_listen: r.release_listen.clone(),
            flag_file: r.flag_file.clone(),
            migrate: r.migrate,
            no_migrate: r.no_migrate,
            app_health: r.app_health.clone(),
            app_health_failures: r.app_health_failures.clone(),
            priority: r.priority.clone(),
            advertise: r.advertise.clone(),
            spread: r.spread,
            no_spread: r.no_spread,
            election_metrics: r.election_metrics.clone(),
            ..ConfigArgs::from(&r.source)
        }
    }
}

impl ConfigArgs {
    /// `self` where set, else `under`.
    fn over(self, under: ConfigArgs) -> ConfigArgs {
        fn list<T>(a: Vec<T>, b: Vec<T>) -> Vec<T> {
            if a.is_empty() {
                b
            } else {
                a
            }
        }
        // An explicit switch wins over the other one given earlier.
        let (migrate, no_migrate) = if self.migrate || self.no_migrate {
            (self.migrate, self.no_migrate)
        } else {
            (under.migrate, under.no_migrate)
        };
        let (spread, no_spread) = if self.spread || self.no_spread {
            (self.spread, self.no_spread)
        } else {
            (under.spread, under.no_spread)
        };
        ConfigArgs {
            config: self.config.or(under.config),
            database_url: self.database_url.or(under.database_url),
            database_url_file: self.database_url_file.or(under.database_url_file),
            log_format: self.log_format.or(under.log_format),
            election: list(self.election, under.election),
            id: self.id.or(under.id),
            heartbeat: self.heartbeat.or(under.heartbeat),
            ttl: self.ttl.or(under.ttl),
            listen: self.listen.or(under.listen),
            release_listen: self.release_listen.or(under.release_listen),
            flag_file: self.flag_file.or(under.flag_file),
            migrate,
            no_migrate,
            app_health: self.app_health.or(under.app_health),
            app_health_failures: self.app_health_failures.or(under.app_health_failures),
            priority: self.priority.or(under.priority),
            advertise: self.advertise.or(under.advertise),
            spread,
            no_spread,
            election_metrics: self.election_metrics.or(under.election_metrics),
            exec: list(self.exec, under.exec),
            stop_grace: self.stop_grace.or(under.stop_grace),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn help(sub: &str) -> String {
        let mut cmd = Cli::command();
        cmd.find_subcommand_mut(sub)
            .unwrap_or_else(|| panic!("no subcommand {sub}"))
            .render_long_help()
            .to_string()
    }

    #[test]
    fn each_subcommand_lists_only_the_flags_it_reads() {
        let release = help("release");
        for flag in [
            "--listen",
            "--release-listen",
            "--election",
            "--hold",
            "--config",
        ] {
            assert!(release.contains(flag), "release lacks {flag}:\n{release}");
        }
        for flag in ["--database-url", "--ttl", "--id", "--exec", "--priority"] {
            assert!(!release.contains(flag), "release lists {flag}:\n{release}");
        }
        for sub in ["migrate", "status"] {
            let text = help(sub);
            assert!(text.contains("--database-url"), "{sub}:\n{text}");
            for flag in ["--ttl", "--listen", "--election", "--exec", "--flag-file"] {
                assert!(!text.contains(flag), "{sub} lists {flag}:\n{text}");
            }
        }
        assert!(help("exec").contains("--stop-grace"));
        assert!(!help("run").contains("--stop-grace"));
        let top = Cli::command().render_long_help().to_string();
        assert!(
            top.contains("--ttl") && !top.contains("--stop-grace"),
            "{top}"
        );
    }

    #[test]
    fn daemon_flags_before_the_subcommand_count_and_its_own_win() {
        let cli = Cli::try_parse_from([
            "leaderd", "--id", "a", "--ttl", "3s", "exec", "--ttl", "5s", "--", "true",
        ])
        .unwrap();
        let c = cli.config();
        assert_eq!(c.id.as_deref(), Some("a"));
        assert_eq!(c.ttl.as_deref(), Some("5s"));
        let cli = Cli::try_parse_from(["leaderd", "--spread", "run", "--no-spread"]).unwrap();
        assert!(cli.config().no_spread && !cli.config().spread);
    }

    #[test]
    fn flags_a_subcommand_does_not_read_are_refused_after_it() {
        assert!(Cli::try_parse_from(["leaderd", "release", "--database-url", "x"]).is_err());
        assert!(Cli::try_parse_from(["leaderd", "migrate", "--ttl", "1s"]).is_err());
        assert!(Cli::try_parse_from(["leaderd", "run", "--stop-grace", "1s"]).is_err());
    }
}
