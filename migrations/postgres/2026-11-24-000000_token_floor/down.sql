DROP TRIGGER IF EXISTS service_leader_keep_token ON service_leader_lock;
DROP FUNCTION IF EXISTS service_leader_keep_token();
DROP FUNCTION IF EXISTS service_leader_token_floor(VARCHAR);
DROP TABLE IF EXISTS service_leader_token;
