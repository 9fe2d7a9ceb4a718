-- The operator console (package console): its tokens and its audit of every action.

-- A token is shown once when made; only its SHA-256 is kept. Two roles: `read`
-- sees every page, `operator` may also replay and archive. Revoked tokens stay,
-- so the audit's `actor` keeps naming someone; a name has one live token at most.
CREATE TABLE IF NOT EXISTS console_tokens (
    token_hash bytea       PRIMARY KEY,
    name       text        NOT NULL,
    role       text        NOT NULL CHECK (role IN ('read', 'operator')),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- One row per intent: the key is made when the page with the button is
-- rendered, so a double click, a resubmitted form or two tabs submitting the
-- same page insert one row; only the request whose INSERT won acts.
CREATE TABLE IF NOT EXISTS console_actions (
    intent_key  text        PRIMARY KEY,
    action      text        NOT NULL CHECK (action IN ('replay', 'archive')),
    actor       text        NOT NULL,
    queue       text        NOT NULL,
    selection   text        NOT NULL,   -- the filters, as the operator gave them
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,            -- NULL: still running, or the console died mid-way
    error       text                    -- why it stopped, when it did not finish
);

-- What the action did to each message. Text columns hold escaped text
-- (a dead letter's id may carry a NUL, which a text column cannot).
CREATE TABLE IF NOT EXISTS console_action_messages (
    intent_key text        NOT NULL REFERENCES console_actions (intent_key),
    n          integer     NOT NULL,
    message_id text        NOT NULL,
    tenant     text        NOT NULL,
    reason     text        NOT NULL,
    outcome    text        NOT NULL,
    why        text        NOT NULL DEFAULT '',
    headers    text,                   -- archived messages: kept whole, escaped
    body       bytea,                  -- archived messages: the body as it was
    at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (intent_key, n)
);

CREATE UNIQUE INDEX IF NOT EXISTS console_tokens_live_name
    ON console_tokens (name) WHERE revoked_at IS NULL;
CREATE INDEX IF NOT EXISTS console_actions_started_at ON console_actions (started_at);
