//! Opening a MySQL/MariaDB connection (the URL's TLS on rustls), and what
//! the server is: MariaDB or MySQL, a Galera node, with `JSON_TABLE` or not.

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};

use crate::shared::error::StoreError;
use crate::shared::sql::Stmt;
use crate::shared::tls::{Files, Verify};
use crate::shared::url::{DatabaseUrl, TlsMode};

/// Opens a connection with the URL's TLS, as diesel-async's own `establish`
/// would otherwise (no driver-side statement cache, `CLIENT_FOUND_ROWS`).
///
/// TLS is mysql_async's, on rustls, from the URL's options; it reads the CA
/// and key files itself at each connect. `PREFERRED` is as MySQL's clients
/// do it: TLS (unverified) when the server offers it, else plain text.
/// Without `ssl-ca`, the system's CA store is given instead of the driver's
/// compiled-in Mozilla list, as on PostgreSQL.
pub(crate) async fn establish(url: &DatabaseUrl) -> Result<AsyncMysqlConnection, StoreError> {
    let opts = mysql_async::Opts::from_url(url.expose())
        .map_err(|e| StoreError::InvalidUrl(e.to_string()))?;
    let base = mysql_async::OptsBuilder::from_opts(opts)
        .stmt_cache_size(0)
        .client_found_rows(true);
    let want = url.tls();
    let connected = match want.mode {
        TlsMode::Disable => mysql_async::Conn::new(base).await,
        TlsMode::Require(verify) => {
            mysql_async::Conn::new(base.ssl_opts(ssl_opts(verify, &want.files))).await
        }
        TlsMode::Prefer => {
            let tls = base
                .clone()
                .ssl_opts(ssl_opts(Verify::Nothing, &want.files));
            match mysql_async::Conn::new(tls).await {
                Err(mysql_async::Error::Driver(
                    mysql_async::DriverError::NoClientSslFlagFromServer,
                )) => mysql_async::Conn::new(base).await,
                other => other,
            }
        }
    };
    let conn = connected
        .map_err(|e| StoreError::Connect(diesel::ConnectionError::BadConnection(e.to_string())))?;
    AsyncMysqlConnection::try_from(conn)
        .await
        .map_err(StoreError::Connect)
}

pub(super) fn ssl_opts(verify: Verify, files: &Files) -> mysql_async::SslOpts {
    let mut opts = mysql_async::SslOpts::default();
    opts = match verify {
        Verify::Nothing => opts.with_danger_accept_invalid_certs(true),
        // Never parsed from a URL (see `shared::url`): the driver's name skip does
        // not work with this rustls, so it would check the name anyway.
        Verify::Chain | Verify::Full => opts,
    };
    if verify != Verify::Nothing {
        // The driver does not name the root type; `into` finds it.
        opts = match &files.root {
            Some(path) => opts.with_root_certs(vec![path.clone().into()]),
            None => opts.with_root_certs(
                crate::shared::tls::system_roots()
                    .into_iter()
                    .map(|der| der.to_vec().into())
                    .collect(),
            ),
        }
        .with_disable_built_in_roots(true);
    }
    if let Some((cert, key)) = &files.client {
        opts = opts.with_client_identity(Some(mysql_async::ClientIdentity::new(
            cert.clone().into(),
            key.clone().into(),
        )));
    }
    opts
}

/// The node's name when this server (its `VERSION()`) is a MariaDB node of
/// a Galera cluster (`@@wsrep_on`); `None` otherwise (MySQL, Percona
/// included, is not asked), and on a server built without wsrep, which has
/// no such variable.
pub(crate) async fn galera_node(conn: &mut AsyncMysqlConnection, version: &str) -> Option<String> {
    if !version.contains("MariaDB") {
        return None;
    }
    let (on, name): (i64, String) =
        Stmt::<(BigInt, Text)>::new("SELECT @@wsrep_on + 0, COALESCE(@@wsrep_node_name, '')", [])
            .get_result(conn)
            .await
            .ok()?;
    (on != 0).then_some(name)
}

/// Whether a server of this `VERSION()` has `JSON_TABLE` (MySQL 8.0.4,
/// MariaDB 10.6). A version that does not parse is given the benefit of the
/// doubt: its statements say so themselves.
pub(super) fn has_json_table(version: &str, mariadb: bool) -> bool {
    // MariaDB's handshake puts "5.5.5-" before its version (for old
    // clients); the server's VERSION() may carry it through a proxy.
    let version = version.strip_prefix("5.5.5-").unwrap_or(version);
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), patch) = (parts.next(), parts.next(), parts.next())
    else {
        return true;
    };
    let patch = patch.flatten().unwrap_or(0);
    if mariadb {
        (major, minor) >= (10, 6)
    } else {
        (major, minor, patch) >= (8, 0, 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_table_is_there_from_mysql_8_0_4_and_mariadb_10_6() {
        for (version, mariadb, has) in [
            ("10.11.19-MariaDB-0+deb12u1", true, true),
            ("10.6.0-MariaDB", true, true),
            ("10.5.23-MariaDB-0+deb11u1", true, false),
            ("5.5.5-10.4.34-MariaDB", true, false),
            ("5.5.5-10.11.2-MariaDB", true, true),
            ("8.0.36", false, true),
            ("8.0.4-rc-log", false, true),
            ("8.0.3", false, false),
            ("5.7.44-log", false, false),
            ("9.1.0", false, true),
            ("something else", false, true),
        ] {
            assert_eq!(has_json_table(version, mariadb), has, "{version}");
        }
    }
}
