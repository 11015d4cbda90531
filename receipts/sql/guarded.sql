-- A fenced state change in one statement, outside any transaction (receipts/guarded.py): the
-- writer read the job with the database clock (`job_get_with_now`), decided, and folded the
-- receipts in Python — the one reducer — and this statement applies what it decided only if
-- the job is still as read. `guard` locks the job's row and holds it when its stream's head is
-- still `expected_seq` and, with `lease_held`, the lease the writer's fence was checked against
-- has not expired at this statement's clock. Every write below is conditioned on `guard`; when
-- it is empty nothing is written and the first column is NULL. An append that commits after
-- this statement's snapshot and before its lock either changed the row (the lock re-reads it,
-- and the head no longer matches) or only the lease row — then its receipt holds the next seq
-- and the insert fails on the receipts' primary key: nothing is written either way.

-- name: job_guard
SELECT j.job_id FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = %(job_id)s
  AND CASE WHEN l.seq > j.seq THEN l.seq ELSE j.seq END = %(expected_seq)s
  AND (NOT %(lease_held)s
       OR CASE WHEN l.seq > j.seq THEN l.expires_at ELSE j.lease_expires_at END > now())
FOR UPDATE OF j

-- name: insert_receipts_guarded
-- The receipts at the clock the writer decided with (`recorded_at`): the fold that wrote the
-- projection used it, so a rebuild from the chain folds the same state.
INSERT INTO receipts (stream, seq, type, data, recorded_at)
SELECT %(stream)s, u.seq, u.type, u.data, %(recorded_at)s
FROM unnest(%(seqs)s::integer[], %(types)b::text[], %(datas)b::jsonb[]) AS u(seq, type, data)
WHERE EXISTS (SELECT 1 FROM guard)
RETURNING position, seq

-- name: append_job_guarded
-- `append_job` under the guard, for a job that exists (an update, never an insert).
WITH guard AS (
    -- include: job_guard
), inserted AS (
    -- include: insert_receipts_guarded
), projected AS (
    UPDATE jobs SET
        seq = %(seq)s, status = %(status)s, attempt = %(attempt)s,
        abort_requested = %(abort_requested)s, available_at = %(available_at)s,
        lease_expires_at = %(lease_expires_at)s, last_heartbeat_at = %(last_heartbeat_at)s,
        updated_at = %(updated_at)s, state = %(state)s, worker_queue = %(worker_queue)s
    WHERE job_id = (SELECT job_id FROM guard)
    RETURNING 1
), lease_ended AS (
    DELETE FROM job_leases WHERE %(lease_ended)s AND job_id = (SELECT job_id FROM guard)
), slot_freed AS (
    DELETE FROM dispatch_slots WHERE %(settled)s AND job_id = (SELECT job_id FROM guard)
), owed AS (
    INSERT INTO callback_outbox (job_id, event)
    SELECT %(job_id)s, %(status)s WHERE %(owed)s AND EXISTS (SELECT 1 FROM guard)
    ON CONFLICT (job_id) DO NOTHING
), hooked AS (
    -- `webhook_owed_job` (receipts/sql/webhooks.sql) under the guard: a refused settle owes
    -- no webhook delivery; a subscription deleted as it settles is skipped, not a failed
    -- settle (webhooks.sql: FOR KEY SHARE).
    INSERT INTO webhook_deliveries (webhook_id, organization_id, event, event_key, subject)
    SELECT w.webhook_id, w.organization_id, 'job.' || %(status)s::text, %(job_id)s, %(job_id)s
    FROM webhooks w
    WHERE %(settled)s AND EXISTS (SELECT 1 FROM guard)
      AND w.organization_id = %(organization_id)s
      AND ('job.' || %(status)s::text) = ANY (w.events)
    FOR KEY SHARE OF w
    ON CONFLICT (webhook_id, event, event_key) DO NOTHING
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM projected),
       (SELECT count(*) FROM (SELECT pg_notify(c, %(note)s) FROM unnest(%(channels)s::text[]) AS c
                              WHERE EXISTS (SELECT 1 FROM guard)) AS sent);

-- name: append_job_heartbeat_guarded
-- `append_job_heartbeat` under the guard: the receipts and the narrow lease row.
WITH guard AS (
    -- include: job_guard
), inserted AS (
    -- include: insert_receipts_guarded
), leased AS (
    INSERT INTO job_leases (job_id, seq, expires_at, patch)
    SELECT %(job_id)s, %(seq)s, %(lease_expires_at)s, %(patch)s
    WHERE EXISTS (SELECT 1 FROM guard)
    ON CONFLICT (job_id) DO UPDATE SET
        seq = EXCLUDED.seq, expires_at = EXCLUDED.expires_at, patch = EXCLUDED.patch
    RETURNING 1
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM leased),
       (SELECT count(*) FROM (SELECT pg_notify(c, %(note)s) FROM unnest(%(channels)s::text[]) AS c
                              WHERE EXISTS (SELECT 1 FROM guard)) AS sent);
