-- A graceful release names the daemon instance that should lead next: the row is then free but blocked for one
-- heartbeat, and only that instance may take it early. NULL otherwise.
-- SQLite has no ADD COLUMN IF NOT EXISTS: leaderd runs this only when the
-- column is missing (a check of its own), under the migration's lock.
ALTER TABLE service_leader_lock ADD COLUMN successor TEXT;
