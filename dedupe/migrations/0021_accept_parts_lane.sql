-- The send API's parts of a large send go to the queue's bulk lane (issue 56):
-- accept_messages() takes, per message, the queue its parts are published to
-- (parts_queues; NULL, as a caller of the version before passes: the message's
-- own queue). The same function otherwise (0012); replaced in one transaction.
DROP FUNCTION accept_messages(
    text[], text[], bytea[], text[], int[], bigint[], text[], bytea[], text[], text[], text, text);

CREATE FUNCTION accept_messages(
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
        INSERT INTO ingress_messages (id, tenant, queue, targets, status)
        SELECT i.id, i.tenant, i.queue, i.targets, 'queued'
          FROM input i JOIN written w ON w.message_id = i.id),
    job AS (
        INSERT INTO outbox (queue, tenant, message_id, headers, body)
        SELECT CASE p.suffix WHEN '' THEN i.queue ELSE i.parts_queue END,
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
