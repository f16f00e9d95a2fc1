//! Configuration: flags > `LEADERD_*` environment > config file (TOML/YAML) >
//! `DATABASE_URL` (for `database_url` only) > defaults.
//!
//! Everything is validated here, before anything binds or connects, and every
//! problem is reported with its key, its value (passwords redacted) and where
//! the value came from. Unknown keys in a file are errors; unknown `LEADERD_*`
//! variables only warnings, because Kubernetes injects `LEADERD_PORT` and the
//! like into every pod when a Service is named `leaderd`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leaderd_core::spread::PRESENCE_PREFIX;
use leaderd_core::{Timing, MAX_NAME_CHARS};
use leaderd_store::DatabaseUrl;

use crate::cli::ConfigArgs;

/// Every key, in the order the README documents them.
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
    "stop_grace",
    "exec",
    "spread",
];

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

fn read_url_file(path: &Path) -> Result<DatabaseUrl, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    DatabaseUrl::parse(text.trim_end_matches(['\n', '\r']))
        .map_err(|e| format!("{} holds an {e}", path.display()))
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

/// A value and where it came from, for error messages.
#[derive(Debug, Clone)]
struct Sourced {
    value: String,
    from: String,
}

/// The raw, layered values of every key.
struct Layers {
    values: BTreeMap<&'static str, Sourced>,
}

impl Layers {
    fn get(&self, key: &str) -> Option<&Sourced> {
        self.values.get(key)
    }
}

/// Where the process environment comes from; a map in tests.
pub trait Env {
    fn var(&self, key: &str) -> Option<String>;
    fn vars(&self) -> Vec<(String, String)>;
}

/// The real process environment.
#[derive(Debug)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
    fn vars(&self) -> Vec<(String, String)> {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect()
    }
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

fn layer(
    args: &ConfigArgs,
    env: &dyn Env,
    problems: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Layers {
    let mut values = BTreeMap::new();
    // Lowest first; later layers overwrite.
    if let Some(url) = env.var("DATABASE_URL") {
        values.insert(
            "database_url",
            Sourced {
                value: url,
                from: "DATABASE_URL".into(),
            },
        );
    }
    if let Some(path) = &args.config {
        let from = format!("config file {}", path.display());
        for entry in read_file(path) {
            match entry {
                Ok((key, value)) => {
                    values.insert(
                        key,
                        Sourced {
                            value,
                            from: from.clone(),
                        },
                    );
                }
                Err(e) => problems.push(e),
            }
        }
    }
    for (name, value) in env.vars() {
        let Some(key) = name.strip_prefix("LEADERD_") else {
            continue;
        };
        let key = key.to_ascii_lowercase();
        match KEYS.iter().find(|k| **k == key) {
            Some(&"elections") => {
                let list: Vec<&str> = value.split(',').map(str::trim).collect();
                let value = list.join(&NAME_SEP.to_string());
                if env.var("LEADERD_ELECTION").is_some() {
                    problems.push(
                        "LEADERD_ELECTION and LEADERD_ELECTIONS are both set; set one".into(),
                    );
                }
                values.insert("election", Sourced { value, from: name });
            }
            Some(k) => {
                values.insert(k, Sourced { value, from: name });
            }
            None => warnings.push(format!("ignoring unknown environment variable {name}")),
        }
    }
    let flags = [
        ("database_url", args.database_url.clone()),
        ("database_url_file", args.database_url_file.clone()),
        (
            "election",
            (!args.election.is_empty()).then(|| args.election.join(&NAME_SEP.to_string())),
        ),
        ("id", args.id.clone()),
        ("heartbeat", args.heartbeat.clone()),
        ("ttl", args.ttl.clone()),
        ("listen", args.listen.clone()),
        ("release_listen", args.release_listen.clone()),
        ("flag_file", args.flag_file.clone()),
        (
            "migrate",
            match (args.migrate, args.no_migrate) {
                (true, _) => Some("true".to_owned()),
                (_, true) => Some("false".to_owned()),
                _ => None,
            },
        ),
        ("log_format", args.log_format.clone()),
        ("app_health", args.app_health.clone()),
        ("app_health_failures", args.app_health_failures.clone()),
        ("stop_grace", args.stop_grace.clone()),
        (
            "exec",
            (!args.exec.is_empty()).then(|| args.exec.join("\n")),
        ),
        (
            "spread",
            match (args.spread, args.no_spread) {
                (true, _) => Some("true".to_owned()),
                (_, true) => Some("false".to_owned()),
                _ => None,
            },
        ),
    ];
    for (key, value) in flags {
        if let Some(value) = value {
            values.insert(
                key,
                Sourced {
                    value,
                    from: format!("--{}", key.replace('_', "-")),
                },
            );
        }
    }
    Layers { values }
}

/// The keys of a config file with their values as text, or a problem for
/// each entry that cannot be used. Messages name keys, lines and columns,
/// never a value: a value may be a URL with a password.
fn read_file(path: &Path) -> Vec<Result<(&'static str, String), String>> {
    let shown = path.display();
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    let format = match ext.to_ascii_lowercase().as_str() {
        "toml" => config::FileFormat::Toml,
        "yaml" | "yml" => config::FileFormat::Yaml,
        _ => {
            return vec![Err(format!(
                "config file {shown}: unknown format (name it *.toml, *.yaml or *.yml)"
            ))]
        }
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return vec![Err(format!("config file {shown}: {e}"))],
    };
    let table = config::Config::builder()
        .add_source(config::File::from_str(&text, format))
        .build()
        .and_then(|c| c.try_deserialize::<config::Map<String, config::Value>>());
    let table = match table {
        Ok(t) => t,
        Err(e) => {
            return vec![Err(format!(
                "config file {shown}: {}",
                syntax_error(&e.to_string(), &text)
            ))]
        }
    };
    let mut entries: Vec<_> = table.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let both = ["election", "elections"]
        .iter()
        .all(|k| entries.iter().any(|(key, _)| key == k));
    if both {
        return vec![Err(format!(
            "config file {shown}: `election` and `elections` are both set; set one"
        ))];
    }
    entries
        .into_iter()
        .map(|(key, value)| {
            let Some(known) = KEYS.iter().find(|k| **k == key) else {
                return Err(format!(
                    "config file {shown}: unknown key `{key}` (known keys: {})",
                    KEYS.join(", ")
                ));
            };
            let boolean = matches!(*known, "migrate" | "spread");
            let text = if boolean {
                value.into_bool().map(|b| b.to_string())
            } else if *known == "exec" {
                return exec_table(value)
                    .map(|t| ("exec", t))
                    .map_err(|why| format!("config file {shown}: `exec` must be {why}"));
            } else if *known == "elections" {
                value.into_array().and_then(|names| {
                    let names: Result<Vec<String>, _> =
                        names.into_iter().map(|n| n.into_string()).collect();
                    names.map(|n| n.join(&NAME_SEP.to_string()))
                })
            } else {
                value.into_string()
            };
            // One setting under two names: `elections` is the list form.
            let known = if *known == "elections" {
                &"election"
            } else {
                known
            };
            text.map(|t| (*known, t)).map_err(|_| {
                let expected = match *known {
                    _ if boolean => "true or false",
                    "election" if key == "elections" => "a list of strings",
                    _ => "a string",
                };
                format!("config file {shown}: `{key}` must be {expected}")
            })
        })
        .collect()
}

/// Where a parser's message says the syntax broke: line, column and the key
/// on that line, if it is one of ours. The parsers' own messages quote the
/// offending line, which may hold a password, so nothing else is kept.
fn syntax_error(msg: &str, text: &str) -> String {
    let number_after = |word: &str| {
        let at = msg.find(word)? + word.len();
        let digits: String = msg[at..]
            .trim_start_matches([' ', ':'])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse::<usize>().ok()
    };
    let Some(line) = number_after("line") else {
        return "syntax error".into();
    };
    let mut at = format!("syntax error at line {line}");
    if let Some(column) = number_after("column") {
        at.push_str(&format!(", column {column}"));
    }
    let key = text
        .lines()
        .nth(line.saturating_sub(1))
        .and_then(|l| l.split(['=', ':']).next())
        .map(str::trim)
        .and_then(|k| KEYS.iter().find(|known| **known == k));
    if let Some(key) = key {
        at.push_str(&format!(" (in `{key}`)"));
    }
    at
}

fn problem(
    problems: &mut Vec<String>,
    key: &str,
    s: &Sourced,
    shown: &str,
    why: impl fmt::Display,
) {
    problems.push(format!("`{key}` = {shown:?} (from {}): {why}", s.from));
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
        id: id?,
        timing: timing?,
        listen: listen?,
        release_listen: release_listen?,
        flag_file,
        migrate: migrate?,
        log_format: log_format?,
        app_health: app_health?,
        app_health_failures: app_health_failures?,
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

/// The app's health URL: plain HTTP to a host and port (the app beside
/// leaderd); HTTPS is not supported.
fn parse_health_url(raw: &str) -> Result<AppHealth, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("{e} (expected http://HOST:PORT/PATH)"))?;
    if url.scheme() != "http" {
        return Err("only http:// is supported (the app beside leaderd, e.g. http://127.0.0.1:8080/healthz)".into());
    }
    let host = match url.host() {
        Some(url::Host::Ipv6(a)) => a.to_string(),
        Some(h) => h.to_string(),
        None => return Err("no host".into()),
    };
    let mut target = url.path().to_owned();
    if let Some(q) = url.query() {
        target.push('?');
        target.push_str(q);
    }
    Ok(AppHealth {
        host,
        port: url.port_or_known_default().unwrap_or(80),
        target,
        url: raw.to_owned(),
    })
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

fn listen_key(layers: &Layers, problems: &mut Vec<String>) -> Option<SocketAddr> {
    match layers.get("listen") {
        None => Some(SocketAddr::from(([127, 0, 0, 1], 4040))),
        Some(s) => socket_addr("listen", s, problems),
    }
}

/// `release_listen`: a loopback address; by default `listen` when that is
/// loopback, else 127.0.0.1 on the port after `listen`'s.
fn release_key(
    layers: &Layers,
    listen: SocketAddr,
    problems: &mut Vec<String>,
) -> Option<SocketAddr> {
    let Some(s) = layers.get("release_listen") else {
        if listen.ip().is_loopback() {
            return Some(listen);
        }
        let Some(port) = listen.port().checked_add(1) else {
            problems.push(format!(
                "`release_listen` must be set: `listen` ({listen}) is not loopback and has no next port"
            ));
            return None;
        };
        return Some(SocketAddr::from(([127, 0, 0, 1], port)));
    };
    let addr = socket_addr("release_listen", s, problems)?;
    if !addr.ip().is_loopback() {
        problem(
            problems,
            "release_listen",
            s,
            &s.value,
            "must be a loopback address (127.0.0.1:PORT or [::1]:PORT): only this pod may ask for a release",
        );
        return None;
    }
    Some(addr)
}

fn socket_addr(key: &str, s: &Sourced, problems: &mut Vec<String>) -> Option<SocketAddr> {
    match s.value.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(e) => {
            problem(
                problems,
                key,
                s,
                &s.value,
                format!("{e} (expected HOST:PORT, e.g. 0.0.0.0:4040)"),
            );
            None
        }
    }
}

/// What can be checked of a parsed URL before connecting: a SQLite file on
/// a network or FUSE file system is refused.
fn usable(url: &DatabaseUrl) -> Result<(), String> {
    match url.sqlite_path() {
        Some(path) => leaderd_store::check_file_system(path).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

fn name_key(
    layers: &Layers,
    key: &str,
    default: impl FnOnce() -> Option<String>,
    problems: &mut Vec<String>,
) -> Option<String> {
    match layers.get(key) {
        Some(s) => check_name(key, s, problems),
        None => default(),
    }
}

/// A name (`id`, an election): 1–100 characters, no control characters, no
/// outer white space.
fn check_name(key: &str, s: &Sourced, problems: &mut Vec<String>) -> Option<String> {
    let chars = s.value.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        problem(
            problems,
            key,
            s,
            &s.value,
            format!("must be 1 to {MAX_NAME_CHARS} characters, got {chars}"),
        );
        None
    } else if s.value.chars().any(char::is_control) {
        problem(
            problems,
            key,
            s,
            &s.value,
            "must not contain control characters",
        );
        None
    } else if s.value.trim() != s.value {
        // MySQL's PAD SPACE collations compare `x` and `x ` as equal; no
        // name that differs only there is allowed anywhere.
        problem(
            problems,
            key,
            s,
            &s.value,
            "must not start or end with white space",
        );
        None
    } else {
        Some(s.value.clone())
    }
}

/// `election` (one name) or `elections` (several; `LEADERD_ELECTIONS=a,b`,
/// `--election` given more than once): 1–100 characters each, no repeats.
fn elections_key(layers: &Layers, problems: &mut Vec<String>) -> Option<Vec<String>> {
    let Some(s) = layers.get("election") else {
        return Some(vec!["default".into()]);
    };
    let mut names: Vec<String> = Vec::new();
    let mut ok = true;
    for name in s.value.split(NAME_SEP) {
        let one = Sourced {
            value: name.to_owned(),
            from: s.from.clone(),
        };
        match check_name("election", &one, problems) {
            Some(n) if n.starts_with(PRESENCE_PREFIX) => {
                let why = format!("names starting with {PRESENCE_PREFIX:?} are leaderd's own");
                problem(problems, "election", &one, name, why);
                ok = false;
            }
            Some(n) if names.contains(&n) => {
                problem(problems, "election", &one, name, "is listed twice");
                ok = false;
            }
            Some(n) => names.push(n),
            None => ok = false,
        }
    }
    ok.then_some(names)
}

/// The file's `exec` table (election name → command, as one string split
/// the way a shell splits words, or as a list of arguments) as the lines
/// `NAME=CMD` that `--exec` and `LEADERD_EXEC` give.
fn exec_table(value: config::Value) -> Result<String, &'static str> {
    const EXPECTED: &str = "a table of election name = command (a string or a list of strings)";
    let table = value.into_table().map_err(|_| EXPECTED)?;
    let mut lines = Vec::new();
    for (name, command) in table {
        // Only text: `mailer = true` must not run `true`.
        let word = |v: config::Value| match v.kind {
            config::ValueKind::String(w) => Ok(w),
            _ => Err(EXPECTED),
        };
        let command = match command.kind {
            config::ValueKind::Array(words) => {
                shell_words::join(words.into_iter().map(word).collect::<Result<Vec<_>, _>>()?)
            }
            _ => word(command)?,
        };
        if command.contains('\n') || name.contains('\n') {
            return Err("one line per command (no line breaks)");
        }
        lines.push(format!("{name}={command}"));
    }
    lines.sort();
    Ok(lines.join("\n"))
}

/// `exec`: one `NAME=CMD` per line (`--exec` given once per election), each
/// naming a configured election once, CMD split into words as a shell
/// would (quotes and backslashes; nothing expanded). Ordered as the
/// elections are.
fn exec_key(
    layers: &Layers,
    elections: Option<&[String]>,
    problems: &mut Vec<String>,
) -> Option<Vec<(String, Vec<String>)>> {
    let Some(s) = layers.get("exec") else {
        return Some(Vec::new());
    };
    let elections = elections?;
    let mut commands: Vec<(String, Vec<String>)> = Vec::new();
    let mut ok = true;
    // Longest names first: a name may itself hold `=` (`a` and `a=b`).
    let mut by_length: Vec<&String> = elections.iter().collect();
    by_length.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for line in s.value.lines().filter(|l| !l.trim().is_empty()) {
        let line = line.trim_start();
        let found = by_length.iter().find_map(|name| {
            let rest = line.strip_prefix(name.as_str())?.trim_start();
            Some((name.as_str(), rest.strip_prefix('=')?))
        });
        // The command is not shown: it may carry a secret.
        let shown = format!("{}=…", line.split('=').next().unwrap_or_default().trim());
        let mut bad = |why: String| {
            problem(problems, "exec", s, &shown, why);
            ok = false;
        };
        let Some((name, command)) = found else {
            bad(match line.split_once('=') {
                None => "expected NAME=COMMAND".into(),
                Some((name, _)) => format!(
                    "no election {:?} is configured (elections: {})",
                    name.trim(),
                    elections.join(", ")
                ),
            });
            continue;
        };
        if commands.iter().any(|(n, _)| n == name) {
            bad(format!("election {name:?} has two commands"));
            continue;
        }
        match shell_words::split(command) {
            Ok(words) if !words.is_empty() => commands.push((name.to_owned(), words)),
            Ok(_) => bad("the command is empty".into()),
            Err(e) => bad(format!("cannot split the command into words: {e}")),
        }
    }
    commands.sort_by_key(|(name, _)| elections.iter().position(|e| e == name));
    ok.then_some(commands)
}

/// A boolean key, `true` when unset.
fn bool_key(layers: &Layers, key: &str, problems: &mut Vec<String>) -> Option<bool> {
    match layers.get(key) {
        None => Some(true),
        Some(s) => match s.value.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Some(true),
            "false" | "0" | "no" | "off" => Some(false),
            _ => {
                problem(problems, key, s, &s.value, "expected true or false");
                None
            }
        },
    }
}

/// The flag file's path for `election`: `{election}` filled in.
fn flag_path(path: &Path, election: &str) -> PathBuf {
    PathBuf::from(path.to_string_lossy().replace("{election}", election))
}

/// The flag file of every election: with several, the path must hold
/// `{election}` (one file cannot say which of them this replica leads), and
/// each file is written atomically beside itself, so its directory must
/// exist now, or every grant would fail to announce itself.
fn check_flag_file(
    path: &Path,
    elections: Option<&[String]>,
    s: &Sourced,
    problems: &mut Vec<String>,
) -> Option<PathBuf> {
    let elections = elections?;
    if elections.len() > 1 && !s.value.contains("{election}") {
        problem(
            problems,
            "flag_file",
            s,
            &s.value,
            "must contain {election} when several elections are configured (one file per election)",
        );
        return None;
    }
    for election in elections {
        let file = flag_path(path, election);
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !dir.is_dir() {
            problem(
                problems,
                "flag_file",
                s,
                &s.value,
                format!("directory {} does not exist", dir.display()),
            );
            return None;
        }
    }
    Some(path.to_path_buf())
}

fn duration_key(
    layers: &Layers,
    key: &str,
    default: Duration,
    problems: &mut Vec<String>,
) -> Option<Duration> {
    let Some(s) = layers.get(key) else {
        return Some(default);
    };
    match humantime::parse_duration(s.value.trim()) {
        Ok(d) => Some(d),
        Err(e) => {
            problem(
                problems,
                key,
                s,
                &s.value,
                format!("{e} (expected a duration such as 1s or 250ms)"),
            );
            None
        }
    }
}

/// `$POD_NAME`, else `$HOSTNAME`, else the host name, else a random UUID.
fn default_id(env: &dyn Env) -> Option<String> {
    let usable = |s: &String| !s.is_empty() && s.chars().count() <= MAX_NAME_CHARS;
    env.var("POD_NAME")
        .filter(usable)
        .or_else(|| env.var("HOSTNAME").filter(usable))
        .or_else(|| {
            let name = rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned();
            Some(name).filter(usable)
        })
        .or_else(|| Some(uuid::Uuid::new_v4().to_string()))
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

    fn load(argv: &[&str], e: &MapEnv) -> Result<Settings, ConfigError> {
        let cli =
            crate::cli::Cli::try_parse_from(std::iter::once("leaderd").chain(argv.iter().copied()))
                .unwrap();
        Settings::load(&cli.config, e)
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
        let msg = problems(&[], &env(&[("LEADERD_ELECTIONS", "a,,b")]));
        assert!(
            msg.contains("LEADERD_ELECTIONS") && msg.contains("1 to 100"),
            "{msg}"
        );
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
            release_target(&cli.config, &e).unwrap().to_string(),
            "127.0.0.1:4041"
        );
        // Not loopback: the next port, on loopback.
        let e = env(&[("LEADERD_LISTEN", "0.0.0.0:4040")]);
        assert_eq!(
            release_target(&cli.config, &e).unwrap().to_string(),
            "127.0.0.1:4041"
        );
        let e = env(&[
            ("LEADERD_LISTEN", "0.0.0.0:4040"),
            ("LEADERD_RELEASE_LISTEN", "[::1]:9000"),
        ]);
        assert_eq!(
            release_target(&cli.config, &e).unwrap().to_string(),
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
