-- The highest token each election's deleted lease row carried. A row made
-- again starts above it, so tokens never go back even when the clock that
-- seeds a new row has stepped back. The trigger that fills it
-- (trigger.sql) is made apart from the steps, best effort: a server with
-- binary logging refuses triggers to a user without SUPER or
-- log_bin_trust_function_creators, and rows are then still created, seeded
-- from the clock alone. Idempotent.
CREATE TABLE IF NOT EXISTS service_leader_token (
    name  VARBINARY(400) NOT NULL PRIMARY KEY,
    token BIGINT         NOT NULL
) ENGINE = InnoDB;
