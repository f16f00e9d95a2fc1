DROP TRIGGER IF EXISTS service_leader_history_first;
DROP TRIGGER IF EXISTS service_leader_history_term;
DROP TABLE IF EXISTS service_leader_history;
