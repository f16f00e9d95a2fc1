-- One row per election. Times are UTC_TIMESTAMP(6) of the server: DATETIME(6)
-- is not converted by the session time zone and keeps microseconds. `name`
-- compares byte for byte (see the exact_names step).
CREATE TABLE IF NOT EXISTS service_leader_lock (
    id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name        VARBINARY(400) NOT NULL,
    holder      VARCHAR(100) NULL,
    instance    VARCHAR(64)  NULL,
    token       BIGINT       NOT NULL,
    acquired_at DATETIME(6)  NULL,
    renewed_at  DATETIME(6)  NULL,
    expires_at  DATETIME(6)  NOT NULL,
    UNIQUE KEY service_leader_lock_name (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
