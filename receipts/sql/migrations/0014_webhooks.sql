-- Per-organization webhooks (receipts/webhooks.py, README "Webhooks"): an organization's
-- subscriptions, and the outbox of deliveries written in the transaction (or the one guarded
-- statement) of the receipt that causes each one.

-- A subscription. `secret` is the Standard Webhooks signing secret (`whsec_…`); it is kept
-- as written because the deliverer signs every post with it (an HMAC key cannot be hashed).
-- The API answers it only at create and rotate.
CREATE TABLE IF NOT EXISTS webhooks (
    webhook_id      text PRIMARY KEY,
    organization_id text        NOT NULL,
    url             text        NOT NULL,
    events          text[]      NOT NULL,
    description     text,
    secret          text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    secret_rotated_at timestamptz
);
-- A settle looks up its organization's subscriptions through this (none: one index probe).
CREATE INDEX IF NOT EXISTS webhooks_org_idx ON webhooks (organization_id, created_at, webhook_id);

-- One event owed to one subscription. `event_key` names the occurrence (a job's id: it settles
-- once; a wakeup's source id; an objective's id; a test's own id), so an occurrence written
-- twice is one delivery. `subject` is the job, agent job or objective it is about (retention
-- deletes the deliveries with it). `data` is the event's data when it was known at write time
-- (a wakeup, an objective, a test); a job's is read from the job when it is posted.
-- `claimed_until`: a deliverer is posting it (the per-organization in-flight count); a claim
-- whose deliverer died lapses and the row is due again.
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    delivery_id     bigserial PRIMARY KEY,
    webhook_id      text        NOT NULL REFERENCES webhooks (webhook_id) ON DELETE CASCADE,
    organization_id text        NOT NULL,
    event           text        NOT NULL,
    event_key       text        NOT NULL,
    subject         text        NOT NULL,
    data            jsonb,
    status          text        NOT NULL DEFAULT 'pending',
    tries           integer     NOT NULL DEFAULT 0,
    next_try_at     timestamptz NOT NULL DEFAULT now(),
    claimed_until   timestamptz,
    last_status_code integer,
    last_error      text,
    attempts        jsonb       NOT NULL DEFAULT '[]',
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    UNIQUE (webhook_id, event, event_key)
);
-- The deliverer's claim: an organization's due rows, soonest first (pending rows only).
CREATE INDEX IF NOT EXISTS webhook_deliveries_due_idx
    ON webhook_deliveries (organization_id, next_try_at) WHERE status = 'pending';
-- GET /webhooks/{id}/deliveries, newest first.
CREATE INDEX IF NOT EXISTS webhook_deliveries_list_idx
    ON webhook_deliveries (webhook_id, delivery_id DESC);
-- Retention deletes a pruned job's, agent job's or objective's deliveries.
CREATE INDEX IF NOT EXISTS webhook_deliveries_subject_idx ON webhook_deliveries (subject);
