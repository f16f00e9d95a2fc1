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
    SQL SECURITY DEFINER COMMENT 'leaderd fence 3'
BEGIN
    DECLARE fenced BIGINT DEFAULT NULL;
    DECLARE live INT DEFAULT 0;
    DECLARE lease_ms BIGINT DEFAULT NULL;
    DECLARE level VARCHAR(40) DEFAULT NULL;
    DECLARE impostor INT DEFAULT 0;
    DECLARE idle_was VARCHAR(40) DEFAULT NULL;
    DECLARE statement_was VARCHAR(40) DEFAULT NULL;
    DECLARE mariadb INT DEFAULT VERSION() LIKE '%MariaDB%';
    DECLARE message VARCHAR(300);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET fenced = NULL;
    SET message = CONCAT('leaderd_fence: election "', election, '": token ', fence_token,
                         ' is not the live lease');
    -- What makes the fence void, before anything is read: autocommit (the
    -- lock would end with this CALL; MariaDB shows it, MySQL has no such
    -- variable; with autocommit off the CALL itself begins a transaction)
    -- and a SERIALIZABLE session (its plain reads lock the lease row
    -- against every renewal).
    SET @leaderd_fence_q = IF(mariadb,
        'SELECT @@tx_isolation, @@in_transaction OR NOT @@autocommit INTO @leaderd_fence_isolation, @leaderd_fence_in',
        'SELECT @@transaction_isolation, 1 INTO @leaderd_fence_isolation, @leaderd_fence_in');
    PREPARE leaderd_fence_s FROM @leaderd_fence_q;
    EXECUTE leaderd_fence_s;
    DEALLOCATE PREPARE leaderd_fence_s;
    IF NOT @leaderd_fence_in THEN
        SIGNAL SQLSTATE 'LF004'
            SET MESSAGE_TEXT = 'leaderd_fence: not in a transaction (autocommit): START TRANSACTION first, or the fence ends with this CALL';
    END IF;
    IF REPLACE(@leaderd_fence_isolation, '-', ' ') = 'SERIALIZABLE' THEN
        SIGNAL SQLSTATE 'LF003'
            SET MESSAGE_TEXT = 'leaderd_fence: SERIALIZABLE is not supported here (its reads lock the lease row against renewals): roll back, and use REPEATABLE READ or READ COMMITTED';
    END IF;
    -- A temporary table of this session named as one of leaderd's would
    -- stand in for it below (temporary tables shadow base tables, whatever
    -- the rights of the code that reads them): one is dropped, and the call
    -- refused.
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1051 SET impostor = impostor - 1;
        SET impostor = 2;
        DROP TEMPORARY TABLE service_leader_fence;
        DROP TEMPORARY TABLE service_leader_lock;
    END;
    IF impostor > 0 THEN
        ROLLBACK;
        SIGNAL SQLSTATE 'LF005'
            SET MESSAGE_TEXT = 'leaderd_fence: this session had a temporary table named as leaderd''s (now dropped); the transaction was rolled back';
    END IF;
    -- Plain reads: the fence row's token (the first read, which starts the
    -- transaction in InnoDB; at worst a share lock on the fence row), then
    -- the transaction's own isolation level, which one set for this
    -- transaction alone (SET TRANSACTION ...) shows only here. The row is
    -- read only when fresh (it names this very statement: the table is a
    -- cache of up to 100 ms); without the PROCESS right it cannot be read,
    -- and the session's level above is all that is checked (README).
    SELECT f.token INTO fenced FROM service_leader_fence f WHERE f.name = election;
    BEGIN
        DECLARE CONTINUE HANDLER FOR NOT FOUND, SQLEXCEPTION SET level = NULL;
        SELECT t.trx_isolation_level INTO level FROM information_schema.INNODB_TRX t
         WHERE t.trx_mysql_thread_id = CONNECTION_ID()
           AND t.trx_query LIKE '%leaderd_fence isolation probe%' LIMIT 1;
    END;
    IF level = 'SERIALIZABLE' THEN
        ROLLBACK;
        SIGNAL SQLSTATE 'LF003'
            SET MESSAGE_TEXT = 'leaderd_fence: SERIALIZABLE is not supported here (its reads lock the lease row against renewals); the transaction was rolled back: use REPEATABLE READ or READ COMMITTED';
    END IF;
    SELECT COUNT(*), MAX(TIMESTAMPDIFF(MICROSECOND, COALESCE(l.renewed_at, l.acquired_at), l.expires_at) DIV 1000)
      INTO live, lease_ms
      FROM service_leader_lock l
     WHERE l.name = election AND l.token = fence_token AND l.instance IS NOT NULL
       AND l.expires_at > UTC_TIMESTAMP(6);
    -- A refusal rolls the transaction back first: a SIGNAL alone ends no
    -- transaction, and a read above may have locked (a level that shows
    -- nowhere, a concurrent takeover's row).
    IF fenced IS NULL OR fenced <> fence_token OR live = 0 THEN
        ROLLBACK;
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
    SET bound_ms = COALESCE(bound_ms, lease_ms);
    IF bound_ms IS NULL OR bound_ms < 1 THEN
        ROLLBACK;
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'leaderd_fence: the bound must be a positive number of milliseconds';
    END IF;
    -- The bound (default: the lease's ttl as the row shows it), set before
    -- the lock is taken. MariaDB and MySQL have no transaction-local
    -- setting: these stay on the session (and are put back on a refusal).
    IF mariadb THEN
        SET idle_was = @@SESSION.idle_transaction_timeout, statement_was = @@SESSION.max_statement_time;
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
    SELECT f.token INTO fenced FROM service_leader_fence f WHERE f.name = election LOCK IN SHARE MODE;
    SELECT COUNT(*) INTO live
      FROM service_leader_lock l
     WHERE l.name = election AND l.token = fence_token AND l.instance IS NOT NULL
       AND l.expires_at > UTC_TIMESTAMP(6);
    IF fenced IS NULL OR fenced <> fence_token OR live = 0 THEN
        ROLLBACK;
        IF mariadb THEN
            SET @leaderd_fence_q = CONCAT('SET SESSION idle_transaction_timeout = ', idle_was,
                                          ', max_statement_time = ', statement_was);
            PREPARE leaderd_fence_s FROM @leaderd_fence_q;
            EXECUTE leaderd_fence_s;
            DEALLOCATE PREPARE leaderd_fence_s;
        END IF;
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
END;
