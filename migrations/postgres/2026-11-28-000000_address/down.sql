ALTER TABLE service_leader_lock DROP COLUMN IF EXISTS address_instance, DROP COLUMN IF EXISTS address;
