-- An index over the names in byte order (the "C" collation), so that a
-- listing by prefix (the replicas' presence rows, read by every replica
-- once a renew interval) reads the rows it lists alone. The unique index
-- on the name follows the database's collation, which a prefix cannot use
-- unless that is "C": without this one, each listing read every election's
-- row, dead versions included (measured: with 10,000 elections shared by
-- three replicas, 7.7 scans of the whole table a second, running longer
-- than the renewals did).
--
-- leaderd runs this again on its own whenever the check that decides
-- whether the steps above run finds them done, so it must never fail nor
-- wait: only the table's owner may make it (anyone else goes on without,
-- at the old cost); building it needs a lock that holds renewals off, so
-- that lock is waited for 100 ms at most, this transaction only, and the
-- catalog is read first, so that a table that has it is not locked at all.
--
-- It runs with the migrating user's rights and search_path, where the
-- app's role may have made operators, functions and collations: each is
-- named with its schema, so that none of theirs can run here.
DO $$
BEGIN
    IF pg_catalog.to_regclass('service_leader_lock') IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_index x
                         JOIN pg_catalog.pg_class i ON i.oid OPERATOR(pg_catalog.=) x.indexrelid
                        WHERE x.indrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('service_leader_lock')::pg_catalog.oid
                          AND i.relname OPERATOR(pg_catalog.=) 'service_leader_lock_name_c') THEN
        PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
        CREATE INDEX service_leader_lock_name_c ON service_leader_lock (name COLLATE pg_catalog."C");
    END IF;
EXCEPTION WHEN insufficient_privilege OR lock_not_available THEN
    NULL;
END $$;
