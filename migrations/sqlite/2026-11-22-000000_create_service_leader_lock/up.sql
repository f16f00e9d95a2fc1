-- One row per election. SQLite has no server clock: times are microseconds of
-- the host's CLOCK_BOOTTIME, valid only for the boot named in boot_id.
CREATE TABLE IF NOT EXISTS service_leader_lock (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 100),
    holder      TEXT    CHECK (holder IS NULL OR length(holder) <= 100),
    instance    TEXT,
    token       INTEGER NOT NULL,
    acquired_at INTEGER,
    renewed_at  INTEGER,
    expires_at  INTEGER NOT NULL,
    boot_id     TEXT    NOT NULL
);
