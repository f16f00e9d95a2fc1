//! What a PostgreSQL connection learns once, at connect, in one round trip:
//! where the lock table is, so that every statement names it with its
//! schema; whether the connection reaches the server directly (then
//! statements may be named and prepared once); and the rights it runs with
//! beyond what the daemon needs, which the daemon says at start.
//!
//! Everything leaderd sends runs with the rights of the role it connects
//! as, often the database's owner or a superuser, in a database where other
//! roles may create objects. PostgreSQL resolves an unqualified operator or
//! function through the search_path, and an exact-typed one in any schema
//! on it wins over `pg_catalog`'s (a `varchar = varchar` planted in `public`
//! beats `text = text`). So every statement names its operators
//! `OPERATOR(pg_catalog.=)` and its functions `pg_catalog.now()`, and the
//! lock table with the schema read here; a schema made later earlier on the
//! path changes nothing for this connection. Type names in casts are SQL
//! keywords (`varchar`, `bigint`), which the parser reads as `pg_catalog`'s,
//! or are named with their schema (`pg_catalog.text`: a domain named
//! `text` in a schema listed before an explicit `pg_catalog` would run its
//! check as this user).

use tokio_postgres::{Client, Row};

use crate::shared::error::StoreError;

/// leaderd's objects in the schema whose oid is `$nsp` (an SQL
/// expression) that this user should not trust, one text each ("trigger
/// x (owner r)"): a table, a type one of their columns has outside
/// `pg_catalog` (a domain's check runs as whoever writes the row), a
/// function of leaderd's name and arguments, or the function of any
/// trigger on the lock table, whose owner is neither a
/// superuser, this user, the schema's owner, nor (for a schema of
/// `pg_database_owner`) the database's owner. Such an owner could run code
/// with this user's rights through them: a trigger on the lock table, a
/// policy, a fence of its own that passes everything (a role that may
/// create in the schema can make them all before leaderd is installed
/// there, and the names alone would look current). The schema's owner is
/// not trusted for a schema named as this user: that is the search_path's
/// `"$user"`, which whoever may create schemas in the database can make
/// (and so put a lock table of its own first on this user's path).
/// Functions of leaderd's names with other arguments are not leaderd's
/// (another role's overload there makes no daemon stop; the warning that
/// others may create in the schema covers the app's call).
macro_rules! untrusted {
    ($nsp:literal) => {
        concat!(
            "SELECT o.what OPERATOR(pg_catalog.||) ' (owner ' OPERATOR(pg_catalog.||) \
             r.rolname::pg_catalog.text OPERATOR(pg_catalog.||) ')' \
             FROM (SELECT c.relname::pg_catalog.text AS what, c.relowner AS owner FROM pg_catalog.pg_class c \
             WHERE c.relnamespace OPERATOR(pg_catalog.=) ",
            $nsp,
            " AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', \
             'service_leader_token', 'service_leader_fence_key', \
             'service_leader_fence_gate', 'service_leader_fence_boot', 'service_leader_history']::pg_catalog.name[]) \
             UNION ALL \
             SELECT 'the type of ' OPERATOR(pg_catalog.||) c.relname::pg_catalog.text \
             OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) a.attname::pg_catalog.text, t.typowner \
             FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) a.attrelid \
             JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid \
             WHERE c.relnamespace OPERATOR(pg_catalog.=) ",
            $nsp,
            " AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', \
             'service_leader_token', 'service_leader_fence_key', \
             'service_leader_fence_gate', 'service_leader_fence_boot', 'service_leader_history']::pg_catalog.name[]) \
             AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped \
             AND t.typnamespace OPERATOR(pg_catalog.<>) pg_catalog.to_regnamespace('pg_catalog') \
             UNION ALL \
             SELECT 'trigger ' OPERATOR(pg_catalog.||) t.tgname::pg_catalog.text, p.proowner \
             FROM pg_catalog.pg_trigger t \
             JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid \
             JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) t.tgfoid \
             WHERE c.relnamespace OPERATOR(pg_catalog.=) ",
            $nsp,
            " AND c.relname OPERATOR(pg_catalog.=) 'service_leader_lock' AND NOT t.tgisinternal \
             UNION ALL \
             SELECT 'function ' OPERATOR(pg_catalog.||) p.proname::pg_catalog.text, p.proowner \
             FROM pg_catalog.pg_proc p WHERE p.pronamespace OPERATOR(pg_catalog.=) ",
            $nsp,
            " AND ((p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_keep_token', \
             'service_leader_seed_token', 'service_leader_take', \
             'service_leader_open_transactions', 'service_leader_record_term']::pg_catalog.name[]) \
             AND p.pronargs OPERATOR(pg_catalog.=) 0) \
             OR (p.proname OPERATOR(pg_catalog.=) 'service_leader_token_floor' \
             AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) 'character varying') \
             OR (p.proname OPERATOR(pg_catalog.=) 'service_leader_fenced_session' \
             AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) 'text') \
             OR (p.proname OPERATOR(pg_catalog.=) 'service_leader_take_key' \
             AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) \
             'character varying, bigint') \
             OR (p.proname OPERATOR(pg_catalog.=) 'leaderd_fence' \
             AND pg_catalog.oidvectortypes(p.proargtypes) OPERATOR(pg_catalog.=) \
             'character varying, bigint, interval'))) o \
             JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) o.owner \
             JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) ",
            $nsp,
            " WHERE NOT (r.rolsuper OR r.rolname OPERATOR(pg_catalog.=) CURRENT_USER \
             OR (n.nspname OPERATOR(pg_catalog.<>) CURRENT_USER \
             AND (r.oid OPERATOR(pg_catalog.=) n.nspowner \
             OR (n.nspowner OPERATOR(pg_catalog.=) pg_catalog.to_regrole('pg_database_owner') \
             AND r.oid OPERATOR(pg_catalog.=) (SELECT d.datdba FROM pg_catalog.pg_database d \
             WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())))))"
        )
    };
}
pub(crate) use untrusted;

/// The one query a connect sends: the addresses each side sees, the lock
/// table's schema (where the path finds it, else the schema a migration
/// would make it in), the role's excess rights, what of leaderd's there
/// it should not trust, and who else may create in that schema.
const SESSION: &str = concat!(
    "WITH s AS (SELECT n.oid, n.nspname, n.nspowner, n.nspacl FROM pg_catalog.pg_namespace n \
     WHERE n.oid OPERATOR(pg_catalog.=) COALESCE( \
       (SELECT c.relnamespace FROM pg_catalog.pg_class c \
         WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('service_leader_lock')), \
       (SELECT m.oid FROM pg_catalog.pg_namespace m \
         WHERE m.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()))) \
     SELECT pg_catalog.host(pg_catalog.inet_client_addr()), pg_catalog.inet_client_port(), \
     pg_catalog.host(pg_catalog.inet_server_addr()), pg_catalog.inet_server_port(), \
     pg_catalog.quote_ident(s.nspname), \
     COALESCE((SELECT r.rolsuper FROM pg_catalog.pg_roles r \
                WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER), false), \
     COALESCE((SELECT pg_catalog.pg_has_role(c.relowner, 'USAGE') FROM pg_catalog.pg_class c \
                WHERE c.relnamespace OPERATOR(pg_catalog.=) s.oid \
                  AND c.relname OPERATOR(pg_catalog.=) 'service_leader_lock'), false), \
     ARRAY(SELECT x::pg_catalog.text FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) x \
            WHERE pg_catalog.has_schema_privilege(x, 'CREATE')), \
     ARRAY(",
    untrusted!("s.oid"),
    "), \
     ARRAY(SELECT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC' \
                  ELSE (SELECT g.rolname::pg_catalog.text FROM pg_catalog.pg_roles g \
                         WHERE g.oid OPERATOR(pg_catalog.=) a.grantee) END \
            FROM pg_catalog.aclexplode(COALESCE(s.nspacl, pg_catalog.acldefault('n', s.nspowner))) a \
           WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE' \
             AND a.grantee OPERATOR(pg_catalog.<>) s.nspowner) \
     FROM s"
);

/// What [`SESSION`] answered.
pub(crate) struct Session {
    /// The lock table's name with its schema, quoted as an identifier.
    pub table: String,
    /// Whether the connection is direct, while [`own_socket`] finds out
    /// (`None`: not direct, or no way to tell).
    pub finding: Option<tokio::task::JoinHandle<bool>>,
    /// What it found of rights.
    pub facts: Facts,
}

/// Rights, as a connect found them.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// The rights this role has beyond the daemon's needs, one phrase each.
    pub excess: Vec<String>,
    /// What of leaderd's this user should not trust (see [`untrusted`]).
    pub untrusted: Vec<String>,
    /// The roles other than its owner that may create in the lock table's
    /// schema (`PUBLIC` for everyone).
    pub open_to: Vec<String>,
}

impl Session {
    /// Asks the server. The lookup in `/proc`, which reads every TCP
    /// socket of the host's network namespace (tens of milliseconds with
    /// many thousands in TIME_WAIT), runs on a blocking thread meanwhile, so
    /// that it never delays an attempt: statements stay unnamed until it
    /// answers.
    pub(crate) async fn read(client: &Client) -> Result<Session, StoreError> {
        let rows = client.query_typed(SESSION, &[]).await?;
        // No row: no schema holds the table, and the path names none.
        let row = rows.first().ok_or_else(|| {
            StoreError::Local(
                "the search_path names no schema that exists: no place for service_leader_lock"
                    .to_owned(),
            )
        })?;
        let schema: String = row.try_get(4)?;
        let (superuser, owner): (bool, bool) = (row.try_get(5)?, row.try_get(6)?);
        let creatable: Vec<String> = row.try_get(7)?;
        let mut excess = Vec::new();
        if superuser {
            excess.push("is a superuser".to_owned());
        } else {
            if owner {
                excess.push("owns service_leader_lock".to_owned());
            }
            if !creatable.is_empty() {
                excess.push(format!(
                    "may create objects in schema {} on its search_path",
                    creatable.join(", ")
                ));
            }
        }
        let finding = peers(row)
            .map(|(ours, theirs)| tokio::task::spawn_blocking(move || own_socket(ours, theirs)));
        Ok(Session {
            table: format!("{schema}.service_leader_lock"),
            finding,
            facts: Facts {
                excess,
                untrusted: row.try_get(8)?,
                open_to: row.try_get(9)?,
            },
        })
    }
}

/// The client's and the server's addresses, as the server sees them;
/// `None` over a Unix socket.
fn peers(row: &Row) -> Option<(std::net::SocketAddr, std::net::SocketAddr)> {
    let addr = |i: usize, j: usize| -> Option<std::net::SocketAddr> {
        let ip: String = row.try_get::<_, Option<String>>(i).ok()??;
        let port: i32 = row.try_get::<_, Option<i32>>(j).ok()??;
        Some(std::net::SocketAddr::new(
            ip.parse().ok()?,
            u16::try_from(port).ok()?,
        ))
    };
    Some((addr(0, 1)?, addr(2, 3)?))
}

/// Whether the connection is direct: the server sees as its peer a TCP
/// socket that this process holds. Through a pooler or any proxy the
/// server's peer is the proxy's socket, found in no file descriptor of
/// ours. Every doubt (a Unix socket, no `/proc`) is `false`. So: whether
/// this process holds a TCP socket from `local` to `remote`, among the
/// sockets of `/proc/self/fd`, one that `/proc/self/net/tcp{,6}` shows with
/// these addresses.
fn own_socket(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> bool {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    // Our sockets' inodes first (a handful), so that only their lines of
    // the (possibly huge) tables are parsed.
    let ours: Vec<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|t| {
            let t = t.to_str()?;
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    if ours.is_empty() {
        return false;
    }
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|table| {
            table.lines().skip(1).any(|line| {
                let f: Vec<&str> = line.split_whitespace().take(10).collect();
                f.len() == 10
                    && ours.iter().any(|i| i == f[9])
                    && proc_addr(f[1]) == Some(local)
                    && proc_addr(f[2]) == Some(remote)
            })
        })
}

/// An address as `/proc/net/tcp` prints it: each 32-bit word of the address
/// in the host's byte order, in hex, then `:` and the port in hex. IPv4
/// addresses mapped into IPv6 compare as IPv4, as the server reports them.
fn proc_addr(text: &str) -> Option<std::net::SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip.len()).step_by(8) {
        let word = u32::from_str_radix(ip.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => std::net::IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => {
            let v6 = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
            v6.to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4)
        }
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_endian = "little")]
    fn reads_proc_net_tcp_addresses() {
        assert_eq!(
            proc_addr("0100007F:1538"),
            Some("127.0.0.1:5432".parse().unwrap())
        );
        assert_eq!(
            proc_addr("00000000000000000000000001000000:D431"),
            Some("[::1]:54321".parse().unwrap())
        );
        // IPv4 mapped into IPv6 (a dual-stack socket) compares as IPv4.
        assert_eq!(
            proc_addr("0000000000000000FFFF00000100007F:1538"),
            Some("127.0.0.1:5432".parse().unwrap())
        );
        assert_eq!(proc_addr("nonsense"), None);
        assert_eq!(proc_addr("0100007:1538"), None);
    }

    #[test]
    fn a_socket_of_this_process_is_found_and_others_are_not() {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = std::net::TcpStream::connect(server.local_addr().unwrap()).unwrap();
        let (local, remote) = (ours.local_addr().unwrap(), ours.peer_addr().unwrap());
        assert!(own_socket(local, remote));
        let mut elsewhere = local;
        elsewhere.set_port(if local.port() == 1 { 2 } else { 1 });
        assert!(!own_socket(elsewhere, remote));
    }
}
