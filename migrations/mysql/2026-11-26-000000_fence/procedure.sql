PROCEDURE leaderd_fence(IN election VARCHAR(100), IN fence_token BIGINT, IN bound_ms BIGINT)
    SQL SECURITY DEFINER COMMENT 'leaderd fence 4'
BEGIN
    -- leaderd_fence(election, token, bound_ms) on MySQL 8 (MariaDB's is
    -- mariadb-procedure.sql, of static statements: MySQL lacks MariaDB's
    -- variables, so the statements that read or set them are prepared at
    -- run time here): see up.sql for what it does.
    -- It runs with its definer's rights inside the caller's transaction, so
    -- it leaves nothing behind when it refuses: every error it ends with
    -- rolls the transaction back and puts back the session's timeouts.
    DECLARE fenced BIGINT DEFAULT NULL;
    DECLARE live INT DEFAULT 0;
    DECLARE lease_ms BIGINT DEFAULT NULL;
    DECLARE impostor INT DEFAULT 0;
    DECLARE xa INT DEFAULT 0;
    DECLARE mariadb INT DEFAULT VERSION() LIKE '%MariaDB%';
    DECLARE message VARCHAR(300);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET fenced = NULL;
    -- A refusal below, a lock wait cut short, a read-only transaction: the
    -- transaction ends with the error (a SIGNAL alone ends none, and a read
    -- may have locked), except an XA branch, which may not be rolled back
    -- from here (and holds nothing of the fence's yet).
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        IF NOT xa THEN
            ROLLBACK;
        END IF;
        IF @leaderd_fence_restore IS NOT NULL THEN
            PREPARE leaderd_fence_s FROM @leaderd_fence_restore;
            EXECUTE leaderd_fence_s;
            DEALLOCATE PREPARE leaderd_fence_s;
            SET @leaderd_fence_restore = NULL;
        END IF;
        RESIGNAL;
    END;
    SET @leaderd_fence_restore = NULL;
    SET message = CONCAT('leaderd_fence: election "', election, '": token ', fence_token,
                         ' is not the live lease');
    -- An XA branch cannot be fenced: a prepared branch whose session ends
    -- loses its share locks, and its XA COMMIT may then land after a
    -- takeover. XA END of an unknown branch answers 1397 inside one (the
    -- branch named afresh, so that it cannot be the caller's).
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1397 SET xa = 1;
        DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
        SET @leaderd_fence_q = CONCAT('XA END ''leaderd-fence-', UUID(), '''');
        PREPARE leaderd_fence_s FROM @leaderd_fence_q;
        EXECUTE leaderd_fence_s;
        DEALLOCATE PREPARE leaderd_fence_s;
    END;
    IF xa THEN
        SIGNAL SQLSTATE 'LF006'
            SET MESSAGE_TEXT = 'leaderd_fence: an XA transaction cannot be fenced (a prepared branch can lose its locks and commit after a takeover)';
    END IF;
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
            SET MESSAGE_TEXT = 'leaderd_fence: SERIALIZABLE is not supported here (its reads lock the lease row against renewals): use REPEATABLE READ or READ COMMITTED';
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
        SIGNAL SQLSTATE 'LF005'
            SET MESSAGE_TEXT = 'leaderd_fence: this session had a temporary table named as leaderd''s (now dropped); the transaction was rolled back';
    END IF;
    -- Plain reads: the fence row's token, then the lease. A level set for
    -- one transaction only (SET TRANSACTION) does not show above: README.
    SELECT f.token INTO fenced FROM service_leader_fence f WHERE f.name = election;
    SELECT COUNT(*), MAX(TIMESTAMPDIFF(MICROSECOND, COALESCE(l.renewed_at, l.acquired_at), l.expires_at) DIV 1000)
      INTO live, lease_ms
      FROM service_leader_lock l
     WHERE l.name = election AND l.token = fence_token AND l.instance IS NOT NULL
       AND l.expires_at > UTC_TIMESTAMP(6);
    IF fenced IS NULL OR fenced <> fence_token OR live = 0 THEN
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
    SET bound_ms = COALESCE(bound_ms, lease_ms);
    IF bound_ms IS NULL OR bound_ms < 1 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'leaderd_fence: the bound must be a positive number of milliseconds';
    END IF;
    -- The bound (default: the lease's ttl as the row shows it), set before
    -- the lock is taken, never above a shorter timeout the app set. MariaDB
    -- and MySQL have no transaction-local setting: these stay on the
    -- session (put back if the call ends with an error).
    SET @leaderd_fence_bound = bound_ms;
    SET @leaderd_fence_q = IF(mariadb,
        'SELECT CONCAT(''SET SESSION idle_transaction_timeout = '', @@idle_transaction_timeout,
                       '', max_statement_time = '', @@max_statement_time),
                CONCAT(''SET SESSION idle_transaction_timeout = '',
                       IF(@@idle_transaction_timeout > 0,
                          LEAST(@@idle_transaction_timeout, CEIL(@leaderd_fence_bound / 1000)),
                          CEIL(@leaderd_fence_bound / 1000)),
                       '', max_statement_time = '',
                       IF(@@max_statement_time > 0,
                          LEAST(@@max_statement_time, @leaderd_fence_bound / 1000),
                          @leaderd_fence_bound / 1000))
           INTO @leaderd_fence_was, @leaderd_fence_set',
        'SELECT CONCAT(''SET SESSION max_execution_time = '', @@max_execution_time),
                CONCAT(''SET SESSION max_execution_time = '',
                       IF(@@max_execution_time > 0,
                          LEAST(@@max_execution_time, @leaderd_fence_bound),
                          @leaderd_fence_bound))
           INTO @leaderd_fence_was, @leaderd_fence_set');
    PREPARE leaderd_fence_s FROM @leaderd_fence_q;
    EXECUTE leaderd_fence_s;
    DEALLOCATE PREPARE leaderd_fence_s;
    SET @leaderd_fence_restore = @leaderd_fence_was;
    PREPARE leaderd_fence_s FROM @leaderd_fence_set;
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
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
    SET @leaderd_fence_restore = NULL;
END;
