-- The highest token each election's deleted lease row carried. A row made
-- again starts above it, so tokens never go back even when the host's wall
-- clock, which seeds a new row, has stepped back. Idempotent.
CREATE TABLE IF NOT EXISTS service_leader_token (
    name  TEXT    PRIMARY KEY,
    token INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS service_leader_keep_token
AFTER DELETE ON service_leader_lock
BEGIN
    INSERT OR REPLACE INTO service_leader_token (name, token)
    VALUES (OLD.name, MAX(OLD.token, COALESCE(
        (SELECT token FROM service_leader_token WHERE name = OLD.name), OLD.token)));
END;
