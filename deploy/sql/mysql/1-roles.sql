-- The users leaderd needs on MySQL/MariaDB, each with the least it needs.
-- Run once as an administrator, with the app's database as the default
-- one (mysql APPDB < 1-roles.sql); then `leaderd migrate` as
-- leaderd_migrator; then 2-grants.sql as the administrator (the daemon's and the app's
-- rights are granted on what the migration made). Rename the users
-- to taste (the same names in both files) and set real passwords.
--
-- leaderd_migrator  runs `leaderd migrate` (the Job): makes the tables, the
--                   triggers and the fence procedure, which run with its
--                   rights (their DEFINER).
-- leaderd_daemon    runs every leaderd replica (migrate = false).
-- leaderd_app       the app's own user (use yours): calls leaderd_fence.
CREATE USER 'leaderd_migrator'@'%' IDENTIFIED BY 'change-me';
CREATE USER 'leaderd_daemon'@'%' IDENTIFIED BY 'change-me';
CREATE USER 'leaderd_app'@'%' IDENTIFIED BY 'change-me';
-- GRANT takes no expression for the database: the statements are built for
-- the current one.
SET @leaderd_db = REPLACE(DATABASE(), '`', '``');
-- The migrating user: the tables (CREATE, ALTER, INDEX, DROP: an old
-- installation's bookkeeping table), its triggers (TRIGGER), the procedure
-- (CREATE ROUTINE, ALTER ROUTINE), and the rows its triggers and procedure
-- read and write as their definer.
SET @leaderd_q = CONCAT('GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP, TRIGGER, ',
    'CREATE ROUTINE, ALTER ROUTINE, EXECUTE, CREATE TEMPORARY TABLES ON `', @leaderd_db,
    '`.* TO ''leaderd_migrator''@''%''');
PREPARE leaderd_s FROM @leaderd_q; EXECUTE leaderd_s; DEALLOCATE PREPARE leaderd_s;
-- The fence reads its own transaction's isolation level in
-- information_schema.INNODB_TRX, which needs PROCESS; without it a
-- SERIALIZABLE level set for one transaction alone is not refused.
GRANT PROCESS ON *.* TO 'leaderd_migrator'@'%';
-- With binary logging on, a user without SUPER may not make triggers and
-- procedures unless the server sets log_bin_trust_function_creators = 1.
