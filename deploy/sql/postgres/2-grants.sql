-- After `leaderd migrate` ran as leaderd_migrator: the daemon's and the
-- app's rights, granted by the owner of what the migration made. Run as
-- leaderd_migrator (psql -U leaderd_migrator -d APPDB -f 2-grants.sql).
--
-- The daemon: rows of the lock table read, created (a new election, its
-- id from the table's sequence) and written; never deleted.
GRANT SELECT, INSERT, UPDATE ON leaderd.service_leader_lock TO leaderd_daemon;
GRANT USAGE ON SEQUENCE leaderd.service_leader_lock_id_seq TO leaderd_daemon;
-- The record of terms read (`leaderd history`); the database's triggers
-- write it, with the owner's rights.
GRANT SELECT ON leaderd.service_leader_history TO leaderd_daemon;
-- The app: the fence only (it runs with the owner's rights, so the app's
-- role needs no right on the lock table). The app calls it by its full
-- name, leaderd.leaderd_fence(...).
GRANT EXECUTE ON FUNCTION leaderd.leaderd_fence(VARCHAR, BIGINT, INTERVAL) TO leaderd_app;
