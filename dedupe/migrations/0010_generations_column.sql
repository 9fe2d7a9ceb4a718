-- Generations, step 1 of 3: processed_messages and ingress_idempotency_keys
-- leave by whole generations (dedupe.generations), not by DELETE. This step
-- names the generation of every row already there: 0, the oldest. Adding a column with a constant default
-- writes no row (PostgreSQL 11 and later keep the default in the catalog), and
-- the CHECK is NOT VALID, so both are catalog changes: the brief ACCESS
-- EXCLUSIVE lock they take waits for the claims in flight and no more, and
-- gives up after lock_timeout rather than stall the claims queued behind it
-- (run `migrate` again then).
SET LOCAL lock_timeout = '5s';
ALTER TABLE processed_messages ADD COLUMN generation integer NOT NULL DEFAULT 0;
ALTER TABLE processed_messages
    ADD CONSTRAINT processed_messages_generation_0 CHECK (generation = 0) NOT VALID;
ALTER TABLE ingress_idempotency_keys ADD COLUMN generation integer NOT NULL DEFAULT 0;
ALTER TABLE ingress_idempotency_keys
    ADD CONSTRAINT ingress_idempotency_keys_generation_0 CHECK (generation = 0) NOT VALID;
