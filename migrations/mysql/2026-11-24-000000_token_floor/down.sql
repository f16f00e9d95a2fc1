DROP TRIGGER IF EXISTS service_leader_keep_token;
DROP TABLE IF EXISTS service_leader_token;
