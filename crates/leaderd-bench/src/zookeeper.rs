//! The reference the handover part measures leaderd against: a standalone
//! ZooKeeper (Debian's package, its server on one port and a data directory
//! of its own, fsyncing its log as it does by default) and three candidates
//! on kazoo's lock recipe (`zookeeper/candidate.py`: an ephemeral
//! sequential node, a watch on the one before it, as Curator's LeaderLatch
//! does). A candidate keeps a flag file while it leads; the bench times
//! from the signal until another candidate's flag file exists.
//!
//! Needs `java`, Debian's `zookeeper` package and Python's `kazoo`
//! (`apt-get install zookeeper`, `pip install kazoo`); without them the
//! part says so and measures leaderd alone.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leaderd_tests::{free_port, Scratch};
use rustix::process::{kill_process, Pid, Signal};

/// The server's jar as Debian installs it (its manifest names the rest).
const JAR: &str = "/usr/share/java/zookeeper.jar";

/// The candidate, written into the run's directory.
const CANDIDATE: &str = include_str!("../zookeeper/candidate.py");

/// Why the reference cannot run here, if it cannot.
pub fn missing() -> Option<String> {
    let java = Command::new("java")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !java.is_ok_and(|s| s.success()) {
        return Some("no java (apt-get install zookeeper brings one)".into());
    }
    if !Path::new(JAR).exists() {
        return Some(format!("no {JAR} (apt-get install zookeeper)"));
    }
    let kazoo = Command::new("python3")
        .args(["-c", "import kazoo"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !kazoo.is_ok_and(|s| s.success()) {
        return Some("no kazoo for python3 (pip install kazoo)".into());
    }
    None
}

/// A standalone server, stopped on drop.
pub struct Server {
    child: Child,
    pub hosts: String,
}

impl Server {
    pub fn start(dir: &Scratch) -> Result<Server> {
        let port = free_port();
        let data = dir.path("zookeeper");
        std::fs::create_dir_all(&data)?;
        let child = Command::new("java")
            .args([
                "-cp",
                JAR,
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(port.to_string())
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ZooKeeper (java)")?;
        let server = Server {
            child,
            hosts: format!("127.0.0.1:{port}"),
        };
        let since = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if since.elapsed() > Duration::from_secs(60) {
                bail!("ZooKeeper did not listen on {port} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One candidate process, killed on drop.
pub struct Candidate {
    child: Child,
    pub id: String,
    flag: PathBuf,
}

impl Candidate {
    /// Starts candidate `id` for the election at `path` and waits until its
    /// session is open.
    pub fn start(server: &Server, dir: &Scratch, path: &str, id: &str) -> Result<Candidate> {
        let script = dir.path("candidate.py");
        if !script.exists() {
            std::fs::write(&script, CANDIDATE)?;
        }
        let flag = dir.path(&format!("flag-{id}"));
        let mut child = Command::new("python3")
            .arg(&script)
            .args([&server.hosts, path, id])
            .arg(&flag)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting a ZooKeeper candidate (python3)")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("the candidate's stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            bail!("candidate {id} did not start: {line:?}");
        }
        Ok(Candidate {
            child,
            id: id.to_owned(),
            flag,
        })
    }

    pub fn leads(&self) -> bool {
        self.flag.exists()
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = kill_process(pid, signal);
        }
    }

    /// Waits for the process to end (after a SIGTERM).
    pub fn wait_exit(&mut self) {
        let _ = self.child.wait();
    }
}

impl Drop for Candidate {
    /// Gracefully (its node goes with its session), else killed.
    fn drop(&mut self) {
        self.signal(Signal::TERM);
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(2) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
