-- The HTTP send API (package ingress): API keys, idempotency keys, messages.

-- A key is shown once when made; only its SHA-256 is kept. One key, one tenant.
CREATE TABLE IF NOT EXISTS ingress_api_keys (
    key_hash   bytea       PRIMARY KEY,
    tenant     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One row per accepted send.  queued -> taken (a push worker claimed it)
--                                 queued -> cancelled (POST .../cancel)
-- Both moves are compare-and-sets on `status`: exactly one of them wins.
CREATE TABLE IF NOT EXISTS ingress_messages (
    id         uuid        PRIMARY KEY,
    tenant     text        NOT NULL,
    queue      text        NOT NULL,   -- the push queue the outbox row goes to
    targets    integer     NOT NULL,   -- devices of the job, after folding repeats
    status     text        NOT NULL CHECK (status IN ('queued', 'taken', 'cancelled')),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The idempotency keys, scoped per tenant. The primary key decides two
-- identical requests at once: the second waits on it, then reads the first's
-- message id. The fingerprint tells a replay from a reused key.
CREATE TABLE IF NOT EXISTS ingress_idempotency_keys (
    tenant          text        NOT NULL,
    idempotency_key text        NOT NULL,
    fingerprint     bytea       NOT NULL,
    message_id      uuid        NOT NULL,   -- ingress_messages.id, written in the same transaction
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, idempotency_key)
);

CREATE INDEX IF NOT EXISTS ingress_messages_created_at
    ON ingress_messages USING brin (created_at);
CREATE INDEX IF NOT EXISTS ingress_idempotency_keys_created_at
    ON ingress_idempotency_keys USING brin (created_at);
