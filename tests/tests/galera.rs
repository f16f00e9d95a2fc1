//! leaderd on a real three-node MariaDB Galera cluster (started by the
//! test; see `leaderd_tests::galera`), one cluster at a time.
//!
//! Galera's nodes share no lock: `GET_LOCK`, which serialises migrations on
//! one server and wakes followers at a release, is each node's own.
//! Migrations started together on three nodes failed ("Duplicate column
//! name"), and two `CREATE TRIGGER`s at once left a node's replication
//! waiting on a metadata lock for good; the migration now claims a row,
//! which the cluster certifies. Followers on other nodes than the leader's
//! learned of a release only at their next poll; they now read their rows.

use std::time::{Duration, Instant};

use leaderd_tests::galera::{value, Galera};
use leaderd_tests::{
    check_handovers, checker, run_cli, run_cli_within, serial, wait_for, wait_single_leader,
    Daemon, Scratch,
};

/// Three `leaderd migrate` at once, one per node, on an empty database,
/// three times: every one exits 0, none logs above INFO, every node has the
/// whole schema, and the claim is gone.
#[test]
fn concurrent_migrations_on_three_nodes_all_succeed() {
    // One cluster at a time: the other test times handovers.
    let _s = serial();
    let cluster = Galera::start();
    for round in 0..3 {
        let db = format!("galera_migrate_{round}");
        leaderd_tests::galera::exec(&cluster.admin_url(1), &format!("CREATE DATABASE {db}"));
        // At once: each on its own thread.
        let runs: Vec<_> = (1..=3)
            .map(|n| {
                let url = cluster.url(n, &db);
                std::thread::spawn(move || {
                    let args = ["migrate", "--database-url", url.as_str()];
                    (n, run_cli_within(&args, Duration::from_secs(30)))
                })
            })
            .collect();
        for run in runs {
            let (n, (code, _, err)) = run.join().expect("migrate thread");
            assert_eq!(code, 0, "round {round}: migrate on node {n} failed: {err}");
            let above_info: Vec<&str> = err
                .lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                .collect();
            assert!(
                above_info.is_empty(),
                "round {round}: node {n} logged {above_info:?}"
            );
        }
        for n in 1..=3 {
            let url = cluster.url(n, &db);
            let count = |sql: &str| value(&url, sql).unwrap_or_default();
            assert_eq!(
                count(
                    "SELECT CAST(COUNT(*) AS CHAR) AS v FROM information_schema.columns \
                     WHERE table_schema = DATABASE() AND table_name = 'service_leader_lock' \
                     AND column_name IN ('successor', 'address', 'address_instance')"
                ),
                "3",
                "node {n}: the lock table's columns"
            );
            assert_eq!(
                count(
                    "SELECT CAST(COUNT(*) AS CHAR) AS v FROM information_schema.triggers \
                     WHERE trigger_schema = DATABASE()"
                ),
                "5",
                "node {n}: the kept-tokens, the fence's and the record of terms' triggers"
            );
            assert_eq!(
                count("SELECT CAST(COUNT(*) AS CHAR) AS v FROM service_leader_migration"),
                "0",
                "node {n}: the migration's claim is left behind"
            );
        }
        // `leaderd status` says which node it asked.
        let url = cluster.url(2, &db);
        let (code, _, err) = run_cli_within(
            &["status", "--database-url", url.as_str()],
            Duration::from_secs(30),
        );
        assert_eq!(code, 0, "{err}");
        assert!(err.contains("MariaDB Galera, node node2"), "{err}");
    }
}

/// What the docs promise for a graceful handover across nodes.
const HANDOVER: Duration = Duration::from_millis(150);
const ROUNDS: usize = 6;

/// One daemon per node of one election, and an app on the leader's node.
struct Replicas {
    db: &'static str,
    dir: Scratch,
    /// The live daemons, and the node each runs on (from 1).
    live: Vec<(Daemon, usize)>,
    /// Stopped ones, kept for the split-brain check of their logs.
    gone: Vec<Daemon>,
    started: usize,
}

impl Replicas {
    fn start(cluster: &Galera, db: &'static str) -> Replicas {
        let mut r = Replicas {
            db,
            dir: Scratch::new(),
            live: Vec::new(),
            gone: Vec::new(),
            started: 0,
        };
        for n in 1..=3 {
            let d = r.daemon(cluster, n);
            r.live.push((d, n));
        }
        r
    }

    fn daemon(&mut self, cluster: &Galera, node: usize) -> Daemon {
        self.started += 1;
        let id = format!("r{}-node{node}", self.started);
        let address = format!("http://{id}.test:8080");
        Daemon::start(
            &cluster.url(node, self.db),
            &id,
            &self.dir,
            &["--advertise", &address],
        )
    }

    fn daemons(&self) -> Vec<&Daemon> {
        self.live.iter().map(|(d, _)| d).collect()
    }

    fn leader(&self) -> usize {
        wait_single_leader(&self.daemons(), Duration::from_secs(15))
    }

    /// Waits for a replica other than `old` to lead; which, and how long
    /// since `from`.
    fn next_leader(&self, old: usize, from: Instant, within: Duration) -> (usize, Duration) {
        let i = wait_for(within, "a new leader", || {
            (0..self.live.len()).find(|&i| i != old && self.live[i].0.is_leader())
        });
        (i, from.elapsed())
    }

    /// Replaces replica `i` (stopped) by a new one on the same node.
    fn replace(&mut self, cluster: &Galera, i: usize) {
        let node = self.live[i].1;
        let fresh = self.daemon(cluster, node);
        let (old, _) = std::mem::replace(&mut self.live[i], (fresh, node));
        self.gone.push(old);
    }

    fn all(&self) -> Vec<&Daemon> {
        self.gone.iter().chain(self.daemons()).collect()
    }
}

/// The daemon's warnings that its election's replicas sit on different
/// nodes.
fn spread_warnings(d: &Daemon) -> Vec<leaderd_tests::Value> {
    let mut said = d.log_events();
    said.retain(|e| {
        e["level"] == "WARN"
            && e["message"]
                .as_str()
                .is_some_and(|m| m.contains("different Galera nodes"))
    });
    said
}

/// Rows the node behind `url` has read since it started (`Rows_read`).
fn rows_read(url: &str) -> u64 {
    value(
        url,
        "SELECT VARIABLE_VALUE AS v FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME = 'ROWS_READ'",
    )
    .and_then(|v| v.parse().ok())
    .expect("Rows_read")
}

/// One daemon on each node of one election: SIGTERM and `leaderd release`
/// hand over across nodes within [`HANDOVER`] (followers read their rows
/// every 40 ms; `GET_LOCK` is each node's own), an idle follower's reads
/// stay within their bound, a fenced transaction on the leader's node is
/// aborted at COMMIT once another node's replica took over, a killed node
/// leaves one leader, and no two replicas ever led at once.
#[test]
fn daemons_on_three_nodes_hand_over_in_milliseconds_and_never_lead_together() {
    let _s = serial();
    let mut cluster = Galera::start();
    let db = "galera_lead";
    leaderd_tests::galera::exec(&cluster.admin_url(1), &format!("CREATE DATABASE {db}"));
    let url1 = cluster.url(1, db);
    let (code, _, err) = run_cli_within(
        &["migrate", "--database-url", url1.as_str()],
        Duration::from_secs(30),
    );
    assert_eq!(code, 0, "{err}");
    leaderd_tests::galera::exec(
        &url1,
        "CREATE TABLE app_log (seq BIGINT AUTO_INCREMENT PRIMARY KEY, token BIGINT NOT NULL)",
    );
    let mut r = Replicas::start(&cluster, db);
    // Another election's replicas, both on node 2.
    let together: Vec<Daemon> = ["s1", "s2"]
        .iter()
        .map(|id| {
            let url = cluster.url(2, db);
            Daemon::start(&url, id, &r.dir, &["--election", "together"])
        })
        .collect();

    // SIGTERM: the replica on another node leads within milliseconds.
    let mut took = Vec::new();
    for _ in 0..ROUNDS {
        let leader = r.leader();
        // Let the followers settle into watching (a fresh one polls first).
        std::thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        r.live[leader].0.sigterm();
        let (_, t) = r.next_leader(leader, sent, Duration::from_secs(5));
        took.push(t);
        let stopped = r.live[leader].0.wait_exit(Duration::from_secs(3));
        assert_eq!(stopped.and_then(|s| s.code()), Some(0));
        r.replace(&cluster, leader);
    }
    check_handovers("Galera SIGTERM", &took, HANDOVER);

    // Replicas on three nodes: each says so (again when a node joined
    // later), naming the nodes; those on one node do not.
    for d in r.daemons() {
        // A replica started while another node's replacement had not yet
        // taken its presence row names two nodes first, then the third.
        let nodes_named = |said: &[leaderd_tests::Value]| -> Vec<String> {
            let named: std::collections::BTreeSet<&str> = said
                .iter()
                .flat_map(|e| e["nodes"].as_str().unwrap_or_default().split(", "))
                .collect();
            named.into_iter().map(String::from).collect()
        };
        let said = leaderd_tests::try_wait_for(Duration::from_secs(10), || {
            let said = spread_warnings(d);
            (nodes_named(&said).len() == 3).then_some(said)
        })
        .unwrap_or_else(|| spread_warnings(d));
        assert_eq!(nodes_named(&said), ["node1", "node2", "node3"], "{}", d.id);
        assert!(said.len() <= 2, "{}: {said:?}", d.id);
    }
    for d in &together {
        assert!(d.is_leader() || d.leader().is_some_and(|(_, b)| b["leader"].is_string()));
        assert_eq!(
            spread_warnings(d),
            Vec::<leaderd_tests::Value>::new(),
            "{}",
            d.id
        );
    }
    drop(together);

    // `leaderd release`, the releaser staying out for its hold.
    let mut took = Vec::new();
    for _ in 0..ROUNDS {
        let leader = r.leader();
        std::thread::sleep(Duration::from_millis(1300));
        let listen = format!("127.0.0.1:{}", r.live[leader].0.port);
        let sent = Instant::now();
        let (code, out, err) = run_cli(&["release", "--listen", &listen, "--hold", "1s"], &[]);
        assert_eq!(code, 0, "{out}{err}");
        let (_, t) = r.next_leader(leader, sent, Duration::from_secs(5));
        took.push(t);
    }
    check_handovers("Galera release", &took, HANDOVER);

    // An idle follower's cost: every row its node reads (this cluster
    // serves nothing else) while it follows, its presence row and its
    // follower's polls included. Its watch alone reads 25 rows a second.
    let leader = r.leader();
    let follower_node = r.live[(leader + 1) % 3].1;
    let follower_url = cluster.url(follower_node, db);
    std::thread::sleep(Duration::from_millis(500));
    let (before, from) = (rows_read(&follower_url), Instant::now());
    std::thread::sleep(Duration::from_secs(4));
    let per_second = (rows_read(&follower_url) - before) as f64 / from.elapsed().as_secs_f64();
    eprintln!("an idle follower's node read {per_second:.0} rows a second");
    assert!(
        per_second < 80.0,
        "an idle follower's node read {per_second:.0} rows a second"
    );

    // A fenced transaction on the leader's node: the replica on another
    // node takes over while it is open (the fence's share lock is that
    // node's own), and the late COMMIT fails with 1213: no late write.
    let leader = r.leader();
    let (token, node) = (
        r.live[leader].0.token_held("").expect("the leader's token"),
        r.live[leader].1,
    );
    let app_url = cluster.url(node, db);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let commit = runtime.block_on(async {
        use mysql_async::prelude::Queryable;
        let mut app = mysql_async::Conn::from_url(app_url.as_str()).await.unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        app.exec_drop("CALL leaderd_fence('default', ?, 10000)", (token,))
            .await
            .unwrap();
        app.exec_drop("INSERT INTO app_log (token) VALUES (?)", (token,))
            .await
            .unwrap();
        r.live[leader].0.sigkill();
        let (_, t) = r.next_leader(leader, Instant::now(), Duration::from_secs(10));
        eprintln!("another node's replica led {t:?} after the fenced leader was killed");
        app.query_drop("COMMIT").await
    });
    match commit {
        Err(mysql_async::Error::Server(e)) => assert_eq!(e.code, 1213, "{e}"),
        other => panic!("the late COMMIT was not refused: {other:?}"),
    }
    for n in 1..=3 {
        assert_eq!(
            value(
                &cluster.url(n, db),
                "SELECT CAST(COUNT(*) AS CHAR) AS v FROM app_log"
            )
            .as_deref(),
            Some("0"),
            "node {n}: a late write"
        );
    }
    r.replace(&cluster, leader);

    // The leader's node killed: after the cluster's reconfiguration one of
    // the others leads.
    let leader = r.leader();
    let node = r.live[leader].1;
    let killed = Instant::now();
    cluster.kill_node(node);
    let (_, t) = r.next_leader(leader, killed, Duration::from_secs(40));
    eprintln!("a leader's node killed: another led {t:?} later");

    let intervals = checker::assert_no_overlap(&r.all());
    assert!(intervals.len() >= 2 * ROUNDS + 2, "{intervals:?}");
}
