//! A throwaway MariaDB server (mariadb-install-db + mariadbd on a free port),
//! so a test can stop and restart the database without touching the shared
//! one. Runs as the `mysql` user when the tests run as root.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::certs::TestCa;
use crate::{free_port, wait_for_port, Scratch};

#[derive(Debug)]
pub struct MariaDbServer {
    pub port: u16,
    dir: Scratch,
    child: Option<Child>,
    /// Extra server options, e.g. `--autocommit=0`.
    options: Vec<String>,
    /// Plain-text connections are refused: the harness connects over TLS.
    tls_only: bool,
    /// The server lives as long as the test process, not this value (see
    /// [`MariaDbServer::shared_tls`]); this directory goes with it.
    tied: Option<PathBuf>,
}

impl MariaDbServer {
    /// Initialises a data directory and starts the server with a `test`
    /// database; root has no password.
    pub fn start() -> MariaDbServer {
        Self::start_with(&[])
    }

    /// As [`MariaDbServer::start`], with extra server options.
    pub fn start_with(options: &[&str]) -> MariaDbServer {
        Self::launch(options, None)
    }

    /// A server that accepts TLS only (`--require-secure-transport=ON`),
    /// with a certificate for `localhost` issued by `ca`.
    pub fn start_tls(ca: &TestCa) -> MariaDbServer {
        Self::launch(&Self::tls_options(ca), None)
    }

    fn tls_options(ca: &TestCa) -> Vec<String> {
        let (cert, key) = ca.issue("mariadb", &["localhost"]);
        vec![
            format!("--ssl-ca={}", ca.ca().display()),
            format!("--ssl-cert={}", cert.display()),
            format!("--ssl-key={}", key.display()),
            "--require-secure-transport=ON".into(),
        ]
    }

    /// One TLS-only server (and its CA) for the whole test process, for
    /// suites of many short cases. It is stopped, and its data removed, when
    /// the process exits however it exits: a shell beside it waits for the
    /// end of a pipe from this process.
    pub fn shared_tls() -> &'static (TestCa, MariaDbServer) {
        static SHARED: OnceLock<(TestCa, MariaDbServer)> = OnceLock::new();
        SHARED.get_or_init(|| {
            let ca = TestCa::new("shared MariaDB");
            // The CA's files go with the server's data: the static is never
            // dropped.
            let server = Self::launch(&Self::tls_options(&ca), Some(ca.dir.0.clone()));
            (ca, server)
        })
    }

    /// `tied`: the server lives as long as this process; the directory given
    /// is removed with its data.
    fn launch(options: &[impl AsRef<str>], tied: Option<PathBuf>) -> MariaDbServer {
        let options: Vec<String> = options.iter().map(|o| o.as_ref().to_owned()).collect();
        let tls_only = options.iter().any(|o| o == "--require-secure-transport=ON");
        let dir = Scratch::new();
        dir.chown_if_root("mysql:mysql");
        install_data_dir(&dir.path("data"));
        let mut server = MariaDbServer {
            port: free_port(),
            dir,
            child: None,
            options,
            tls_only,
            tied,
        };
        server.start_again();
        crate::exec(
            crate::Kind::Mysql,
            &server.admin_url(),
            &["CREATE DATABASE IF NOT EXISTS test", "COMMIT"],
        );
        server
    }

    /// The root URL for the harness's own connections (mysql_async's
    /// parameters: TLS without checks on a TLS-only server, on `localhost`,
    /// the name in its certificate, so that databases made from it can be
    /// reached with `VERIFY_IDENTITY`).
    pub fn admin_url(&self) -> String {
        if self.tls_only {
            format!(
                "mysql://root@localhost:{}/mysql?require_ssl=true&verify_ca=false&prefer_socket=false",
                self.port
            )
        } else {
            format!("mysql://root@127.0.0.1:{}/mysql", self.port)
        }
    }

    /// The `test` database, for leaderd, on `127.0.0.1` (TLS parameters are
    /// the caller's to add).
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
        let mut cmd = if let Some(also) = &self.tied {
            // `cat` returns when this process's end of its stdin closes, at
            // exit; mariadbd is then killed and its data removed.
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(
                    "mariadbd \"$@\" </dev/null & pid=$!; cat >/dev/null; \
                     kill -9 $pid; wait $pid; rm -rf \"$LEADERD_TEST_DIR\" \"$LEADERD_TEST_ALSO\"",
                )
                .arg("sh")
                .env("LEADERD_TEST_DIR", &self.dir.0)
                .env("LEADERD_TEST_ALSO", also)
                .stdin(Stdio::piped());
            sh
        } else {
            let mut d = Command::new("mariadbd");
            d.stdin(Stdio::null());
            d
        };
        let child = cmd
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("mariadbd");
        self.child = Some(child);
        let port = self.port;
        // mariadbd listens only once it is ready for connections.
        wait_for_port(port, Duration::from_secs(20), "MariaDB");
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

/// Makes a server's data directory at `datadir` (run as the `mysql`
/// user; root without a password).
pub(crate) fn install_data_dir(datadir: &std::path::Path) {
    let out = Command::new("mariadb-install-db")
        .args([
            "--user=mysql",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ])
        .arg(format!("--datadir={}", datadir.display()))
        .output()
        .expect("mariadb-install-db");
    assert!(
        out.status.success(),
        "mariadb-install-db: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
