//! A throwaway PostgreSQL server (initdb + pg_ctl on a free port), so a test
//! can stop and restart the database without touching the shared one.
//!
//! PostgreSQL refuses to run as root; when the tests run as root the server
//! runs as the `postgres` user via `runuser`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::{free_port, wait_for_port, Scratch};

#[derive(Debug)]
pub struct PgServer {
    pub port: u16,
    data: PathBuf,
    bin: PathBuf,
    /// Server settings beyond the harness's own, as `-c name=value`.
    settings: String,
    _dir: Scratch,
}

/// The oldest PostgreSQL server the project supports, as `scripts/test`
/// installs it (`scripts/old-postgres`): its `bin` directory, or `None`
/// when it is not there. `LEADERD_TEST_PG_OLD_BIN` names another.
pub fn oldest_bin() -> Option<PathBuf> {
    let bin = match std::env::var_os("LEADERD_TEST_PG_OLD_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/postgres-old/native/bin"),
    };
    bin.join("postgres").exists().then_some(bin)
}

/// The newest PostgreSQL server installed from Debian's packages: its
/// `bin` directory.
pub fn newest_bin() -> PathBuf {
    let root = PathBuf::from("/usr/lib/postgresql");
    let mut versions: Vec<_> = std::fs::read_dir(&root)
        .expect("PostgreSQL installed under /usr/lib/postgresql")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    versions.sort();
    versions.pop().expect("a PostgreSQL version").join("bin")
}

fn as_postgres(cmd: &PathBuf) -> Command {
    if rustix::process::geteuid().is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(cmd);
        c
    } else {
        Command::new(cmd)
    }
}

/// Runs `cmd` to completion; panics with its stderr unless it succeeds.
fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl PgServer {
    /// initdb and start a server with trust auth on a free port.
    pub fn start() -> PgServer {
        Self::start_with(newest_bin(), &[])
    }

    /// [`PgServer::start`] with the server binaries of `bin` (e.g.
    /// [`oldest_bin`]) and these settings.
    pub fn start_with(bin: PathBuf, settings: &[(&str, &str)]) -> PgServer {
        let dir = Scratch::new();
        let data = dir.path("data");
        dir.chown_if_root("postgres:postgres");
        run_ok(
            as_postgres(&bin.join("initdb"))
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(&data),
            "initdb",
        );
        let settings = settings
            .iter()
            .map(|(k, v)| format!(" -c {k}={v}"))
            .collect();
        let server = PgServer {
            port: free_port(),
            data,
            bin,
            settings,
            _dir: dir,
        };
        server.run_ctl("start");
        server
    }

    /// The server's major version, as `postgres --version` says it.
    pub fn version(&self) -> String {
        let out = Command::new(self.bin.join("postgres"))
            .arg("--version")
            .output()
            .expect("postgres --version");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`) on a free port:
    /// read-only until [`PgServer::promote`].
    pub fn standby_of(primary: &PgServer) -> PgServer {
        let dir = Scratch::new();
        let data = dir.path("data");
        dir.chown_if_root("postgres:postgres");
        let mut backup = as_postgres(&primary.bin.join("pg_basebackup"));
        backup
            .args(["-h", "127.0.0.1", "-U", "postgres", "-X", "stream", "-R"])
            .arg(format!("--port={}", primary.port))
            .arg("-D")
            .arg(&data);
        run_ok(&mut backup, "pg_basebackup");
        let server = PgServer {
            port: free_port(),
            data,
            bin: primary.bin.clone(),
            settings: primary.settings.clone(),
            _dir: dir,
        };
        server.run_ctl("start");
        server
    }

    /// Promotes a standby to primary, waiting until it accepts writes.
    pub fn promote(&self) {
        run_ok(
            as_postgres(&self.bin.join("pg_ctl"))
                .args(["-w", "-D"])
                .arg(&self.data)
                .arg("promote"),
            "pg_ctl promote",
        );
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run_ctl(&self, action: &str) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off{}",
            self.port,
            self.data.display(),
            self.settings
        );
        let mut cmd = as_postgres(&self.bin.join("pg_ctl"));
        cmd.args(["-D"])
            .arg(&self.data)
            .args(["-o", &opts, "-w", "-m", "fast"]);
        cmd.arg("-l").arg(self.data.join("server.log")).arg(action);
        run_ok(&mut cmd, &format!("pg_ctl {action}"));
        if action != "stop" {
            let port = self.port;
            wait_for_port(port, Duration::from_secs(10), "PostgreSQL");
        }
    }

    pub fn stop(&self) {
        self.run_ctl("stop");
    }

    pub fn restart(&self) {
        self.run_ctl("restart");
    }

    pub fn start_again(&self) {
        self.run_ctl("start");
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin.join("pg_ctl"))
            .args(["-D"])
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}
