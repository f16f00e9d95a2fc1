DROP TRIGGER IF EXISTS service_leader_history_first;
DROP TRIGGER IF EXISTS service_leader_history_take;
DROP TRIGGER IF EXISTS service_leader_history_release;
DROP TABLE IF EXISTS service_leader_history;
