//! A throwaway three-node MariaDB Galera cluster on loopback (Debian's
//! `galera-4`, state transfer by `rsync`; `scripts/test` installs both when
//! missing), every port free and picked at start. Runs as the `mysql` user
//! when the tests run as root. The nodes are killed when the value drops.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::mariadbserver::install_data_dir;
use crate::{free_ports, Kind, Scratch};

/// The wsrep provider the nodes load.
pub const PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

#[derive(Debug)]
pub struct Galera {
    /// Each node's client port, node 1 first.
    pub ports: Vec<u16>,
    dir: Scratch,
    children: Vec<Child>,
}

/// One node's ports: client, group communication, incremental and full
/// state transfer.
#[derive(Debug, Clone, Copy)]
struct Ports {
    client: u16,
    group: u16,
    ist: u16,
    sst: u16,
}

impl Galera {
    /// Three nodes, synced, each with a `test` database (made on one and
    /// replicated); root has no password. About 10 s.
    pub fn start() -> Galera {
        assert!(
            std::path::Path::new(PROVIDER).exists(),
            "{PROVIDER} is missing: install Debian's galera-4 and rsync (scripts/test does)"
        );
        let dir = Scratch::new();
        // Twelve different ports: two nodes' listeners on one port (an IST
        // receiver where the SST daemon listens) fail a node's join.
        let ports: Vec<Ports> = free_ports(12)
            .chunks(4)
            .map(|p| Ports {
                client: p[0],
                group: p[1],
                ist: p[2],
                sst: p[3],
            })
            .collect();
        for n in 1..=3 {
            install_data_dir(&dir.path(&format!("n{n}")));
        }
        dir.chown_if_root("mysql:mysql");
        let cluster: Vec<String> = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.group))
            .collect();
        let cluster = format!("gcomm://{}", cluster.join(","));
        let mut galera = Galera {
            ports: ports.iter().map(|p| p.client).collect(),
            dir,
            children: Vec::new(),
        };
        // The first node makes the cluster; the others join it one by one
        // (each takes a full copy from a donor, which serves one at a time).
        for (i, p) in ports.iter().enumerate() {
            let child = galera.node(i + 1, *p, &cluster, i == 0);
            galera.children.push(child);
            galera.wait_synced(i + 1, Duration::from_secs(60));
        }
        crate::exec(
            Kind::Mysql,
            &galera.admin_url(1),
            &["CREATE DATABASE IF NOT EXISTS test"],
        );
        galera
    }

    fn node(&self, n: usize, p: Ports, cluster: &str, first: bool) -> Child {
        let data = self.dir.path(&format!("n{n}"));
        let log = std::fs::File::create(self.dir.path(&format!("n{n}.log"))).expect("log");
        let mut cmd = Command::new("mariadbd");
        cmd.args([
            "--no-defaults",
            "--user=mysql",
            "--bind-address=127.0.0.1",
            "--binlog-format=ROW",
            "--default-storage-engine=InnoDB",
            "--innodb-autoinc-lock-mode=2",
            "--innodb-flush-log-at-trx-commit=1",
            "--innodb-buffer-pool-size=32M",
            "--wsrep-on=ON",
            "--wsrep-sst-method=rsync",
            "--wsrep-cluster-name=leaderd-test",
        ])
        .arg(format!("--wsrep-provider={PROVIDER}"))
        .arg(format!("--wsrep-cluster-address={cluster}"))
        .arg(format!(
            "--wsrep-provider-options=gmcast.listen_addr=tcp://127.0.0.1:{};\
             ist.recv_addr=127.0.0.1:{};gcache.size=16M",
            p.group, p.ist
        ))
        .arg(format!("--wsrep-node-address=127.0.0.1:{}", p.group))
        .arg(format!("--wsrep-sst-receive-address=127.0.0.1:{}", p.sst))
        .arg(format!("--wsrep-node-name=node{n}"))
        .arg(format!("--port={}", p.client))
        .arg(format!("--datadir={}", data.display()))
        .arg(format!(
            "--socket={}",
            self.dir.path(&format!("n{n}.sock")).display()
        ))
        .arg(format!(
            "--pid-file={}",
            self.dir.path(&format!("n{n}.pid")).display()
        ));
        if first {
            cmd.arg("--wsrep-new-cluster");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("mariadbd")
    }

    /// Waits until node `n` (from 1) answers and is synced with the cluster.
    fn wait_synced(&self, n: usize, within: Duration) {
        let until = Instant::now() + within;
        loop {
            let state = value(
                &self.admin_url(n),
                "SELECT VARIABLE_VALUE AS v FROM information_schema.GLOBAL_STATUS \
                 WHERE VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT'",
            );
            if state.as_deref() == Some("Synced") {
                return;
            }
            assert!(
                Instant::now() < until,
                "Galera node {n} not synced within {within:?}: {}",
                std::fs::read_to_string(self.dir.path(&format!("n{n}.log"))).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills node `n` (from 1) at once, as a crashed machine would go.
    pub fn kill_node(&mut self, n: usize) {
        let child = &mut self.children[n - 1];
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Root on node `n` (from 1), database `mysql`.
    pub fn admin_url(&self, n: usize) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.ports[n - 1])
    }

    /// Database `db` on node `n` (from 1).
    pub fn url(&self, n: usize, db: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{db}", self.ports[n - 1])
    }
}

/// Runs one statement on `url`, panicking on failure.
pub fn exec(url: &str, sql: &str) {
    crate::exec(Kind::Mysql, url, &[sql]);
}

/// The first column of the first row of `sql` (named `v`, as text) on
/// `url`; `None` when the node does not answer (yet) or there is no row.
pub fn value(url: &str, sql: &str) -> Option<String> {
    let (url, sql) = (url.to_owned(), sql.to_owned());
    crate::block_on(async move {
        use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl};
        #[derive(diesel::QueryableByName)]
        struct V {
            #[diesel(sql_type = diesel::sql_types::Text)]
            v: String,
        }
        let mut c = AsyncMysqlConnection::establish(&url).await.ok()?;
        let rows: Vec<V> = diesel::sql_query(&sql).load(&mut c).await.ok()?;
        rows.into_iter().next().map(|r| r.v)
    })
}

impl Drop for Galera {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
