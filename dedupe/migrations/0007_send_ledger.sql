-- The send ledger holds every external effect, not only pushes: a webhook call, an
-- e-mail, an API request are rows beside the devices of a push job.
--   channel      ios | android | web | webhook | email | an API channel's name
--   address      device token, subscription endpoint, webhook endpoint id, e-mail
--                address, API resource: whom the effect goes to
--   effect_id    the target's stable id: apns-id, webhook-id, Message-ID, Idempotency-Key
--   first_sent_at when the row was first leased to a sender: a channel that replays
--                by key within a window counts the window from here (never later
--                than the provider's own first sight of the key; rows written
--                before this column read created_at instead)
-- Renames and one nullable column: catalog changes, no table rewrite. Workers of
-- the version before must be stopped first (their statements name the old table).
ALTER TABLE outbound_sends RENAME TO send_ledger;
ALTER TABLE send_ledger RENAME COLUMN platform TO channel;
ALTER TABLE send_ledger RENAME COLUMN token TO address;
ALTER TABLE send_ledger RENAME COLUMN apns_id TO effect_id;
ALTER TABLE send_ledger ADD COLUMN first_sent_at timestamptz;
ALTER INDEX outbound_sends_pkey RENAME TO send_ledger_pkey;
ALTER INDEX outbound_sends_created_at RENAME TO send_ledger_created_at;
