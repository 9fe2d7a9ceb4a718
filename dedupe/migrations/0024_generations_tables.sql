-- Step 3 of 3: send_ledger, ingress_messages and outbox become tables
-- partitioned by generation, each table of steps 1 and 2 its generation 0
-- (attached as it is: its validated CHECK proves the bound, nothing is read).
-- Every statement here changes the catalog only; the renames' ACCESS
-- EXCLUSIVE locks last until this transaction commits, milliseconds, and give
-- up after lock_timeout.
--
-- Unlike the claims, no key of these tables must be unique across
-- generations by itself: a ledger row is written only for a job its claim
-- made new, messages and outbox rows get fresh ids. So a row goes to the
-- generation current when it is written (the column's default,
-- dedupe_generation() below, or named by the writer), and a generation is
-- dropped once it ended longer ago than retention, after moving to the current
-- generation the rows that must outlive it: a ledger row not yet `sent` or
-- `failed`, a message still `queued`, an outbox row not yet published
-- (dedupe/generations.py). Each generation has its own primary key; the
-- parents have no index. Generations made later also get a partial index on
-- the rows that must outlive them, so finding those reads no more than they
-- are; generation 0 (the table as it was) has none, and is read once, when
-- it is dropped.
SET LOCAL lock_timeout = '5s';

-- The generation `family`'s rows go to now (a column default). PL/pgSQL, whose
-- plan is kept for the session: a SQL function's would be made again for every
-- statement (so for every row an INSERT ... VALUES writes), twice the INSERT's cost.
-- Our own writers name the generation with a subquery read once a statement.
CREATE FUNCTION dedupe_generation(family text) RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (SELECT g.generation FROM dedupe_generations g
             WHERE g.family = dedupe_generation.family
               AND g.began_at IS NOT NULL AND g.ended_at IS NULL);
END
$$;

-- The send ledger.
ALTER TABLE send_ledger RENAME TO send_ledger_g0;
ALTER TABLE send_ledger_g0 RENAME CONSTRAINT send_ledger_pkey TO send_ledger_g0_pkey;
ALTER TABLE send_ledger_g0 RENAME CONSTRAINT outbound_sends_status_check TO send_ledger_status_check;
ALTER INDEX send_ledger_created_at RENAME TO send_ledger_g0_created_at;
CREATE TABLE send_ledger (LIKE send_ledger_g0 INCLUDING DEFAULTS)
    PARTITION BY LIST (generation);
ALTER TABLE send_ledger
    ALTER COLUMN generation SET DEFAULT dedupe_generation('send_ledger'),
    ADD CONSTRAINT send_ledger_status_check
        CHECK (status IN ('claimed', 'sending', 'sent', 'failed'));
ALTER TABLE send_ledger ATTACH PARTITION send_ledger_g0 FOR VALUES IN (0);
INSERT INTO dedupe_generations (family, generation, began_at) VALUES ('send_ledger', 0, now());

-- The send API's messages.
ALTER TABLE ingress_messages RENAME TO ingress_messages_g0;
ALTER TABLE ingress_messages_g0 RENAME CONSTRAINT ingress_messages_pkey TO ingress_messages_g0_pkey;
ALTER INDEX ingress_messages_created_at RENAME TO ingress_messages_g0_created_at;
CREATE TABLE ingress_messages (LIKE ingress_messages_g0 INCLUDING DEFAULTS)
    PARTITION BY LIST (generation);
ALTER TABLE ingress_messages
    ALTER COLUMN generation SET DEFAULT dedupe_generation('ingress_messages'),
    ADD CONSTRAINT ingress_messages_status_check
        CHECK (status IN ('queued', 'taken', 'cancelled'));
ALTER TABLE ingress_messages ATTACH PARTITION ingress_messages_g0 FOR VALUES IN (0);
INSERT INTO dedupe_generations (family, generation, began_at)
    VALUES ('ingress_messages', 0, now());

-- The outbox: the parent numbers new rows, from where the old table's numbers end.
ALTER TABLE outbox RENAME TO outbox_g0;
ALTER TABLE outbox_g0 RENAME CONSTRAINT outbox_pkey TO outbox_g0_pkey;
ALTER INDEX outbox_created_at RENAME TO outbox_g0_created_at;
ALTER INDEX outbox_pending RENAME TO outbox_g0_pending;
DROP TRIGGER outbox_notify ON outbox_g0;
CREATE TABLE outbox (LIKE outbox_g0 INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING CONSTRAINTS)
    PARTITION BY LIST (generation);
ALTER TABLE outbox
    ALTER COLUMN generation SET DEFAULT dedupe_generation('outbox'),
    DROP CONSTRAINT outbox_generation_0;
SELECT setval(pg_get_serial_sequence('outbox', 'id'),
              greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence('outbox_g0', 'id')::regclass), 0),
                       coalesce((SELECT max(id) FROM outbox_g0), 0)) + 1, false);
ALTER TABLE outbox ATTACH PARTITION outbox_g0 FOR VALUES IN (0);
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
INSERT INTO dedupe_generations (family, generation, began_at) VALUES ('outbox', 0, now());

-- accept_messages() (0021) names the generations of the rows it writes: the
-- default would look them up once a row. The same function otherwise.
CREATE OR REPLACE FUNCTION accept_messages(
    tenants text[], idempotency_keys text[], fingerprints bytea[], queues text[],
    targets int[], job_n bigint[], job_suffixes text[], job_bodies bytea[],
    traceparents text[], tracestates text[], job_prefix text, ingress_header text,
    parts_queues text[] DEFAULT NULL
) RETURNS TABLE (won boolean, fingerprint bytea, message_id uuid)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    key_generation integer;
    message_generation integer;
    job_generation integer;
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
    message_generation := dedupe_generation('ingress_messages');
    job_generation := dedupe_generation('outbox');
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT x.*, gen_random_uuid() AS id
          FROM unnest(tenants, idempotency_keys, fingerprints, queues, targets,
                      traceparents, tracestates, coalesce(parts_queues, queues))
               WITH ORDINALITY AS x(tenant, idempotency_key, fingerprint, queue, targets,
                                    traceparent, tracestate, parts_queue, n)),
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
        INSERT INTO ingress_messages (generation, id, tenant, queue, targets, status)
        SELECT message_generation, i.id, i.tenant, i.queue, i.targets, 'queued'
          FROM input i JOIN written w ON w.message_id = i.id),
    job AS (
        INSERT INTO outbox (generation, queue, tenant, message_id, headers, body)
        SELECT job_generation, CASE p.suffix WHEN '' THEN i.queue ELSE i.parts_queue END,
               i.tenant, job_prefix || i.id || p.suffix,
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
