//! Database URLs: which backend, the connection parameters leaderd reads
//! from them (TLS, `application_name`, `connect_timeout`), and a `Display`
//! that never shows the password.
//!
//! Parameters are checked here, with the rest of the configuration: one
//! leaderd does not know, or a bad value, is an error naming it, so a typo
//! such as `sslmode=requre` never connects in plain text. The drivers get a
//! URL without the parameters leaderd handles itself.

use std::fmt;
use std::path::PathBuf;

use super::error::StoreError;
use super::tls::{Files, Verify};

/// The database families leaderd can talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Mysql,
    Sqlite,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// A validated database URL. It holds a secret: `Display` and `Debug` redact
/// the password, and only [`DatabaseUrl::expose`] gives the real text to a
/// driver.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    /// What the driver gets: the URL less the parameters handled here.
    raw: String,
    backend: Backend,
    redacted: String,
    tls: Tls,
}

/// Whether and how a connection is encrypted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tls {
    pub(crate) mode: TlsMode,
    pub(crate) files: Files,
}

/// libpq's `sslmode`, MySQL's `ssl-mode`, in one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// Plain text.
    Disable,
    /// TLS when the server offers it, without checking its certificate.
    Prefer,
    /// TLS or no connection, checking this much of the certificate.
    Require(Verify),
}

/// What a URL parameter is, and so how leaderd reads its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The TLS mode; read here, not passed on.
    Mode,
    /// A PEM file of trusted CAs; read here.
    Root,
    /// A PEM client certificate (chain); read here, with [`Kind::Key`].
    Cert,
    /// The client certificate's key; read here, with [`Kind::Cert`].
    Key,
    /// Whole seconds; passed on to the driver.
    Seconds,
    /// `true` or `false`; passed on.
    Bool,
    /// libpq's `target_session_attrs`: `any` and `read-write` passed on,
    /// `primary` (libpq 14's name for it) passed on as `read-write`; those
    /// that would pick a standby are refused (leaderd writes).
    Sessions,
    /// Passed on as it is (the driver reads it).
    Driver,
}

impl Kind {
    /// Read here, and so kept from the driver.
    fn handled(self) -> bool {
        matches!(self, Kind::Mode | Kind::Root | Kind::Cert | Kind::Key)
    }
}

/// Every parameter of one backend that leaderd accepts: what "leaderd
/// knows" lists, what is read here and what goes on to the driver.
type Params = &'static [(&'static str, Kind)];

/// PostgreSQL's, as libpq names them; tokio-postgres reads the passed-on
/// ones as libpq does.
const POSTGRES: Params = &[
    ("sslmode", Kind::Mode),
    ("sslrootcert", Kind::Root),
    ("sslcert", Kind::Cert),
    ("sslkey", Kind::Key),
    ("application_name", Kind::Driver),
    ("connect_timeout", Kind::Seconds),
    ("options", Kind::Driver),
    ("user", Kind::Driver),
    ("password", Kind::Driver),
    ("dbname", Kind::Driver),
    ("host", Kind::Driver),
    ("port", Kind::Driver),
    ("keepalives", Kind::Driver),
    ("keepalives_idle", Kind::Driver),
    ("target_session_attrs", Kind::Sessions),
];
const PG_MODES: &str = "disable, prefer, require, verify-ca, verify-full";

/// MySQL's, named as MySQL's own clients name them.
const MYSQL: Params = &[
    ("ssl-mode", Kind::Mode),
    ("ssl-ca", Kind::Root),
    ("ssl-cert", Kind::Cert),
    ("ssl-key", Kind::Key),
    ("prefer_socket", Kind::Bool),
];
/// Not `VERIFY_CA`: mysql_async (0.36) can skip the name check only by
/// matching the text of rustls's error, which rustls 0.23 no longer words
/// that way, so it would refuse every server whose name differs. Refused up
/// front rather than failing at connect (docs/databases.md).
const MYSQL_MODES: &str = "DISABLED, PREFERRED, REQUIRED, VERIFY_IDENTITY";

/// The name of the parameter of `kind` among `params`.
fn named(params: Params, kind: Kind) -> &'static str {
    params
        .iter()
        .find(|(_, k)| *k == kind)
        .map_or("", |(name, _)| name)
}

/// Reads the parameters: every one known, none twice, each value valid.
fn parameters(url: &url::Url, backend: Backend) -> Result<Tls, StoreError> {
    let (params, modes) = match backend {
        Backend::Postgres => (POSTGRES, PG_MODES),
        _ => (MYSQL, MYSQL_MODES),
    };
    let mut seen: Vec<String> = Vec::new();
    let mut mode = None;
    let (mut root, mut cert, mut key) = (None, None, None);
    for (k, v) in url.query_pairs() {
        let Some(&(_, kind)) = params.iter().find(|(name, _)| *name == k) else {
            let known: Vec<&str> = params.iter().map(|(name, _)| *name).collect();
            return Err(StoreError::InvalidUrl(format!(
                "unknown parameter `{k}` (leaderd knows: {})",
                known.join(", ")
            )));
        };
        if seen.iter().any(|s| *s == k) {
            return Err(StoreError::InvalidUrl(format!(
                "parameter `{k}` given twice"
            )));
        }
        seen.push(k.clone().into_owned());
        match kind {
            Kind::Mode => {
                if backend == Backend::Mysql && v.eq_ignore_ascii_case("VERIFY_CA") {
                    return Err(StoreError::InvalidUrl(format!(
                        "`{k}={v}` is not supported on MySQL/MariaDB: use VERIFY_IDENTITY \
                         (the server's certificate must name the URL's host) or REQUIRED"
                    )));
                }
                mode = Some(parse_mode(backend, &v).ok_or_else(|| {
                    StoreError::InvalidUrl(format!("`{k}={v}`: expected one of {modes}"))
                })?);
            }
            Kind::Root | Kind::Cert | Kind::Key => {
                if v.is_empty() {
                    return Err(StoreError::InvalidUrl(format!("`{k}` names no file")));
                }
                let file = Some(PathBuf::from(v.into_owned()));
                match kind {
                    Kind::Root => root = file,
                    Kind::Cert => cert = file,
                    _ => key = file,
                }
            }
            Kind::Seconds | Kind::Bool | Kind::Sessions | Kind::Driver => {
                check_value(kind, &k, &v)?
            }
        }
    }
    tls(backend, params, mode, root, (cert, key))
}

/// Checks the value of a parameter that leaderd only reads or passes on.
fn check_value(kind: Kind, k: &str, v: &str) -> Result<(), StoreError> {
    match kind {
        Kind::Seconds if v.parse::<u32>().is_err() => Err(StoreError::InvalidUrl(format!(
            "`{k}={v}`: expected whole seconds"
        ))),
        Kind::Bool if !matches!(v, "true" | "false") => Err(StoreError::InvalidUrl(format!(
            "`{k}={v}`: expected true or false"
        ))),
        Kind::Sessions => match v {
            "any" | "read-write" | "primary" => Ok(()),
            "standby" | "read-only" | "prefer-standby" => Err(StoreError::InvalidUrl(format!(
                "`{k}={v}` would pick a server that cannot write, and leaderd writes \
                 its lease: use read-write (or primary), or any"
            ))),
            _ => Err(StoreError::InvalidUrl(format!(
                "`{k}={v}`: expected any, read-write or primary"
            ))),
        },
        _ => Ok(()),
    }
}

/// The TLS the parameters ask for, once all are read: a client
/// certificate needs its key, MySQL's CA file a mode, and PostgreSQL's
/// `require` with a CA file checks the chain.
fn tls(
    backend: Backend,
    params: Params,
    mode: Option<TlsMode>,
    root: Option<PathBuf>,
    (cert, key): (Option<PathBuf>, Option<PathBuf>),
) -> Result<Tls, StoreError> {
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(StoreError::InvalidUrl(format!(
                "`{}` and `{}` go together (a client certificate and its key)",
                named(params, Kind::Cert),
                named(params, Kind::Key)
            )))
        }
    };
    if backend == Backend::Mysql && mode.is_none() && root.is_some() {
        // MySQL's clients verify the server with `--ssl-ca` and no mode;
        // leaderd's default (PREFERRED) would ignore the file.
        return Err(StoreError::InvalidUrl(
            "`ssl-ca` without `ssl-mode`: set ssl-mode=VERIFY_IDENTITY to verify the server \
             with it (or REQUIRED to encrypt without checking)"
                .to_owned(),
        ));
    }
    let mode = match mode.unwrap_or(TlsMode::Prefer) {
        // As libpq: with a CA file, `require` checks the chain as well.
        TlsMode::Require(Verify::Nothing) if backend == Backend::Postgres && root.is_some() => {
            TlsMode::Require(Verify::Chain)
        }
        m => m,
    };
    Ok(Tls {
        mode,
        files: Files { root, client },
    })
}

fn parse_mode(backend: Backend, v: &str) -> Option<TlsMode> {
    Some(match backend {
        // libpq's values are lower case, and so are leaderd's.
        Backend::Postgres => match v {
            "disable" => TlsMode::Disable,
            "prefer" => TlsMode::Prefer,
            "require" => TlsMode::Require(Verify::Nothing),
            "verify-ca" => TlsMode::Require(Verify::Chain),
            "verify-full" => TlsMode::Require(Verify::Full),
            _ => return None,
        },
        // MySQL's clients take any case.
        _ => match v.to_ascii_uppercase().as_str() {
            "DISABLED" => TlsMode::Disable,
            "PREFERRED" => TlsMode::Prefer,
            "REQUIRED" => TlsMode::Require(Verify::Nothing),
            "VERIFY_IDENTITY" => TlsMode::Require(Verify::Full),
            _ => return None,
        },
    })
}

/// The URL less the parameters read here (see [`Kind::handled`]). The
/// others are kept byte for byte: re-encoding them as a web form would turn
/// `%20` into `+`, which the drivers read literally.
fn without(url: &url::Url, params: Params) -> url::Url {
    let mut out = url.clone();
    let kept: Vec<&str> = url
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|part| !part.is_empty())
        .filter(|part| {
            let key = part.split_once('=').map_or(*part, |(k, _)| k);
            let key = url::form_urlencoded::parse(key.as_bytes())
                .next()
                .map(|(k, _)| k.into_owned())
                .unwrap_or_default();
            !params
                .iter()
                .any(|(name, kind)| *name == key && kind.handled())
        })
        .collect();
    out.set_query((!kept.is_empty()).then(|| kept.join("&")).as_deref());
    out
}

/// `target_session_attrs=primary` spelled as the driver knows it
/// (tokio-postgres reads `read-write` only; both mean "a server that
/// writes").
fn primary_as_read_write(url: &mut url::Url) {
    let Some(query) = url.query() else { return };
    let parts: Vec<&str> = query
        .split('&')
        .map(|part| match part {
            "target_session_attrs=primary" => "target_session_attrs=read-write",
            other => other,
        })
        .collect();
    let query = parts.join("&");
    url.set_query(Some(&query));
}

/// The URL handed to the driver: without the parameters leaderd reads
/// itself, with the ones leaderd sets for it (MySQL: no switch to a Unix
/// socket; PostgreSQL: its `application_name`, `primary` as `read-write`).
fn for_driver(
    parsed: &url::Url,
    backend: Backend,
    host_list: Option<&str>,
) -> Result<String, StoreError> {
    Ok(if backend == Backend::Mysql {
        let mut driver = without(parsed, MYSQL);
        // The driver only knows `mysql://`.
        let _ = driver.set_scheme("mysql");
        // mysql_async would otherwise switch a loopback TCP connection to
        // the server's Unix socket, bypassing whatever the URL names
        // (a proxy, a port forward) and TLS with it.
        if !driver.query_pairs().any(|(k, _)| k == "prefer_socket") {
            driver
                .query_pairs_mut()
                .append_pair("prefer_socket", "false");
        }
        driver.to_string()
    } else {
        let mut driver = without(parsed, POSTGRES);
        primary_as_read_write(&mut driver);
        // Sent in the startup packet: a `SET` would be session state,
        // which a transaction pooler does not keep.
        if !driver.query_pairs().any(|(k, _)| k == "application_name") {
            driver
                .query_pairs_mut()
                .append_pair("application_name", "leaderd");
        }
        let driver = restore_host_list(driver.to_string(), host_list);
        // tokio-postgres's own reading of the rest (host lists, ports);
        // its messages name the option, never the password.
        driver
            .parse::<tokio_postgres::Config>()
            .map_err(|e| StoreError::InvalidUrl(e.to_string()))?;
        driver
    })
}

impl DatabaseUrl {
    /// Parses `postgres://…`, `postgresql://…`, `mysql://…`, `mariadb://…` or
    /// `sqlite://PATH` (also `sqlite:PATH`).
    pub fn parse(raw: &str) -> Result<Self, StoreError> {
        let raw = raw.trim();
        let scheme = raw.split_once(':').map(|(s, _)| s.to_ascii_lowercase());
        let backend = match scheme.as_deref() {
            Some("postgres" | "postgresql") => Backend::Postgres,
            Some("mysql" | "mariadb") => Backend::Mysql,
            Some("sqlite") => Backend::Sqlite,
            Some(other) => {
                return Err(StoreError::InvalidUrl(format!(
                    "unsupported scheme `{other}` (expected postgres://, mysql:// or sqlite://)"
                )))
            }
            None => {
                return Err(StoreError::InvalidUrl(
                    "no scheme (expected postgres://, mysql:// or sqlite://)".into(),
                ))
            }
        };
        if backend == Backend::Sqlite {
            let path = sqlite_path(raw);
            if path.is_empty() {
                return Err(StoreError::InvalidUrl("sqlite URL has no file path".into()));
            }
            return Ok(Self {
                raw: raw.to_owned(),
                backend,
                redacted: raw.to_owned(),
                tls: Tls {
                    mode: TlsMode::Disable,
                    files: Files::default(),
                },
            });
        }
        let (for_url, host_list) = match backend {
            Backend::Postgres => hide_host_list(raw),
            _ => (raw.to_owned(), None),
        };
        let mut parsed = url::Url::parse(&for_url).map_err(|e| {
            // The url crate's messages never echo the input, so the password
            // cannot leak through them.
            StoreError::InvalidUrl(e.to_string())
        })?;
        // libpq also takes the host (a socket directory, say) as `host=`.
        let host_param =
            backend == Backend::Postgres && parsed.query_pairs().any(|(k, _)| k == "host");
        if parsed.host_str().is_none_or(str::is_empty) && !host_param {
            return Err(StoreError::InvalidUrl("URL has no host".into()));
        }
        if parsed.path().trim_start_matches('/').is_empty() {
            return Err(StoreError::InvalidUrl(
                "URL names no database (…/DBNAME)".into(),
            ));
        }
        let tls = parameters(&parsed, backend)?;
        let raw = for_driver(&parsed, backend, host_list.as_deref())?;
        redact(&mut parsed);
        Ok(Self {
            raw,
            backend,
            redacted: restore_host_list(parsed.to_string(), host_list.as_deref()),
            tls,
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL with its password, for the driver only (less the parameters
    /// leaderd handles itself). Never log this.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    pub(crate) fn tls(&self) -> &Tls {
        &self.tls
    }

    /// PostgreSQL: each host of the URL's host list with the driver's URL
    /// for it alone, in order (one entry for a single host, or for hosts,
    /// ports or addresses given as lists in parameters, which the driver
    /// walks itself). Never log the URLs.
    pub(crate) fn postgres_hosts(&self) -> Vec<(String, String)> {
        let whole = || vec![(String::new(), self.raw.clone())];
        let (hidden, hosts) = hide_host_list(&self.raw);
        let Some(hosts) = hosts else {
            return whole();
        };
        let listed_in_parameters = self.raw.split_once('?').is_some_and(|(_, query)| {
            url::form_urlencoded::parse(query.as_bytes())
                .any(|(k, v)| matches!(&*k, "host" | "hostaddr" | "port") && v.contains(','))
        });
        if listed_in_parameters {
            return whole();
        }
        hosts
            .split(',')
            .map(|host| (host.to_owned(), hidden.replacen(HOST_LIST, host, 1)))
            .collect()
    }

    /// For SQLite: the file path.
    pub fn sqlite_path(&self) -> Option<&str> {
        (self.backend == Backend::Sqlite).then(|| sqlite_path(&self.raw))
    }
}

/// Stands for a libpq host list while the url crate reads the rest.
const HOST_LIST: &str = "host-list.leaderd.invalid";

/// libpq's host lists (`h1:5432,h2:5433`, tried in order) are not URL
/// syntax: the url crate would refuse the port. The list is swapped for
/// [`HOST_LIST`] and put back by [`restore_host_list`].
fn hide_host_list(raw: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return (raw.to_owned(), None);
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return (raw.to_owned(), None);
    }
    let hidden = format!("{scheme}://{user}{HOST_LIST}{}", &rest[end..]);
    (hidden, Some(hosts.to_owned()))
}

fn restore_host_list(text: String, hosts: Option<&str>) -> String {
    match hosts {
        Some(hosts) => text.replacen(HOST_LIST, hosts, 1),
        None => text,
    }
}

/// Query parameters that carry a secret (tokio-postgres takes `password=`).
const SECRET_PARAMS: &[&str] = &["password", "sslpassword"];

/// Replaces the password, in the user-info part and in any secret
/// parameter, with `REDACTED`.
fn redact(url: &mut url::Url) {
    if url.password().is_some() {
        let _ = url.set_password(Some("REDACTED"));
    }
    let secret = |k: &str| SECRET_PARAMS.iter().any(|s| k.eq_ignore_ascii_case(s));
    if url.query_pairs().any(|(k, _)| secret(&k)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    "REDACTED".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
}

fn sqlite_path(raw: &str) -> &str {
    let rest = &raw["sqlite:".len()..];
    rest.strip_prefix("//").unwrap_or(rest)
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({})", self.redacted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_the_password_everywhere() {
        let u = DatabaseUrl::parse("postgres://app:s3cr3t@db:5432/app").unwrap();
        assert_eq!(u.backend(), Backend::Postgres);
        assert_eq!(u.to_string(), "postgres://app:REDACTED@db:5432/app");
        assert!(!format!("{u:?}").contains("s3cr3t"));
        assert!(u.expose().contains("s3cr3t"));
    }

    #[test]
    fn redacts_password_parameters() {
        let u =
            DatabaseUrl::parse("postgres://app@db/app?password=s3cr3t&sslmode=require&user=k3y")
                .unwrap();
        let shown = format!("{u} {u:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("password=REDACTED"), "{shown}");
        assert!(shown.contains("sslmode=require"), "{shown}");
        assert!(u.expose().contains("password=s3cr3t"));
    }

    #[test]
    fn knows_the_backends() {
        assert_eq!(
            DatabaseUrl::parse("postgresql://h/d").unwrap().backend(),
            Backend::Postgres
        );
        let m = DatabaseUrl::parse("mariadb://root:pw@h/d").unwrap();
        assert_eq!(m.backend(), Backend::Mysql);
        assert!(m.expose().starts_with("mysql://"));
        assert!(
            m.expose().ends_with("?prefer_socket=false"),
            "{}",
            m.expose()
        );
        let s = DatabaseUrl::parse("sqlite://leaderd.db").unwrap();
        assert_eq!(s.sqlite_path(), Some("leaderd.db"));
        assert_eq!(
            DatabaseUrl::parse("sqlite:///var/x.db")
                .unwrap()
                .sqlite_path(),
            Some("/var/x.db")
        );
    }

    #[test]
    fn rejects_what_it_cannot_use() {
        for bad in [
            "redis://h/0",
            "nonsense",
            "postgres://",
            "postgres://h",
            "sqlite://",
            "mysql://u:p@/d",
        ] {
            let err = DatabaseUrl::parse(bad).unwrap_err().to_string();
            assert!(!err.is_empty(), "{bad}");
            assert!(!err.contains(":p@"), "{err}");
        }
    }

    /// libpq's forms for HA clusters and sockets.
    #[test]
    fn host_lists_and_a_host_parameter_reach_the_driver() {
        let u = DatabaseUrl::parse(
            "postgres://u:s3cr3t@10.0.0.1:5432,10.0.0.2:5433/db?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            u.expose(),
            "postgres://u:s3cr3t@10.0.0.1:5432,10.0.0.2:5433/db?target_session_attrs=read-write&application_name=leaderd"
        );
        assert_eq!(
            u.to_string(),
            "postgres://u:REDACTED@10.0.0.1:5432,10.0.0.2:5433/db?target_session_attrs=read-write"
        );
        let config: tokio_postgres::Config = u.expose().parse().unwrap();
        assert_eq!(config.get_hosts().len(), 2);
        assert_eq!(config.get_ports(), [5432, 5433]);
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        let u = DatabaseUrl::parse("postgres://h1,h2/db?target_session_attrs=any").unwrap();
        assert_eq!(
            u.to_string(),
            "postgres://h1,h2/db?target_session_attrs=any"
        );

        let u = DatabaseUrl::parse("postgres:///db?host=/var/run/postgresql").unwrap();
        let config: tokio_postgres::Config = u.expose().parse().unwrap();
        assert!(matches!(
            config.get_hosts(),
            [tokio_postgres::config::Host::Unix(p)] if p == std::path::Path::new("/var/run/postgresql")
        ));
        // Each host of a list alone, in order, with the rest of the URL.
        let u = DatabaseUrl::parse("postgres://u:pw@h1:5433,h2/db?connect_timeout=1").unwrap();
        let hosts: Vec<(String, String)> = u.postgres_hosts();
        assert_eq!(hosts.len(), 2);
        assert_eq!(hosts[0].0, "h1:5433");
        let one: tokio_postgres::Config = hosts[0].1.parse().unwrap();
        assert_eq!(one.get_ports(), [5433]);
        assert_eq!(one.get_password(), Some(&b"pw"[..]));
        let two: tokio_postgres::Config = hosts[1].1.parse().unwrap();
        assert!(matches!(
            two.get_hosts(),
            [tokio_postgres::config::Host::Tcp(h)] if h == "h2"
        ));
        assert_eq!(
            two.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(1))
        );
        // A port list in the parameters goes to the driver whole.
        let u = DatabaseUrl::parse("postgres://u@h1,h2/db?port=5432,5433").unwrap();
        assert_eq!(u.postgres_hosts().len(), 1);
        // libpq 14's `primary` is read-write; a standby is refused, naming
        // the parameter and why.
        let u = DatabaseUrl::parse("postgres://h1,h2/db?target_session_attrs=primary").unwrap();
        let config: tokio_postgres::Config = u.expose().parse().unwrap();
        assert_eq!(
            config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        assert_eq!(
            u.to_string(),
            "postgres://h1,h2/db?target_session_attrs=primary"
        );
        for standby in ["standby", "read-only", "prefer-standby"] {
            let raw = format!("postgres://h1,h2/db?target_session_attrs={standby}");
            let e = DatabaseUrl::parse(&raw).unwrap_err().to_string();
            assert!(
                e.contains("target_session_attrs") && e.contains("write"),
                "{e}"
            );
        }
        // Still refused: no host at all, a bad attribute, a bad list.
        for bad in [
            "postgres:///db",
            "postgres://h1,h2/db?target_session_attrs=sometimes",
            "postgres://h1:5432,h2:x/db",
        ] {
            assert!(DatabaseUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unknown_parameter_is_named() {
        for (raw, name) in [
            ("postgres://u:pw@h/d?sslmod=require", "`sslmod`"),
            ("postgres://u:pw@h/d?ssl-mode=REQUIRED", "`ssl-mode`"),
            ("mysql://u:pw@h/d?sslmode=require", "`sslmode`"),
            ("mysql://u:pw@h/d?ssl_ca=/x", "`ssl_ca`"),
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err().to_string();
            assert!(
                err.contains("unknown parameter") && err.contains(name),
                "{err}"
            );
            assert!(!err.contains("pw"), "{err}");
        }
    }

    #[test]
    fn a_bad_value_is_named() {
        for (raw, named) in [
            ("postgres://u:pw@h/d?sslmode=requre", "`sslmode=requre`"),
            ("postgres://u:pw@h/d?sslmode=REQUIRE", "`sslmode=REQUIRE`"),
            ("mysql://u:pw@h/d?ssl-mode=VERIFY", "`ssl-mode=VERIFY`"),
            (
                "mysql://u:pw@h/d?ssl-mode=VERIFY_CA",
                "`ssl-mode=VERIFY_CA`",
            ),
            (
                "postgres://u:pw@h/d?connect_timeout=5s",
                "`connect_timeout=5s`",
            ),
            ("postgres://u:pw@h/d?sslcert=/c.pem", "`sslcert`"),
            ("mysql://u:pw@h/d?ssl-key=/k.pem", "`ssl-key`"),
            ("postgres://u:pw@h/d?sslrootcert=", "`sslrootcert`"),
            (
                "postgres://u:pw@h/d?sslmode=require&sslmode=disable",
                "`sslmode`",
            ),
        ] {
            let err = DatabaseUrl::parse(raw).unwrap_err().to_string();
            assert!(err.contains(named), "{raw}: {err}");
            assert!(!err.contains("pw@"), "{err}");
        }
    }

    #[test]
    fn other_parameters_reach_the_driver_byte_for_byte() {
        let u = DatabaseUrl::parse(
            "postgres://u:a%20b@h/d?options=-c%20statement_timeout%3D5000&sslmode=disable",
        )
        .unwrap();
        assert!(
            u.expose().contains("options=-c%20statement_timeout%3D5000"),
            "{}",
            u.expose()
        );
        assert!(!u.expose().contains("sslmode"));
    }

    #[test]
    fn a_mysql_ca_file_needs_a_mode() {
        let e = DatabaseUrl::parse("mysql://u@h/d?ssl-ca=/ca.pem").unwrap_err();
        assert!(e.to_string().contains("ssl-mode=VERIFY_IDENTITY"), "{e}");
        assert!(DatabaseUrl::parse("mysql://u@h/d?ssl-ca=/ca.pem&ssl-mode=REQUIRED").is_ok());
    }

    #[test]
    fn tls_parameters_are_read_and_kept_from_the_driver() {
        let u = DatabaseUrl::parse(
            "postgres://u@h/d?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
        )
        .unwrap();
        assert_eq!(u.tls().mode, TlsMode::Require(Verify::Full));
        assert_eq!(u.tls().files.root.as_deref(), Some("/ca.pem".as_ref()));
        assert_eq!(
            u.expose(),
            "postgres://u@h/d?connect_timeout=3&application_name=leaderd"
        );
        assert!(u.to_string().contains("sslmode=verify-full"), "{u}");
        // libpq's default, and `require` with a CA file checks the chain.
        let d = DatabaseUrl::parse("postgres://u@h/d").unwrap();
        assert_eq!(d.tls().mode, TlsMode::Prefer);
        let r = DatabaseUrl::parse("postgres://u@h/d?sslmode=require&sslrootcert=/ca.pem").unwrap();
        assert_eq!(r.tls().mode, TlsMode::Require(Verify::Chain));
        // A user's own application_name is kept.
        let a = DatabaseUrl::parse("postgres://u@h/d?application_name=app").unwrap();
        assert_eq!(a.expose(), "postgres://u@h/d?application_name=app");

        let m = DatabaseUrl::parse(
            "mysql://u@h/d?ssl-mode=verify_identity&ssl-ca=/ca.pem&ssl-cert=/c.pem&ssl-key=/k.pem",
        )
        .unwrap();
        assert_eq!(m.tls().mode, TlsMode::Require(Verify::Full));
        assert_eq!(
            m.tls().files.client,
            Some(("/c.pem".into(), "/k.pem".into()))
        );
        assert_eq!(m.expose(), "mysql://u@h/d?prefer_socket=false");
        assert_eq!(
            DatabaseUrl::parse("mysql://u@h/d").unwrap().tls().mode,
            TlsMode::Prefer
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// Any text: no panic, and an error never echoes the input.
        #[test]
        fn any_text_is_parsed_or_refused_cleanly(raw in "\\PC{0,80}") {
            if let Err(e) = DatabaseUrl::parse(&raw) {
                let msg = e.to_string();
                proptest::prop_assert!(!msg.is_empty());
                if raw.len() > 12 {
                    proptest::prop_assert!(!msg.contains(raw.trim()), "{msg}");
                }
            }
        }

        /// Whatever the shape around it, a password never shows.
        #[test]
        fn the_password_never_shows(
            scheme in "(postgres|postgresql|mysql|mariadb)",
            user in "[a-z]{1,8}",
            secret in "[A-Za-z0-9]{12,20}",
            host in "[a-z]{1,10}(:[0-9]{1,5})?",
            query in "(\\?[a-z_]{1,10}=[a-z0-9]{0,8}(&[a-z_]{1,10}=[a-z0-9]{0,8}){0,3})?",
            in_param in proptest::bool::ANY,
        ) {
            let raw = if in_param {
                let sep = if query.is_empty() { "?" } else { "&" };
                format!("{scheme}://{user}@{host}/db{query}{sep}password={secret}")
            } else {
                format!("{scheme}://{user}:{secret}@{host}/db{query}")
            };
            match DatabaseUrl::parse(&raw) {
                Ok(u) => {
                    proptest::prop_assert!(!u.to_string().contains(&secret), "{u}");
                    let debug = format!("{u:?}");
                    proptest::prop_assert!(!debug.contains(&secret), "{debug}");
                }
                Err(e) => proptest::prop_assert!(!e.to_string().contains(&secret), "{e}"),
            }
        }
    }
}
