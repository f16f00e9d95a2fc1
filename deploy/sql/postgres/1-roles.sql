-- The roles leaderd needs on PostgreSQL, each with the least it needs, and
-- a schema of leaderd's own. Run once as a superuser or the database's
-- owner, connected to the app's database (psql -d APPDB -f 1-roles.sql);
-- then `leaderd migrate` as leaderd_migrator; then 2-grants.sql as
-- leaderd_migrator. Rename the roles to taste (the same names in both
-- files), and give each a password: \password leaderd_migrator
--
-- leaderd_migrator  runs `leaderd migrate` (the Job): owns the schema, the
--                   lock table, its triggers and the fence function, which
--                   run with its rights.
-- leaderd_daemon    runs every leaderd replica (migrate = false): reads and
--                   writes the lock table, nothing else.
-- leaderd_app       the app's own role (use yours): calls the fence.
CREATE ROLE leaderd_migrator LOGIN;
CREATE ROLE leaderd_daemon LOGIN;
CREATE ROLE leaderd_app LOGIN;
-- A schema only the migrating role may create in. leaderd's own
-- statements, and the migration, find operators and functions through the
-- search_path: in a schema the app's role may create in (public, on
-- PostgreSQL 14 and earlier, or for an app that runs its own migrations),
-- the app's role could plant one that runs with the daemon's rights. The
-- functions leaderd installs find nothing through any schema, whatever
-- the search_path.
CREATE SCHEMA leaderd AUTHORIZATION leaderd_migrator;
GRANT USAGE ON SCHEMA leaderd TO leaderd_daemon, leaderd_app;
-- Role defaults, applied at each login (no session SET, so they hold
-- through a transaction pooler too).
ALTER ROLE leaderd_migrator SET search_path = leaderd;
ALTER ROLE leaderd_daemon SET search_path = leaderd;
