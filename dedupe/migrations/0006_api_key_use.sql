-- When each API key was last used, to within the send API's key cache time:
-- the API writes it when it reads the key from this table, not on every request.
ALTER TABLE ingress_api_keys ADD COLUMN IF NOT EXISTS last_used_at timestamptz;
