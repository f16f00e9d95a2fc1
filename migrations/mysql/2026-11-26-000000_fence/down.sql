DROP PROCEDURE IF EXISTS leaderd_fence;
DROP TRIGGER IF EXISTS service_leader_fence_take;
DROP TRIGGER IF EXISTS service_leader_fence_new;
DROP TABLE IF EXISTS service_leader_fence;
