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
-- naming the election and the token given.
--
-- The first procedure says "not installed": it is replaced by the real one
-- only once the triggers exist (a server with binary logging refuses
-- triggers to a user without SUPER or log_bin_trust_function_creators; the
-- statements stop at the first error), so a fence without its triggers is
-- never a silent pass. Idempotent; the comment is the version checked.
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
CREATE TRIGGER service_leader_fence_take BEFORE UPDATE ON service_leader_lock FOR EACH ROW
    IF NEW.token <> OLD.token THEN
        INSERT INTO service_leader_fence (name, token) VALUES (NEW.name, NEW.token)
            ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
    END IF;
DROP TRIGGER IF EXISTS service_leader_fence_new;
CREATE TRIGGER service_leader_fence_new AFTER INSERT ON service_leader_lock FOR EACH ROW
    INSERT INTO service_leader_fence (name, token) VALUES (NEW.name, NEW.token)
        ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
INSERT INTO service_leader_fence (name, token)
    SELECT name, token FROM service_leader_lock
    ON DUPLICATE KEY UPDATE token = GREATEST(service_leader_fence.token, VALUES(token));
DROP PROCEDURE IF EXISTS leaderd_fence;
CREATE PROCEDURE leaderd_fence(IN election VARCHAR(100), IN fence_token BIGINT, IN bound_ms BIGINT)
    SQL SECURITY DEFINER COMMENT 'leaderd fence 2'
BEGIN
    DECLARE fenced BIGINT DEFAULT NULL;
    DECLARE live INT DEFAULT 0;
    DECLARE lease_ms BIGINT DEFAULT NULL;
    DECLARE message VARCHAR(300);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET fenced = NULL;
    SET message = CONCAT('leaderd_fence: election "', election, '": token ', fence_token,
                         ' is not the live lease');
    -- Refusals come before any lock, so that a refused call (its
    -- transaction goes on after the error) holds nothing: not the fence row,
    -- nor a gap of the index (a name without a row). First what makes the
    -- fence void: autocommit (the lock would end with this CALL; MariaDB
    -- shows it, MySQL has no such variable) and a SERIALIZABLE session (its
    -- plain reads lock the lease row against every renewal; a level set for
    -- one transaction only shows nowhere reliable: README).
    SET @leaderd_fence_q = IF(VERSION() LIKE '%MariaDB%',
        'SELECT @@tx_isolation, @@in_transaction INTO @leaderd_fence_isolation, @leaderd_fence_in',
        'SELECT @@transaction_isolation, 1 INTO @leaderd_fence_isolation, @leaderd_fence_in');
    PREPARE leaderd_fence_s FROM @leaderd_fence_q;
    EXECUTE leaderd_fence_s;
    DEALLOCATE PREPARE leaderd_fence_s;
    IF @leaderd_fence_in = 0 THEN
        SIGNAL SQLSTATE 'LF004'
            SET MESSAGE_TEXT = 'leaderd_fence: not in a transaction (autocommit): START TRANSACTION first, or the fence ends with this CALL';
    END IF;
    IF REPLACE(@leaderd_fence_isolation, '-', ' ') = 'SERIALIZABLE' THEN
        SIGNAL SQLSTATE 'LF003'
            SET MESSAGE_TEXT = 'leaderd_fence: SERIALIZABLE is not supported here (its reads lock the lease row against renewals): roll back, and use REPEATABLE READ or READ COMMITTED';
    END IF;
    -- Plain reads: the fence row's token and the lease (held, live).
    SELECT token INTO fenced FROM service_leader_fence WHERE name = election;
    SELECT COUNT(*), MAX(TIMESTAMPDIFF(MICROSECOND, COALESCE(renewed_at, acquired_at), expires_at) DIV 1000)
      INTO live, lease_ms
      FROM service_leader_lock
     WHERE name = election AND token = fence_token AND instance IS NOT NULL
       AND expires_at > UTC_TIMESTAMP(6);
    IF fenced IS NULL OR fenced <> fence_token OR live = 0 THEN
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
    -- The bound (default: the lease's ttl as the row shows it), set before
    -- the lock is taken. MariaDB and MySQL have no transaction-local
    -- setting: these stay on the session.
    SET bound_ms = COALESCE(bound_ms, lease_ms);
    IF bound_ms IS NULL OR bound_ms < 1 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'leaderd_fence: the bound must be a positive number of milliseconds';
    END IF;
    IF VERSION() LIKE '%MariaDB%' THEN
        SET @leaderd_fence_q = CONCAT('SET SESSION idle_transaction_timeout = ', CEIL(bound_ms / 1000),
                                      ', max_statement_time = ', bound_ms / 1000);
    ELSE
        SET @leaderd_fence_q = CONCAT('SET SESSION max_execution_time = ', bound_ms);
    END IF;
    PREPARE leaderd_fence_s FROM @leaderd_fence_q;
    EXECUTE leaderd_fence_s;
    DEALLOCATE PREPARE leaderd_fence_s;
    -- The lock every takeover's trigger needs, on the row as it is now (a
    -- locking read sees the latest version), then the checks again: a
    -- takeover between the reads above and the lock changed the token, and
    -- the lease is judged by the clock now.
    SET fenced = NULL;
    SELECT token INTO fenced FROM service_leader_fence WHERE name = election LOCK IN SHARE MODE;
    SELECT COUNT(*) INTO live
      FROM service_leader_lock
     WHERE name = election AND token = fence_token AND instance IS NOT NULL
       AND expires_at > UTC_TIMESTAMP(6);
    IF fenced IS NULL OR fenced <> fence_token OR live = 0 THEN
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
END;
