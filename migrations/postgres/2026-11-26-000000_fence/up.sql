-- Fenced writes: called first in the app's own transaction,
-- leaderd_fence(election, token [, bound]) holds every takeover of the
-- election off until that transaction ends, after checking that `token` is
-- the live lease by the database's clock (clock_timestamp(): now() is the
-- transaction's start). A fenced write that commits was therefore
-- serialised before any takeover. Otherwise it raises SQLSTATE LF001 naming
-- the election and token (the transaction is then aborted, and its lock
-- freed when it ends).
--
-- How it holds takeovers off, at the price of one round trip: it locks
-- the election's row of service_leader_fence_gate FOR KEY SHARE, so fenced
-- transactions never wait for each other; the trigger below locks the same
-- row FOR UPDATE in every takeover, never waiting (SKIP LOCKED), and a
-- takeover that cannot get it changes nothing (the daemon reads it as a
-- refusal and tries again). Renewals and releases take nothing. The gate
-- table is its own, apart from the lease rows that renewals update, and
-- only its owner may read or lock it: a role that may not call the fence
-- cannot hold a takeover off (version 5 used an advisory key, which any
-- role that may connect could take and keep). The trigger is the
-- database's, so a daemon of any version, and any other writer, is held
-- off the same way.
--
-- The row is read after the gate, in a statement of its own: under READ
-- COMMITTED that statement's snapshot shows every takeover that committed
-- before the gate was granted (a takeover frees the gate only once it is
-- visible). Under REPEATABLE READ and SERIALIZABLE the snapshot is the
-- transaction's and may predate the gate: a row version that a later one
-- superseded (xmax set) is then locked FOR KEY SHARE, which raises a
-- serialization failure (40001) when a takeover committed since the
-- snapshot; a version nobody superseded is the row as it is, and stays so.
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
    s pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
    trigger pg_catalog.text;
    grantee pg_catalog.text;
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'leaderd: no current schema to install into (search_path)';
    END IF;
    -- The gate: one row per election, made by the first takeover of a
    -- name (or by a fence that finds none), never deleted, read and locked
    -- by nobody but its owner (the functions below run with the owner's
    -- rights). Names compare byte by byte, whatever collation a caller's
    -- value carries. The row named '' (no election's) says which
    -- transactions were open at an upgrade from versions 4 and 5 (below).
    IF pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_fence_gate', s)) IS NULL THEN
        EXECUTE pg_catalog.format('CREATE TABLE %s.service_leader_fence_gate '
            '(name pg_catalog.text COLLATE "C" PRIMARY KEY, old_fences pg_catalog.text[], settled BOOLEAN)', s);
    END IF;
    -- One row while the server runs as it did at an upgrade's listing
    -- (below): an unlogged table, which crash recovery empties (a
    -- backend's crash reinitialises the server, keeps its start time, and
    -- hands session ids out again), while a clean restart changes the
    -- start. Only its owner may write it: no other role can make a crash
    -- look unseen.
    IF pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_fence_boot', s)) IS NULL THEN
        EXECUTE pg_catalog.format('CREATE UNLOGGED TABLE %s.service_leader_fence_boot '
            '(listed BOOLEAN NOT NULL)', s);
    END IF;
    -- Under REPEATABLE READ and SERIALIZABLE the fence's fallback (FOR KEY
    -- SHARE on a row version a later one superseded) raises 40001 only
    -- when the update that superseded it changed a key: a unique index over
    -- the token makes every takeover one, whatever statement made it
    -- (leaderd's own lock the row FOR UPDATE, which does the same; an
    -- UPDATE by hand or by another program need not). Renewals change no
    -- key, and stay HOT updates.
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                    WHERE i.indrelid OPERATOR(pg_catalog.=)
                          pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_lock', s))
                      AND i.indexrelid OPERATOR(pg_catalog.=)
                          pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_lock_name_token', s))
                      AND i.indisunique) THEN
        EXECUTE pg_catalog.format('CREATE UNIQUE INDEX service_leader_lock_name_token '
            'ON %s.service_leader_lock (name, token)', s);
    END IF;
    -- The advisory key's seed, which the fence and the trigger read.
    IF pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_fence_key', s)) IS NULL THEN
        EXECUTE pg_catalog.format('CREATE TABLE %s.service_leader_fence_key (seed BIGINT NOT NULL)', s);
        EXECUTE pg_catalog.format('INSERT INTO %s.service_leader_fence_key VALUES ((%L OPERATOR(pg_catalog.||) '
            'pg_catalog.substr(pg_catalog.md5(pg_catalog.random()::pg_catalog.text OPERATOR(pg_catalog.||) '
            'pg_catalog.clock_timestamp()::pg_catalog.text), 1, 16))::bit(64)::bigint)', s, 'x');
    END IF;
    -- Only the owner: PUBLIC's rights, and any a default privilege of the
    -- schema gave another role (a role that may lock or update these rows
    -- could hold takeovers off, or let one pass).
    FOREACH trigger IN ARRAY ARRAY['service_leader_fence_gate', 'service_leader_fence_key',
                                   'service_leader_fence_boot', 'service_leader_token'] LOOP
        IF pg_catalog.to_regclass(pg_catalog.format('%s.%s', s, trigger)) IS NOT NULL THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON %s.%s FROM PUBLIC', s, trigger);
            -- Table and column grants (a table's REVOKE takes both), and
            -- what their grantees granted on (CASCADE).
            FOR grantee IN
                SELECT DISTINCT pg_catalog.quote_ident(r.rolname)
                  FROM pg_catalog.pg_class c
                  JOIN LATERAL (SELECT t.acl FROM (VALUES (c.relacl)) t(acl)
                                UNION ALL
                                SELECT t.attacl FROM pg_catalog.pg_attribute t
                                 WHERE t.attrelid OPERATOR(pg_catalog.=) c.oid) g ON true
                  JOIN LATERAL pg_catalog.aclexplode(g.acl) a ON true
                  JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
                 WHERE c.oid OPERATOR(pg_catalog.=)
                       pg_catalog.to_regclass(pg_catalog.format('%s.%s', s, trigger))
                   AND a.grantee OPERATOR(pg_catalog.<>) c.relowner LOOP
                EXECUTE pg_catalog.format('REVOKE ALL ON %s.%s FROM %s CASCADE', s, trigger, grantee);
            END LOOP;
        END IF;
    END LOOP;
    -- The transactions open now, other than the caller's: live sessions'
    -- ('v:', the virtual transaction id, '@' and the pid: ids start over
    -- when the server restarts after a backend's crash; of every database, since
    -- which database a session is in is read from statistics that a
    -- transaction keeps as they were when it first read them) and this
    -- database's prepared ones ('p:' and the transaction id; they hold no
    -- virtual one).
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_open_transactions() RETURNS pg_catalog.text[]
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
SELECT ARRAY(SELECT 'v:' || k.virtualxid || '@' || k.pid FROM pg_locks k
              WHERE k.locktype = 'virtualxid' AND k.pid <> pg_backend_pid()
             UNION ALL
             SELECT 'p:' || p.transaction::pg_catalog.text FROM pg_prepared_xacts p
              WHERE p.database = current_database())
$fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_open_transactions() FROM PUBLIC', s);
    -- Whether the session of virtual transaction `vxid`, holding the old
    -- key in a transaction open at an upgrade from version 5, may be
    -- holding a fence of that version (see the trigger). That fence made
    -- the table pg_temp.leaderd_fenced in its caller's session (unless one
    -- of that name was there: any owner's counts): the session counts
    -- when it has that table, or when its open transaction
    -- made a relation nobody else can see yet (a lock on one that is not
    -- in pg_class: the table of the session's first fence, perhaps),
    -- whatever its role (a role may reach a fence in more ways than can
    -- be told: SET ROLE, functions and triggers of other roles, grants
    -- changed since).
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_fenced_session(vxid pg_catalog.text) RETURNS BOOLEAN
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE c.relname = 'leaderd_fenced' AND c.relpersistence = 't'
                  AND n.nspname = 'pg_temp_' || split_part(vxid, '/', 1))
    OR EXISTS (SELECT 1 FROM pg_locks l
                WHERE l.virtualtransaction = vxid AND l.locktype = 'relation'
                  AND l.mode = 'AccessExclusiveLock' AND l.granted
                  AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = l.relation))
$fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_fenced_session(pg_catalog.text) FROM PUBLIC', s);
    -- Every takeover (the token changes, or a process takes a row), every
    -- row made already held, and every rename locks the election's gate
    -- FOR UPDATE (a rename: both names'), never waiting, or is skipped:
    -- RETURN NULL leaves the row as it was, and the statement goes on with
    -- the other rows it writes. A name without a gate row gets one, held
    -- by the takeover's transaction until it ends; another transaction
    -- making the same one is not waited for (a refusal).
    --
    -- A skipped takeover is told who holds the gate in a notice (SQLSTATE
    -- LF012): the session's pid and role, or the prepared transaction's
    -- name, found from the transaction that locked the row (or, several
    -- fenced transactions at once, one of its multixact's). leaderd logs
    -- it once the takeover has been held off for longer than a lease (a
    -- fenced transaction that lifted its own timeouts, or a prepared one
    -- where the owner may not make the temporary table that refuses
    -- PREPARE). Naming never fails the takeover's statement.
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_take_key(election VARCHAR, seed BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    gated BOOLEAN;
    old_fences pg_catalog.text[];
    settled BOOLEAN;
    marker BOOLEAN;
    relisted pg_catalog.text[];
    fencer OID;
    tempered BOOLEAN;
    same_start BOOLEAN;
    key BIGINT;
    locker xid;
    lockers xid[];
    holder pg_catalog.text;
    quiet pg_catalog.text;
BEGIN
    PERFORM 1 FROM {schema}.service_leader_fence_gate g
     WHERE g.name = (election COLLATE "C") FOR UPDATE SKIP LOCKED;
    gated := FOUND;
    IF NOT gated THEN
        quiet := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '1ms', true);
            INSERT INTO {schema}.service_leader_fence_gate AS g (name) VALUES (election)
                ON CONFLICT DO NOTHING;
            gated := FOUND;
        EXCEPTION WHEN lock_not_available THEN
            gated := false;
        END;
        PERFORM set_config('lock_timeout', quiet, true);
    END IF;
    -- After an upgrade from an advisory fence, while a transaction open
    -- then lives: its key too, as that fence held it. The list the
    -- installation read may miss an old fence called after it was read,
    -- before its commit was seen: `leaderd migrate` lists what is open
    -- once it has committed (settled), and the first takeover does if
    -- that did not happen. Until then, and where the row '' is not seen
    -- (a snapshot older than the upgrade), any holder of the key holds
    -- the takeover off. After, a transaction of the list holds it off when
    -- it holds the key and:
    -- - where version 5's fence could make temporary tables (tagged
    --   'temp' in the list at the upgrade, and still so), it is a
    --   session that may hold such a fence (service_leader_fenced_session:
    --   that fence's table in its session, or a relation made in its open
    --   transaction), so a session that kept a transaction open across
    --   the upgrade and took the key, having made nothing, holds nothing
    --   off; no prepared transaction counts (that fence's table makes
    --   PREPARE fail);
    -- - where it could not (or from version 4), it is any session of the
    --   list, or a prepared transaction that was one (its locks keep the
    --   session's virtual transaction id) or was listed prepared, or one
    --   that cannot be told (PostgreSQL versions whose prepared
    --   transactions' locks show none).
    -- A session of the list is told by its virtual transaction id and
    -- its pid, and only while the server runs as it did at the listing
    -- (after a restart, or a reinitialisation after a backend's crash,
    -- ids are handed out again). A prepared transaction outlives
    -- a restart, its locks then showing no session ('-1/'): where the old
    -- fence's could be prepared, every such one counts and keeps the
    -- window open. The window ends when nothing of the list is left. A fence called after a takeover passed a holder refuses the
    -- lease it takes, free or expired by clock_timestamp().
    SELECT g.old_fences, g.settled INTO old_fences, settled
      FROM {schema}.service_leader_fence_gate g WHERE g.name = '';
    marker := FOUND;
    IF gated AND marker AND old_fences IS NOT NULL AND NOT settled THEN
        UPDATE {schema}.service_leader_fence_gate g
           SET old_fences = g.old_fences || {schema}.service_leader_open_transactions(), settled = true
         WHERE g.name IN (SELECT o.name FROM {schema}.service_leader_fence_gate o
                           WHERE o.name = '' AND NOT o.settled FOR UPDATE SKIP LOCKED)
        RETURNING g.old_fences INTO relisted;
        IF FOUND THEN
            old_fences := relisted;
            settled := true;
        END IF;
    END IF;
    IF gated AND (NOT marker OR old_fences IS NOT NULL) THEN
        key := hashtextextended(election COLLATE "C", seed);
        fencer := (SELECT f.proowner FROM pg_proc f
                    WHERE f.oid = to_regprocedure('{schema}.leaderd_fence(varchar, bigint, interval)'));
        tempered := marker AND 'temp' = ANY (old_fences) AND fencer IS NOT NULL
                    AND has_database_privilege(fencer, current_database(), 'TEMPORARY');
        -- The server as it ran at the listing: the same start, and no
        -- crash since (the unlogged row the listing wrote is still there).
        same_start := 's:' || ((date_part('epoch', pg_postmaster_start_time()) * 1000000)::bigint)::pg_catalog.text
                      = ANY (old_fences)
                      AND EXISTS (SELECT 1 FROM {schema}.service_leader_fence_boot);
        IF NOT marker OR NOT settled
           OR (same_start AND EXISTS (
                   SELECT 1 FROM pg_locks k
                    WHERE (k.pid IS NOT NULL
                           AND 'v:' || k.virtualtransaction || '@' || k.pid = ANY (old_fences))
                       OR (k.pid IS NULL AND NOT tempered
                           AND EXISTS (SELECT 1 FROM unnest(old_fences) e
                                        WHERE e LIKE 'v:' || k.virtualtransaction || '@%'))))
           OR EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE 'p:' || p.transaction::pg_catalog.text = ANY (old_fences))
           OR (NOT tempered AND EXISTS (SELECT 1 FROM pg_locks k
                                         WHERE k.pid IS NULL AND k.virtualtransaction LIKE '-1/%')) THEN
            IF NOT pg_try_advisory_xact_lock(key) THEN
                -- Who is in which session now, not as this transaction
                -- first read it.
                PERFORM pg_stat_clear_snapshot();
                SELECT CASE WHEN k.pid IS NULL THEN
                           format('prepared transaction %L (owner %s)',
                                  COALESCE(p.gid, 'unknown'), COALESCE(p.owner::pg_catalog.text, 'unknown'))
                       ELSE format('pid %s (role %s)', k.pid,
                                   COALESCE((SELECT r.rolname::pg_catalog.text
                                               FROM pg_stat_get_activity(k.pid) a
                                               JOIN pg_roles r ON r.oid = a.usesysid
                                              LIMIT 1), 'unknown')) END
                  INTO holder
                  FROM pg_locks k
                  LEFT JOIN LATERAL (SELECT t.transactionid FROM pg_locks t
                                      WHERE k.pid IS NULL AND t.locktype = 'transactionid'
                                        AND t.virtualtransaction = k.virtualtransaction
                                      LIMIT 1) x ON true
                  LEFT JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
                 WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
                   AND k.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
                   AND k.classid = ((key >> 32) & 4294967295)::pg_catalog.oid
                   AND k.objid = (key & 4294967295)::pg_catalog.oid
                   AND (NOT marker OR NOT settled
                        OR (k.pid IS NOT NULL AND same_start
                            AND 'v:' || k.virtualtransaction || '@' || k.pid = ANY (old_fences)
                            AND (NOT tempered
                                 OR {schema}.service_leader_fenced_session(k.virtualtransaction)))
                        OR (k.pid IS NULL AND NOT tempered
                            AND ((same_start AND EXISTS (SELECT 1 FROM unnest(old_fences) e
                                                          WHERE e LIKE 'v:' || k.virtualtransaction || '@%'))
                                 OR 'p:' || x.transactionid::pg_catalog.text = ANY (old_fences)
                                 OR k.virtualtransaction LIKE '-1/%')))
                 LIMIT 1;
                -- Held by a transaction of the list that may hold an old
                -- fence (or, until the list is settled, by anyone).
                IF FOUND OR NOT marker OR NOT settled THEN
                    RAISE NOTICE USING MESSAGE = format('leaderd: takeover of election "%s" held off by %s',
                        election, COALESCE(holder || ', listed at the upgrade from the advisory fence',
                                           'a transaction listed at the upgrade from the advisory fence')),
                        ERRCODE = 'LF012';
                    RETURN false;
                END IF;
            END IF;
        ELSE
            -- None left (or the server restarted): the window ends
            -- (whoever holds the row now ends it instead).
            UPDATE {schema}.service_leader_fence_gate g SET old_fences = NULL
             WHERE g.name IN (SELECT o.name FROM {schema}.service_leader_fence_gate o
                               WHERE o.name = '' FOR UPDATE SKIP LOCKED);
        END IF;
    END IF;
    IF gated THEN
        RETURN true;
    END IF;
    BEGIN
        SELECT g.xmax INTO locker FROM {schema}.service_leader_fence_gate g
         WHERE g.name = (election COLLATE "C");
        lockers := ARRAY[locker];
        -- Not a live transaction: several fenced transactions' multixact.
        IF NOT EXISTS (SELECT 1 FROM pg_locks k
                        WHERE k.locktype = 'transactionid' AND k.transactionid = locker) THEN
            BEGIN
                lockers := ARRAY(SELECT m.xid FROM pg_get_multixact_members(locker) m);
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END IF;
        SELECT CASE WHEN k.pid IS NOT NULL THEN
                   format('pid %s (role %s)', k.pid,
                          COALESCE((SELECT r.rolname::pg_catalog.text
                                      FROM pg_stat_get_activity(k.pid) a
                                      JOIN pg_roles r ON r.oid = a.usesysid
                                     LIMIT 1), 'unknown'))
               ELSE format('prepared transaction %L (owner %s)',
                           COALESCE(p.gid, 'unknown'), COALESCE(p.owner::pg_catalog.text, 'unknown')) END
          INTO holder
          FROM pg_locks k
          LEFT JOIN pg_prepared_xacts p ON k.pid IS NULL AND p.transaction = k.transactionid
         WHERE k.locktype = 'transactionid' AND k.mode = 'ExclusiveLock' AND k.granted
           AND k.transactionid = ANY (lockers)
         LIMIT 1;
    EXCEPTION WHEN OTHERS THEN
        NULL;
    END;
    RAISE NOTICE USING MESSAGE = format('leaderd: takeover of election "%s" held off by %s',
        election, COALESCE(holder, 'a transaction that has just ended')), ERRCODE = 'LF012';
    RETURN false;
END $fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_take_key(VARCHAR, BIGINT) FROM PUBLIC', s);
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_take() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    seed BIGINT := (SELECT min(k.seed) FROM {schema}.service_leader_fence_key k);
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.name IS DISTINCT FROM NEW.name
       AND NOT {schema}.service_leader_take_key(OLD.name, seed) THEN
        RETURN NULL;
    END IF;
    IF {schema}.service_leader_take_key(NEW.name, seed) THEN
        RETURN NEW;
    END IF;
    RETURN NULL;
END $fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_take() FROM PUBLIC', s);
    -- The WHEN clauses spare renewals and releases the call. Made only when
    -- missing (see 2026-11-24). The migration's check counts both; a lock
    -- table made again has neither, and the steps then drop the fence
    -- (2026-11-24) until this file installs it with them. Disabling them
    -- (ALTER TABLE ... DISABLE TRIGGER, which only the table's owner may)
    -- voids the fence.
    FOREACH trigger IN ARRAY ARRAY[
        'service_leader_take BEFORE UPDATE|NOT (OLD.token OPERATOR(pg_catalog.=) NEW.token) '
            'OR NOT (OLD.name OPERATOR(pg_catalog.=) NEW.name) '
            'OR (NEW.instance IS NOT NULL AND (OLD.instance IS NULL '
            'OR OLD.instance OPERATOR(pg_catalog.<>) NEW.instance))',
        'service_leader_take_new BEFORE INSERT|NEW.instance IS NOT NULL'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                        WHERE t.tgname OPERATOR(pg_catalog.=) pg_catalog.split_part(trigger, ' ', 1)
                          AND t.tgrelid OPERATOR(pg_catalog.=)
                              pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_lock', s))) THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER %2$s ON %1$s.service_leader_lock '
                'FOR EACH ROW WHEN (%3$s) EXECUTE FUNCTION %1$s.service_leader_take()',
                s, pg_catalog.split_part(trigger, '|', 1), pg_catalog.split_part(trigger, '|', 2));
        END IF;
    END LOOP;
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.leaderd_fence(election VARCHAR, token BIGINT, bound INTERVAL DEFAULT NULL)
RETURNS BIGINT
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    held BIGINT;
    expires pg_catalog.timestamptz;
    lease INTERVAL;
    superseded BOOLEAN;
    seed BIGINT;
    triggers BIGINT;
    ms BIGINT;
    quiet pg_catalog.text;
BEGIN
    -- One SELECT calling it, alone in a query of its own (comments before
    -- it allowed) that began the transaction: autocommit. (A query that
    -- holds more statements, or one sent with the extended protocol,
    -- whose statement time is its Execute's, cannot be told: README.)
    IF statement_timestamp() = transaction_timestamp()
       AND current_query() ~* '^\s*((/\*([^*]|\*+[^*/])*\*+/|--[^\n]*(\n|$))\s*)*select\s[^;]*leaderd_fence\s*\([^;]*;?\s*$' THEN
        RAISE EXCEPTION 'leaderd_fence: not in a transaction block (autocommit): its lock would end with this statement; BEGIN first'
            USING ERRCODE = 'LF004';
    END IF;
    -- A read-only transaction writes nothing that could land late, and on
    -- a standby the row may lag: refused, as a row lock would be.
    IF current_setting('transaction_read_only') = 'on' THEN
        RAISE EXCEPTION 'leaderd_fence: a read-only transaction (or a standby) cannot be fenced'
            USING ERRCODE = '25006';
    END IF;
    -- The takeover triggers, the table of the key an upgrade's window
    -- needs, and the index that makes a takeover a key update: without
    -- them (a table made again by hand, a trigger disabled, the index
    -- dropped) the gate below would hold nothing off, or the fallback
    -- under REPEATABLE READ would pass a superseded lease.
    SELECT min(k.seed), (SELECT count(*) FROM pg_trigger t
                          WHERE t.tgrelid = '{schema}.service_leader_lock'::regclass
                            AND t.tgname IN ('service_leader_take', 'service_leader_take_new')
                            AND t.tgenabled <> 'D')
                        + (SELECT count(*) FROM pg_index i
                            WHERE i.indrelid = '{schema}.service_leader_lock'::regclass
                              AND i.indexrelid = to_regclass('{schema}.service_leader_lock_name_token')
                              AND i.indisunique)
      INTO seed, triggers
      FROM {schema}.service_leader_fence_key k;
    IF triggers IS DISTINCT FROM 3 OR seed IS NULL THEN
        RAISE EXCEPTION 'leaderd_fence: not installed (the takeover triggers on service_leader_lock are missing or disabled, or its index service_leader_lock_name_token is missing): run leaderd migrate'
            USING ERRCODE = 'LF007';
    END IF;
    -- The bound, from the lease as the row shows it when none is given.
    IF bound IS NULL THEN
        SELECT l.expires_at - COALESCE(l.renewed_at, l.acquired_at) INTO lease
          FROM {schema}.service_leader_lock l
         WHERE l.name = (election COLLATE "default");
    END IF;
    ms := ceil(EXTRACT(EPOCH FROM COALESCE(bound, lease, interval '1 second')) * 1000);
    -- A bound the server's timeouts can hold (their limit: 2^31 - 1 ms).
    IF ms IS NULL OR ms < 1 OR ms > 2147483647 THEN
        RAISE EXCEPTION 'leaderd_fence: the bound must be a positive interval of at most 24 days, not %', bound
            USING ERRCODE = '22023';
    END IF;
    -- A fenced transaction cannot be prepared (two-phase): a prepared one
    -- would keep the gate, and every takeover off, until someone resolved
    -- it, past any bound. PREPARE TRANSACTION refuses a transaction that
    -- used a temporary object ("cannot PREPARE a transaction that has
    -- operated on temporary objects"); this makes one, once a session,
    -- and names it again at each call (the notice that it exists is not
    -- sent). Where the owner may not make temporary tables, nothing is
    -- made (docs/security.md says what a prepared transaction does then).
    IF has_database_privilege(current_database(), 'TEMPORARY') THEN
        quiet := current_setting('client_min_messages');
        PERFORM set_config('client_min_messages', 'warning', true);
        CREATE TEMPORARY TABLE IF NOT EXISTS leaderd_fenced ();
        PERFORM set_config('client_min_messages', quiet, true);
    END IF;
    -- Under READ COMMITTED this read is current: a token that is not the
    -- live lease is refused before the gate is taken, so that a caller
    -- with a wrong token holds no takeover off, even for a moment. (Under
    -- REPEATABLE READ the snapshot may be older than the caller's token.)
    IF current_setting('transaction_isolation') = 'read committed'
       AND NOT EXISTS (SELECT 1 FROM {schema}.service_leader_lock l
                        WHERE l.name = (election COLLATE "default") AND l.instance IS NOT NULL
                          AND l.token = leaderd_fence.token AND l.expires_at > clock_timestamp()) THEN
        RAISE EXCEPTION 'leaderd_fence: election "%": token % is not the live lease', election, token
            USING ERRCODE = 'LF001';
    END IF;
    -- The election's gate, shared. A takeover holding it now is waited
    -- for, for the bound at most (LF011); so is one making the gate row of
    -- a name that has none yet. Only the owner's functions lock it.
    PERFORM 1 FROM {schema}.service_leader_fence_gate g
     WHERE g.name = (election COLLATE "C") FOR KEY SHARE SKIP LOCKED;
    IF NOT FOUND THEN
        quiet := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', ms::pg_catalog.text, true);
        BEGIN
            INSERT INTO {schema}.service_leader_fence_gate AS g (name) VALUES (election)
                ON CONFLICT DO NOTHING;
            PERFORM 1 FROM {schema}.service_leader_fence_gate g
             WHERE g.name = (election COLLATE "C") FOR KEY SHARE;
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'leaderd_fence: election "%": a takeover held the election for longer than the bound (% ms)', election, ms
                USING ERRCODE = 'LF011';
        END;
        PERFORM set_config('lock_timeout', quiet, true);
    END IF;
    -- One read, a statement of its own: under READ COMMITTED its snapshot
    -- is taken after the lock.
    SELECT CASE WHEN l.instance IS NULL THEN NULL ELSE l.token END,
           l.expires_at, l.xmax <> '0'::xid
      INTO held, expires, superseded
      FROM {schema}.service_leader_lock l
     WHERE l.name = (election COLLATE "default");
    IF superseded AND current_setting('transaction_isolation') <> 'read committed' THEN
        SELECT CASE WHEN l.instance IS NULL THEN NULL ELSE l.token END, l.expires_at
          INTO held, expires
          FROM {schema}.service_leader_lock l
         WHERE l.name = (election COLLATE "default")
           FOR KEY SHARE;
    END IF;
    -- One message for a wrong token and an expired one: the error tells a
    -- caller nothing about the live token.
    IF NOT FOUND OR held IS DISTINCT FROM token OR expires <= clock_timestamp() THEN
        RAISE EXCEPTION 'leaderd_fence: election "%": token % is not the live lease', election, token
            USING ERRCODE = 'LF001';
    END IF;
    -- Never above a shorter timeout the app set itself. current_setting(),
    -- not the pg_settings view (which builds a row for every setting: 0.4 ms
    -- a call); transaction_timeout exists from PostgreSQL 17 on.
    PERFORM set_config('idle_in_transaction_session_timeout', LEAST(ms, NULLIF(ceil(EXTRACT(EPOCH FROM
                current_setting('idle_in_transaction_session_timeout')::interval) * 1000)::bigint, 0))::pg_catalog.text, true),
            set_config('statement_timeout', LEAST(ms, NULLIF(ceil(EXTRACT(EPOCH FROM
                current_setting('statement_timeout')::interval) * 1000)::bigint, 0))::pg_catalog.text, true);
    IF current_setting('transaction_timeout', true) IS NOT NULL THEN
        PERFORM set_config('transaction_timeout', LEAST(ms, NULLIF(ceil(EXTRACT(EPOCH FROM
                current_setting('transaction_timeout')::interval) * 1000)::bigint, 0))::pg_catalog.text, true);
    END IF;
    RETURN held;
END $fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.leaderd_fence(VARCHAR, BIGINT, INTERVAL) FROM PUBLIC', s);
    -- Versions 4 and 5 of the fence held the election's advisory key
    -- instead (hashed with service_leader_fence_key's seed). A transaction
    -- fenced by one of them may be open while this runs, and stay open for
    -- as long as its bound (or longer, its timeouts lifted): while any
    -- transaction of this database that is open at the upgrade lives, a
    -- takeover also needs that key, when one of them holds it (see the
    -- trigger, which lists them again after this commits). Nothing here
    -- waits for them. The row '' is written at every installation: a
    -- takeover that cannot see it has a snapshot older than this one.
    IF (SELECT pg_catalog.obj_description(p.oid, 'pg_proc') FROM pg_catalog.pg_proc p
         WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(pg_catalog.format(
               '%s.leaderd_fence(varchar, bigint, interval)', s)))
       OPERATOR(pg_catalog.=) ANY (ARRAY['leaderd fence 4', 'leaderd fence 5']) THEN
        -- Tagged 'temp' when version 5's fence could make its table in
        -- the caller's session, and 's:' with the server's start; the
        -- unlogged row says no crash came since (see the trigger). `leaderd
        -- migrate` lists the open transactions again once this has
        -- committed (settled).
        EXECUTE pg_catalog.format('DELETE FROM %s.service_leader_fence_boot', s);
        EXECUTE pg_catalog.format('INSERT INTO %s.service_leader_fence_boot VALUES (true)', s);
        EXECUTE pg_catalog.format('INSERT INTO %1$s.service_leader_fence_gate AS g (name, old_fences, settled) '
            'VALUES ($1, $2 OPERATOR(pg_catalog.||) $3 OPERATOR(pg_catalog.||) '
            '%1$s.service_leader_open_transactions(), false) '
            'ON CONFLICT (name) DO UPDATE SET old_fences = EXCLUDED.old_fences, settled = false', s)
            USING '', CASE WHEN (SELECT pg_catalog.obj_description(p.oid, 'pg_proc') OPERATOR(pg_catalog.=) 'leaderd fence 5'
                                        AND pg_catalog.has_database_privilege(p.proowner,
                                                pg_catalog.current_database(), 'TEMPORARY')
                                   FROM pg_catalog.pg_proc p
                                  WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(pg_catalog.format(
                                        '%s.leaderd_fence(varchar, bigint, interval)', s)))
                           THEN ARRAY['temp'] ELSE ARRAY[]::pg_catalog.text[] END,
                      ARRAY['s:' OPERATOR(pg_catalog.||) ((pg_catalog.date_part('epoch', pg_catalog.pg_postmaster_start_time())
                                                            OPERATOR(pg_catalog.*) 1000000)::bigint)::pg_catalog.text];
    ELSE
        EXECUTE pg_catalog.format('INSERT INTO %s.service_leader_fence_gate AS g (name, settled) '
            'VALUES ($1, true) ON CONFLICT (name) DO NOTHING', s) USING '';
    END IF;
    EXECUTE pg_catalog.format('COMMENT ON FUNCTION %s.leaderd_fence(VARCHAR, BIGINT, INTERVAL) IS %L', s, 'leaderd fence 6');
END $migrate$;
