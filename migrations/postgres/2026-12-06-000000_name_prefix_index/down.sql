DROP INDEX IF EXISTS service_leader_lock_name_c;
