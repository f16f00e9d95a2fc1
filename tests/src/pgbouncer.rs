//! A throwaway PgBouncer (Debian's package, 1.18) in transaction pooling in
//! front of the local PostgreSQL, on a free port with a generated
//! configuration. `scripts/test` installs the package when it is missing.
//!
//! PgBouncer refuses to run as root; as root it is started with `-u
//! postgres` (it switches user itself, so it stays this process's child and
//! dies with it).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_for_port, Scratch};

#[derive(Debug)]
pub struct PgBouncer {
    pub port: u16,
    dir: Scratch,
    child: Child,
}

impl PgBouncer {
    /// Transaction pooling to every database of the local PostgreSQL
    /// (127.0.0.1:5432), at most `pool_size` server connections per
    /// database; clients log in as anyone (trust).
    pub fn start(pool_size: u32) -> PgBouncer {
        let dir = Scratch::new();
        let port = free_port();
        let (host, pg_port) = upstream();
        std::fs::write(dir.path("userlist.txt"), "\"postgres\" \"\"\n").expect("userlist");
        std::fs::write(
            dir.path("pgbouncer.ini"),
            format!(
                "[databases]\n\
                 * = host={host} port={pg_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = transaction\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 200\n\
                 logfile = {log}\n",
                users = dir.path("userlist.txt").display(),
                log = dir.path("pgbouncer.log").display(),
            ),
        )
        .expect("pgbouncer.ini");
        let root = dir.chown_if_root("postgres:postgres");
        let mut cmd = Command::new("pgbouncer");
        if root {
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(dir.path("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("pgbouncer (apt-get install pgbouncer; scripts/test does)");
        wait_for_port(port, Duration::from_secs(10), "PgBouncer");
        PgBouncer { port, dir, child }
    }

    /// What PgBouncer logged (e.g. its own view of client errors).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path("pgbouncer.log")).unwrap_or_default()
    }
}

/// Host and port of the PostgreSQL under test.
fn upstream() -> (String, u16) {
    let url = crate::postgres_admin_url();
    let rest = url.split_once('@').map_or(url.as_str(), |(_, r)| r);
    let hostport = rest.split('/').next().unwrap_or("127.0.0.1:5432");
    match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), p.parse().unwrap_or(5432)),
        None => (hostport.to_owned(), 5432),
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
