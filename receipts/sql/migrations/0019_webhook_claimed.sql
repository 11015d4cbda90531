-- The deliverer's claim counts each organization's deliveries in flight (claimed, not yet
-- recorded: `claimed_until` set, cleared by the try's record). This index holds only those, so
-- the count reads a handful of rows, not every pending delivery of an organization with a day's
-- backlog at a dead endpoint (a full read of them, every second, on every driver, under the
-- claim's one lock).
CREATE INDEX IF NOT EXISTS webhook_deliveries_claimed_idx
    ON webhook_deliveries (organization_id, claimed_until)
    WHERE status = 'pending' AND claimed_until IS NOT NULL;
