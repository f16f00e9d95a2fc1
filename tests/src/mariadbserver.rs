//! A throwaway MariaDB server (mariadb-install-db + mariadbd on a free port),
//! so a test can stop and restart the database without touching the shared
//! one. Runs as the `mysql` user when the tests run as root.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, wait_for, Scratch};

#[derive(Debug)]
pub struct MariaDbServer {
    pub port: u16,
    dir: Scratch,
    child: Option<Child>,
    /// Extra server options, e.g. `--autocommit=0`.
    options: Vec<String>,
}

impl MariaDbServer {
    /// Initialises a data directory and starts the server with a `test`
    /// database; root has no password.
    pub fn start() -> MariaDbServer {
        Self::start_with(&[])
    }

    /// As [`MariaDbServer::start`], with extra server options.
    pub fn start_with(options: &[&str]) -> MariaDbServer {
        let dir = Scratch::new();
        if rustix::process::geteuid().is_root() {
            let ok = Command::new("chown")
                .args(["-R", "mysql:mysql"])
                .arg(&dir.0)
                .status()
                .expect("chown");
            assert!(ok.success());
        }
        let out = Command::new("mariadb-install-db")
            .args([
                "--user=mysql",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ])
            .arg(format!("--datadir={}", dir.path("data").display()))
            .output()
            .expect("mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = MariaDbServer {
            port: free_port(),
            dir,
            child: None,
            options: options.iter().map(|o| o.to_string()).collect(),
        };
        server.start_again();
        crate::exec(
            crate::Kind::Mysql,
            &server.admin_url(),
            &["CREATE DATABASE IF NOT EXISTS test", "COMMIT"],
        );
        server
    }

    fn admin_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
    }

    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }

    /// Starts the server (again) and waits until it answers.
    pub fn start_again(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path("server.log"))
            .expect("log");
        let child = Command::new("mariadbd")
            .args([
                "--no-defaults",
                "--user=mysql",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
            ])
            .args(["--innodb-buffer-pool-size=32M"])
            .args(&self.options)
            .arg(format!("--port={}", self.port))
            .arg(format!("--datadir={}", self.dir.path("data").display()))
            .arg(format!(
                "--socket={}",
                self.dir.path("mysqld.sock").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("mariadbd");
        self.child = Some(child);
        let port = self.port;
        // mariadbd listens only once it is ready for connections.
        wait_for(
            Duration::from_secs(20),
            "MariaDB to accept connections",
            || {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .ok()
                    .map(|_| ())
            },
        );
    }

    /// Stops the server the hard way (SIGKILL, as in a crash; InnoDB
    /// recovers at the next start). A clean shutdown waits on client
    /// threads, which reconnecting daemons keep busy.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
