//! Configuration: flags > `LEADERD_*` environment > config file (TOML/YAML) >
//! `DATABASE_URL` (for `database_url` only) > defaults.
//!
//! Everything is validated here, before anything binds or connects, and every
//! problem is reported with its key, its value (passwords redacted) and where
//! the value came from. Unknown keys in a file are errors; unknown `LEADERD_*`
//! variables only warnings, because Kubernetes injects `LEADERD_PORT` and the
//! like into every pod when a Service is named `leaderd`.
//!
//! `sources` reads and layers the sources into one raw value per key;
//! `keys` reads and checks each key; `validate`, here, puts them together
//! into [`Settings`].

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::Timing;
use leaderd_store::DatabaseUrl;

use crate::cli::ConfigArgs;

mod keys;
mod sources;

use keys::*;
use sources::*;
pub use sources::{Env, ProcessEnv};

/// Every key, in the order docs/reference.md documents them.
pub const KEYS: &[&str] = &[
    "database_url",
    "database_url_file",
    "election",
    "elections",
    "id",
    "heartbeat",
    "ttl",
    "listen",
    "release_listen",
    "flag_file",
    "migrate",
    "log_format",
    "app_health",
    "app_health_failures",
    "priority",
    "advertise",
    "stop_grace",
    "exec",
    "spread",
    "election_metrics",
];

/// The largest `priority`, either way: room enough for any ordering a
/// user needs, and short in the presence row that carries it.
const PRIORITY_LIMIT: i32 = 1_000_000;

/// Separates the names of several elections inside one layered value: no
/// name may hold a control character, so the join is unambiguous.
const NAME_SEP: char = '\n';

/// The configuration could not be used. Each entry names its key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .problems.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    pub problems: Vec<String>,
}

/// Where the database URL comes from.
#[derive(Debug, Clone)]
pub enum DatabaseSource {
    Url(DatabaseUrl),
    /// Re-read at every reconnect, so a rotated Kubernetes secret is picked up.
    File(PathBuf),
}

impl DatabaseSource {
    /// The URL to connect with now.
    pub fn resolve(&self) -> Result<DatabaseUrl, String> {
        match self {
            DatabaseSource::Url(u) => Ok(u.clone()),
            DatabaseSource::File(p) => read_url_file(p),
        }
    }
}

impl fmt::Display for DatabaseSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatabaseSource::Url(u) => u.fmt(f),
            DatabaseSource::File(p) => write!(f, "URL from file {}", p.display()),
        }
    }
}

/// An `http://HOST:PORT/PATH` health URL on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppHealth {
    pub host: String,
    pub port: u16,
    /// Path and query.
    pub target: String,
    /// As configured, for logs.
    pub url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Which series `/metrics` serves per election (`election_metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionMetrics {
    /// Every per-election family: seven series an election.
    All,
    /// `leaderd_is_leader` alone: one series an election, for daemons of
    /// thousands. The alerts and the dashboard work on either.
    IsLeader,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub database: DatabaseSource,
    /// The election this loop runs: the first of [`Settings::elections`]
    /// until [`Settings::for_election`] picks another.
    pub election: String,
    /// Every election this daemon runs, in the configured order, without
    /// repeats; never empty.
    /// Shared: every election's settings carry the list, and a copy each
    /// would cost E² names.
    pub elections: Arc<[String]>,
    /// Whether the elections are spread across the live replicas.
    pub spread: bool,
    /// Which series `/metrics` serves per election.
    pub election_metrics: ElectionMetrics,
    pub id: String,
    pub timing: Timing,
    pub listen: SocketAddr,
    /// Where `POST /release` is served: `listen` when that is loopback, else
    /// a loopback listener of its own (see `http`).
    pub release_listen: SocketAddr,
    pub flag_file: Option<PathBuf>,
    pub migrate: bool,
    pub log_format: LogFormat,
    /// The app's health URL, checked every heartbeat.
    pub app_health: Option<AppHealth>,
    /// Consecutive failed checks before stepping down.
    pub app_health_failures: u32,
    /// Preference as a successor at handovers:
    /// higher first.
    pub priority: i32,
    /// Where this replica's app can be reached, stored in the row with
    /// each takeover and reported as `leader_address`.
    pub advertise: Option<String>,
    /// `exec` only: how long before the local deadline a child is told to
    /// stop when renewals fail.
    pub stop_grace: Duration,
    /// `exec` only: each election's own command (`NAME=CMD`), in the
    /// configured order of the elections it names. Shared, as `elections`.
    pub exec: Arc<[(String, Vec<String>)]>,
    /// Environment variables that carried leaderd's database URL: `exec`
    /// keeps them from the command (they may hold a password).
    pub secret_env: Vec<&'static str>,
    /// Things worth a warning once logging is up (unknown variables).
    pub warnings: Vec<String>,
}

impl Settings {
    /// The settings of one of the elections: its name, and its flag file
    /// with `{election}` filled in.
    pub fn for_election(&self, name: &str) -> Settings {
        let mut one = self.clone();
        one.election = name.to_owned();
        one.flag_file = self.flag_file.as_deref().map(|p| flag_path(p, name));
        one
    }

    /// [`Settings::for_election`] of every election, in the configured
    /// order: made once, for both the daemon's shared state and the loops.
    pub fn each_election(&self) -> Vec<Settings> {
        self.elections
            .iter()
            .map(|name| self.for_election(name))
            .collect()
    }

    /// Builds the settings from flags, environment and the config file.
    pub fn load(args: &ConfigArgs, env: &dyn Env) -> Result<Settings, ConfigError> {
        let mut problems = Vec::new();
        let mut warnings = Vec::new();
        let layers = layer(args, env, &mut problems, &mut warnings);
        let settings = validate(&layers, env, &mut problems, warnings);
        match settings {
            Some(s) if problems.is_empty() => Ok(s),
            _ => Err(ConfigError { problems }),
        }
    }
}

fn validate(
    layers: &Layers,
    env: &dyn Env,
    problems: &mut Vec<String>,
    warnings: Vec<String>,
) -> Option<Settings> {
    let database = database_source(layers, env, problems);
    let elections = elections_key(layers, problems);
    let id = name_key(layers, "id", || default_id(env), problems);
    let heartbeat = duration_key(layers, "heartbeat", Duration::from_secs(1), problems);
    let ttl = duration_key(layers, "ttl", Duration::from_millis(1200), problems);
    let timing = match (heartbeat, ttl) {
        (Some(h), Some(t)) => match Timing::new(h, t) {
            Ok(timing) => Some(timing),
            Err(e) => {
                problems.push(format!("`heartbeat`/`ttl`: {e}"));
                None
            }
        },
        _ => None,
    };
    let listen = listen_key(layers, problems);
    let release_listen = listen.and_then(|l| release_key(layers, l, problems));
    let flag_file = match layers.get("flag_file") {
        Some(s) if s.value.is_empty() => {
            problem(problems, "flag_file", s, &s.value, "must not be empty");
            None
        }
        Some(s) => {
            let path = PathBuf::from(&s.value);
            check_flag_file(&path, elections.as_deref(), s, problems)
        }
        None => None,
    };
    let migrate = bool_key(layers, "migrate", problems);
    let spread = bool_key(layers, "spread", problems);
    let election_metrics = match layers
        .get("election_metrics")
        .map(|s| (s, s.value.as_str()))
    {
        None | Some((_, "all")) => Some(ElectionMetrics::All),
        Some((_, "is_leader")) => Some(ElectionMetrics::IsLeader),
        Some((s, v)) => {
            problem(
                problems,
                "election_metrics",
                s,
                v,
                "expected all or is_leader",
            );
            None
        }
    };
    let log_format = match layers.get("log_format").map(|s| (s, s.value.as_str())) {
        None | Some((_, "text")) => Some(LogFormat::Text),
        Some((_, "json")) => Some(LogFormat::Json),
        Some((s, v)) => {
            problem(problems, "log_format", s, v, "expected text or json");
            None
        }
    };
    let app_health = match layers.get("app_health") {
        None => Some(None),
        Some(s) => match parse_health_url(&s.value) {
            Ok(h) => Some(Some(h)),
            Err(e) => {
                problem(problems, "app_health", s, &s.value, e);
                None
            }
        },
    };
    let app_health_failures = match layers.get("app_health_failures") {
        None => Some(3),
        Some(s) => match s.value.trim().parse::<u32>() {
            Ok(n) if (1..=1000).contains(&n) => Some(n),
            _ => {
                problem(
                    problems,
                    "app_health_failures",
                    s,
                    &s.value,
                    "expected a whole number from 1 to 1000",
                );
                None
            }
        },
    };
    let priority = match layers.get("priority") {
        None => Some(0),
        Some(s) => match s.value.trim().parse::<i32>() {
            Ok(n) if (-PRIORITY_LIMIT..=PRIORITY_LIMIT).contains(&n) => Some(n),
            _ => {
                problem(
                    problems,
                    "priority",
                    s,
                    &s.value,
                    "expected a whole number from -1000000 to 1000000",
                );
                None
            }
        },
    };
    let advertise = match layers.get("advertise") {
        None => Some(None),
        Some(s) => match check_advertise(&s.value) {
            Ok(a) => Some(Some(a)),
            Err(e) => {
                problem(problems, "advertise", s, &s.value, e);
                None
            }
        },
    };
    let stop_grace = match (timing, layers.get("stop_grace")) {
        (Some(t), None) => Some(t.default_stop_grace()),
        (Some(t), Some(s)) => duration_key(layers, "stop_grace", Duration::ZERO, problems)
            .and_then(|d| match t.check_stop_grace(d) {
                Ok(d) => Some(d),
                Err(e) => {
                    problem(problems, "stop_grace", s, &s.value, e);
                    None
                }
            }),
        // Judged against the timing, which has its own problem.
        (None, _) => None,
    };
    let exec = exec_key(layers, elections.as_deref(), problems);
    // The app's own `DATABASE_URL` is passed on when leaderd did not use it.
    let mut secret_env = vec!["LEADERD_DATABASE_URL"];
    let from_url = matches!(database, Some(DatabaseSource::Url(_)));
    if from_url
        && layers
            .get("database_url")
            .is_some_and(|u| u.from == "DATABASE_URL")
    {
        secret_env.push("DATABASE_URL");
    }
    Some(Settings {
        database: database?,
        election: elections.as_ref()?.first()?.clone(),
        elections: elections?.into(),
        spread: spread?,
        election_metrics: election_metrics?,
        id: id?,
        timing: timing?,
        listen: listen?,
        release_listen: release_listen?,
        flag_file,
        migrate: migrate?,
        log_format: log_format?,
        app_health: app_health?,
        app_health_failures: app_health_failures?,
        priority: priority?,
        advertise: advertise?,
        stop_grace: stop_grace?,
        exec: exec?.into(),
        secret_env,
        warnings,
    })
}

fn database_source(
    layers: &Layers,
    env: &dyn Env,
    problems: &mut Vec<String>,
) -> Option<DatabaseSource> {
    let url = layers.get("database_url");
    let file = layers.get("database_url_file");
    match (url, file) {
        (Some(u), Some(f)) if u.from != "DATABASE_URL" => {
            problems.push(format!(
                "`database_url` (from {}) and `database_url_file` (from {}) are both set; set only one",
                u.from, f.from
            ));
            None
        }
        (_, Some(f)) => {
            if f.value.is_empty() {
                problem(
                    problems,
                    "database_url_file",
                    f,
                    &f.value,
                    "must not be empty",
                );
                return None;
            }
            let path = PathBuf::from(&f.value);
            match read_url_file(&path).and_then(|u| usable(&u)) {
                Ok(()) => Some(DatabaseSource::File(path)),
                Err(e) => {
                    problem(problems, "database_url_file", f, &f.value, e);
                    None
                }
            }
        }
        (Some(u), None) => match DatabaseUrl::parse(&u.value) {
            Ok(url) => match usable(&url) {
                Ok(()) => Some(DatabaseSource::Url(url)),
                Err(e) => {
                    problem(problems, "database_url", u, &url.to_string(), e);
                    None
                }
            },
            Err(e) => {
                // Never echo a value that may carry a password.
                problem(problems, "database_url", u, "<redacted>", e);
                None
            }
        },
        (None, None) => {
            if env.var("KUBERNETES_SERVICE_HOST").is_some() {
                problems.push(
                    "`database_url`: not set, and this is a Kubernetes pod (KUBERNETES_SERVICE_HOST is set). \
                     The SQLite default is private to each pod, so every pod would lead: \
                     set database_url or database_url_file to the shared database"
                        .into(),
                );
                return None;
            }
            DatabaseUrl::parse("sqlite://leaderd.db")
                .ok()
                .map(DatabaseSource::Url)
        }
    }
}

/// Where the daemon serves `POST /release`, for `leaderd release`, which talks to the
/// local daemon and needs nothing else (a pod's app container may have no
/// database configuration at all).
pub fn release_target(args: &ConfigArgs, env: &dyn Env) -> Result<SocketAddr, ConfigError> {
    let mut problems = Vec::new();
    let layers = layer(args, env, &mut problems, &mut Vec::new());
    let release =
        listen_key(&layers, &mut problems).and_then(|l| release_key(&layers, l, &mut problems));
    match release {
        Some(r) if problems.is_empty() => Ok(r),
        _ => Err(ConfigError { problems }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::collections::HashMap;

    struct MapEnv(HashMap<String, String>);

    impl Env for MapEnv {
        fn var(&self, key: &str) -> Option<String> {
            self.0.get(key).cloned()
        }
        fn vars(&self) -> Vec<(String, String)> {
            self.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        }
    }

    fn env(pairs: &[(&str, &str)]) -> MapEnv {
        MapEnv(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// Settings from `leaderd exec FLAGS` (exec takes every flag there is).
    fn load(argv: &[&str], e: &MapEnv) -> Result<Settings, ConfigError> {
        let cli = crate::cli::Cli::try_parse_from(
            ["leaderd", "exec"].into_iter().chain(argv.iter().copied()),
        )
        .unwrap();
        Settings::load(&cli.config(), e)
    }

    fn problems(argv: &[&str], e: &MapEnv) -> String {
        load(argv, e).unwrap_err().to_string()
    }

    #[test]
    fn defaults() {
        let s = load(&[], &env(&[("POD_NAME", "pod-a")])).unwrap();
        assert_eq!(s.id, "pod-a");
        assert_eq!(s.election, "default");
        assert_eq!(s.timing.heartbeat(), Duration::from_secs(1));
        assert_eq!(s.timing.ttl(), Duration::from_millis(1200));
        assert_eq!(s.listen.to_string(), "127.0.0.1:4040");
        assert!(s.migrate);
        assert_eq!(s.database.to_string(), "sqlite://leaderd.db");
    }

    #[test]
    fn precedence_flag_env_file_database_url() {
        let dir = std::env::temp_dir().join(format!("leaderd-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.toml");
        std::fs::write(
            &file,
            "election = \"from-file\"\nid = \"file-id\"\nttl = \"3s\"\nheartbeat = \"1s\"\n",
        )
        .unwrap();
        let e = env(&[
            ("LEADERD_ID", "env-id"),
            ("LEADERD_TTL", "2s"),
            ("DATABASE_URL", "postgres://u:pw@h/d"),
        ]);
        let s = load(&["--config", file.to_str().unwrap(), "--ttl", "5s"], &e).unwrap();
        assert_eq!(s.election, "from-file");
        assert_eq!(s.id, "env-id");
        assert_eq!(s.timing.ttl(), Duration::from_secs(5));
        assert_eq!(s.database.to_string(), "postgres://u:REDACTED@h/d");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn unknown_file_key_is_an_error_and_unknown_env_a_warning() {
        let dir = std::env::temp_dir().join(format!("leaderd-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("c.yaml");
        std::fs::write(&file, "election: x\nhartbeat: 1s\n").unwrap();
        let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
        assert!(msg.contains("hartbeat"), "{msg}");
        let s = load(
            &[],
            &env(&[("LEADERD_PORT", "tcp://10.0.0.1:4040"), ("POD_NAME", "p")]),
        )
        .unwrap();
        assert_eq!(s.warnings.len(), 1);
        assert!(s.warnings[0].contains("LEADERD_PORT"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_bad_value_is_named_with_its_key() {
        let long = "x".repeat(101);
        let msg = problems(
            &[
                "--ttl",
                "soon",
                "--heartbeat",
                "1",
                "--listen",
                "nowhere",
                "--log-format",
                "xml",
                "--election",
                &long,
                "--id",
                "",
                "--database-url",
                "redis://u:hunter2@h/0",
            ],
            &env(&[]),
        );
        for key in [
            "`ttl`",
            "`heartbeat`",
            "`listen`",
            "`log_format`",
            "`election`",
            "`id`",
            "`database_url`",
        ] {
            assert!(msg.contains(key), "{key} missing from: {msg}");
        }
        assert!(msg.contains("--ttl"), "names the source: {msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
    }

    #[test]
    fn a_duration_without_a_unit_is_told_how_to_write_one() {
        let msg = problems(&["--ttl", "1.5"], &env(&[]));
        assert!(
            msg.contains("a unit is needed (ms, s, m, h), for example 1.5s"),
            "{msg}"
        );
        let msg = problems(&["--ttl", "5x"], &env(&[]));
        assert!(msg.contains("unknown time unit \"x\""), "{msg}");
    }

    #[test]
    fn several_elections_from_each_source() {
        let s = load(&["--election", "a", "--election", "b"], &env(&[])).unwrap();
        assert_eq!(
            (s.election.as_str(), s.elections.to_vec()),
            ("a", vec!["a".to_owned(), "b".to_owned()])
        );
        assert!(s.spread);
        let s = load(&[], &env(&[("LEADERD_ELECTIONS", "mailer, reports,jobs")])).unwrap();
        assert_eq!(*s.elections, ["mailer", "reports", "jobs"]);
        let (dir, file) = config_file("e.toml", "elections = [\"x\", \"y\"]\nspread = false\n");
        let s = load(&["--config", file.to_str().unwrap()], &env(&[])).unwrap();
        assert_eq!(*s.elections, ["x", "y"]);
        assert!(!s.spread);
        // A flag beats the file.
        let s = load(
            &["--config", file.to_str().unwrap(), "--election", "z"],
            &env(&[]),
        )
        .unwrap();
        assert_eq!(*s.elections, ["z"]);
        std::fs::remove_dir_all(dir).unwrap();
        let s = load(&["--no-spread"], &env(&[])).unwrap();
        assert_eq!(
            (s.elections.to_vec(), s.spread),
            (vec!["default".to_owned()], false)
        );
    }

    #[test]
    fn exec_commands_from_each_source_in_election_order() {
        let words = |s: &Settings| -> Vec<(String, Vec<String>)> { s.exec.to_vec() };
        let flags = [
            "--election",
            "Mailer",
            "--election",
            "reports",
            "--exec",
            "reports=/bin/report --out 'a b'",
            "--exec",
            "Mailer = mail\\ er",
        ];
        let s = load(&flags, &env(&[])).unwrap();
        assert_eq!(
            words(&s),
            [
                ("Mailer".to_owned(), vec!["mail er".to_owned()]),
                (
                    "reports".to_owned(),
                    vec!["/bin/report".into(), "--out".into(), "a b".into()]
                ),
            ]
        );
        let vars = [
            ("LEADERD_ELECTIONS", "a,b"),
            ("LEADERD_EXEC", "b=run b\n\na=run a\n"),
        ];
        let s = load(&[], &env(&vars)).unwrap();
        assert_eq!(s.exec[0], ("a".to_owned(), vec!["run".into(), "a".into()]));
        assert_eq!(s.exec[1].0, "b");
        // A file's table: a string or a list of words; names keep their case.
        let text = "elections = [\"Jobs\", \"mail\"]\n[exec]\nJobs = \"jobs --all\"\nmail = [\"mail\", \"x y\"]\n";
        let (dir, file) = config_file("x.toml", text);
        let s = load(&["--config", file.to_str().unwrap()], &env(&[])).unwrap();
        assert_eq!(
            words(&s),
            [
                ("Jobs".to_owned(), vec!["jobs".into(), "--all".into()]),
                ("mail".to_owned(), vec!["mail".into(), "x y".into()]),
            ]
        );
        // Flags replace the file's whole table, as every key's value.
        let s = load(
            &["--config", file.to_str().unwrap(), "--exec", "mail=m"],
            &env(&[]),
        )
        .unwrap();
        assert_eq!(words(&s), [("mail".to_owned(), vec!["m".to_owned()])]);
        std::fs::remove_dir_all(dir).unwrap();
        assert!(load(&[], &env(&[])).unwrap().exec.is_empty());
    }

    #[test]
    fn bad_exec_commands_are_named() {
        let two = ["--election", "a", "--election", "b"];
        let with = |extra: &[&str]| problems(&[&two[..], extra].concat(), &env(&[]));
        let msg = with(&["--exec", "c=x"]);
        assert!(
            msg.contains("`exec`") && msg.contains("no election \"c\"") && msg.contains("a, b"),
            "{msg}"
        );
        let msg = with(&["--exec", "a=x", "--exec", "a=y"]);
        assert!(msg.contains("two commands"), "{msg}");
        assert!(with(&["--exec", "a"]).contains("expected NAME=COMMAND"));
        assert!(with(&["--exec", "a= "]).contains("the command is empty"));
        let msg = with(&["--exec", "a=run 'unclosed"]);
        assert!(msg.contains("cannot split"), "{msg}");
        // The command is never shown (it may carry a secret).
        let msg = with(&["--exec", "a=run 'S3cret"]);
        assert!(!msg.contains("S3cret") && msg.contains("\"a=…\""), "{msg}");
        for text in [
            "exec = \"run\"\n",
            "[exec]\nm = true\n",
            "[exec]\nm = [\"x\", 1]\n",
        ] {
            let (dir, file) = config_file("e.toml", text);
            let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
            assert!(msg.contains("`exec` must be a table"), "{text}: {msg}");
            std::fs::remove_dir_all(dir).unwrap();
        }
        // A name holding `=`: the longest configured name that fits.
        let s = load(
            &[
                "--election",
                "a",
                "--election",
                "a=b",
                "--exec",
                "a=b=x",
                "--exec",
                "a=y",
            ],
            &env(&[]),
        )
        .unwrap();
        assert_eq!(
            s.exec.to_vec(),
            [
                ("a".to_owned(), vec!["y".to_owned()]),
                ("a=b".to_owned(), vec!["x".to_owned()])
            ]
        );
    }

    #[test]
    fn bad_election_lists_are_named() {
        let msg = problems(&["--election", "a", "--election", "a"], &env(&[]));
        assert!(
            msg.contains("`election`") && msg.contains("listed twice"),
            "{msg}"
        );
        // Names of leaderd's own rows.
        for own in ["leaderd-presence/g/slot-0", "leaderd-warm-up/42"] {
            let msg = problems(&["--election", own], &env(&[]));
            assert!(msg.contains("are leaderd's own"), "{own}: {msg}");
        }
        let msg = problems(&[], &env(&[("LEADERD_ELECTIONS", "a,,b")]));
        assert!(
            msg.contains("LEADERD_ELECTIONS") && msg.contains("1 to 100"),
            "{msg}"
        );
        // The singular key is one name, wherever it is set: a comma or a
        // line break names the list key instead of making two elections.
        for msg in [
            problems(&["--election", "a,b"], &env(&[])),
            problems(&[], &env(&[("LEADERD_ELECTION", "a,b")])),
            problems(&["--election", "a\nb"], &env(&[])),
        ] {
            assert!(
                msg.contains("is one name") && msg.contains("`elections`"),
                "{msg}"
            );
        }
        for text in ["election = \"a,b\"\n", "election = \"a\\nb\"\n"] {
            let (dir, file) = config_file("one.toml", text);
            let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
            assert!(
                msg.contains("is one name") && msg.contains("`elections`"),
                "{text}: {msg}"
            );
            std::fs::remove_dir_all(dir).unwrap();
        }
        let both = [("LEADERD_ELECTIONS", "a,b"), ("LEADERD_ELECTION", "c")];
        assert!(problems(&[], &env(&both)).contains("both set"));
        let (dir, file) = config_file("b.toml", "election = \"a\"\nelections = [\"b\"]\n");
        let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
        assert!(msg.contains("both set"), "{msg}");
        std::fs::remove_dir_all(dir).unwrap();
        let (dir, file) = config_file("c.yaml", "elections: mailer\n");
        let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
        assert!(
            msg.contains("`elections` must be a list of strings"),
            "{msg}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn several_elections_need_a_flag_file_per_election() {
        let dir = std::env::temp_dir().join(format!("leaderd-flag-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let one = dir.join("leader").to_str().unwrap().to_owned();
        let msg = problems(
            &["--election", "a", "--election", "b", "--flag-file", &one],
            &env(&[]),
        );
        assert!(
            msg.contains("`flag_file`") && msg.contains("{election}"),
            "{msg}"
        );
        let each = dir.join("leader-{election}").to_str().unwrap().to_owned();
        let argv = ["--election", "a", "--election", "b", "--flag-file", &each];
        let s = load(&argv, &env(&[])).unwrap();
        assert_eq!(s.for_election("b").flag_file, Some(dir.join("leader-b")));
        assert_eq!(s.for_election("b").election, "b");
        // `{election}` naming a directory that does not exist.
        let nested = dir
            .join("{election}")
            .join("flag")
            .to_str()
            .unwrap()
            .to_owned();
        let msg = problems(&["--election", "a", "--flag-file", &nested], &env(&[]));
        assert!(msg.contains("does not exist"), "{msg}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ttl_must_exceed_heartbeat() {
        let msg = problems(&["--ttl", "1s", "--heartbeat", "1s"], &env(&[]));
        assert!(msg.contains("ttl"), "{msg}");
    }

    #[test]
    fn url_and_url_file_together_are_rejected() {
        let msg = problems(
            &[
                "--database-url",
                "postgres://h/d",
                "--database-url-file",
                "/nonexistent",
            ],
            &env(&[]),
        );
        assert!(msg.contains("both set"), "{msg}");
    }

    #[test]
    fn unreadable_url_file_is_rejected() {
        let msg = problems(&["--database-url-file", "/nonexistent/url"], &env(&[]));
        assert!(
            msg.contains("`database_url_file`") && msg.contains("cannot read"),
            "{msg}"
        );
    }

    #[test]
    fn url_file_is_trimmed_and_read() {
        let path = std::env::temp_dir().join(format!("leaderd-url-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, "postgres://u:pw@h/d\n").unwrap();
        let s = load(&["--database-url-file", path.to_str().unwrap()], &env(&[])).unwrap();
        assert_eq!(
            s.database.resolve().unwrap().to_string(),
            "postgres://u:REDACTED@h/d"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn sqlite_default_is_refused_in_kubernetes() {
        let msg = problems(&[], &env(&[("KUBERNETES_SERVICE_HOST", "10.0.0.1")]));
        assert!(msg.contains("KUBERNETES_SERVICE_HOST"), "{msg}");
        assert!(load(
            &["--database-url", "postgres://h/d"],
            &env(&[("KUBERNETES_SERVICE_HOST", "10.0.0.1")])
        )
        .is_ok());
    }

    #[test]
    fn flag_file_needs_an_existing_directory() {
        let msg = problems(&["--flag-file", "/nonexistent/dir/leader"], &env(&[]));
        assert!(
            msg.contains("`flag_file`") && msg.contains("does not exist"),
            "{msg}"
        );
        let s = load(&["--flag-file", "leader.json"], &env(&[])).unwrap();
        assert_eq!(s.flag_file, Some(PathBuf::from("leader.json")));
    }

    #[test]
    fn names_with_outer_white_space_are_rejected() {
        for bad in ["x ", " x", "x\u{a0}"] {
            let msg = problems(&["--election", bad, "--id", bad], &env(&[]));
            assert!(
                msg.contains("`election`") && msg.contains("`id`") && msg.contains("white space"),
                "{bad:?}: {msg}"
            );
        }
        assert!(load(&["--election", "a b"], &env(&[])).is_ok());
    }

    #[test]
    fn ttl_has_an_upper_bound() {
        let msg = problems(&["--ttl", "1h", "--heartbeat", "1s"], &env(&[]));
        assert!(msg.contains("at most"), "{msg}");
    }

    fn config_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("leaderd-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(name);
        std::fs::write(&file, text).unwrap();
        (dir, file)
    }

    #[test]
    fn config_syntax_errors_name_the_place_never_the_text() {
        for (name, text) in [
            (
                "c.toml",
                "election = \"e\"\ndatabase_url = \"postgres://u:hunter2@h/d\n",
            ),
            ("c.toml", "database_url = postgres://u:hunter2@h/d\n"),
            (
                "c.yaml",
                "election: e\ndatabase_url: \"postgres://u:hunter2@h/d\n  x: [\n",
            ),
        ] {
            let (dir, file) = config_file(name, text);
            let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
            assert!(!msg.contains("hunter2"), "{msg}");
            assert!(msg.contains("syntax error at line"), "{msg}");
            std::fs::remove_dir_all(dir).unwrap();
        }
        let (dir, file) = config_file("c.toml", "database_url = \"postgres://u:hunter2@h/d\n");
        let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
        assert!(
            msg.contains("line 1") && msg.contains("`database_url`"),
            "{msg}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn config_values_of_the_wrong_type_are_named_by_key() {
        let (dir, file) = config_file(
            "c.yaml",
            "database_url: [\"postgres://u:hunter2@h/d\"]\nmigrate: maybe\n",
        );
        let msg = problems(&["--config", file.to_str().unwrap()], &env(&[]));
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(msg.contains("`database_url` must be a string"), "{msg}");
        assert!(msg.contains("`migrate` must be true or false"), "{msg}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_url_password_parameter_is_never_shown() {
        let s = load(
            &["--database-url", "postgres://u@h/d?password=hunter2"],
            &env(&[]),
        )
        .unwrap();
        assert!(!s.database.to_string().contains("hunter2"));
    }

    #[test]
    fn stop_grace_defaults_to_a_quarter_ttl_and_must_leave_room_for_a_renewal() {
        let s = load(&[], &env(&[])).unwrap();
        assert_eq!(s.stop_grace, Duration::from_millis(300));
        let s = load(&["--ttl", "10s", "--stop-grace", "2s"], &env(&[])).unwrap();
        assert_eq!(s.stop_grace, Duration::from_secs(2));
        let msg = problems(&["--stop-grace", "1s"], &env(&[]));
        assert!(
            msg.contains("`stop_grace` = \"1s\" (from --stop-grace)")
                && msg.contains("at most 375ms"),
            "{msg}"
        );
        let msg = problems(&["--stop-grace", "soon"], &env(&[]));
        assert!(msg.contains("`stop_grace`"), "{msg}");
    }

    #[test]
    fn advertise_is_free_text_of_at_most_255_characters() {
        assert_eq!(load(&[], &env(&[])).unwrap().advertise, None);
        let url = "http://10.1.2.3:8080/ü";
        let s = load(&["--advertise", url], &env(&[])).unwrap();
        assert_eq!(s.advertise.as_deref(), Some(url));
        let s = load(&[], &env(&[("LEADERD_ADVERTISE", "grpc://a:9")])).unwrap();
        assert_eq!(s.advertise.as_deref(), Some("grpc://a:9"));
        let longest = "é".repeat(255);
        assert!(load(&["--advertise", &longest], &env(&[])).is_ok());
        for (bad, says) in [
            ("", "1 to 255 characters, got 0"),
            (&*"a".repeat(256), "got 256"),
            ("http://a\n:80", "control characters"),
            (" http://a:80", "white space"),
            (
                "http://$(POD_IP):8080",
                "$(POD_IP), a Kubernetes variable that was not expanded",
            ),
        ] {
            let msg = problems(&["--advertise", bad], &env(&[]));
            assert!(
                msg.contains("`advertise`") && msg.contains(says),
                "{bad:?}: {msg}"
            );
        }
    }

    #[test]
    fn priority_is_a_bounded_whole_number_from_any_source() {
        assert_eq!(load(&[], &env(&[])).unwrap().priority, 0);
        assert_eq!(load(&["--priority", "-5"], &env(&[])).unwrap().priority, -5);
        let s = load(&[], &env(&[("LEADERD_PRIORITY", "7")])).unwrap();
        assert_eq!(s.priority, 7);
        let (_dir, file) = config_file("p.toml", "priority = 3\n");
        let s = load(&["--config", file.to_str().unwrap()], &env(&[])).unwrap();
        assert_eq!(s.priority, 3);
        // White space around a number is dropped, as around a duration
        // (an environment variable written `" 5"`); inside one it is not.
        for (spaced, n) in [(" 5", 5), ("4 ", 4), ("\t9\n", 9)] {
            assert_eq!(
                load(&["--priority", spaced], &env(&[])).unwrap().priority,
                n
            );
            let s = load(&[], &env(&[("LEADERD_APP_HEALTH_FAILURES", spaced)]));
            assert_eq!(s.map(|s| s.app_health_failures).ok(), u32::try_from(n).ok());
        }
        let s = load(&["--heartbeat", " 250ms "], &env(&[])).unwrap();
        assert_eq!(s.timing.heartbeat(), Duration::from_millis(250));
        for bad in ["high", "1.5", "1000001", "", "1 000", "+ 5"] {
            let msg = problems(&["--priority", bad], &env(&[]));
            assert!(
                msg.contains("`priority`") && msg.contains("-1000000"),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn app_health_is_an_http_url_and_failures_a_count() {
        let s = load(
            &["--app-health", "http://127.0.0.1:8080/healthz?deep=1"],
            &env(&[]),
        )
        .unwrap();
        let h = s.app_health.unwrap();
        assert_eq!((h.host.as_str(), h.port), ("127.0.0.1", 8080));
        assert_eq!(h.target, "/healthz?deep=1");
        assert_eq!(s.app_health_failures, 3);
        let msg = problems(
            &[
                "--app-health",
                "https://app/healthz",
                "--app-health-failures",
                "0",
            ],
            &env(&[]),
        );
        assert!(
            msg.contains("`app_health`") && msg.contains("`app_health_failures`"),
            "{msg}"
        );
    }

    #[test]
    fn release_reads_only_the_listen_addresses() {
        let cli = crate::cli::Cli::try_parse_from(["leaderd", "release"]).unwrap();
        // No database in a Kubernetes pod would stop `run`, not `release`.
        let e = env(&[
            ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ("LEADERD_LISTEN", "127.0.0.1:4041"),
        ]);
        assert_eq!(
            release_target(&cli.config(), &e).unwrap().to_string(),
            "127.0.0.1:4041"
        );
        // Not loopback: the next port, on loopback.
        let e = env(&[("LEADERD_LISTEN", "0.0.0.0:4040")]);
        assert_eq!(
            release_target(&cli.config(), &e).unwrap().to_string(),
            "127.0.0.1:4041"
        );
        let e = env(&[
            ("LEADERD_LISTEN", "0.0.0.0:4040"),
            ("LEADERD_RELEASE_LISTEN", "[::1]:9000"),
        ]);
        assert_eq!(
            release_target(&cli.config(), &e).unwrap().to_string(),
            "[::1]:9000"
        );
    }

    #[test]
    fn release_listen_must_be_loopback() {
        let err = load(&["--release-listen", "0.0.0.0:4041"], &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`release_listen`") && err.contains("loopback"),
            "{err}"
        );
        let err = load(&["--listen", "0.0.0.0:65535"], &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("`release_listen` must be set"), "{err}");
    }

    #[test]
    fn migrate_flags() {
        assert!(!load(&["--no-migrate"], &env(&[])).unwrap().migrate);
        assert!(
            !load(&[], &env(&[("LEADERD_MIGRATE", "false")]))
                .unwrap()
                .migrate
        );
        assert!(problems(&[], &env(&[("LEADERD_MIGRATE", "maybe")])).contains("`migrate`"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]

        /// Any value of any key, from the environment: no panic, and every
        /// problem names its key.
        #[test]
        fn any_value_is_accepted_or_named(key in 0..KEYS.len(), value in "\\PC{0,40}") {
            let key = KEYS[key];
            let var = format!("LEADERD_{}", key.to_ascii_uppercase());
            // database_url_file would read an arbitrary path; skip it here.
            if key != "database_url_file" {
                if let Err(e) = load(&[], &env(&[(var.as_str(), value.as_str()), ("POD_NAME", "p")])) {
                    for p in &e.problems {
                        proptest::prop_assert!(p.contains('`'), "no key named: {p}");
                    }
                }
            }
        }

        /// Any text as a config file: no panic, and a planted secret never
        /// shows in the errors.
        #[test]
        fn any_config_file_is_read_or_refused_cleanly(
            text in "\\PC{0,120}",
            yaml in proptest::bool::ANY,
        ) {
            let planted = format!("database_url = \"postgres://u:Pl4nt3dS3cret@h/d\"\n{text}");
            let (dir, file) = config_file(if yaml { "c.yaml" } else { "c.toml" }, &planted);
            let result = load(&["--config", file.to_str().unwrap()], &env(&[("POD_NAME", "p")]));
            std::fs::remove_dir_all(dir).unwrap();
            if let Err(e) = result {
                proptest::prop_assert!(!e.to_string().contains("Pl4nt3dS3cret"), "{e}");
            }
        }

        /// Durations: no panic on any text, and huge values are refused, not
        /// wrapped.
        #[test]
        fn any_duration_is_parsed_or_refused(value in "[0-9]{1,25}(ns|us|ms|s|m|h|d|y)?") {
            let _ = load(&["--ttl", &value], &env(&[("POD_NAME", "p")]));
        }
    }
}
