-- One row per election. Times come from the database's clock only.
CREATE TABLE IF NOT EXISTS service_leader_lock (
    id          BIGSERIAL    PRIMARY KEY,
    name        VARCHAR(100) NOT NULL UNIQUE,
    holder      VARCHAR(100),
    instance    VARCHAR(64),
    token       BIGINT       NOT NULL,
    acquired_at pg_catalog.timestamptz,
    renewed_at  pg_catalog.timestamptz,
    expires_at  pg_catalog.timestamptz  NOT NULL
);
