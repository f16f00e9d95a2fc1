//! The least-privilege roles of `deploy/sql/`, used as a user would: the
//! administrator runs `1-roles.sql`, `leaderd migrate` runs as the
//! migrating role, `2-grants.sql` follows, three daemons run as the
//! daemon's role (with `--no-migrate`) and the app writes, fenced, as the
//! app's role. Each has exactly what the scripts give it: the election,
//! a handover, the fence, `leaderd status` and `leaderd history` work, and what the scripts
//! do not grant is refused.

use std::time::Duration;

use leaderd_tests::{
    block_on, hand_over_by_sigterm, run_cli, serial, wait_single_leader, Daemon, Scratch, TempDb,
    Value,
};

const PG_ROLES: &str = include_str!("../../deploy/sql/postgres/1-roles.sql");
const PG_GRANTS: &str = include_str!("../../deploy/sql/postgres/2-grants.sql");
const MY_ROLES: &str = include_str!("../../deploy/sql/mysql/1-roles.sql");
const MY_GRANTS: &str = include_str!("../../deploy/sql/mysql/2-grants.sql");

/// The scripts' role names, made unique to this run (roles are the
/// server's, not the database's, and tests run side by side).
struct Names {
    migrator: String,
    daemon: String,
    app: String,
}

impl Names {
    fn new() -> Names {
        let tag = &uuid::Uuid::new_v4().simple().to_string()[..10];
        Names {
            migrator: format!("lm_{tag}"),
            daemon: format!("ld_{tag}"),
            app: format!("la_{tag}"),
        }
    }

    fn apply(&self, script: &str) -> String {
        script
            .replace("leaderd_migrator", &self.migrator)
            .replace("leaderd_daemon", &self.daemon)
            .replace("leaderd_app", &self.app)
    }

    fn all(&self) -> [&str; 3] {
        [&self.migrator, &self.daemon, &self.app]
    }
}

/// `url` logging in as `user` (with `password`, if any).
fn url_as(url: &str, user: &str, password: Option<&str>) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    match password {
        Some(p) => format!("{scheme}://{user}:{p}@{host}"),
        None => format!("{scheme}://{user}@{host}"),
    }
}

/// Three daemons as the daemon's role: one leads; the leader's SIGTERM
/// hands over; the daemons never logged a refused right. Returns the
/// daemons and the token the final leader holds.
fn elect_and_hand_over(url: &str) -> (Vec<Daemon>, Scratch, i64, i64) {
    let dir = Scratch::new();
    let mut daemons: Vec<Daemon> = ["a", "b", "c"]
        .iter()
        .map(|id| Daemon::start(url, id, &dir, &["--no-migrate"]))
        .collect();
    let refs: Vec<&Daemon> = daemons.iter().collect();
    let first = wait_single_leader(&refs, Duration::from_secs(20));
    let old = daemons[first].token_held("").expect("the leader's token");
    let (leader, next) = hand_over_by_sigterm(&mut daemons, first);
    let new = daemons[next]
        .token_held("")
        .expect("the new leader's token");
    assert!(new > old);
    for d in daemons.iter().chain([&leader]) {
        let log = d.log_text().to_lowercase();
        for refused in ["permission denied", "denied", "command denied"] {
            assert!(!log.contains(refused), "{}: {log}", d.id);
        }
    }
    daemons.push(leader);
    (daemons, dir, old, new)
}

/// `leaderd migrate` as the migrating user (nothing logged above INFO),
/// then `grant`, then the daemons' election and handover, and `leaderd
/// status` as the daemon's user: the daemons, their directory, and the
/// tokens before and after the handover.
fn migrate_grant_and_elect(
    migrator: &str,
    grant: impl FnOnce(),
    daemon: &str,
) -> (Vec<Daemon>, Scratch, i64, i64) {
    let (code, _, err) = run_cli(&["migrate", "--database-url", migrator], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("WARN"), "{err}");
    grant();
    let elected = elect_and_hand_over(daemon);
    let (code, out, err) = run_cli(&["status", "--json", "--database-url", daemon], &[]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows[0]["token"].as_i64(), Some(elected.3), "{rows:?}");
    assert_eq!(rows[0]["holder_predates_presence"], false, "{rows:?}");
    // The record of terms, readable by the daemon's user: the handover's
    // term is the last.
    let (code, out, err) = run_cli(&["history", "--json", "--database-url", daemon], &[]);
    assert_eq!(code, 0, "{err}");
    let terms: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert!(terms.len() >= 2, "{terms:?}");
    assert_eq!(
        terms.last().unwrap()["token"].as_i64(),
        Some(elected.3),
        "{terms:?}"
    );
    elected
}

mod postgres {
    use super::*;
    use leaderd_tests::pg_session as session;

    fn state(r: &Result<impl Sized, tokio_postgres::Error>) -> String {
        match r {
            Ok(_) => "ok".to_owned(),
            Err(e) => e
                .code()
                .map_or_else(|| e.to_string(), |c| c.code().to_owned()),
        }
    }

    #[test]
    fn the_scripts_roles_run_leaderd_and_the_fence_with_nothing_more() {
        let _s = serial();
        let db = TempDb::postgres();
        let names = Names::new();
        let cleanup = Cleanup(db.url.clone(), names.all().map(str::to_owned));
        let migrator = url_as(&db.url, &names.migrator, None);
        let daemon = url_as(&db.url, &names.daemon, None);
        let app = url_as(&db.url, &names.app, None);
        block_on({
            let (url, sql, app_role) = (db.url.clone(), names.apply(PG_ROLES), names.app.clone());
            async move {
                let admin = session(&url).await;
                admin.batch_execute(&sql).await.unwrap();
                // The app's own table, the app's business.
                admin
                    .batch_execute(&format!(
                        "CREATE TABLE public.app_log (token BIGINT NOT NULL); \
                         GRANT SELECT, INSERT ON public.app_log TO {app_role}"
                    ))
                    .await
                    .unwrap();
            }
        });
        let grants = || {
            let (url, sql) = (migrator.clone(), names.apply(PG_GRANTS));
            block_on(async move { session(&url).await.batch_execute(&sql).await.unwrap() })
        };
        let (_daemons, _dir, old, new) = migrate_grant_and_elect(&migrator, grants, &daemon);
        block_on(async move {
            // A connection's warm-up (a takeover's path, undone) needs no
            // more than the daemon's rights either.
            let mut c = leaderd_tests::store::connect(&daemon).await;
            c.warm_up()
                .await
                .expect("the warm-up, as the daemon's role");
            let app = session(&app).await;
            app.batch_execute("BEGIN").await.unwrap();
            let r = app
                .query_one("SELECT leaderd.leaderd_fence('default', $1)", &[&old])
                .await;
            assert_eq!(state(&r), "LF001");
            app.batch_execute("ROLLBACK; BEGIN").await.unwrap();
            app.query_one("SELECT leaderd.leaderd_fence('default', $1)", &[&new])
                .await
                .expect("the live token, as the app's role");
            app.execute("INSERT INTO public.app_log VALUES ($1)", &[&new])
                .await
                .unwrap();
            app.batch_execute("COMMIT").await.unwrap();
            // Nothing more: the app may not touch the lock table.
            let r = app
                .query("SELECT * FROM leaderd.service_leader_lock", &[])
                .await;
            assert_eq!(state(&r), "42501", "the app read the lock table");
            let daemon = session(&daemon).await;
            for sql in [
                "DELETE FROM service_leader_lock",
                "TRUNCATE service_leader_lock",
                "SELECT * FROM service_leader_token",
                "CREATE TABLE leaderd.x (a INT)",
                "BEGIN; SELECT leaderd_fence('default', 1)",
            ] {
                let r = daemon.batch_execute(sql).await;
                assert_eq!(state(&r), "42501", "the daemon's role may: {sql}");
                let _ = daemon.batch_execute("ROLLBACK").await;
            }
        });
        drop(cleanup);
    }

    /// Drops the test's roles and what they own at the end.
    struct Cleanup(String, [String; 3]);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            leaderd_tests::drop_pg_roles(&self.0, &self.1);
        }
    }
}

mod mariadb {
    use super::*;
    use mysql_async::prelude::Queryable;
    use mysql_async::Conn;

    fn state<T>(r: &Result<T, mysql_async::Error>) -> String {
        match r {
            Ok(_) => "ok".to_owned(),
            Err(mysql_async::Error::Server(e)) => format!("{}", e.code),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_scripts_users_run_leaderd_and_the_fence_with_nothing_more() {
        let _s = serial();
        // leaderd's database (the scripts' `leaderd`) and the app's own.
        let db = TempDb::mysql();
        let app_db = TempDb::mysql();
        let names = Names::new();
        let _cleanup = Cleanup(names.all().map(str::to_owned));
        let ours = format!("`{}`", db.name());
        let script = |sql: &str| names.apply(sql).replace("`leaderd`", &ours);
        let pass = Some("change-me");
        let migrator = url_as(&db.url, &names.migrator, pass);
        let daemon = url_as(&db.url, &names.daemon, pass);
        let app = url_as(&app_db.url, &names.app, pass);
        block_on({
            let (url, sql, app_user) = (db.url.clone(), script(MY_ROLES), names.app.clone());
            let app_schema = app_db.name().to_owned();
            async move {
                let mut admin = Conn::from_url(url.as_str()).await.unwrap();
                admin.query_drop(sql).await.unwrap();
                admin
                    .query_drop(format!(
                        "CREATE TABLE {app_schema}.app_log (token BIGINT NOT NULL); \
                         GRANT SELECT, INSERT ON {app_schema}.app_log TO '{app_user}'@'%'"
                    ))
                    .await
                    .unwrap();
            }
        });
        let grants = || {
            let (url, sql) = (db.url.clone(), script(MY_GRANTS));
            block_on(async move {
                let mut admin = Conn::from_url(url.as_str()).await.unwrap();
                admin.query_drop(sql).await.unwrap();
            })
        };
        let (_daemons, _dir, old, new) = migrate_grant_and_elect(&migrator, grants, &daemon);
        // The daemon's user cannot see the fence's triggers, and says so;
        // the migrating user sees it installed.
        for (url, fence) in [
            (&daemon, "not_visible_to_this_user"),
            (&migrator, "installed"),
        ] {
            let (code, out, err) = run_cli(&["status", "--json", "--database-url", url], &[]);
            assert_eq!(code, 0, "{err}");
            let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
            assert_eq!(rows[0]["fence"], fence, "{rows:?}");
        }
        // A user without the right is told so once: the server's message,
        // not again as its own cause.
        let no_right = url_as(&db.url, &names.app, pass);
        let (code, _, err) = run_cli(&["status", "--database-url", &no_right], &[]);
        assert_ne!(code, 0, "{err}");
        assert_eq!(err.matches("command denied").count(), 1, "{err}");
        let fence = format!("CALL {ours}.leaderd_fence('default', ?, NULL)");
        block_on(async move {
            let mut app = Conn::from_url(app.as_str()).await.unwrap();
            app.query_drop("START TRANSACTION").await.unwrap();
            let r = app.exec_drop(fence.as_str(), (old,)).await;
            assert_eq!(state(&r), "1644", "{r:?}");
            app.query_drop("START TRANSACTION").await.unwrap();
            app.exec_drop(fence.as_str(), (new,))
                .await
                .expect("the live token, as the app's user");
            app.exec_drop("INSERT INTO app_log VALUES (?)", (new,))
                .await
                .unwrap();
            app.query_drop("COMMIT").await.unwrap();
            for sql in [
                format!("SELECT * FROM {ours}.service_leader_lock"),
                format!("RENAME TABLE {ours}.service_leader_fence TO {ours}.x"),
                format!("CREATE VIEW {ours}.v AS SELECT 1"),
            ] {
                let r = app.query_drop(sql.as_str()).await;
                assert!(
                    ["1142", "1044"].contains(&state(&r).as_str()),
                    "the app's user may: {sql}: {r:?}"
                );
            }
            let mut daemon = Conn::from_url(daemon.as_str()).await.unwrap();
            for sql in [
                "DELETE FROM service_leader_lock",
                "UPDATE service_leader_fence SET token = 0",
                "DROP TRIGGER service_leader_fence_take",
            ] {
                let r = daemon.query_drop(sql).await;
                assert!(
                    ["1142", "1143", "1227", "1370"].contains(&state(&r).as_str()),
                    "the daemon's user may: {sql}: {r:?}"
                );
            }
            let r = daemon
                .query_drop("CALL leaderd_fence('default', 1, NULL)")
                .await;
            assert_eq!(state(&r), "1370", "the daemon's user may call the fence");
        });
    }

    /// Drops the test's users at the end.
    struct Cleanup([String; 3]);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            leaderd_tests::drop_mysql_users(&self.0);
        }
    }
}
