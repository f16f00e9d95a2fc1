//! The SQL leaderd installs in the app's database (the fence, the trigger
//! functions, the migration's own lock), tried as the app's
//! least-privileged role would: it plants operators and functions where the
//! installed code might find them, calls what it may call, holds the locks
//! anyone may take, and must gain nothing.

use std::time::{Duration, Instant};

use leaderd_store::{LeaseRequest, StoreError};
use leaderd_tests::store::{acquire, connect, migrated};
use leaderd_tests::TempDb;

fn req<'a>(election: &'a str, instance: &'a str) -> LeaseRequest<'a> {
    LeaseRequest {
        election,
        holder: instance,
        instance,
        ttl: Duration::from_secs(3),
        held_token: None,
        daemon: None,
        address: None,
    }
}

mod postgres {
    use super::*;
    use leaderd_tests::pg_session as session;
    use leaderd_tests::PgRole;
    use tokio_postgres::Client;

    /// What leaderd's previous release installed: SECURITY DEFINER
    /// functions whose search_path was the schema, then pg_temp.
    const PREVIOUS_RELEASE: &str = include_str!("../fixtures/postgres-previous-release.sql");

    /// The app's traps, made by its role in `public` (which every role may
    /// create in on PostgreSQL 14 and earlier, and an app that runs its own
    /// migrations may on any version): an operator or function with the
    /// exact argument types a body uses wins over `pg_catalog`'s where a
    /// function's search_path reaches `public`. Each trap does its job (so
    /// the call goes through) and, run by anyone but its caller (that is,
    /// with a SECURITY DEFINER function's rights), writes down whose rights
    /// it had and makes the caller a superuser.
    fn traps() -> Vec<String> {
        let mut sql = vec![
            "CREATE TABLE public.trap_seen (who TEXT, what TEXT)".to_owned(),
            "GRANT INSERT ON public.trap_seen TO PUBLIC".to_owned(),
            "CREATE FUNCTION public.trap_sprung(what TEXT) RETURNS void LANGUAGE plpgsql AS $$ \
             BEGIN \
               IF current_user::text IS DISTINCT FROM session_user::text THEN \
                 INSERT INTO public.trap_seen VALUES (current_user::text, what); \
                 EXECUTE 'ALTER ROLE ' || quote_ident(session_user::text) || ' SUPERUSER'; \
               END IF; \
             END $$"
                .to_owned(),
        ];
        for (op, name) in [
            ("=", "eq"),
            ("<>", "ne"),
            ("<", "lt"),
            ("<=", "le"),
            (">", "gt"),
            (">=", "ge"),
        ] {
            sql.push(format!(
                "CREATE FUNCTION public.trap_vc_{name}(a VARCHAR, b VARCHAR) RETURNS boolean \
                 LANGUAGE plpgsql AS $$ BEGIN PERFORM public.trap_sprung('varchar {op}'); \
                 RETURN a::text {op} b::text; END $$"
            ));
            sql.push(format!(
                "CREATE OPERATOR public.{op} (LEFTARG = VARCHAR, RIGHTARG = VARCHAR, \
                 FUNCTION = public.trap_vc_{name})"
            ));
        }
        for (op, name, l, r, body) in [
            ("*", "mul", "NUMERIC", "INTEGER", "a * b::numeric"),
            ("+", "add", "BIGINT", "INTEGER", "a + b::bigint"),
            ("=", "beq", "BIGINT", "BIGINT", "a::numeric = b::numeric"),
            ("=", "oideq", "OID", "REGCLASS", "a = b::oid"),
            (
                "<=",
                "tle",
                "TIMESTAMPTZ",
                "TIMESTAMPTZ",
                "a::timestamp <= b::timestamp",
            ),
            (
                "-",
                "tsub",
                "TIMESTAMPTZ",
                "TIMESTAMPTZ",
                "a::timestamp - b::timestamp",
            ),
        ] {
            let ret = match op {
                "*" => "NUMERIC",
                "+" => "BIGINT",
                "-" => "INTERVAL",
                _ => "BOOLEAN",
            };
            sql.push(format!(
                "CREATE FUNCTION public.trap_{name}(a {l}, b {r}) RETURNS {ret} \
                 LANGUAGE plpgsql AS $$ BEGIN PERFORM public.trap_sprung('{l} {op} {r}'); \
                 RETURN {body}; END $$"
            ));
            sql.push(format!(
                "CREATE OPERATOR public.{op} (LEFTARG = {l}, RIGHTARG = {r}, \
                 FUNCTION = public.trap_{name})"
            ));
        }
        for (f, args, ret, body) in [
            (
                "clock_timestamp",
                "",
                "TIMESTAMPTZ",
                "pg_catalog.clock_timestamp()",
            ),
            (
                "statement_timestamp",
                "",
                "TIMESTAMPTZ",
                "pg_catalog.statement_timestamp()",
            ),
            (
                "transaction_timestamp",
                "",
                "TIMESTAMPTZ",
                "pg_catalog.transaction_timestamp()",
            ),
            ("ceil", "x NUMERIC", "NUMERIC", "pg_catalog.ceil(x)"),
            (
                "ceil",
                "x DOUBLE PRECISION",
                "DOUBLE PRECISION",
                "pg_catalog.ceil(x)",
            ),
            (
                "set_config",
                "a TEXT, b TEXT, c BOOLEAN",
                "TEXT",
                "pg_catalog.set_config(a, b, c)",
            ),
            (
                "current_setting",
                "a TEXT, b BOOLEAN",
                "TEXT",
                "pg_catalog.current_setting(a, b)",
            ),
            (
                "coalesce",
                "a BIGINT, b BIGINT",
                "BIGINT",
                "pg_catalog.int8larger(a, b)",
            ),
        ] {
            sql.push(format!(
                "CREATE FUNCTION public.{f}({args}) RETURNS {ret} LANGUAGE plpgsql AS $$ \
                 BEGIN PERFORM public.trap_sprung('{f}'); RETURN {body}; END $$"
            ));
        }
        sql
    }

    /// Who a trap ran as, and what it was.
    async fn sprung(admin: &Client) -> Vec<(String, String)> {
        admin
            .query("SELECT who, what FROM public.trap_seen", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    async fn is_superuser(admin: &Client, role: &str) -> bool {
        admin
            .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role])
            .await
            .unwrap()
            .get(0)
    }

    /// Every function leaderd installed: name, SECURITY DEFINER, its
    /// settings, whether PUBLIC may execute it.
    async fn installed(admin: &Client) -> Vec<(String, bool, Vec<String>, bool)> {
        admin
            .query(
                "SELECT p.proname::text, p.prosecdef, coalesce(p.proconfig, '{}'), \
                 p.proacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(p.proacl) a WHERE a.grantee = 0) \
                 FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace \
                 AND (p.proname LIKE 'leaderd%' OR p.proname LIKE 'service_leader%') ORDER BY 1",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    /// The reproduction: on the previous release's SQL the app's role,
    /// with EXECUTE on the fence only (and even without it, through the
    /// token floor PUBLIC could call), becomes a superuser through a
    /// planted operator. The migration replaces those functions, and then
    /// the same role, calling every function it may with valid arguments,
    /// and the daemon's role, making and deleting rows (the triggers),
    /// gain nothing.
    #[tokio::test]
    async fn a_planted_operator_never_runs_with_the_owners_rights() {
        let db = TempDb::postgres();
        let admin = session(&db.url).await;
        admin.batch_execute(PREVIOUS_RELEASE).await.unwrap();
        let app = PgRole::new(&db, "app");
        let daemon = PgRole::new(&db, "daemon");
        db.exec(&[
            &format!("GRANT CREATE ON SCHEMA public TO {}", app.name),
            &format!(
                "GRANT EXECUTE ON FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) TO {}",
                app.name
            ),
            &format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE ON service_leader_lock TO {}",
                daemon.name
            ),
            &format!(
                "GRANT USAGE ON SEQUENCE service_leader_lock_id_seq TO {}",
                daemon.name
            ),
        ]);
        // A deleted row's token kept: the floor's table has a row to compare.
        admin
            .batch_execute(
                "INSERT INTO service_leader_lock (name, token, expires_at) VALUES ('old', 3, now()); \
                 DELETE FROM service_leader_lock WHERE name = 'old'",
            )
            .await
            .unwrap();
        let as_app = session(&db.url_as(&app.name)).await;
        for sql in traps() {
            as_app
                .batch_execute(&sql)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        // Before: the floor needs no grant, and its `=` is the app's.
        as_app
            .query_one("SELECT service_leader_token_floor('e')", &[])
            .await
            .expect("PUBLIC could call the previous release's floor");
        let seen = sprung(&admin).await;
        assert!(
            seen.iter().any(|(who, _)| who == "postgres"),
            "the reproduction did not reproduce: {seen:?}"
        );
        assert!(is_superuser(&admin, &app.name).await, "{seen:?}");
        admin
            .batch_execute(&format!(
                "ALTER ROLE {} NOSUPERUSER; DELETE FROM public.trap_seen",
                app.name
            ))
            .await
            .unwrap();

        // The upgrade, then a leader (this daemon's statements need the
        // schema it installs).
        connect(&db.url).await.migrate().await.unwrap();
        let mut leader = connect(&db.url).await;
        let token = acquire(&mut leader, &req("e", "a"), Duration::from_secs(5)).await;
        let functions = installed(&admin).await;
        let names: Vec<&str> = functions.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "leaderd_fence",
                "service_leader_fenced_session",
                "service_leader_keep_token",
                "service_leader_open_transactions",
                "service_leader_record_term",
                "service_leader_seed_token",
                "service_leader_take",
                "service_leader_take_key",
                "service_leader_token_floor"
            ]
        );
        for (name, definer, config, public) in &functions {
            assert!(definer, "{name}");
            assert_eq!(config, &["search_path=pg_catalog, pg_temp"], "{name}");
            assert!(!public, "PUBLIC may execute {name}");
        }

        // After: every call the app's role may make, with valid arguments.
        let as_app = session(&db.url_as(&app.name)).await;
        as_app.batch_execute("BEGIN").await.unwrap();
        let fenced: i64 = as_app
            .query_one("SELECT leaderd_fence('e', $1)", &[&token])
            .await
            .expect("the fence, with the live token")
            .get(0);
        assert_eq!(fenced, token);
        as_app.batch_execute("COMMIT").await.unwrap();
        as_app.batch_execute("BEGIN").await.unwrap();
        as_app
            .query_one(
                "SELECT leaderd_fence('e', $1, interval '250 milliseconds')",
                &[&token],
            )
            .await
            .expect("the fence with a bound");
        as_app.batch_execute("COMMIT").await.unwrap();
        let denied = as_app
            .query_one("SELECT service_leader_token_floor('e')", &[])
            .await
            .expect_err("PUBLIC may no longer call the floor");
        assert_eq!(denied.code().map(|c| c.code()), Some("42501"), "{denied}");
        // Granted, it is no way in either.
        admin
            .batch_execute(&format!(
                "GRANT EXECUTE ON FUNCTION service_leader_token_floor(VARCHAR) TO {}",
                app.name
            ))
            .await
            .unwrap();
        as_app
            .query_one("SELECT service_leader_token_floor('e')", &[])
            .await
            .unwrap();
        // The trigger functions, fired by the daemon's role: a row made,
        // deleted (its token kept) and made again (seeded above it).
        let as_daemon = session(&db.url_as(&daemon.name)).await;
        as_daemon
            .batch_execute(
                "INSERT INTO service_leader_lock (name, token, expires_at) VALUES ('gone', 5, now()); \
                 UPDATE service_leader_lock SET token = 9000000000000000000 WHERE name = 'gone'; \
                 DELETE FROM service_leader_lock WHERE name = 'gone'; \
                 INSERT INTO service_leader_lock (name, token, expires_at) VALUES ('gone', 7, now())",
            )
            .await
            .unwrap();
        let seeded: i64 = admin
            .query_one(
                "SELECT token FROM service_leader_lock WHERE name = 'gone'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(seeded, 9_000_000_000_000_000_001, "the kept token's floor");
        let seen = sprung(&admin).await;
        assert!(
            seen.iter().all(|(who, _)| who != "postgres"),
            "a trap ran with the owner's rights: {seen:?}"
        );
        assert!(!is_superuser(&admin, &app.name).await);
        assert!(!is_superuser(&admin, &daemon.name).await);
        let rights: bool = admin
            .query_one(
                "SELECT has_table_privilege($1, 'service_leader_lock', \
                 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')",
                &[&app.name],
            )
            .await
            .unwrap()
            .get(0);
        assert!(!rights, "the app's role got a right on the lock table");
        drop((as_app, as_daemon, admin, leader));
    }

    /// Code that runs with the migrating user's rights is installed only
    /// where nobody else can replace what it names: not in a schema another
    /// role owns (its owner may drop and re-create leaderd's tables), and
    /// not over tables another role made first (with a policy or trigger of
    /// its own). The migration refuses, says why, and leaves nothing.
    #[test]
    fn nothing_is_installed_where_another_role_could_replace_the_tables() {
        use leaderd_tests::run_cli;
        // A database the app's role owns, and its schema public (as
        // PostgreSQL 15 makes it; older servers give it to the bootstrap
        // superuser), migrated by a superuser; the app left a trap on a
        // table the migration would clean up.
        let db = TempDb::postgres();
        let app = PgRole::new(&db, "owner");
        db.exec(&[
            &format!("ALTER DATABASE {} OWNER TO {}", db.name(), app.name),
            &format!("ALTER SCHEMA public OWNER TO {}", app.name),
        ]);
        leaderd_tests::block_on({
            let url = db.url_as(&app.name);
            let name = app.name.clone();
            async move {
                let c = session(&url).await;
                c.batch_execute(&format!(
                    "CREATE TABLE public.__diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY); \
                     INSERT INTO public.__diesel_schema_migrations VALUES ('20261122000000'); \
                     CREATE FUNCTION public.trap() RETURNS trigger LANGUAGE plpgsql AS $$ \
                     BEGIN EXECUTE 'ALTER ROLE {name} SUPERUSER'; RETURN OLD; END $$; \
                     CREATE TRIGGER trap BEFORE DELETE ON public.__diesel_schema_migrations \
                     FOR EACH ROW EXECUTE FUNCTION public.trap()"
                ))
                .await
                .unwrap();
            }
        });
        let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("is not owned by postgres"), "{err}");
        assert!(
            !db.has_table("service_leader_lock"),
            "installed all the same"
        );
        let superuser = db.scalar(&format!(
            "(SELECT rolsuper FROM pg_roles WHERE rolname = '{}')",
            app.name
        ));
        assert_eq!(superuser, "false");
        // The schema is the migrating user's, but the app made the lock
        // table first, with a policy that would run inside the fence.
        let owned = db;
        let db = TempDb::postgres();
        db.exec(&[&format!("GRANT CREATE ON SCHEMA public TO {}", app.name)]);
        leaderd_tests::block_on({
            let url = db.url_as(&app.name);
            async move {
                session(&url)
                    .await
                    .batch_execute(
                        "CREATE TABLE public.service_leader_lock (id BIGSERIAL PRIMARY KEY, \
                         name VARCHAR(100) NOT NULL UNIQUE, holder VARCHAR(100), instance VARCHAR(64), \
                         token BIGINT NOT NULL, acquired_at TIMESTAMPTZ, renewed_at TIMESTAMPTZ, \
                         expires_at TIMESTAMPTZ NOT NULL, successor VARCHAR(64)); \
                         GRANT ALL ON public.service_leader_lock TO PUBLIC",
                    )
                    .await
                    .unwrap();
            }
        });
        let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("is not a plain table of postgres"), "{err}");
        let functions = db.scalar(
            "(SELECT count(*) FROM pg_proc WHERE proname LIKE 'service_leader%' OR proname = 'leaderd_fence')",
        );
        assert_eq!(functions, "0");
        // A function of the app's where one of leaderd's goes: CREATE OR
        // REPLACE would keep the app as its owner, free to rewrite it (a
        // trigger's, and the fence's takeover trigger's).
        for function in ["service_leader_seed_token", "service_leader_take"] {
            let third = TempDb::postgres();
            third.exec(&[&format!("GRANT CREATE ON SCHEMA public TO {}", app.name)]);
            leaderd_tests::block_on({
                let url = third.url_as(&app.name);
                async move {
                    session(&url)
                        .await
                        .batch_execute(&format!(
                            "CREATE FUNCTION public.{function}() RETURNS trigger \
                             LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$"
                        ))
                        .await
                        .unwrap();
                }
            });
            let (code, _, err) = run_cli(&["migrate", "--database-url", &third.url], &[]);
            assert_eq!(code, 1, "{function}: {err}");
            assert!(
                err.contains("belongs to a role other than postgres"),
                "{function}: {err}"
            );
        }
        // The databases first: the role owns one.
        drop((db, owned, app));
    }

    /// The app's role, owning the database, makes what looks like a current
    /// installation (the table, a trigger and a fence of the right names and
    /// version) with a trap in its trigger. A superuser's leaderd does not
    /// take it for installed: `leaderd migrate` refuses, and a daemon never
    /// writes there (it would run the app's trigger as the superuser).
    #[test]
    fn a_fake_installation_is_not_taken_for_current_by_a_superuser() {
        use leaderd_tests::{run_cli, wait_for, Daemon, Scratch};
        let db = TempDb::postgres();
        let app = PgRole::new(&db, "faker");
        db.exec(&[&format!(
            "ALTER DATABASE {} OWNER TO {}",
            db.name(),
            app.name
        )]);
        leaderd_tests::block_on({
            let (url, name) = (db.url_as(&app.name), app.name.clone());
            async move {
                session(&url)
                    .await
                    .batch_execute(&format!(
                        "CREATE TABLE public.service_leader_lock (id BIGSERIAL PRIMARY KEY, \
                         name VARCHAR(100) NOT NULL UNIQUE, holder VARCHAR(100), instance VARCHAR(64), \
                         token BIGINT NOT NULL, acquired_at TIMESTAMPTZ, renewed_at TIMESTAMPTZ, \
                         expires_at TIMESTAMPTZ NOT NULL, successor VARCHAR(64)); \
                         CREATE FUNCTION public.trap() RETURNS trigger LANGUAGE plpgsql AS $$ \
                         BEGIN EXECUTE 'ALTER ROLE {name} SUPERUSER'; RETURN NEW; END $$; \
                         CREATE TRIGGER service_leader_keep_token BEFORE INSERT OR UPDATE OR DELETE \
                         ON public.service_leader_lock FOR EACH ROW EXECUTE FUNCTION public.trap(); \
                         CREATE FUNCTION public.leaderd_fence(VARCHAR, BIGINT, INTERVAL) RETURNS BIGINT \
                         LANGUAGE sql AS $$ SELECT 1::bigint $$; \
                         COMMENT ON FUNCTION public.leaderd_fence(VARCHAR, BIGINT, INTERVAL) IS 'leaderd fence 3'"
                    ))
                    .await
                    .unwrap();
            }
        });
        let (code, _, err) = run_cli(&["migrate", "--database-url", &db.url], &[]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("unsafe database"), "{err}");
        let dir = Scratch::new();
        let daemon = Daemon::start(&db.url, "a", &dir, &[]);
        wait_for(Duration::from_secs(10), "the daemon to refuse", || {
            daemon
                .log_text()
                .contains("refusing to use this database")
                .then_some(())
        });
        assert!(!daemon.is_leader());
        drop(daemon);
        let superuser = db.scalar(&format!(
            "(SELECT rolsuper FROM pg_roles WHERE rolname = '{}')",
            app.name
        ));
        assert_eq!(superuser, "false", "the app's trap ran as the superuser");
        drop((db, app));
    }

    /// leaderd's old bookkeeping table, read by another session that keeps
    /// its transaction open: the migration's clean-up waits for it briefly
    /// (as every step waits), goes on without it, and leaves no session of
    /// its own waiting on the server.
    #[tokio::test]
    async fn the_old_bookkeeping_is_cleaned_up_without_waiting_on_a_reader() {
        let db = TempDb::postgres();
        drop(migrated(&db.url).await);
        let reader = session(&db.url).await;
        reader
            .batch_execute(
                "CREATE TABLE __diesel_schema_migrations (version VARCHAR(50) PRIMARY KEY); \
                 INSERT INTO __diesel_schema_migrations VALUES ('20261122000000'); \
                 BEGIN; SELECT count(*) FROM __diesel_schema_migrations",
            )
            .await
            .unwrap();
        let started = Instant::now();
        connect(&db.url).await.migrate().await.unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let waiting: i64 = reader
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'leaderd' \
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(waiting, 0, "a leaderd session left waiting");
        reader.batch_execute("COMMIT").await.unwrap();
        connect(&db.url).await.migrate().await.unwrap();
        assert!(
            !db.has_table("__diesel_schema_migrations"),
            "cleaned up once free"
        );
    }

    /// A temporary table named as leaderd's is not what the fence reads:
    /// its search_path names pg_temp last and its table is qualified.
    #[tokio::test]
    async fn a_temporary_lock_table_does_not_fool_the_fence() {
        let db = TempDb::postgres();
        let mut leader = migrated(&db.url).await;
        let token = acquire(&mut leader, &req("e", "a"), Duration::from_secs(5)).await;
        let app = session(&db.url).await;
        app.batch_execute(
            "CREATE TEMPORARY TABLE service_leader_lock AS SELECT * FROM public.service_leader_lock; \
             UPDATE pg_temp.service_leader_lock SET token = 424242, expires_at = now() + interval '1 hour'; \
             BEGIN",
        )
        .await
        .unwrap();
        let forged = app
            .query_one("SELECT leaderd_fence('e', 424242)", &[])
            .await
            .expect_err("a made-up token passed");
        assert_eq!(forged.code().map(|c| c.code()), Some("LF001"), "{forged}");
        app.batch_execute("ROLLBACK; BEGIN").await.unwrap();
        app.query_one("SELECT leaderd_fence('e', $1)", &[&token])
            .await
            .expect("the live token");
    }

    /// The same, with real processes: while another session keeps the key
    /// for longer than anyone waits, `leaderd migrate` exits 1 (postponed)
    /// well within 15 s, three daemons on a table that wants an upgrade
    /// elect meanwhile, and no leaderd session ever waits on the server
    /// (a daemon that gave up its connect used to leave its wait behind,
    /// about 12 a minute). Once the key is free the migration completes.
    #[test]
    fn while_the_migration_key_is_held_daemons_elect_and_nothing_waits() {
        use leaderd_tests::{run_cli_within, serial, wait_single_leader, Daemon, Scratch};
        let _s = serial();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let db = TempDb::postgres();
        rt.block_on(async { drop(migrated(&db.url).await) });
        // An upgrade wanted: the fence is gone.
        db.exec(&["DROP FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL)"]);
        let holder = rt.block_on(session(&db.url));
        rt.block_on(holder.batch_execute("SELECT pg_advisory_lock(30510766455353956)"))
            .unwrap();
        let started = Instant::now();
        let (code, _, err) = run_cli_within(
            &["migrate", "--database-url", &db.url],
            Duration::from_secs(15),
        );
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("postponed"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(15));
        let dir = Scratch::new();
        let daemons: Vec<Daemon> = ["a", "b", "c"]
            .iter()
            .map(|id| Daemon::start(&db.url, id, &dir, &[]))
            .collect();
        let refs: Vec<&Daemon> = daemons.iter().collect();
        wait_single_leader(&refs, Duration::from_secs(20));
        let waiting = || -> i64 {
            rt.block_on(holder.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'leaderd' \
                 AND wait_event_type = 'Lock'",
                &[],
            ))
            .unwrap()
            .get(0)
        };
        let until = Instant::now() + Duration::from_secs(6);
        while Instant::now() < until {
            assert_eq!(waiting(), 0, "a leaderd session waits on the server");
            std::thread::sleep(Duration::from_millis(100));
        }
        wait_single_leader(&refs, Duration::from_secs(5));
        assert!(
            daemons.iter().any(|d| d.log_text().contains("postponed")),
            "no daemon tried to migrate"
        );
        rt.block_on(holder.batch_execute("SELECT pg_advisory_unlock(30510766455353956)"))
            .unwrap();
        let (code, _, err) = run_cli_within(
            &["migrate", "--database-url", &db.url],
            Duration::from_secs(15),
        );
        assert_eq!(code, 0, "{err}");
        let installed: bool = rt
            .block_on(holder.query_one(
                "SELECT to_regprocedure('leaderd_fence(varchar, bigint, interval)') IS NOT NULL",
                &[],
            ))
            .unwrap()
            .get(0);
        assert!(installed);
    }

    /// Anyone who may connect can take the migration's advisory lock and
    /// keep it. The migration tries it without waiting (so no session of
    /// its own is left waiting on the server) and is postponed within its
    /// bound; daemons keep electing meanwhile, and once the key is free the
    /// migration completes.
    #[tokio::test]
    async fn a_held_migration_lock_postpones_the_migration_within_its_bound() {
        let db = TempDb::postgres();
        let holder = session(&db.url).await;
        holder
            .batch_execute("SELECT pg_advisory_lock(30510766455353956)")
            .await
            .unwrap();
        let started = Instant::now();
        let r = connect(&db.url).await.migrate().await;
        let took = started.elapsed();
        assert!(matches!(r, Err(StoreError::MigrationBusy(_))), "{r:?}");
        assert!(took < Duration::from_secs(8), "{took:?}");
        assert!(!db.has_table("service_leader_lock"), "ran beside the lock");
        let waiting: i64 = holder
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(waiting, 0, "a session left waiting on the server");
        holder
            .batch_execute("SELECT pg_advisory_unlock(30510766455353956)")
            .await
            .unwrap();
        connect(&db.url).await.migrate().await.unwrap();
        assert!(db.has_table("service_leader_lock"));
    }
}

mod mariadb {
    use super::*;
    use leaderd_store::{Attempt, Connection};
    use leaderd_tests::sqlstate::mysql as state;
    use mysql_async::prelude::Queryable;
    use mysql_async::Conn;

    /// A MariaDB user of its own for one test (the app's role: EXECUTE on
    /// the fence, temporary tables, its own table), dropped at the end.
    struct AppUser {
        name: String,
        url: String,
    }

    impl AppUser {
        fn new(db: &TempDb) -> AppUser {
            let name = format!(
                "leaderd_app_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            );
            let schema = db.url.rsplit('/').next().unwrap().to_owned();
            leaderd_tests::mysql_exec(&format!("CREATE USER '{name}'@'%'"));
            leaderd_tests::mysql_exec(&format!(
                "GRANT EXECUTE ON PROCEDURE {schema}.leaderd_fence TO '{name}'@'%'"
            ));
            leaderd_tests::mysql_exec(&format!(
                "GRANT CREATE TEMPORARY TABLES, SELECT, INSERT ON {schema}.* TO '{name}'@'%'"
            ));
            AppUser {
                url: db.url.replacen("root@", &format!("{name}@"), 1),
                name,
            }
        }
    }

    impl Drop for AppUser {
        fn drop(&mut self) {
            leaderd_tests::drop_mysql_users(std::slice::from_ref(&self.name));
        }
    }

    /// A migrated database whose leader `a` holds `e` with a 3 s lease.
    async fn led() -> (TempDb, Connection, i64) {
        let db = TempDb::mysql();
        let mut a = migrated(&db.url).await;
        let token = acquire(&mut a, &req("e", "a"), Duration::from_secs(5)).await;
        (db, a, token)
    }

    async fn in_transaction(c: &mut Conn) -> bool {
        let v: Option<i64> = c.query_first("SELECT @@in_transaction").await.unwrap();
        v == Some(1)
    }

    /// The leader renews every 300 ms for `for_`: every renewal must be
    /// granted (a lock left by a refused fence makes them Busy).
    async fn renewals_go_on(leader: &mut Connection, token: i64, for_: Duration) {
        let until = Instant::now() + for_;
        while Instant::now() < until {
            let r = leader
                .acquire_or_renew(&LeaseRequest {
                    held_token: Some(token),
                    ..req("e", "a")
                })
                .await;
            assert!(
                matches!(r, Ok(Attempt::Granted { token: t }) if t == token),
                "a renewal beside the app's idle session: {r:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// SERIALIZABLE for one transaction only (which `@@tx_isolation` does
    /// not show) and a refused call, then left idle: nothing stays locked
    /// (the call rolls back before its error, and its read of the lease row
    /// locked it at that level), so the leader renews throughout.
    #[tokio::test]
    async fn a_refused_fence_leaves_nothing_locked_whatever_the_level() {
        let (db, mut leader, token) = led().await;
        let user = AppUser::new(&db);
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        for level in ["SERIALIZABLE", "REPEATABLE READ"] {
            let given = 0;
            app.query_drop(format!(
                "SET TRANSACTION ISOLATION LEVEL {level}; START TRANSACTION"
            ))
            .await
            .unwrap();
            let r = app
                .exec_drop("CALL leaderd_fence('e', ?, NULL)", (given,))
                .await;
            assert_eq!(state(&r), "LF001", "{level}, token {given}: {r:?}");
            assert!(!in_transaction(&mut app).await, "token {given}: left open");
            renewals_go_on(&mut leader, token, Duration::from_millis(1500)).await;
        }
        // A refusal after the bound was set puts the session's back.
        let before: Option<(f64, i64)> = app
            .query_first("SELECT @@max_statement_time, @@idle_transaction_timeout")
            .await
            .unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('e', ?, 5000)", (token + 1,))
            .await;
        assert_eq!(state(&r), "LF001");
        let after: Option<(f64, i64)> = app
            .query_first("SELECT @@max_statement_time, @@idle_transaction_timeout")
            .await
            .unwrap();
        assert_eq!(before, after, "a refused call left its bound");
    }

    /// Temporary tables named as leaderd's shadow the real ones inside the
    /// SQL SECURITY DEFINER procedure; made by the app's role with a
    /// made-up token, they are refused (and dropped).
    #[tokio::test]
    async fn temporary_tables_named_as_leaderds_do_not_fake_the_fence() {
        let (db, _leader, token) = led().await;
        let user = AppUser::new(&db);
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        for shadowed in ["service_leader_fence", "service_leader_lock", "both"] {
            if shadowed != "service_leader_lock" {
                app.query_drop(
                    "CREATE TEMPORARY TABLE service_leader_fence \
                     (name VARBINARY(400) PRIMARY KEY, token BIGINT NOT NULL); \
                     INSERT INTO service_leader_fence VALUES ('e', 42)",
                )
                .await
                .unwrap();
            }
            if shadowed != "service_leader_fence" {
                app.query_drop(
                    "CREATE TEMPORARY TABLE service_leader_lock (name VARCHAR(100), \
                     holder VARCHAR(100), instance VARCHAR(64), token BIGINT, \
                     acquired_at DATETIME(6), renewed_at DATETIME(6), expires_at DATETIME(6)); \
                     INSERT INTO service_leader_lock VALUES ('e', 'x', 'x', 42, UTC_TIMESTAMP(6), \
                     UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
                )
                .await
                .unwrap();
            }
            app.query_drop("START TRANSACTION").await.unwrap();
            let r = app.query_drop("CALL leaderd_fence('e', 42, NULL)").await;
            assert_eq!(state(&r), "LF005", "{shadowed}: {r:?}");
            app.query_drop("START TRANSACTION").await.unwrap();
            let r = app
                .exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
                .await;
            assert_eq!(state(&r), "ok", "{shadowed}: the real token: {r:?}");
            app.query_drop("ROLLBACK").await.unwrap();
        }
    }

    /// With autocommit off (the Python DB-API's default) the CALL itself
    /// begins the transaction: accepted without START TRANSACTION, and it
    /// holds a takeover off until COMMIT. With autocommit on and no
    /// transaction it is refused.
    #[tokio::test]
    async fn autocommit_off_fences_without_start_transaction() {
        let (db, _leader, token) = led().await;
        let user = AppUser::new(&db);
        db.exec(&["CREATE TABLE app_log (token BIGINT NOT NULL)"]);
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
            .await;
        assert_eq!(state(&r), "LF004", "autocommit on: {r:?}");
        app.query_drop("SET autocommit = 0").await.unwrap();
        app.exec_drop("CALL leaderd_fence('e', ?, 10000)", (token,))
            .await
            .expect("autocommit off, no START TRANSACTION");
        app.exec_drop("INSERT INTO app_log VALUES (?)", (token,))
            .await
            .unwrap();
        // The lease expires; the takeover waits for the COMMIT.
        let mut b = connect(&db.url).await;
        let until = Instant::now() + Duration::from_secs(4);
        while Instant::now() < until {
            let r = b.acquire_or_renew(&req("e", "b")).await.unwrap();
            assert!(
                !matches!(r, Attempt::Granted { .. }),
                "a takeover while fenced"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        app.query_drop("COMMIT").await.unwrap();
        let taken = acquire(&mut b, &req("e", "b"), Duration::from_secs(3)).await;
        assert!(taken > token);
    }

    /// An XA branch cannot be fenced (a prepared branch whose session ends
    /// loses its share locks, and its commit could land after a takeover):
    /// refused before anything is read.
    #[tokio::test]
    async fn an_xa_transaction_is_refused() {
        let (db, _leader, token) = led().await;
        let user = AppUser::new(&db);
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        // Any branch name, the probe's own kind too.
        for xid in ["leaderd-test", "leaderd-fence-probe"] {
            app.query_drop(format!("XA START '{xid}'")).await.unwrap();
            let r = app
                .exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
                .await;
            assert_eq!(state(&r), "LF006", "{xid}: {r:?}");
            app.query_drop(format!("XA END '{xid}'; XA ROLLBACK '{xid}'"))
                .await
                .unwrap();
        }
        app.query_drop("START TRANSACTION").await.unwrap();
        app.exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
            .await
            .expect("a plain transaction after it");
    }

    /// SERIALIZABLE set for one transaction only does not show in the
    /// session's level, which is all the fence reads (the transaction's own
    /// is in INNODB_TRX, a cache read at 30 us a call, a third of the
    /// fence's cost): the fence passes, safely (its reads lock the lease
    /// row), and the leader's renewals are busy until the transaction ends,
    /// as docs/integrating.md warns; they go on after it, and the next transaction, at
    /// the session's level, passes.
    #[tokio::test]
    async fn serializable_for_one_transaction_passes_and_holds_renewals_off_until_it_ends() {
        let (db, mut leader, token) = led().await;
        let user = AppUser::new(&db);
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        app.query_drop("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION")
            .await
            .unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
            .await;
        assert_eq!(state(&r), "ok", "{r:?}");
        let renewal = leader
            .acquire_or_renew(&LeaseRequest {
                held_token: Some(token),
                ..req("e", "a")
            })
            .await;
        assert!(
            !matches!(renewal, Ok(Attempt::Granted { .. })),
            "renewed under a SERIALIZABLE transaction's lock: the warning is wrong"
        );
        app.query_drop("COMMIT").await.unwrap();
        renewals_go_on(&mut leader, token, Duration::from_millis(600)).await;
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
            .await;
        assert_eq!(state(&r), "ok", "REPEATABLE READ right after: {r:?}");
        app.query_drop("ROLLBACK").await.unwrap();
    }

    /// A call that ends with an error of the server's (here a lock wait on
    /// the fence row, cut short) ends the transaction and puts back the
    /// session's timeouts; a call that passes keeps an app's shorter ones.
    #[tokio::test]
    async fn an_error_inside_the_fence_leaves_nothing_behind() {
        let (db, _leader, token) = led().await;
        let user = AppUser::new(&db);
        let mut holder = Conn::from_url(db.url.as_str()).await.unwrap();
        holder
            .query_drop(
                "START TRANSACTION; SELECT token FROM service_leader_fence WHERE name = 'e' FOR UPDATE",
            )
            .await
            .unwrap();
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        app.query_drop(
            "SET SESSION innodb_lock_wait_timeout = 1, max_statement_time = 5, \
             idle_transaction_timeout = 10",
        )
        .await
        .unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        let r = app
            .exec_drop("CALL leaderd_fence('e', ?, 60000)", (token,))
            .await;
        assert_ne!(state(&r), "ok");
        assert!(!in_transaction(&mut app).await, "left open: {r:?}");
        let timeouts: Option<(f64, i64)> = app
            .query_first("SELECT @@max_statement_time, @@idle_transaction_timeout")
            .await
            .unwrap();
        assert_eq!(timeouts, Some((5.0, 10)), "{r:?}");
        holder.query_drop("ROLLBACK").await.unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        app.exec_drop("CALL leaderd_fence('e', ?, 60000)", (token,))
            .await
            .unwrap();
        let timeouts: Option<(f64, i64)> = app
            .query_first("SELECT @@max_statement_time, @@idle_transaction_timeout")
            .await
            .unwrap();
        assert_eq!(timeouts, Some((5.0, 10)), "the app's shorter ones kept");
    }

    /// A migration that installs the fence again (a newer version, a lost
    /// trigger) replaces it in place: the app's grant stays, and a
    /// migration postponed by an open fenced transaction leaves the
    /// installed fence as it was (not a stub that refuses every call).
    #[tokio::test]
    async fn installing_again_keeps_the_grant_and_never_leaves_a_stub() {
        let (db, _leader, token) = led().await;
        let user = AppUser::new(&db);
        let older = "ALTER PROCEDURE leaderd_fence COMMENT 'leaderd fence 2'";
        db.exec(&[older]);
        connect(&db.url).await.migrate().await.unwrap();
        let mut app = Conn::from_url(user.url.as_str()).await.unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        app.exec_drop("CALL leaderd_fence('e', ?, 60000)", (token,))
            .await
            .expect("the grant survives the reinstall");
        db.exec(&[older]);
        let r = connect(&db.url).await.migrate().await;
        assert!(matches!(r, Err(StoreError::MigrationBusy(_))), "{r:?}");
        app.query_drop("COMMIT").await.unwrap();
        app.query_drop("START TRANSACTION").await.unwrap();
        app.exec_drop("CALL leaderd_fence('e', ?, NULL)", (token,))
            .await
            .expect("the installed fence, not a stub");
    }

    /// Anyone may hold `GET_LOCK('leaderd_migrate')`: the migration tries
    /// it without waiting, and is postponed within its bound.
    #[tokio::test]
    async fn a_held_migration_lock_postpones_the_migration_within_its_bound() {
        use leaderd_tests::mariadbserver::MariaDbServer;
        let server = MariaDbServer::start();
        let mut holder = Conn::from_url(server.url()).await.unwrap();
        let got: Option<i64> = holder
            .query_first("SELECT GET_LOCK('leaderd_migrate', 0)")
            .await
            .unwrap();
        assert_eq!(got, Some(1));
        let started = Instant::now();
        let r = connect(&server.url()).await.migrate().await;
        assert!(matches!(r, Err(StoreError::MigrationBusy(_))), "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(8));
        let waiting: Option<i64> = holder
            .query_first(
                "SELECT COUNT(*) FROM information_schema.processlist \
                 WHERE state LIKE '%lock%' AND id <> CONNECTION_ID()",
            )
            .await
            .unwrap();
        assert_eq!(waiting, Some(0), "a session left waiting on the server");
        holder
            .query_drop("DO RELEASE_LOCK('leaderd_migrate')")
            .await
            .unwrap();
        connect(&server.url()).await.migrate().await.unwrap();
    }
}
