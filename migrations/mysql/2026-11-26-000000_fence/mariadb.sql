-- MariaDB's installation of fenced writes (what the fence does: up.sql);
-- the procedure itself is mariadb-procedure.sql, appended by the migration after
-- "CREATE OR REPLACE ". Everything is replaced in place, nothing dropped:
-- there is no moment without triggers behind a procedure that would pass
-- without them (so no stub is needed), a refusal (binary logging without
-- SUPER or log_bin_trust_function_creators; a lock the DDL does not wait
-- for) leaves the installed version whole, and the procedure keeps its
-- EXECUTE grants. The triggers come first: the procedure is replaced only
-- once they are in place. Idempotent; the comment is the version checked.
CREATE TABLE IF NOT EXISTS service_leader_fence (
    name  VARBINARY(400) NOT NULL PRIMARY KEY,
    token BIGINT         NOT NULL
) ENGINE = InnoDB;
-- A rename writes both names' fence rows: a fenced transaction holds its
-- election's row, so that neither its lease renamed away nor another
-- renamed into its name can get past it.
CREATE OR REPLACE TRIGGER service_leader_fence_take BEFORE UPDATE ON service_leader_lock FOR EACH ROW
BEGIN
    IF NEW.token <> OLD.token OR NEW.name <> OLD.name THEN
        INSERT INTO service_leader_fence (name, token) VALUES (NEW.name, NEW.token)
            ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
    END IF;
    IF NEW.name <> OLD.name THEN
        INSERT INTO service_leader_fence (name, token) VALUES (OLD.name, OLD.token)
            ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
    END IF;
END;
CREATE OR REPLACE TRIGGER service_leader_fence_new AFTER INSERT ON service_leader_lock FOR EACH ROW
    INSERT INTO service_leader_fence (name, token) VALUES (NEW.name, NEW.token)
        ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
INSERT INTO service_leader_fence (name, token)
    SELECT name, token FROM service_leader_lock
    ON DUPLICATE KEY UPDATE token = GREATEST(service_leader_fence.token, VALUES(token));
