-- The highest token each election's deleted lease row carried. A row made
-- again starts above it, so tokens never go back even when the clock that
-- seeds a new row has stepped back. The functions run with their owner's
-- rights (the migrating user's), so a user with rights on
-- service_leader_lock alone needs no grant here. Idempotent.
CREATE TABLE IF NOT EXISTS service_leader_token (
    name  VARCHAR(100) PRIMARY KEY,
    token BIGINT       NOT NULL
);
CREATE OR REPLACE FUNCTION service_leader_keep_token() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO service_leader_token AS t (name, token) VALUES (OLD.name, OLD.token)
    ON CONFLICT (name) DO UPDATE SET token = GREATEST(t.token, EXCLUDED.token);
    RETURN OLD;
END $$;
CREATE OR REPLACE FUNCTION service_leader_token_floor(election VARCHAR) RETURNS BIGINT
LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT AS $$
    SELECT token FROM service_leader_token WHERE name = election
$$;
DROP TRIGGER IF EXISTS service_leader_keep_token ON service_leader_lock;
CREATE TRIGGER service_leader_keep_token AFTER DELETE ON service_leader_lock
    FOR EACH ROW EXECUTE FUNCTION service_leader_keep_token();
