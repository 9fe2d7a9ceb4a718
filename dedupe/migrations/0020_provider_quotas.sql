-- One row per provider quota the fleet keeps together (consumers.effects.quota): a
-- token bucket refilled by time, taken from in batches by every worker, and the
-- pause a provider asked for (a 429's Retry-After), which every worker honours.
--   name         the quota's name: a sender's quota_name (apns:<topic>) or name (fcm)
--   per_second   tokens added a second; burst: the most the bucket holds
--   tokens       what was left at refilled_at (refilled on each take)
--   paused_until no send to this provider before then (PostgreSQL's clock)
-- Updated in place many times a second: a low fillfactor keeps the updates HOT.
CREATE TABLE provider_quotas (
    name text PRIMARY KEY,
    per_second double precision NOT NULL CHECK (per_second > 0),
    burst double precision NOT NULL CHECK (burst >= 1),
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_until timestamptz
) WITH (fillfactor = 50);
