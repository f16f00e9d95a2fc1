-- After `leaderd migrate` ran as leaderd_migrator on the database `leaderd`
-- (MariaDB grants rights only on tables and procedures that exist): the
-- daemon's and the app's rights. Run as the administrator
-- (mysql < 2-grants.sql).
--
-- The daemon: rows of the lock table read, created and written (never
-- deleted), and the tokens of deleted rows read when a row is made again.
GRANT SELECT, INSERT, UPDATE ON `leaderd`.service_leader_lock TO 'leaderd_daemon'@'%';
GRANT SELECT ON `leaderd`.service_leader_token TO 'leaderd_daemon'@'%';
-- The record of terms read (`leaderd history`); the triggers write it,
-- with their definer's rights.
GRANT SELECT ON `leaderd`.service_leader_history TO 'leaderd_daemon'@'%';
-- The app: the fence only (it runs with its definer's rights, so the
-- app's user needs no right on leaderd's tables).
GRANT EXECUTE ON PROCEDURE `leaderd`.leaderd_fence TO 'leaderd_app'@'%';
