-- The users leaderd needs on MySQL/MariaDB, each with the least it needs,
-- and a database of leaderd's own. Run once as an administrator
-- (mysql < 1-roles.sql); then `leaderd migrate` as leaderd_migrator on the
-- database `leaderd`; then 2-grants.sql as the administrator (rights are
-- granted on what the migration made). Rename the users and the database
-- to taste (the same names in both files) and set real passwords.
--
-- leaderd_migrator  runs `leaderd migrate` (the Job): makes the tables, the
--                   triggers and the fence procedure, which run with its
--                   rights (their DEFINER).
-- leaderd_daemon    runs every leaderd replica (migrate = false).
-- leaderd_app       the app's own user (use yours): calls the fence.
--
-- Why a database of its own: whoever may drop, rename or create tables
-- and views where leaderd's tables are (an app that runs its own
-- migrations usually may, in its database) could put a view in their place
-- and run code with the migrating user's rights inside the fence. The app
-- has no right on this database but to call the fence, by its full name
-- (CALL leaderd.leaderd_fence(...)); its transaction spans both databases.
CREATE DATABASE IF NOT EXISTS `leaderd`;
CREATE USER 'leaderd_migrator'@'%' IDENTIFIED BY 'change-me';
CREATE USER 'leaderd_daemon'@'%' IDENTIFIED BY 'change-me';
CREATE USER 'leaderd_app'@'%' IDENTIFIED BY 'change-me';
-- The migrating user: the tables (CREATE, ALTER, INDEX, DROP: an old
-- installation's bookkeeping table), its triggers (TRIGGER), the procedure
-- (CREATE ROUTINE, ALTER ROUTINE), the rows its triggers and procedure
-- read and write as their definer, and the temporary tables the fence
-- looks for (a temporary table named as leaderd's is dropped).
GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX, DROP, TRIGGER,
      CREATE ROUTINE, ALTER ROUTINE, EXECUTE, CREATE TEMPORARY TABLES
   ON `leaderd`.* TO 'leaderd_migrator'@'%';
-- With binary logging on, a user without SUPER may not make triggers and
-- procedures unless the server sets log_bin_trust_function_creators = 1.
