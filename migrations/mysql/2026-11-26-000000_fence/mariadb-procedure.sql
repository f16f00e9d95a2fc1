PROCEDURE leaderd_fence(IN election VARCHAR(100), IN fence_token BIGINT, IN bound_ms BIGINT)
    SQL SECURITY DEFINER COMMENT 'leaderd fence 4'
BEGIN
    -- leaderd_fence(election, token, bound_ms) on MariaDB: see up.sql for
    -- what it does (MySQL 8's is procedure.sql). Static statements only,
    -- but for the XA probe: a statement prepared at run time costs tens of
    -- microseconds, and a fenced transaction pays for every one
    -- (BENCHMARKS.md, "Fenced writes"). It runs with its definer's rights
    -- inside the caller's transaction, so it leaves nothing behind when it
    -- refuses: every error it ends with rolls the transaction back, and the
    -- bound is set last, once nothing can fail.
    DECLARE fenced BIGINT DEFAULT NULL;
    DECLARE lease_ms BIGINT DEFAULT NULL;
    DECLARE impostor INT DEFAULT 0;
    DECLARE xa INT DEFAULT 0;
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
        RESIGNAL;
    END;
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
    -- lock would end with this CALL; with autocommit off the CALL itself
    -- begins a transaction) and a SERIALIZABLE session (its plain reads
    -- lock the lease row against every renewal). A level set for one
    -- transaction only (SET TRANSACTION) does not show here: README.
    IF NOT (@@in_transaction OR NOT @@autocommit) THEN
        SIGNAL SQLSTATE 'LF004'
            SET MESSAGE_TEXT = 'leaderd_fence: not in a transaction (autocommit): START TRANSACTION first, or the fence ends with this CALL';
    END IF;
    IF @@tx_isolation = 'SERIALIZABLE' THEN
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
    -- The lock every takeover's trigger needs, on the fence row as it is
    -- now (a locking read sees the latest version, whatever the snapshot):
    -- the token must still be the caller's. From here until the
    -- transaction ends no takeover can change it.
    SELECT f.token INTO fenced FROM service_leader_fence f WHERE f.name = election LOCK IN SHARE MODE;
    IF fenced IS NULL OR fenced <> fence_token THEN
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
    -- Then a plain read of the lease: held by this token and live by the
    -- server's clock now, and its ttl (the default bound). Under REPEATABLE
    -- READ it may show the row as the transaction's snapshot had it: a
    -- release or an expiry since then is not seen, but nobody can take the
    -- lease over before this transaction ends, so its writes still come
    -- before the next holder's. One read of each table: each costs about
    -- 20 us in a transaction of its own (BENCHMARKS.md).
    SELECT MAX(TIMESTAMPDIFF(MICROSECOND, COALESCE(l.renewed_at, l.acquired_at), l.expires_at) DIV 1000)
      INTO lease_ms
      FROM service_leader_lock l
     WHERE l.name = election AND l.token = fence_token AND l.instance IS NOT NULL
       AND l.expires_at > UTC_TIMESTAMP(6);
    IF lease_ms IS NULL THEN
        SIGNAL SQLSTATE 'LF001' SET MESSAGE_TEXT = message;
    END IF;
    SET bound_ms = COALESCE(bound_ms, lease_ms);
    IF bound_ms IS NULL OR bound_ms < 1 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'leaderd_fence: the bound must be a positive number of milliseconds';
    END IF;
    -- The bound, never above a shorter timeout the app set. MariaDB has no
    -- transaction-local setting: these stay on the session.
    SET SESSION
        idle_transaction_timeout = IF(@@idle_transaction_timeout > 0,
            LEAST(@@idle_transaction_timeout, CEIL(bound_ms / 1000)), CEIL(bound_ms / 1000)),
        max_statement_time = IF(@@max_statement_time > 0,
            LEAST(@@max_statement_time, bound_ms / 1000), bound_ms / 1000);
END;
