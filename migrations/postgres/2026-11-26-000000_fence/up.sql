-- Fenced writes: called first in the app's own transaction,
-- leaderd_fence(election, token [, bound]) locks the election's lease row
-- FOR KEY SHARE, which every takeover needs (leaderd takes the row FOR
-- UPDATE) and no renewal does (FOR NO KEY UPDATE), then checks that `token`
-- is the live lease by the database's clock (clock_timestamp(): now() is
-- the transaction's start). Until the transaction ends no successor can
-- take the row, so a fenced write that commits was serialised before any
-- takeover. Otherwise it raises SQLSTATE LF001 naming the election and
-- token (the transaction is then aborted and its locks freed).
--
-- The bound (default: the lease's ttl as the row shows it, expires_at -
-- renewed_at) keeps a hung transaction from holding takeovers off: it is set
-- transaction-locally as idle_in_transaction_session_timeout (idle) and
-- statement_timeout (each later statement), and transaction_timeout on
-- PostgreSQL 17 and later, never above a shorter one the app set. Past it
-- the server ends the transaction and its writes are lost, never late.
--
-- Called outside a transaction block (autocommit) its lock would end with
-- its own statement and protect nothing. PostgreSQL does not tell a
-- function whether it runs in a transaction block; the one case it can
-- tell for sure is refused (LF004): the call alone in a simple-protocol
-- query that began its transaction (psql's `-c "SELECT leaderd_fence(…)"`,
-- a script without BEGIN, a driver in autocommit that sends queries as
-- text). Through the extended protocol in autocommit it cannot be told:
-- the README says so beside every example.
-- Call it at the top level of the transaction, in a statement of its own,
-- first: a savepoint rolled back after it (an ORM's nested block, psql's
-- ON_ERROR_ROLLBACK) gives its lock and bound back, and the statement that
-- calls it is not bounded (its timeout was set before it started).
--
-- SECURITY DEFINER: it runs with the migrating user's rights, so the app's
-- role needs no right on service_leader_lock, only EXECUTE, which nobody
-- has until it is granted (PUBLIC's is revoked): grant it to the app's
-- role. As the trigger functions (2026-11-24), it finds nothing through a
-- schema another role may create in: search_path is pg_catalog, then
-- pg_temp, and the table is named with its schema. A caller with EXECUTE
-- holds takeovers off only with the live token, and for the bound only
-- while it cooperates (its own SET LOCAL may lift the timeouts), as with
-- any lock the app takes. The error names no live token.
-- Idempotent; the comment is the version the migration checks.
DO $migrate$
DECLARE
    s TEXT := pg_catalog.quote_ident(pg_catalog.current_schema());
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'leaderd: no current schema to install into (search_path)';
    END IF;
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.leaderd_fence(election VARCHAR, token BIGINT, bound INTERVAL DEFAULT NULL)
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    held BIGINT;
    expires TIMESTAMPTZ;
    lease INTERVAL;
    ms BIGINT;
    setting TEXT;
    current_ms BIGINT;
BEGIN
    -- Alone in a query of its own that began the transaction: autocommit.
    -- (A query that holds more, or one sent with the extended protocol,
    -- whose statement time is its Execute's, cannot be told: README.)
    IF statement_timestamp() = transaction_timestamp()
       AND current_query() ~* '^\s*select\s+(\*\s+from\s+)?([a-z0-9_"]+\.)?leaderd_fence\s*\([^;]*\)\s*;?\s*$' THEN
        RAISE EXCEPTION 'leaderd_fence: not in a transaction block (autocommit): its lock would end with this statement; BEGIN first'
            USING ERRCODE = 'LF004';
    END IF;
    SELECT CASE WHEN l.instance IS NULL THEN NULL ELSE l.token END,
           l.expires_at, l.expires_at - COALESCE(l.renewed_at, l.acquired_at)
      INTO held, expires, lease
      FROM {schema}.service_leader_lock l
     WHERE l.name = election
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'leaderd_fence: election "%" has no lease (token %)', election, token
            USING ERRCODE = 'LF001';
    END IF;
    -- One message for a wrong token and an expired one: the error tells a
    -- caller nothing about the live token.
    IF held IS DISTINCT FROM token OR expires <= clock_timestamp() THEN
        RAISE EXCEPTION 'leaderd_fence: election "%": token % is not the live lease', election, token
            USING ERRCODE = 'LF001';
    END IF;
    ms := ceil(EXTRACT(EPOCH FROM COALESCE(bound, lease)) * 1000);
    IF ms IS NULL OR ms < 1 THEN
        RAISE EXCEPTION 'leaderd_fence: the bound must be a positive interval, not %', bound
            USING ERRCODE = '22023';
    END IF;
    -- Never above a shorter timeout the app set itself. current_setting(),
    -- not the pg_settings view (which builds a row for every setting: 0.4 ms
    -- a call); transaction_timeout exists from PostgreSQL 17 on.
    FOREACH setting IN ARRAY ARRAY['idle_in_transaction_session_timeout', 'statement_timeout', 'transaction_timeout'] LOOP
        current_ms := ceil(EXTRACT(EPOCH FROM current_setting(setting, true)::interval) * 1000);
        IF current_ms IS NOT NULL THEN
            PERFORM set_config(setting, LEAST(ms, NULLIF(current_ms, 0))::text, true);
        END IF;
    END LOOP;
    RETURN held;
END $fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.leaderd_fence(VARCHAR, BIGINT, INTERVAL) FROM PUBLIC', s);
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s.leaderd_fence(VARCHAR, BIGINT, INTERVAL) IS %L', s, 'leaderd fence 3');
END $migrate$;
