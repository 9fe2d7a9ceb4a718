-- Generations, step 3 of 3: processed_messages becomes a table partitioned by
-- generation, the table of steps 1 and 2 its generation 0 (attached as it is:
-- its validated CHECK proves the partition's bound, so nothing is read), and
-- claims go through claim_messages() below. Every statement here changes the
-- catalog only; the rename's ACCESS EXCLUSIVE lock lasts until this
-- transaction commits, milliseconds, and gives up after lock_timeout.
--
-- Each generation is a table of its own with its own primary key on the
-- dedupe key; the parent has no index (a unique index on it would have to
-- contain the generation, and so would not make the key unique).
-- dedupe/generations.py makes the next generations ahead, rotates, and drops
-- a generation whose newest row is older than retention.
SET LOCAL lock_timeout = '5s';

ALTER TABLE processed_messages RENAME TO processed_messages_g0;
ALTER TABLE processed_messages_g0 RENAME CONSTRAINT processed_messages_pkey TO processed_messages_g0_pkey;
ALTER INDEX IF EXISTS processed_messages_processed_at RENAME TO processed_messages_g0_processed_at;

CREATE TABLE processed_messages (
    consumer     text        NOT NULL,
    tenant       text        NOT NULL,
    message_id   text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    -- Until the first rotation the rows of a client that does not name the
    -- generation (a worker of an earlier version during a rolling upgrade)
    -- go to generation 0, the current one; the first rotation drops this
    -- default, so such an INSERT fails from then on rather than miss the
    -- other generations.
    generation   integer     NOT NULL DEFAULT 0
) PARTITION BY LIST (generation);

ALTER TABLE processed_messages ATTACH PARTITION processed_messages_g0 FOR VALUES IN (0);

-- One row per generation of each partitioned dedupe table (its family).
-- began_at: when it became the current one (NULL: made ahead, not yet);
-- ended_at: when the next one did (its newest row is older than that);
-- dropped_at: when its table was detached and dropped.
CREATE TABLE dedupe_generations (
    family     text        NOT NULL,
    generation integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    began_at   timestamptz,
    ended_at   timestamptz,
    dropped_at timestamptz,
    PRIMARY KEY (family, generation)
);
CREATE UNIQUE INDEX dedupe_generations_current ON dedupe_generations (family)
    WHERE began_at IS NOT NULL AND ended_at IS NULL;
INSERT INTO dedupe_generations (family, generation, began_at)
    VALUES ('processed_messages', 0, now());

-- The claim of a batch's keys, in one round trip (dedupe/inbox.py):
-- 1. hold the schema's rotation lock shared until the transaction ends, so
--    no rotation happens between this claim and its commit;
-- 2. read the current generation, in a snapshot taken after (1.): each
--    statement of a VOLATILE function takes a fresh one under READ COMMITTED,
--    so a rotation that committed while (1.) waited is seen;
-- 3. insert into the current generation every key that no older live
--    generation holds (a lookup of each key in each older generation's
--    primary key, in a snapshot taken after (1.) too); the current
--    generation's primary key decides races (ON CONFLICT DO NOTHING, the
--    second claimant waits for the first to commit). Returns the keys it
--    inserted; a key missing from the answer was claimed before.
-- Keys arrive sorted (the caller's order is the lock order). Other isolation
-- levels take one snapshot per transaction, before (1.), so they are refused.
CREATE FUNCTION claim_messages(
    consumers text[], tenants text[], message_ids text[], fingerprints bytea[]
) RETURNS TABLE (consumer text, tenant text, message_id text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    claim_generation integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'claim_messages() needs READ COMMITTED, not %',
            current_setting('transaction_isolation');
    END IF;
    PERFORM pg_advisory_xact_lock_shared(
        hashtext('idempotent-workers.generations'), hashtext(current_schema()));
    SELECT g.generation INTO STRICT claim_generation FROM dedupe_generations g
     WHERE g.family = 'processed_messages' AND g.began_at IS NOT NULL AND g.ended_at IS NULL;
    RETURN QUERY
    INSERT INTO processed_messages AS p (generation, consumer, tenant, message_id, fingerprint)
    SELECT claim_generation, k.consumer, k.tenant, k.message_id, k.fingerprint
      FROM unnest(consumers, tenants, message_ids, fingerprints)
           AS k(consumer, tenant, message_id, fingerprint)
      LEFT JOIN LATERAL (
          SELECT 1 AS found FROM processed_messages o
           WHERE o.generation < claim_generation
             AND o.consumer = k.consumer AND o.tenant = k.tenant
             AND o.message_id = k.message_id
           LIMIT 1) AS older ON true
     WHERE older.found IS NULL
    ON CONFLICT DO NOTHING
    RETURNING p.consumer, p.tenant, p.message_id;
END
$$;
