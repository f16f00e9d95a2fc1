DROP TABLE IF EXISTS service_leader_token;
