ALTER TABLE service_leader_lock DROP COLUMN IF EXISTS successor;
