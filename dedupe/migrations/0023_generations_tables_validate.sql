-- Step 2 of 3: prove the CHECKs of step 1 on the rows already there, so that
-- step 3 attaches each table as its generation 0 without reading it.
-- VALIDATE reads each table under SHARE UPDATE EXCLUSIVE, which writes and
-- reads do not wait for: one sequential scan each, with the workers running.
ALTER TABLE send_ledger VALIDATE CONSTRAINT send_ledger_generation_0;
ALTER TABLE ingress_messages VALIDATE CONSTRAINT ingress_messages_generation_0;
ALTER TABLE outbox VALIDATE CONSTRAINT outbox_generation_0;
