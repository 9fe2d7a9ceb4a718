-- Generations, step 2 of 3: prove the CHECK of step 1 on the rows already
-- there, so that step 3 attaches each table as generation 0 without reading it.
-- VALIDATE reads each whole table under SHARE UPDATE EXCLUSIVE, which claims
-- (INSERT) and reads do not wait for: on a large table this step takes the
-- time of one sequential scan, with the workers running.
ALTER TABLE processed_messages VALIDATE CONSTRAINT processed_messages_generation_0;
ALTER TABLE ingress_idempotency_keys VALIDATE CONSTRAINT ingress_idempotency_keys_generation_0;
