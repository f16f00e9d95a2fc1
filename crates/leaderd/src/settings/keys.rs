//! Reading and checking one key (or a few that go together): names,
//! elections, `exec` commands, addresses, durations, the flag file, the
//! health URL. Each reports its problems naming the key and the value's
//! source, and never a password.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leaderd_core::spread::PRESENCE_PREFIX;
use leaderd_core::MAX_NAME_CHARS;
use leaderd_store::DatabaseUrl;
use leaderd_store::WARM_UP_PREFIX;

use super::sources::{problem, Env, Layers, Sourced};
use super::{AppHealth, NAME_SEP};

pub(super) fn read_url_file(path: &Path) -> Result<DatabaseUrl, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    DatabaseUrl::parse(text.trim_end_matches(['\n', '\r']))
        .map_err(|e| format!("{} holds an {e}", path.display()))
}

/// The app's health URL: plain HTTP to a host and port (the app beside
/// leaderd); HTTPS is not supported.
pub(super) fn parse_health_url(raw: &str) -> Result<AppHealth, String> {
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

pub(super) fn listen_key(layers: &Layers, problems: &mut Vec<String>) -> Option<SocketAddr> {
    match layers.get("listen") {
        None => Some(SocketAddr::from(([127, 0, 0, 1], 4040))),
        Some(s) => socket_addr("listen", s, problems),
    }
}

/// `release_listen`: a loopback address; by default `listen` when that is
/// loopback, else 127.0.0.1 on the port after `listen`'s.
pub(super) fn release_key(
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

pub(super) fn socket_addr(
    key: &str,
    s: &Sourced,
    problems: &mut Vec<String>,
) -> Option<SocketAddr> {
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
pub(super) fn usable(url: &DatabaseUrl) -> Result<(), String> {
    match url.sqlite_path() {
        Some(path) => leaderd_store::check_file_system(path).map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

pub(super) fn name_key(
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

use leaderd_store::MAX_ADDRESS_CHARS as MAX_ADVERTISE_CHARS;

/// `advertise`: free text of 1–255 characters, no control characters, no
/// outer white space; and no `$(VAR)` left unexpanded (Kubernetes leaves
/// one as it is when `VAR` is not defined earlier in the container's `env`,
/// and every follower would be told to reach `$(POD_IP)`).
pub(super) fn check_advertise(value: &str) -> Result<String, String> {
    let chars = value.chars().count();
    if chars == 0 || chars > MAX_ADVERTISE_CHARS {
        return Err(format!(
            "must be 1 to {MAX_ADVERTISE_CHARS} characters, got {chars}"
        ));
    }
    if value.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    if value.trim() != value {
        return Err("must not start or end with white space".into());
    }
    if let Some(start) = value.find("$(") {
        let var = value[start..].split(')').next().unwrap_or_default();
        return Err(format!(
            "holds {var}), a Kubernetes variable that was not expanded: define it earlier \
             in the container's env than the variable that uses it"
        ));
    }
    Ok(value.to_owned())
}

/// A name (`id`, an election): 1–100 characters, no control characters, no
/// outer white space.
pub(super) fn check_name(key: &str, s: &Sourced, problems: &mut Vec<String>) -> Option<String> {
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
pub(super) fn elections_key(layers: &Layers, problems: &mut Vec<String>) -> Option<Vec<String>> {
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
            Some(n) if n.starts_with(PRESENCE_PREFIX) || n.starts_with(WARM_UP_PREFIX) => {
                let prefix = if n.starts_with(PRESENCE_PREFIX) {
                    PRESENCE_PREFIX
                } else {
                    WARM_UP_PREFIX
                };
                let why = format!("names starting with {prefix:?} are leaderd's own");
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

/// `exec`: one `NAME=CMD` per line (`--exec` given once per election), each
/// naming a configured election once, CMD split into words as a shell
/// would (quotes and backslashes; nothing expanded). Ordered as the
/// elections are.
pub(super) fn exec_key(
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
pub(super) fn bool_key(layers: &Layers, key: &str, problems: &mut Vec<String>) -> Option<bool> {
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
pub(super) fn flag_path(path: &Path, election: &str) -> PathBuf {
    PathBuf::from(path.to_string_lossy().replace("{election}", election))
}

/// The flag file of every election: with several, the path must hold
/// `{election}` (one file cannot say which of them this replica leads), and
/// each file is written atomically beside itself, so its directory must
/// exist now, or every grant would fail to announce itself.
pub(super) fn check_flag_file(
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

pub(super) fn duration_key(
    layers: &Layers,
    key: &str,
    default: Duration,
    problems: &mut Vec<String>,
) -> Option<Duration> {
    let Some(s) = layers.get(key) else {
        return Some(default);
    };
    let text = s.value.trim();
    match humantime::parse_duration(text) {
        Ok(d) => Some(d),
        Err(e) => {
            let why = match e {
                // Its own words suggest `sec`, where leaderd's docs write `s`.
                humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
                    format!("a unit is needed (ms, s, m, h), for example {text}s")
                }
                e => format!("{e} (expected a duration such as 1s or 250ms)"),
            };
            problem(problems, key, s, &s.value, why);
            None
        }
    }
}

/// `$POD_NAME`, else `$HOSTNAME`, else the host name, else a random UUID.
pub(super) fn default_id(env: &dyn Env) -> Option<String> {
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
