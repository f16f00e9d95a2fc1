-- A record of terms: one row per change of holder (token), kept by the
-- database itself, so that a takeover by any daemon, of any version, is
-- in it (`leaderd history`; docs/operations.md, "A record of terms").
-- Times are microseconds of CLOCK_BOOTTIME, valid for the boot named in
-- boot_id, as in the lock table. Bounded: the last 100 terms of each
-- election, the oldest beyond them deleted through the primary key. The
-- triggers fire only when the token or the holder is written (`UPDATE
-- OF`), which a renewal never does. The spread's presence rows are not
-- elections, and are not recorded. See the PostgreSQL file for what each
-- `began_how` and `ended_how` means. Idempotent.
CREATE TABLE IF NOT EXISTS service_leader_history (
    name            TEXT    NOT NULL,
    token           INTEGER NOT NULL,
    holder          TEXT,
    instance        TEXT,
    address         TEXT,
    boot_id         TEXT    NOT NULL,
    began_at        INTEGER NOT NULL,
    began_how       TEXT    NOT NULL,
    earlier_version INTEGER NOT NULL,
    ended_at        INTEGER,
    ended_how       TEXT,
    PRIMARY KEY (name, token)
);
-- A release ends the term at its own time: the release writes renewed_at
-- (an earlier version's does not: then the sooner of the lease's end and
-- the released row's expiry); one after the lease ran out ends it
-- `expired`, at the lease's end. A takeover that writes no acquired_at of
-- its own (an earlier version's may not) began, as far as can be told
-- here without a clock, when the previous lease ran out.
CREATE TRIGGER IF NOT EXISTS service_leader_history_release
AFTER UPDATE OF holder ON service_leader_lock
WHEN OLD.holder IS NOT NULL AND NEW.holder IS NULL
BEGIN
    UPDATE service_leader_history
       SET ended_at = MIN(OLD.expires_at, CASE WHEN NEW.renewed_at IS NOT OLD.renewed_at
                                               THEN NEW.renewed_at ELSE NEW.expires_at END),
           ended_how = CASE WHEN NEW.renewed_at IS NOT OLD.renewed_at
                                 AND NEW.renewed_at >= OLD.expires_at THEN 'expired'
                            ELSE 'released' END
     WHERE name = OLD.name AND token = OLD.token AND ended_at IS NULL;
END;
CREATE TRIGGER IF NOT EXISTS service_leader_history_take
AFTER UPDATE OF token ON service_leader_lock
WHEN NEW.token <> OLD.token AND NEW.holder IS NOT NULL
     AND substr(NEW.name, 1, 17) <> 'leaderd-presence/'
BEGIN
    UPDATE service_leader_history
       SET ended_at = CASE WHEN OLD.boot_id = NEW.boot_id AND NEW.acquired_at IS NOT OLD.acquired_at
                                AND NEW.acquired_at IS NOT NULL
                           THEN MIN(OLD.expires_at, NEW.acquired_at) ELSE OLD.expires_at END,
           ended_how = 'expired'
     WHERE OLD.holder IS NOT NULL AND name = OLD.name AND token = OLD.token AND ended_at IS NULL;
    INSERT OR IGNORE INTO service_leader_history
        (name, token, holder, instance, address, boot_id, began_at, began_how, earlier_version)
    VALUES (NEW.name, NEW.token, NEW.holder, NEW.instance,
            CASE WHEN NEW.address_instance = NEW.instance THEN NEW.address END,
            NEW.boot_id,
            CASE WHEN NEW.acquired_at IS NOT OLD.acquired_at AND NEW.acquired_at IS NOT NULL
                 THEN NEW.acquired_at ELSE OLD.expires_at END,
            CASE WHEN OLD.holder IS NOT NULL THEN 'expired'
                 WHEN OLD.acquired_at IS NULL THEN 'first'
                 WHEN OLD.successor IS NOT NULL AND OLD.boot_id = NEW.boot_id
                      AND NEW.acquired_at IS NOT OLD.acquired_at
                      AND NEW.acquired_at < OLD.expires_at THEN 'successor'
                 ELSE 'released' END,
            NEW.address_instance IS NOT NEW.instance);
    DELETE FROM service_leader_history
     WHERE name = NEW.name
       AND token < (SELECT token FROM service_leader_history
                     WHERE name = NEW.name ORDER BY token DESC LIMIT 1 OFFSET 99);
END;
CREATE TRIGGER IF NOT EXISTS service_leader_history_first
AFTER INSERT ON service_leader_lock
WHEN NEW.holder IS NOT NULL AND substr(NEW.name, 1, 17) <> 'leaderd-presence/'
BEGIN
    INSERT OR IGNORE INTO service_leader_history
        (name, token, holder, instance, address, boot_id, began_at, began_how, earlier_version)
    VALUES (NEW.name, NEW.token, NEW.holder, NEW.instance,
            CASE WHEN NEW.address_instance = NEW.instance THEN NEW.address END,
            NEW.boot_id, COALESCE(NEW.acquired_at, NEW.renewed_at, NEW.expires_at), 'first',
            NEW.address_instance IS NOT NEW.instance);
END;
