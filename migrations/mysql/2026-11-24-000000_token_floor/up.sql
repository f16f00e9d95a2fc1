-- The highest token each election's deleted lease row carried. A row made
-- again starts above it, so tokens never go back even when the clock that
-- seeds a new row has stepped back. The table comes first: where the server
-- refuses the trigger (binary logging without SUPER or
-- log_bin_trust_function_creators), rows are still created, seeded from the
-- clock alone. Idempotent.
CREATE TABLE IF NOT EXISTS service_leader_token (
    name  VARBINARY(400) NOT NULL PRIMARY KEY,
    token BIGINT         NOT NULL
) ENGINE = InnoDB;
DROP TRIGGER IF EXISTS service_leader_keep_token;
CREATE TRIGGER service_leader_keep_token AFTER DELETE ON service_leader_lock
    FOR EACH ROW INSERT INTO service_leader_token (name, token) VALUES (OLD.name, OLD.token)
    ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
