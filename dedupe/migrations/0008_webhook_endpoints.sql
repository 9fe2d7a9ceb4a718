-- Webhook endpoints per tenant, and their signing secrets.
--   webhook_endpoints  id (ep_<random>), the tenant it belongs to, its URL, the event
--                      types it takes (empty: every one); disabled_at and its reason
--                      when an operator disabled it or it answered 410 Gone
--   webhook_secrets    the endpoint's `whsec_` secrets, encrypted (a Fernet token
--                      under IW_WEBHOOK_SECRETS_KEY): a secret must stay usable for
--                      signing, so it is not hashed. `prefix` is all that is ever
--                      shown again. expires_at NULL: current; a rotation sets the old
--                      one's, and it signs beside the new one until then.
CREATE TABLE IF NOT EXISTS webhook_endpoints (
    id              text        PRIMARY KEY,
    tenant          text        NOT NULL,
    url             text        NOT NULL,
    event_types     text[]      NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    disabled_at     timestamptz,
    disabled_reason text,
    CHECK ((disabled_at IS NULL) = (disabled_reason IS NULL))
);

-- A job's recipients: the tenant's enabled endpoints, one statement per claim.
CREATE INDEX IF NOT EXISTS webhook_endpoints_enabled
    ON webhook_endpoints (tenant, created_at) WHERE disabled_at IS NULL;

CREATE TABLE IF NOT EXISTS webhook_secrets (
    id          bigserial   PRIMARY KEY,
    endpoint_id text        NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    prefix      text        NOT NULL,
    ciphertext  bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz
);

CREATE INDEX IF NOT EXISTS webhook_secrets_endpoint ON webhook_secrets (endpoint_id);
