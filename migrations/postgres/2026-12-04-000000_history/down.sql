DROP TRIGGER IF EXISTS service_leader_record_term ON service_leader_lock;
DROP TRIGGER IF EXISTS service_leader_record_first ON service_leader_lock;
DROP FUNCTION IF EXISTS service_leader_record_term();
DROP TABLE IF EXISTS service_leader_history;
