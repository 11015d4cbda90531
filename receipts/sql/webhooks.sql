-- Per-organization webhooks and their delivery outbox (migrations/0014_webhooks.sql,
-- receipts/webhooks.py).

-- name: webhook_owed_job
-- A job settled now: one delivery per subscription of its organization to `job.<status>`,
-- in the statement that settles it (append_job includes this; guarded.sql writes the same
-- under its guard). No subscription: one probe of webhooks_org_idx, nothing written.
-- `FOR KEY SHARE OF w` (here and in every statement owing a delivery): a subscription being
-- deleted as this reads it (still in this statement's snapshot, its row locked by the delete)
-- is waited for and, once the delete commits, skipped. Read without the lock, its delivery was
-- inserted anyway and the foreign key refused it: the settle itself failed (a StorageError the
-- worker does not retry), because the organization deleted a webhook at that moment.
INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, subject)
SELECT w.webhook_id, w.organization_id, 'job.' || %(status)s::text, %(job_id)s, %(job_id)s
FROM webhooks w
WHERE %(settled)s AND w.organization_id = %(organization_id)s
  AND ('job.' || %(status)s::text) = ANY (w.events)
FOR KEY SHARE OF w
ON CONFLICT (webhook_id, event, event_key) DO NOTHING

-- name: webhook_owed_event
-- Any other event of an organization (a wakeup, an objective settled), in the caller's
-- transaction: one delivery per subscription to it, with its data.
INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, subject, data)
SELECT w.webhook_id, w.organization_id, %(event)s, %(event_key)s, %(subject)s, %(data)s
FROM webhooks w
WHERE w.organization_id = %(organization_id)s AND %(event)s = ANY (w.events)
FOR KEY SHARE OF w
ON CONFLICT (webhook_id, event, event_key) DO NOTHING;

-- name: webhook_owed_test
-- `POST /webhooks/{id}/test`: one `webhook.test` delivery to this subscription only.
INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, subject, data)
SELECT w.webhook_id, w.organization_id, 'webhook.test', %(event_key)s, w.webhook_id, %(data)s
FROM webhooks w WHERE w.webhook_id = %(webhook_id)s
FOR KEY SHARE OF w
RETURNING delivery_id, created_at;

-- name: webhook_org_lock
-- Creates of one organization one at a time, so its cap holds (transaction-scoped).
SELECT pg_advisory_xact_lock(hashtextextended('webhooks:' || %(organization_id)s, 0));

-- name: webhook_count
SELECT count(*) FROM webhooks WHERE organization_id = %(organization_id)s;

-- name: webhook_insert
INSERT INTO webhooks (webhook_id, organization_id, url, events, description, secret)
VALUES (%(webhook_id)s, %(organization_id)s, %(url)s, %(events)s, %(description)s, %(secret)s)
RETURNING webhook_id, organization_id, url, events, description, created_at, secret_rotated_at,
       delivery_key;

-- name: webhook_keyed
-- A create sent again under its Idempotency-Key: the subscription it made, with its secret.
SELECT webhook_id, organization_id, url, events, description, created_at, secret_rotated_at,
       delivery_key, secret
FROM webhooks WHERE webhook_id = %(webhook_id)s AND organization_id = %(organization_id)s;

-- name: webhook_get
SELECT webhook_id, organization_id, url, events, description, created_at, secret_rotated_at,
       delivery_key
FROM webhooks WHERE webhook_id = %(webhook_id)s;

-- name: webhooks_page
-- Newest first, after the keyset cursor; one organization's, or every one's for an admin.
SELECT webhook_id, organization_id, url, events, description, created_at, secret_rotated_at,
       delivery_key
FROM webhooks
WHERE (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, webhook_id) < (%(after_at)s::timestamptz, %(after_key)s::text))
ORDER BY created_at DESC, webhook_id DESC
LIMIT %(limit)s;

-- name: webhook_delete
DELETE FROM webhooks WHERE webhook_id = %(webhook_id)s RETURNING webhook_id;

-- name: webhook_rotate
UPDATE webhooks SET secret = %(secret)s, secret_rotated_at = now()
WHERE webhook_id = %(webhook_id)s
RETURNING webhook_id, organization_id, url, events, description, created_at, secret_rotated_at,
       delivery_key;

-- name: webhook_deliveries_page
-- A subscription's deliveries, newest first, after the keyset cursor.
SELECT delivery_id, event, event_key, subject, status, tries, next_try_at, claimed_until,
       last_status_code, last_error, attempts, created_at, finished_at
FROM webhook_deliveries
WHERE webhook_id = %(webhook_id)s
  AND (%(after_id)s::bigint IS NULL OR delivery_id < %(after_id)s::bigint)
ORDER BY delivery_id DESC
LIMIT %(limit)s;

-- name: webhook_deliveries_claim
-- The deliverer's claim: for each organization with a subscription, its soonest due rows, as
-- many as its in-flight cap leaves (rows another deliverer claimed and has not finished count
-- against it), locked SKIP LOCKED and marked claimed until `lease_ms` from now (a deliverer
-- that dies lets its claims lapse). At most `limit` in all, taken round-robin across the
-- organizations (each one's first, then each one's second, …, ties in random order): one
-- organization's backlog takes only its own share, and however many organizations have one,
-- none is left out (a plain LIMIT over the organizations in the planner's order served the
-- same first few every pass).
WITH orgs AS (
    SELECT DISTINCT organization_id FROM webhooks
), due AS (
    SELECT orgs.organization_id, p.delivery_id, p.next_try_at FROM orgs, LATERAL (
        SELECT d.delivery_id, d.next_try_at FROM webhook_deliveries d
        WHERE d.organization_id = orgs.organization_id AND d.status = 'pending'
          AND d.next_try_at <= now()
        ORDER BY d.next_try_at, d.delivery_id
        LIMIT greatest(%(per_org)s - (
            SELECT count(*) FROM webhook_deliveries f
            WHERE f.organization_id = orgs.organization_id AND f.status = 'pending'
              AND f.claimed_until > now()), 0)
        FOR UPDATE OF d SKIP LOCKED
    ) p
), picked AS (
    SELECT delivery_id FROM due
    ORDER BY row_number() OVER (PARTITION BY organization_id ORDER BY next_try_at, delivery_id),
             random()
    LIMIT %(limit)s
)
UPDATE webhook_deliveries d SET
    claimed_until = now() + make_interval(secs => %(lease_ms)s / 1000.0),
    next_try_at = now() + make_interval(secs => %(lease_ms)s / 1000.0)
FROM picked, webhooks w
WHERE d.delivery_id = picked.delivery_id AND w.webhook_id = d.webhook_id
RETURNING d.delivery_id, d.webhook_id, d.organization_id, d.event, d.event_key, d.subject,
          d.data, d.tries, d.created_at, w.url, now(), d.claimed_until;

-- name: webhook_delivery_secret
-- The secret to sign a claimed delivery's post with, read just before the post, under the
-- claim's fence: none when the subscription was deleted since the claim (its deliveries went
-- with it) or the claim lapsed to another deliverer. The claim's own read of it is as old as
-- the claim: a rotation in between signed the post with the old secret.
SELECT w.secret FROM webhook_deliveries d JOIN webhooks w ON w.webhook_id = d.webhook_id
WHERE d.delivery_id = %(delivery_id)s AND d.status = 'pending'
  AND d.claimed_until = %(claimed_until)s;

-- name: webhook_delivery_record
-- One try's outcome: `status` 'delivered', 'failed' (given up) or 'pending' (tried again at
-- `retry_ms` from now); the try is appended to `attempts`. Only under the claim it was made
-- under: `claimed_until` is the claim's fence (a try that outlived its claim, which another
-- deliverer then took, must not clear that claim nor record over its try).
UPDATE webhook_deliveries SET
    status = %(status)s,
    tries = tries + 1,
    claimed_until = NULL,
    next_try_at = CASE WHEN %(status)s = 'pending'
                       THEN now() + make_interval(secs => %(retry_ms)s / 1000.0)
                       ELSE next_try_at END,
    last_status_code = %(status_code)s,
    last_error = %(error)s,
    attempts = attempts || jsonb_build_array(jsonb_build_object(
        'at', now(), 'statusCode', %(status_code)s::integer, 'error', %(error)s::text,
        'durationMs', %(duration_ms)s::integer)),
    finished_at = CASE WHEN %(status)s = 'pending' THEN NULL ELSE now() END
WHERE delivery_id = %(delivery_id)s
  -- A late try (its claim lapsed and another finished it) never reopens a finished delivery.
  AND status = 'pending'
  AND claimed_until = %(claimed_until)s
RETURNING next_try_at;

-- name: webhook_delivery_tried
-- A delivery as it stands, read after a try's record lost its answer (it may have been made):
-- its status, its claim, its next try and the database clock.
SELECT status, claimed_until, next_try_at, now() FROM webhook_deliveries
WHERE delivery_id = %(delivery_id)s;

-- name: webhook_job_state
-- A job's folded state, for the body of its event's delivery.
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = %(job_id)s;

-- Retention (receipts/retention.py): a pruned job's, agent job's or objective's deliveries go
-- with it. None of them is pending then: retention keeps a subject while one is (retention.sql).
-- A job and an objective of one organization may share a runtime id (`<id>~<tag>`): each
-- statement names its subject's events too, so neither takes the other's deliveries.

-- name: prune_webhook_deliveries
DELETE FROM webhook_deliveries
WHERE subject = ANY (%(job_ids)s::text[]) AND event LIKE 'job.%%';

-- name: count_webhook_deliveries
SELECT count(*) FROM webhook_deliveries
WHERE subject = ANY (%(job_ids)s::text[]) AND event LIKE 'job.%%';

-- name: prune_agent_webhook_deliveries
DELETE FROM webhook_deliveries
WHERE subject = ANY (%(agent_job_ids)s::text[]) AND event = 'session.wakeup';

-- name: count_agent_webhook_deliveries
SELECT count(*) FROM webhook_deliveries
WHERE subject = ANY (%(agent_job_ids)s::text[]) AND event = 'session.wakeup';

-- name: prune_objective_webhook_deliveries
DELETE FROM webhook_deliveries
WHERE subject = ANY (%(objective_ids)s::text[]) AND event = 'objective.settled';

-- name: count_objective_webhook_deliveries
SELECT count(*) FROM webhook_deliveries
WHERE subject = ANY (%(objective_ids)s::text[]) AND event = 'objective.settled';
