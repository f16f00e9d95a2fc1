ALTER TABLE service_leader_lock DROP COLUMN address_instance, DROP COLUMN address;
