-- A record of terms: one row per change of holder (token), kept by the
-- database itself, so that a takeover by any daemon, of any version, is
-- in it (`leaderd history`; docs/operations.md, "A record of terms").
-- Times are UTC_TIMESTAMP(6) of the server, as in the lock table.
-- Bounded: the last 100 terms of each election; each new term deletes
-- the one that falls out, by its primary key. See the
-- PostgreSQL file for what each `began_how` and `ended_how` means.
--
-- Installed apart from the steps, best effort, as the kept-tokens trigger
-- (a server with binary logging refuses triggers to a user without SUPER
-- or log_bin_trust_function_creators). A MySQL trigger cannot name its
-- columns: it fires on every update of the lock table, and a renewal, which
-- changes neither the token nor the holder, costs it one comparison. The
-- spread's presence rows are not elections, and are not recorded.
-- Idempotent.
CREATE TABLE IF NOT EXISTS service_leader_history (
    name            VARBINARY(400) NOT NULL,
    token           BIGINT         NOT NULL,
    holder          VARCHAR(100)   NULL,
    instance        VARCHAR(64)    NULL,
    address         VARCHAR(255)   NULL,
    began_at        DATETIME(6)    NOT NULL,
    began_how       VARCHAR(16)    NOT NULL,
    earlier_version BOOLEAN        NOT NULL,
    ended_at        DATETIME(6)    NULL,
    ended_how       VARCHAR(16)    NULL,
    PRIMARY KEY (name, token)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TRIGGER IF NOT EXISTS service_leader_history_term AFTER UPDATE ON service_leader_lock FOR EACH ROW
BEGIN
    DECLARE began DATETIME(6);
    DECLARE cutoff BIGINT;
    IF (NEW.token <> OLD.token OR NEW.holder IS NULL) AND LEFT(NEW.name, 17) <> 'leaderd-presence/' THEN
        -- The takeover's own time where it wrote one (an earlier
        -- version's may not: it keeps the previous term's).
        SET began = IF(NEW.acquired_at <=> OLD.acquired_at OR NEW.acquired_at IS NULL,
                       UTC_TIMESTAMP(6), NEW.acquired_at);
        IF OLD.holder IS NOT NULL THEN
            UPDATE service_leader_history
               SET ended_at = LEAST(OLD.expires_at, began),
                   ended_how = IF(NEW.holder IS NULL AND began < OLD.expires_at, 'released', 'expired')
             WHERE name = OLD.name AND token = OLD.token AND ended_at IS NULL;
        END IF;
        IF NEW.token <> OLD.token AND NEW.holder IS NOT NULL THEN
            INSERT INTO service_leader_history
                (name, token, holder, instance, address, began_at, began_how, earlier_version)
            VALUES (NEW.name, NEW.token, NEW.holder, NEW.instance,
                    IF(NEW.address_instance = NEW.instance, NEW.address, NULL), began,
                    CASE WHEN OLD.holder IS NOT NULL THEN 'expired'
                         WHEN OLD.acquired_at IS NULL THEN 'first'
                         WHEN OLD.successor IS NOT NULL AND began < OLD.expires_at THEN 'successor'
                         ELSE 'released' END,
                    NOT (NEW.address_instance <=> NEW.instance))
                ON DUPLICATE KEY UPDATE token = token;
            -- One key, the oldest beyond the last 100: a range would lock
            -- the gap before it, where another election's terms go.
            SET cutoff = (SELECT h.token FROM service_leader_history h
                           WHERE h.name = NEW.name ORDER BY h.token DESC LIMIT 1 OFFSET 100);
            DELETE FROM service_leader_history WHERE name = NEW.name AND token = cutoff;
        END IF;
    END IF;
END;
CREATE TRIGGER IF NOT EXISTS service_leader_history_first AFTER INSERT ON service_leader_lock FOR EACH ROW
    INSERT INTO service_leader_history
        (name, token, holder, instance, address, began_at, began_how, earlier_version)
    SELECT NEW.name, NEW.token, NEW.holder, NEW.instance,
           IF(NEW.address_instance = NEW.instance, NEW.address, NULL),
           COALESCE(NEW.acquired_at, UTC_TIMESTAMP(6)), 'first',
           NOT (NEW.address_instance <=> NEW.instance)
     WHERE NEW.holder IS NOT NULL AND LEFT(NEW.name, 17) <> 'leaderd-presence/'
    ON DUPLICATE KEY UPDATE token = service_leader_history.token;
