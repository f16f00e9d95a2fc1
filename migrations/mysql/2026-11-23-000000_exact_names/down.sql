ALTER TABLE service_leader_lock MODIFY name VARCHAR(100) NOT NULL COLLATE utf8mb4_bin;
