-- After `leaderd migrate` ran as leaderd_migrator (MariaDB grants rights
-- only on tables and procedures that exist): the daemon's and the app's
-- rights. Run as the administrator, with the app's database as the default
-- one (mysql APPDB < 2-grants.sql).
SET @leaderd_db = REPLACE(DATABASE(), '`', '``');
-- The daemon: rows of the lock table read, created and written (never
-- deleted), and the tokens of deleted rows read when a row is made again.
SET @leaderd_q = CONCAT('GRANT SELECT, INSERT, UPDATE ON `', @leaderd_db,
    '`.service_leader_lock TO ''leaderd_daemon''@''%''');
PREPARE leaderd_s FROM @leaderd_q; EXECUTE leaderd_s; DEALLOCATE PREPARE leaderd_s;
SET @leaderd_q = CONCAT('GRANT SELECT ON `', @leaderd_db,
    '`.service_leader_token TO ''leaderd_daemon''@''%''');
PREPARE leaderd_s FROM @leaderd_q; EXECUTE leaderd_s; DEALLOCATE PREPARE leaderd_s;
-- The app: the fence only (it runs with its definer's rights, so the
-- app's user needs no right on leaderd's tables).
SET @leaderd_q = CONCAT('GRANT EXECUTE ON PROCEDURE `', @leaderd_db,
    '`.leaderd_fence TO ''leaderd_app''@''%''');
PREPARE leaderd_s FROM @leaderd_q; EXECUTE leaderd_s; DEALLOCATE PREPARE leaderd_s;
