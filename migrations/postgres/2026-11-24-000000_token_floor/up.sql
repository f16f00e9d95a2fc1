-- The highest token each election's deleted lease row carried. A row made
-- again starts above it, so tokens never go back even when the clock that
-- seeds a new row has stepped back. Idempotent: the fence's installation
-- (2026-11-26) runs this file again, so that an upgrade replaces the
-- functions of older versions.
CREATE TABLE IF NOT EXISTS service_leader_token (
    name  VARCHAR(100) PRIMARY KEY,
    token BIGINT       NOT NULL
);
-- Two triggers keep and apply that floor. Their functions run with their
-- owner's rights (the migrating user's), so that the daemon's role needs
-- rights on service_leader_lock alone. Code that runs with an owner's
-- rights in someone else's database finds nothing through a schema another
-- role may create in: search_path is pg_catalog, then pg_temp (named last,
-- so that a temporary object shadows nothing), and every table is named
-- with its schema, this migration's, written into the text when it runs
-- ({schema} below). An operator or function that the app's role plants in
-- its own schema is then never seen. Nobody but the owner may call them
-- (a trigger's function is not checked for EXECUTE when the trigger fires).
DO $migrate$
DECLARE
    s pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
    trigger pg_catalog.text;
BEGIN
    IF s IS NULL THEN
        RAISE EXCEPTION 'leaderd: no current schema to install into (search_path)';
    END IF;
    -- The name is written into dollar-quoted function bodies (here and in
    -- the fence's file, which runs after this one).
    IF pg_catalog.strpos(s, '$') OPERATOR(pg_catalog.>) 0 THEN
        RAISE EXCEPTION 'leaderd: the schema''s name % holds a $: choose another', s;
    END IF;
    -- Naming tables with their schema helps only while nobody else can
    -- replace them: the schema's owner may drop and re-create anything in
    -- it, and the owner of a table may add a policy or a trigger that runs
    -- inside these functions. So the schema must be this user's (or a
    -- superuser's, or the database's when this user owns the database), and
    -- leaderd's tables plain tables of this user's (or a superuser's),
    -- without row security: else nothing is installed, and leaderd (SQLSTATE
    -- LF010) uses the database no further.
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_namespace n
          JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) n.nspowner
         WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
           AND (o.rolname OPERATOR(pg_catalog.=) CURRENT_USER OR o.rolsuper
                OR (o.rolname OPERATOR(pg_catalog.=) 'pg_database_owner'
                    AND EXISTS (SELECT 1 FROM pg_catalog.pg_database d
                                  JOIN pg_catalog.pg_roles dr ON dr.oid OPERATOR(pg_catalog.=) d.datdba
                                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
                                   AND (dr.rolname OPERATOR(pg_catalog.=) CURRENT_USER OR dr.rolsuper))))) THEN
        RAISE EXCEPTION USING ERRCODE = 'LF010', MESSAGE = pg_catalog.format(
            'leaderd: schema %s is not owned by %s, and its owner could replace leaderd''s tables '
            'and so run code with %s''s rights: install leaderd in a schema %s owns (docs/security.md)',
            s, CURRENT_USER, CURRENT_USER, CURRENT_USER);
    END IF;
    IF EXISTS (
        SELECT 1 FROM pg_catalog.pg_class c
          JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) c.relowner
         WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(s)
           AND c.relname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_lock', 'service_leader_token',
                                                          'service_leader_fence_key',
                                                          'service_leader_fence_gate',
                                                          'service_leader_fence_boot',
                                                          'service_leader_history']::pg_catalog.name[])
           AND (c.relkind OPERATOR(pg_catalog.<>) 'r' OR c.relrowsecurity
                OR NOT (o.rolname OPERATOR(pg_catalog.=) CURRENT_USER OR o.rolsuper)
                -- A column of a type made outside pg_catalog (a domain whose
                -- check runs as whoever writes the row, found through a
                -- search_path when the table was made).
                OR EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a
                             JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
                            WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid
                              AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
                              AND t.typnamespace OPERATOR(pg_catalog.<>)
                                  pg_catalog.to_regnamespace('pg_catalog')))) THEN
        RAISE EXCEPTION USING ERRCODE = 'LF010', MESSAGE = pg_catalog.format(
            'leaderd: %s.service_leader_lock, service_leader_token, service_leader_fence_key, '
            'service_leader_fence_gate, service_leader_fence_boot or service_leader_history is not '
            'a plain table of %s''s '
            '(another role made it, or it is a view, or has row security, or a column of a type '
            'made outside pg_catalog): its owner could run code with %s''s rights; nothing '
            'installed (docs/security.md)', s, CURRENT_USER, CURRENT_USER);
    END IF;
    -- Nor another role's relation where the fence's index goes (the
    -- index would not be made, and the fence not installed).
    IF EXISTS (
        SELECT 1 FROM pg_catalog.pg_class c
         WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(s)
           AND c.relname OPERATOR(pg_catalog.=) 'service_leader_lock_name_token'
           AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index i
                            WHERE i.indexrelid OPERATOR(pg_catalog.=) c.oid
                              AND i.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(
                                  pg_catalog.format('%s.service_leader_lock', s)))) THEN
        RAISE EXCEPTION USING ERRCODE = 'LF010', MESSAGE = pg_catalog.format(
            'leaderd: %s.service_leader_lock_name_token is not an index of the lock table (another '
            'role made it, where leaderd''s index goes); nothing installed (docs/security.md)', s);
    END IF;
    -- Nor may another role's function stand where these go: CREATE OR
    -- REPLACE keeps a function's owner, who could then rewrite its body.
    -- Only the very functions (name and arguments): one of the same name
    -- with other arguments is another function, which nothing here
    -- replaces or calls.
    IF EXISTS (
        SELECT 1 FROM pg_catalog.pg_proc p
          JOIN pg_catalog.pg_roles o ON o.oid OPERATOR(pg_catalog.=) p.proowner
         WHERE p.oid OPERATOR(pg_catalog.=) ANY (ARRAY[
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_keep_token()', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_seed_token()', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_token_floor(varchar)', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_take()', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_take_key(varchar, bigint)', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_open_transactions()', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_record_term()', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.service_leader_fenced_session(pg_catalog.text)', s)),
                   pg_catalog.to_regprocedure(pg_catalog.format('%s.leaderd_fence(varchar, bigint, interval)', s))
               ]::pg_catalog.oid[])
           AND NOT (o.rolname OPERATOR(pg_catalog.=) CURRENT_USER OR o.rolsuper)) THEN
        RAISE EXCEPTION USING ERRCODE = 'LF010', MESSAGE = pg_catalog.format(
            'leaderd: a function named as one of leaderd''s in schema %s belongs to a role other than %s, '
            'which could rewrite it to run with others'' rights; nothing installed (docs/security.md)', s, CURRENT_USER);
    END IF;
    -- leaderd_fence from version 4 on holds takeovers off through the
    -- takeover triggers (2026-11-26). A lock table made again has none,
    -- and such a fence would pass holding nothing off: it is dropped here
    -- (its grants with it, as the table's), and the fence's installation
    -- puts it back with its triggers.
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
                WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace(s)
                  AND p.proname OPERATOR(pg_catalog.=) 'leaderd_fence'
                  AND pg_catalog.obj_description(p.oid, 'pg_proc')
                      OPERATOR(pg_catalog.~) '^leaderd fence ([4-9]|[1-9][0-9]+)$')
       AND (SELECT pg_catalog.count(*) FROM pg_catalog.pg_trigger t
             WHERE t.tgrelid OPERATOR(pg_catalog.=)
                   pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_lock', s))
               AND t.tgname OPERATOR(pg_catalog.=) ANY (ARRAY['service_leader_take',
                                                              'service_leader_take_new']::pg_catalog.name[]))
           OPERATOR(pg_catalog.<>) 2 THEN
        EXECUTE pg_catalog.format('DROP FUNCTION %s.leaderd_fence(VARCHAR, BIGINT, INTERVAL)', s);
    END IF;
    -- A lease row deleted: its token is kept.
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_keep_token() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    INSERT INTO {schema}.service_leader_token AS t (name, token) VALUES (OLD.name, OLD.token)
    ON CONFLICT (name) DO UPDATE SET token = GREATEST(t.token, EXCLUDED.token);
    RETURN OLD;
END $fn$$sql$, '{schema}', s);
    -- A lease row made: its token starts above the kept one. A trigger
    -- rather than a function in leaderd's INSERT, so that the daemon's role
    -- needs no EXECUTE right.
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_seed_token() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    NEW.token := GREATEST(NEW.token,
        COALESCE((SELECT t.token + 1 FROM {schema}.service_leader_token t WHERE t.name = NEW.name),
                 NEW.token));
    RETURN NEW;
END $fn$$sql$, '{schema}', s);
    -- What daemons of earlier versions call when they make a row (they run
    -- as the owner, or were granted EXECUTE: PUBLIC no longer has it).
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_token_floor(election VARCHAR) RETURNS BIGINT
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT t.token FROM {schema}.service_leader_token t WHERE t.name = election
$fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_keep_token() FROM PUBLIC', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_seed_token() FROM PUBLIC', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_token_floor(VARCHAR) FROM PUBLIC', s);
    -- Made only when missing: a trigger dropped and made again would leave
    -- a gap, and the table's lock for nothing.
    FOREACH trigger IN ARRAY ARRAY['service_leader_keep_token AFTER DELETE',
                                   'service_leader_seed_token BEFORE INSERT'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                        WHERE t.tgname OPERATOR(pg_catalog.=) pg_catalog.split_part(trigger, ' ', 1)
                          AND t.tgrelid OPERATOR(pg_catalog.=)
                              pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_lock', s))) THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER %2$s ON %1$s.service_leader_lock '
                'FOR EACH ROW EXECUTE FUNCTION %1$s.%3$s()', s, trigger, pg_catalog.split_part(trigger, ' ', 1));
        END IF;
    END LOOP;
END $migrate$;
