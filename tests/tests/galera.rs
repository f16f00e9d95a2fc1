//! leaderd on a real three-node MariaDB Galera cluster (started by the
//! test; see `leaderd_tests::galera`).
//!
//! Galera's nodes share no lock: `GET_LOCK`, which serialises migrations on
//! one server, is each node's own. Migrations started together on three
//! nodes failed ("Duplicate column name"), and two `CREATE TRIGGER`s at
//! once left a node's replication waiting on a metadata lock for good; the
//! migration now claims a row, which the cluster certifies.

use std::time::Duration;

use leaderd_tests::galera::{value, Galera};
use leaderd_tests::run_cli_within;

/// Three `leaderd migrate` at once, one per node, on an empty database,
/// three times: every one exits 0, none logs above INFO, every node has the
/// whole schema, and the claim is gone.
#[test]
fn concurrent_migrations_on_three_nodes_all_succeed() {
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
                "3",
                "node {n}: the kept-tokens and the fence's triggers"
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
