-- Names compare byte for byte: utf8mb4_bin pads with spaces, so `x` and `x `
-- were one election. VARBINARY has no padding on MySQL and MariaDB alike
-- (100 characters of utf8mb4 are at most 400 bytes). Idempotent.
ALTER TABLE service_leader_lock MODIFY name VARBINARY(400) NOT NULL;
