-- Generations for the tables that grow with traffic beside the claims, step 1
-- of 3 (as 0010-0012 did for the claims): the send ledger, the send API's
-- messages and the outbox leave by whole generations too, not by DELETE.
-- This step names the generation of every row already there: 0, the oldest
-- of each table's own generations. A constant default and a NOT VALID CHECK
-- are catalog changes only: the brief ACCESS EXCLUSIVE lock each takes waits
-- for the transactions in flight and no more, and gives up after
-- lock_timeout (run `migrate` again then).
SET LOCAL lock_timeout = '5s';
ALTER TABLE send_ledger ADD COLUMN generation integer NOT NULL DEFAULT 0;
ALTER TABLE send_ledger
    ADD CONSTRAINT send_ledger_generation_0 CHECK (generation = 0) NOT VALID;
ALTER TABLE ingress_messages ADD COLUMN generation integer NOT NULL DEFAULT 0;
ALTER TABLE ingress_messages
    ADD CONSTRAINT ingress_messages_generation_0 CHECK (generation = 0) NOT VALID;
ALTER TABLE outbox ADD COLUMN generation integer NOT NULL DEFAULT 0;
ALTER TABLE outbox
    ADD CONSTRAINT outbox_generation_0 CHECK (generation = 0) NOT VALID;
