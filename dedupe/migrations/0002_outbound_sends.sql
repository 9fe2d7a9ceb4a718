-- The send ledger: one row per (dedupe key, target) of a push job.
--   claimed -> sending -> sent | failed
-- `sending` carries a lease (owner, expiry by PostgreSQL's clock): while it is
-- live, another worker holding the same job must not send; once it expired,
-- the sender crashed mid-call and the outcome is unknown.
CREATE TABLE IF NOT EXISTS outbound_sends (
    consumer            text        NOT NULL,
    tenant              text        NOT NULL,
    message_id          text        NOT NULL,
    target_index        integer     NOT NULL,
    platform            text        NOT NULL,
    token               text        NOT NULL,
    apns_id             uuid        NOT NULL,
    collapse_id         text        NOT NULL,
    status              text        NOT NULL
        CHECK (status IN ('claimed', 'sending', 'sent', 'failed')),
    lease_owner         text,
    lease_expires_at    timestamptz,
    sends               integer     NOT NULL DEFAULT 0,  -- provider calls started
    provider_message_id text,
    failure_reason      text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, tenant, message_id, target_index)
);

CREATE INDEX IF NOT EXISTS outbound_sends_created_at
    ON outbound_sends USING brin (created_at);
