-- Generations, step 3 of 3: processed_messages and ingress_idempotency_keys
-- become tables partitioned by generation, each table of steps 1 and 2 its
-- generation 0 (attached as it is: its validated CHECK proves the partition's
-- bound, so nothing is read); claims go through claim_messages() and the send
-- API's keys through accept_messages(), below. Every statement here changes the
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

-- The send API's idempotency keys, the same way.
ALTER TABLE ingress_idempotency_keys RENAME TO ingress_idempotency_keys_g0;
ALTER TABLE ingress_idempotency_keys_g0
    RENAME CONSTRAINT ingress_idempotency_keys_pkey TO ingress_idempotency_keys_g0_pkey;
ALTER INDEX IF EXISTS ingress_idempotency_keys_created_at
    RENAME TO ingress_idempotency_keys_g0_created_at;

CREATE TABLE ingress_idempotency_keys (
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     bytea       NOT NULL,
    message_id      uuid        NOT NULL,   -- ingress_messages.id, written in the same transaction
    created_at      timestamptz NOT NULL DEFAULT now(),
    generation      integer     NOT NULL DEFAULT 0   -- dropped by the first rotation, as above
) PARTITION BY LIST (generation);

ALTER TABLE ingress_idempotency_keys
    ATTACH PARTITION ingress_idempotency_keys_g0 FOR VALUES IN (0);
INSERT INTO dedupe_generations (family, generation, began_at)
    VALUES ('ingress_idempotency_keys', 0, now());

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

-- The send API's acceptance of one commit's requests (dedupe/messages.py), in one
-- round trip, as claim_messages() claims: the rotation lock shared, then in
-- fresh snapshots the current generation, then one statement that
-- 1. inserts into the current generation every key no older live generation
--    holds (the current one's primary key decides two writers of one key);
-- 2. for each key written, its message row (`queued`) and its outbox rows
--    (the push job: message_id = job_prefix || id || suffix, the ingress
--    header naming the message, the request's trace context when it had one);
-- 3. answers, per request in order: whether its key was written, and if not
--    the stored fingerprint and message id across the generations, as this
--    statement's snapshot saw them (NULL if it missed them), locked FOR KEY
--    SHARE (a duplicate is answered on a replicated key).
CREATE FUNCTION accept_messages(
    tenants text[], idempotency_keys text[], fingerprints bytea[], queues text[],
    targets int[], job_n bigint[], job_suffixes text[], job_bodies bytea[],
    traceparents text[], tracestates text[], job_prefix text, ingress_header text
) RETURNS TABLE (won boolean, fingerprint bytea, message_id uuid)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    key_generation integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'accept_messages() needs READ COMMITTED, not %',
            current_setting('transaction_isolation');
    END IF;
    PERFORM pg_advisory_xact_lock_shared(
        hashtext('idempotent-workers.generations'), hashtext(current_schema()));
    SELECT g.generation INTO STRICT key_generation FROM dedupe_generations g
     WHERE g.family = 'ingress_idempotency_keys' AND g.began_at IS NOT NULL
       AND g.ended_at IS NULL;
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT x.*, gen_random_uuid() AS id
          FROM unnest(tenants, idempotency_keys, fingerprints, queues, targets,
                      traceparents, tracestates)
               WITH ORDINALITY AS x(tenant, idempotency_key, fingerprint, queue, targets,
                                    traceparent, tracestate, n)),
    written AS (
        INSERT INTO ingress_idempotency_keys AS w
               (generation, tenant, idempotency_key, fingerprint, message_id)
        SELECT key_generation, i.tenant, i.idempotency_key, i.fingerprint, i.id
          FROM input i
          LEFT JOIN LATERAL (
              SELECT 1 AS found FROM ingress_idempotency_keys o
               WHERE o.generation < key_generation
                 AND o.tenant = i.tenant AND o.idempotency_key = i.idempotency_key
               LIMIT 1) AS older ON true
         WHERE older.found IS NULL
         ORDER BY i.n
        ON CONFLICT DO NOTHING
        RETURNING w.message_id),
    message AS (
        INSERT INTO ingress_messages (id, tenant, queue, targets, status)
        SELECT i.id, i.tenant, i.queue, i.targets, 'queued'
          FROM input i JOIN written w ON w.message_id = i.id),
    job AS (
        INSERT INTO outbox (queue, tenant, message_id, headers, body)
        SELECT i.queue, i.tenant, job_prefix || i.id || p.suffix,
               jsonb_strip_nulls(jsonb_build_object(ingress_header, i.id::text,
                   'traceparent', i.traceparent, 'tracestate', i.tracestate)), p.body
          FROM input i JOIN written w ON w.message_id = i.id
          JOIN unnest(job_n, job_suffixes, job_bodies) AS p(n, suffix, body) ON p.n = i.n)
    SELECT w.message_id IS NOT NULL, k.fingerprint, coalesce(w.message_id, k.message_id)
      FROM input i
      LEFT JOIN written w ON w.message_id = i.id
      LEFT JOIN LATERAL (
          SELECT s.fingerprint, s.message_id FROM ingress_idempotency_keys s
           WHERE s.tenant = i.tenant AND s.idempotency_key = i.idempotency_key
             AND w.message_id IS NULL
           LIMIT 1 FOR KEY SHARE) AS k ON true
     ORDER BY i.n;
END
$$;
