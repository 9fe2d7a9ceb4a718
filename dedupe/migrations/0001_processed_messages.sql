-- The inbox: one row per dedupe key that has been claimed and committed.
-- The primary key decides races between workers; the fingerprint tells a
-- duplicate (same body) from a reused message_id (another body).
CREATE TABLE IF NOT EXISTS processed_messages (
    consumer     text        NOT NULL,
    tenant       text        NOT NULL,
    message_id   text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, tenant, message_id)
);

-- Retention deletes by age in bounded batches; a BRIN index costs next to
-- nothing on insert, and rows arrive in time order.
CREATE INDEX IF NOT EXISTS processed_messages_processed_at
    ON processed_messages USING brin (processed_at);
