-- Where the holder's app can be reached (its `advertise` setting), written
-- with each takeover together with the instance that wrote it, and cleared
-- at release. A reader reports `address` only while `address_instance` is
-- the row's `instance`: a daemon of an earlier version, which writes
-- neither, takes the row over without leaving the address of the previous holder
-- address to be read as its own.
-- MySQL 8 has no ADD COLUMN IF NOT EXISTS: leaderd runs this only when the
-- columns are missing (a check of its own), under the migration's lock.
-- Nullable columns at the end are added in place (no table copy), both in
-- one statement.
ALTER TABLE service_leader_lock
    ADD COLUMN address VARCHAR(255) NULL,
    ADD COLUMN address_instance VARCHAR(64) NULL;
