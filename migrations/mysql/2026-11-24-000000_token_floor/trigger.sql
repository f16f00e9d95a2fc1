-- Fills service_leader_token (up.sql) when a lease row is deleted. Not a
-- step: made by the migration apart from the steps, best effort, and only
-- when missing (it is never dropped and made again, which would leave a gap
-- where a deleted row's token is lost): a server with binary logging refuses
-- triggers to a user without SUPER or log_bin_trust_function_creators, and
-- rows are then seeded from the clock alone.
CREATE TRIGGER service_leader_keep_token AFTER DELETE ON service_leader_lock
    FOR EACH ROW INSERT INTO service_leader_token (name, token) VALUES (OLD.name, OLD.token)
    ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token));
