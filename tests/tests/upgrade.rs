//! An upgrade's migration beside leaders that are running: every DDL step waits briefly for the locks it needs, then is
//! tried again later, so a long transaction on the lock table never queues
//! the leaders' renewals behind a migration.
//!
//! The schema is set back to an older release's (a step undone), the old
//! daemons (`--no-migrate`) lead, another transaction holds the table (as a
//! long report or a stuck app would), and the new release's daemon starts
//! and migrates. Before: the migration's lock request waited behind that
//! transaction and every renewal queued behind it: all leases were lost,
//! and nobody led until the transaction ended.

use std::time::{Duration, Instant};

use leaderd_tests::{run_cli, run_cli_within, serial, wait_for, Daemon, Scratch, TempDb};

const ELECTIONS: [&str; 3] = ["jobs", "mailer", "reports"];

/// How long the other transaction holds the table: several leases, and
/// longer than a migration may take to give up ([`GIVES_UP`]).
const HELD: Duration = Duration::from_secs(8);
/// Within this, `leaderd migrate` gives up ("postponed"): it tries the
/// migration's own lock for 4 s (the new daemon, migrating at the same
/// time, may hold it that long), and each step for 100 ms more.
const GIVES_UP: Duration = Duration::from_secs(6);

fn old_daemon(db: &TempDb, dir: &Scratch, id: &str) -> Daemon {
    Daemon::launch(&db.url, id, dir, id, &["--no-migrate", "--no-spread"])
        .elections(&ELECTIONS)
        .start()
}

/// `undo` sets the schema back by one step; `hold` is what the other
/// transaction runs (it keeps its locks until it ends); `migrated` is true
/// once the step is back.
fn migration_behind_a_long_transaction(db: TempDb, undo: &str, hold: &str, migrated: &str) {
    let _s = serial();
    let dir = Scratch::new();
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    let old = old_daemon(&db, &dir, "old");
    wait_for(
        Duration::from_secs(15),
        "the old daemon to lead all",
        || (old.leading()?.len() == ELECTIONS.len()).then_some(()),
    );
    // Undone once the rows exist: the old release creates none.
    db.exec(&[undo]);
    assert_eq!(db.scalar(migrated), "0", "the step is undone");
    let held = Instant::now();
    let other = db.hold(hold);
    // The upgrade: a new daemon that migrates, and the migration job.
    let new = Daemon::launch(&db.url, "new", &dir, "new", &["--no-spread"])
        .elections(&ELECTIONS)
        .start();
    let args = ["migrate", "--database-url", &db.url];
    let (code, _, err) = run_cli_within(&args, GIVES_UP);
    assert_ne!(code, 0, "the migration cannot have run: {err}");
    assert!(err.contains("postponed"), "{err}");
    wait_for(Duration::from_secs(5), "the new daemon to postpone", || {
        new.log_text().contains("postponed").then_some(())
    });
    // Leases live through the whole hold, renewed every 400 ms.
    while held.elapsed() < HELD {
        assert_eq!(
            old.leading().unwrap().len(),
            ELECTIONS.len(),
            "a lease lost"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(other);
    assert!(old.logged("lost leadership").is_empty(), "leases lost");
    assert!(new.leading().unwrap().is_empty(), "two leaders");
    // Tried again once the table is free.
    let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(db.scalar(migrated), "1", "migrated after the hold");
}

#[test]
fn a_migration_behind_a_long_transaction_costs_no_lease_on_postgres() {
    migration_behind_a_long_transaction(
        TempDb::postgres(),
        "DROP TRIGGER service_leader_keep_token ON service_leader_lock",
        // Row-exclusive: every renewal goes on beside it; a trigger's DDL
        // waits for it.
        "LOCK TABLE service_leader_lock IN ROW EXCLUSIVE MODE",
        "SELECT COUNT(*) FROM pg_trigger WHERE tgname = 'service_leader_keep_token'",
    );
}

#[test]
fn a_migration_behind_a_long_transaction_costs_no_lease_on_mysql() {
    migration_behind_a_long_transaction(
        TempDb::mysql(),
        "DROP TABLE service_leader_token",
        // A read in an open transaction keeps the table's shared metadata
        // lock: renewals go on beside it; DDL waits for it.
        "SELECT COUNT(*) FROM service_leader_lock",
        "SELECT COUNT(*) FROM information_schema.tables \
         WHERE table_schema = DATABASE() AND table_name = 'service_leader_token'",
    );
}
