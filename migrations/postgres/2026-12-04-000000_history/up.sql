-- A record of terms: one row per change of holder (token), kept by the
-- database itself, so that a takeover by any daemon, of any version, is
-- in it. `leaderd history` reads it (docs/operations.md, "A record of
-- terms"). Installed apart from the steps, best effort, after the token
-- floor's file (2026-11-24), whose checks it relies on: the schema is this
-- user's and no other role owns a table or function named as leaderd's.
--
-- Bounded: the last 100 terms of each election are kept; each new term
-- deletes the oldest beyond them, found through the primary key (the
-- election's own entries only, never a scan of the table). A renewal
-- costs nothing: the trigger's WHEN clause leaves it out (no call). The
-- spread's presence rows are not elections, and are not recorded.
DO $migrate$
DECLARE
    s pg_catalog.text := pg_catalog.quote_ident(pg_catalog.current_schema());
    grantee pg_catalog.text;
    trigger pg_catalog.text;
BEGIN
    -- Made once, readable by its owner alone: a default privilege of the
    -- schema may have granted more to another role (one that may lock or
    -- write these rows could stall a takeover or forge the record). The
    -- operator grants SELECT to the daemon's role (deploy/sql/postgres),
    -- and a later installation leaves that grant alone.
    IF pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_history', s)) IS NULL THEN
        EXECUTE pg_catalog.format($sql$
CREATE TABLE %s.service_leader_history (
    name            VARCHAR(100) NOT NULL,
    token           BIGINT       NOT NULL,
    holder          VARCHAR(100),
    instance        VARCHAR(64),
    address         VARCHAR(255),
    began_at        pg_catalog.timestamptz  NOT NULL,
    began_how       VARCHAR(16)  NOT NULL,
    earlier_version BOOLEAN      NOT NULL,
    ended_at        pg_catalog.timestamptz,
    ended_how       VARCHAR(16),
    PRIMARY KEY (name, token)
)$sql$, s);
        EXECUTE pg_catalog.format('REVOKE ALL ON %s.service_leader_history FROM PUBLIC', s);
        FOR grantee IN
            SELECT DISTINCT pg_catalog.quote_ident(r.rolname)
              FROM pg_catalog.pg_class c
              JOIN LATERAL pg_catalog.aclexplode(c.relacl) a ON true
              JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
             WHERE c.oid OPERATOR(pg_catalog.=)
                   pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_history', s))
               AND a.grantee OPERATOR(pg_catalog.<>) c.relowner LOOP
            EXECUTE pg_catalog.format('REVOKE ALL ON %s.service_leader_history FROM %s CASCADE', s, grantee);
        END LOOP;
        EXECUTE pg_catalog.format('COMMENT ON TABLE %s.service_leader_history IS %L', s, 'leaderd history 1');
    END IF;
    -- Runs with its owner's rights (the daemon's role needs SELECT on the
    -- history alone), and finds nothing through a schema another role may
    -- create in (see 2026-11-24).
    --
    -- How a term began: `first` (the row had never been held), `expired`
    -- (its holder's lease ran out: killed, cut off, or too slow),
    -- `released` (given up, to anyone), `successor` (given up to this
    -- daemon, which took it within the window only it may). A daemon
    -- that does not write its instance as the address's
    -- (`address_instance`) is of a version before addresses: an earlier
    -- version's takeover. How it ended: `released`, or `expired` (at the
    -- lease's end by the database's clock), filled in by the next term.
    EXECUTE pg_catalog.replace($sql$
CREATE OR REPLACE FUNCTION {schema}.service_leader_record_term() RETURNS pg_catalog.trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    how pg_catalog.text;
    began pg_catalog.timestamptz := now();
BEGIN
    -- The takeover's own time where it wrote one (an earlier version's
    -- may not: it keeps the previous term's).
    IF TG_OP = 'INSERT' THEN
        began := COALESCE(NEW.acquired_at, began);
    ELSIF NEW.acquired_at IS DISTINCT FROM OLD.acquired_at AND NEW.acquired_at IS NOT NULL THEN
        began := NEW.acquired_at;
    END IF;
    IF starts_with(NEW.name, 'leaderd-presence/') THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.holder IS NOT NULL THEN
        UPDATE {schema}.service_leader_history h
           SET ended_at = LEAST(OLD.expires_at, CASE WHEN NEW.holder IS NULL THEN now() ELSE began END),
               ended_how = CASE WHEN NEW.holder IS NULL AND now() < OLD.expires_at THEN 'released'
                                ELSE 'expired' END
         WHERE h.name = OLD.name AND h.token = OLD.token AND h.ended_at IS NULL;
    END IF;
    IF NEW.holder IS NULL OR (TG_OP = 'UPDATE' AND OLD.token = NEW.token) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        how := 'first';
    ELSIF OLD.holder IS NOT NULL THEN
        how := 'expired';
    ELSIF OLD.acquired_at IS NULL THEN
        how := 'first';
    ELSIF OLD.successor IS NOT NULL AND began < OLD.expires_at THEN
        how := 'successor';
    ELSE
        how := 'released';
    END IF;
    INSERT INTO {schema}.service_leader_history AS h
        (name, token, holder, instance, address, began_at, began_how, earlier_version)
    VALUES (NEW.name, NEW.token, NEW.holder, NEW.instance,
            CASE WHEN NEW.address_instance = NEW.instance THEN NEW.address END,
            began, how, NEW.address_instance IS DISTINCT FROM NEW.instance)
    ON CONFLICT (name, token) DO NOTHING;
    DELETE FROM {schema}.service_leader_history h
     WHERE h.name = NEW.name
       AND h.token < (SELECT k.token FROM {schema}.service_leader_history k
                       WHERE k.name = NEW.name ORDER BY k.token DESC OFFSET 99 LIMIT 1);
    RETURN NULL;
END $fn$$sql$, '{schema}', s);
    EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s.service_leader_record_term() FROM PUBLIC', s);
    -- Made only when missing (see 2026-11-24). The WHEN clauses leave out
    -- renewals: a term begins with a new token (or a row made held) and
    -- ends with the holder cleared (a release).
    FOREACH trigger IN ARRAY ARRAY[
        'service_leader_record_term AFTER UPDATE|NOT (OLD.token OPERATOR(pg_catalog.=) NEW.token) '
            'OR (OLD.holder IS NOT NULL AND NEW.holder IS NULL)',
        'service_leader_record_first AFTER INSERT|NEW.holder IS NOT NULL'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t
                        WHERE t.tgname OPERATOR(pg_catalog.=) pg_catalog.split_part(trigger, ' ', 1)
                          AND t.tgrelid OPERATOR(pg_catalog.=)
                              pg_catalog.to_regclass(pg_catalog.format('%s.service_leader_lock', s))) THEN
            EXECUTE pg_catalog.format('CREATE TRIGGER %2$s ON %1$s.service_leader_lock '
                'FOR EACH ROW WHEN (%3$s) EXECUTE FUNCTION %1$s.service_leader_record_term()',
                s, pg_catalog.split_part(trigger, '|', 1), pg_catalog.split_part(trigger, '|', 2));
        END IF;
    END LOOP;
END $migrate$;
