//! Database URLs: which backend, and a `Display` that never shows the password.

use std::fmt;

use crate::StoreError;

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
    raw: String,
    backend: Backend,
    redacted: String,
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
            });
        }
        let mut parsed = url::Url::parse(raw).map_err(|e| {
            // The url crate's messages never echo the input, so the password
            // cannot leak through them.
            StoreError::InvalidUrl(e.to_string())
        })?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(StoreError::InvalidUrl("URL has no host".into()));
        }
        if parsed.path().trim_start_matches('/').is_empty() {
            return Err(StoreError::InvalidUrl(
                "URL names no database (…/DBNAME)".into(),
            ));
        }
        let mut raw = raw.to_owned();
        if backend == Backend::Mysql {
            let mut driver = parsed.clone();
            // The driver only knows `mysql://`.
            let _ = driver.set_scheme("mysql");
            // mysql_async would otherwise switch a loopback TCP connection to
            // the server's Unix socket, bypassing whatever the URL names
            // (a proxy, a port forward).
            if !driver.query_pairs().any(|(k, _)| k == "prefer_socket") {
                driver
                    .query_pairs_mut()
                    .append_pair("prefer_socket", "false");
            }
            raw = driver.to_string();
        }
        redact(&mut parsed);
        Ok(Self {
            raw,
            backend,
            redacted: parsed.to_string(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL with its password, for the driver only. Never log this.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// For SQLite: the file path.
    pub fn sqlite_path(&self) -> Option<&str> {
        (self.backend == Backend::Sqlite).then(|| sqlite_path(&self.raw))
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
        let u = DatabaseUrl::parse(
            "postgres://app@db/app?password=s3cr3t&sslmode=require&SSLPassword=k3y",
        )
        .unwrap();
        let shown = format!("{u} {u:?}");
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("k3y"),
            "{shown}"
        );
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
