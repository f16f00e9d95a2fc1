-- Fenced writes (README, "Fenced writes"): called first in the app's own
-- transaction, leaderd_fence(election, token [, bound]) locks the election's
-- lease row FOR KEY SHARE, which every takeover needs (leaderd takes the row
-- FOR UPDATE) and no renewal does (FOR NO KEY UPDATE), then checks that
-- `token` is the live lease by the database's clock (clock_timestamp(): now()
-- is the transaction's start). Until the transaction ends no successor can
-- take the row, so a fenced write that commits was serialised before any
-- takeover. Otherwise it raises SQLSTATE LF001 naming the election and token
-- (the transaction is then aborted and its locks freed).
--
-- The bound (default: the lease's ttl as the row shows it, expires_at -
-- renewed_at) keeps a hung transaction from holding takeovers off: it is set
-- transaction-locally as idle_in_transaction_session_timeout (idle) and
-- statement_timeout (each later statement), and transaction_timeout on
-- PostgreSQL 17 and later. Past it the server ends the transaction and its
-- writes are lost, never late.
--
-- Call it at the top level of the transaction, in a statement of its own,
-- first: a savepoint rolled back after it (an ORM's nested block, psql's
-- ON_ERROR_ROLLBACK) gives its lock and bound back, and the statement that
-- calls it is not bounded (its timeout was set before it started).
--
-- SECURITY DEFINER: it runs with the migrating user's rights, so the app's
-- role needs no right on service_leader_lock, only EXECUTE, which is revoked
-- from PUBLIC here: grant it to the app's role. Its search_path is this
-- schema and then pg_temp, set below: with pg_temp left implicit it is
-- searched first, and a temporary table named service_leader_lock would pass
-- the fence (the two older SECURITY DEFINER functions get the same). A caller
-- with EXECUTE holds takeovers off only with the live token, and for the
-- bound only while it cooperates (its own SET LOCAL may lift the timeouts),
-- as with any lock the app takes. The error names no live token.
-- Idempotent; the comment is the version the migration checks.
CREATE OR REPLACE FUNCTION leaderd_fence(election VARCHAR, token BIGINT, bound INTERVAL DEFAULT NULL)
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    held BIGINT;
    expires TIMESTAMPTZ;
    lease INTERVAL;
    ms BIGINT;
BEGIN
    SELECT CASE WHEN l.instance IS NULL THEN NULL ELSE l.token END,
           l.expires_at, l.expires_at - COALESCE(l.renewed_at, l.acquired_at)
      INTO held, expires, lease
      FROM service_leader_lock l
     WHERE l.name = election
       FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'leaderd_fence: election "%" has no lease (token %)', election, token
            USING ERRCODE = 'LF001';
    END IF;
    IF held IS DISTINCT FROM token THEN
        RAISE EXCEPTION 'leaderd_fence: election "%": token % is not the live lease', election, token
            USING ERRCODE = 'LF001';
    END IF;
    IF expires <= clock_timestamp() THEN
        RAISE EXCEPTION 'leaderd_fence: election "%": the lease of token % has expired', election, token
            USING ERRCODE = 'LF001';
    END IF;
    ms := ceil(EXTRACT(EPOCH FROM COALESCE(bound, lease)) * 1000);
    IF ms IS NULL OR ms < 1 THEN
        RAISE EXCEPTION 'leaderd_fence: the bound must be a positive interval, not %', bound
            USING ERRCODE = '22023';
    END IF;
    -- Never above a shorter timeout the app set itself.
    -- (transaction_timeout exists from PostgreSQL 17 on; pg_settings gives
    -- each in milliseconds.)
    PERFORM set_config(s.name, LEAST(ms, NULLIF(s.setting::bigint, 0))::text, true)
       FROM pg_catalog.pg_settings s
      WHERE s.name IN ('idle_in_transaction_session_timeout', 'statement_timeout', 'transaction_timeout');
    RETURN held;
END $$;
REVOKE EXECUTE ON FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) FROM PUBLIC;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION service_leader_keep_token() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION service_leader_token_floor(VARCHAR) SET search_path = %I, pg_temp', current_schema());
END $$;
COMMENT ON FUNCTION leaderd_fence(VARCHAR, BIGINT, INTERVAL) IS 'leaderd fence 2';
