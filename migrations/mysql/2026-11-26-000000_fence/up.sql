-- MySQL 8's installation (MariaDB's is mariadb.sql); the procedure itself
-- is procedure.sql, appended by the migration after "CREATE ".
--
-- Fenced writes (README, "Fenced writes"): CALL leaderd_fence(election,
-- token, bound_ms) first in the app's own transaction. Renewals are left
-- untouched: the lock a takeover needs is on a row of its own, one per
-- election in service_leader_fence, written only when the token changes
-- (the triggers below: a takeover, a new row). The procedure reads that row
-- LOCK IN SHARE MODE (the token must be the caller's), then the lease with a
-- plain read (held, live by the server's clock). Until the transaction ends
-- a takeover's trigger cannot write the fence row: on MariaDB it fails at
-- once (leaderd's statements wait for no row lock) and the takeover is
-- refused; a re-created row's trigger likewise. Otherwise SQLSTATE LF001
-- naming the election and the token given. Every refusal rolls the
-- transaction back first, so that it leaves nothing locked.
--
-- The first procedure says "not installed": it is replaced by the real one
-- only once the triggers exist (a server with binary logging refuses
-- triggers to a user without SUPER or log_bin_trust_function_creators; the
-- statements stop at the first error), so a fence without its triggers is
-- never a silent pass. MySQL 8 has no CREATE OR REPLACE PROCEDURE: the
-- procedure dropped takes its EXECUTE grants with it, to be granted again
-- after an upgrade that replaces it. Idempotent; the comment is the
-- version checked.
CREATE TABLE IF NOT EXISTS service_leader_fence (
    name  VARBINARY(400) NOT NULL PRIMARY KEY,
    token BIGINT         NOT NULL
) ENGINE = InnoDB;
DROP PROCEDURE IF EXISTS leaderd_fence;
CREATE PROCEDURE leaderd_fence(IN election VARCHAR(100), IN fence_token BIGINT, IN bound_ms BIGINT)
    SQL SECURITY DEFINER COMMENT 'leaderd fence 0'
    SIGNAL SQLSTATE 'LF002'
        SET MESSAGE_TEXT = 'leaderd_fence is not installed: the migration could not create its triggers (see leaderd''s log)';
DROP TRIGGER IF EXISTS service_leader_fence_take;
-- A rename writes both names' fence rows: a fenced transaction holds its
-- election's row, so that neither its lease renamed away nor another
-- renamed into its name can get past it.
CREATE TRIGGER service_leader_fence_take BEFORE UPDATE ON service_leader_lock FOR EACH ROW
BEGIN
    IF NEW.token <> OLD.token OR NEW.name <> OLD.name THEN
        INSERT INTO service_leader_fence (name, token) VALUES (NEW.name, NEW.token)
            ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
    END IF;
    IF NEW.name <> OLD.name THEN
        INSERT INTO service_leader_fence (name, token) VALUES (OLD.name, OLD.token)
            ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
    END IF;
END;
DROP TRIGGER IF EXISTS service_leader_fence_new;
CREATE TRIGGER service_leader_fence_new AFTER INSERT ON service_leader_lock FOR EACH ROW
    INSERT INTO service_leader_fence (name, token) VALUES (NEW.name, NEW.token)
        ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
INSERT INTO service_leader_fence (name, token)
    SELECT name, token FROM service_leader_lock
    ON DUPLICATE KEY UPDATE token = GREATEST(service_leader_fence.token, VALUES(token));
DROP PROCEDURE IF EXISTS leaderd_fence;
