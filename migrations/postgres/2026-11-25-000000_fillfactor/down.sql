ALTER TABLE service_leader_lock RESET (fillfactor);
