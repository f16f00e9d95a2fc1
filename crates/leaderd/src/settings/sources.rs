//! Where the settings come from: flags, `LEADERD_*` variables, a config
//! file (TOML or YAML) and `DATABASE_URL`, layered by precedence into one
//! raw value per key, each remembering its source for the error messages.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::cli::ConfigArgs;

use super::{KEYS, NAME_SEP};

/// A value and where it came from, for error messages.
#[derive(Debug, Clone)]
pub(super) struct Sourced {
    pub(super) value: String,
    pub(super) from: String,
}

/// The raw, layered values of every key.
pub(super) struct Layers {
    pub(super) values: BTreeMap<&'static str, Sourced>,
}

impl Layers {
    pub(super) fn get(&self, key: &str) -> Option<&Sourced> {
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

pub(super) fn layer(
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
            Some(&"election") => match one_name(&name, &value) {
                Ok(()) => {
                    values.insert("election", Sourced { value, from: name });
                }
                Err(e) => problems.push(e),
            },
            Some(k) => {
                values.insert(k, Sourced { value, from: name });
            }
            None => warnings.push(format!("ignoring unknown environment variable {name}")),
        }
    }
    for name in &args.election {
        if let Err(e) = one_name("--election", name) {
            problems.push(e);
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
        ("priority", args.priority.clone()),
        ("advertise", args.advertise.clone()),
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
        ("election_metrics", args.election_metrics.clone()),
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

/// The singular `election` holds one name. A comma or a line break in it
/// is a list meant for `elections`, and would otherwise make one odd name
/// (a comma) or, silently, two elections (a line break separates the
/// names of the list form in the layers).
fn one_name(from: &str, value: &str) -> Result<(), String> {
    if value.contains([',', '\n', '\r']) {
        Err(format!(
            "{from}: `election` is one name, got {value:?}; for several elections use \
             `elections` (LEADERD_ELECTIONS=a,b, `elections = [\"a\", \"b\"]` in a file, or \
             --election once per name)"
        ))
    } else {
        Ok(())
    }
}

/// The keys of a config file with their values as text, or a problem for
/// each entry that cannot be used. Messages name keys, lines and columns,
/// never a value: a value may be a URL with a password.
pub(super) fn read_file(path: &Path) -> Vec<Result<(&'static str, String), String>> {
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
            } else if *known == "election" {
                match value.into_string() {
                    Ok(name) => match one_name(&format!("config file {shown}"), &name) {
                        Ok(()) => Ok(name),
                        Err(e) => return Err(e),
                    },
                    Err(e) => Err(e),
                }
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
pub(super) fn syntax_error(msg: &str, text: &str) -> String {
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

pub(super) fn problem(
    problems: &mut Vec<String>,
    key: &str,
    s: &Sourced,
    shown: &str,
    why: impl fmt::Display,
) {
    problems.push(format!("`{key}` = {shown:?} (from {}): {why}", s.from));
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
