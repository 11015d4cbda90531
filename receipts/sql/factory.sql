-- Factory (objectives) statements. Every scan reads the `objectives` projection (migration
-- 0004) and the jobs projection's indexes; none scans `receipts` by stream prefix.

-- name: objective_get
SELECT state FROM objectives WHERE objective_id = %(objective_id)s;

-- name: objectives_by_caller_id
-- The objectives an admin may mean by an organization's own id (`<id>` of `<id>~<tag>`, or an
-- unscoped id): two rows tell "one" from "ambiguous" (objectives_caller_id_idx, 0024).
SELECT objective_id FROM objectives
WHERE split_part(objective_id, '~', 1) = %(objective_id)s::text
ORDER BY objective_id
LIMIT 2;

-- name: objective_get_for_update
-- A writer's read, under its stream lock: the row lock waits out a rebuild's table lock (a plain
-- read does not, and a writer that read before the rebuild wrote its stale state back after it).
SELECT state FROM objectives WHERE objective_id = %(objective_id)s FOR NO KEY UPDATE;

-- name: objective_lock_if_exists
-- The objective stream's lock (`key`, as `lock_key` takes it), taken only when the objective
-- exists: one round trip, and a job naming an objective that does not exist (a standalone
-- job's made-up id) waits on nobody's lock. Its state is read after, under the lock.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))
FROM objectives WHERE objective_id = %(objective_id)s;

-- name: objective_upsert
-- Callers hold the objective stream's lock: the row always follows the stream's head.
INSERT INTO objectives (
    objective_id, organization_id, seq, status, phase, title, control_requested_seq,
    control_delivered_seq, reconciled_seq, created_at, updated_at, state
) VALUES (
    %(objective_id)s, %(organization_id)s, %(seq)s, %(status)s, %(phase)s, %(title)s,
    %(control_requested_seq)s, %(control_delivered_seq)s, %(reconciled_seq)s, %(created_at)s,
    %(updated_at)s, %(state)s
)
ON CONFLICT (objective_id) DO UPDATE SET
    seq = EXCLUDED.seq,
    status = EXCLUDED.status,
    phase = EXCLUDED.phase,
    title = EXCLUDED.title,
    control_requested_seq = EXCLUDED.control_requested_seq,
    control_delivered_seq = EXCLUDED.control_delivered_seq,
    reconciled_seq = EXCLUDED.reconciled_seq,
    updated_at = EXCLUDED.updated_at,
    state = EXCLUDED.state;

-- name: objective_outbox
-- Objectives owing a control pass: a request not yet handed to a control job, or an active
-- objective with a request no pass covered and no control job left to cover it (the one it
-- was handed to died or finished first). The session index answers the NOT EXISTS.
SELECT o.objective_id
FROM objectives o
WHERE o.control_pending
   OR (o.status = 'active'
       AND o.control_requested_seq > o.reconciled_seq
       AND NOT EXISTS (
           SELECT 1 FROM jobs j
           WHERE j.organization_id = o.organization_id
             AND j.session_key = 'objective:' || o.objective_id
             AND j.status IN ('queued', 'leased', 'running')))
ORDER BY o.updated_at
LIMIT %(limit)s;

-- name: objectives_audit_lost
-- Settled objectives whose audit job ended without auditing them (failed its attempts, or
-- aborted): no audit job will come again (objectives_audit_owed_idx, then each one's job).
SELECT o.objective_id, j.status
FROM objectives o JOIN jobs j ON j.job_id = o.state ->> 'auditJobId'
WHERE o.status <> 'active' AND o.state ->> 'auditJobId' IS NOT NULL
  AND o.state ->> 'audit' IS NULL
  AND j.status IN ('failed', 'canceled')
ORDER BY o.updated_at, o.objective_id
LIMIT %(limit)s;

-- name: objectives_active
-- Active objectives, the oldest-updated first, a window of `limit` of them: window `tick`
-- modulo their number of windows (the watchdog's tick; objectives_active_idx), in one read.
SELECT state, now() FROM objectives
WHERE status = 'active'
ORDER BY updated_at, objective_id
LIMIT %(limit)s
OFFSET (SELECT (mod(%(tick)s::numeric, greatest(1, ceil(count(*)::numeric / %(limit)s)))
                * %(limit)s)::bigint
        FROM objectives WHERE status = 'active');

-- name: objective_resume_candidates
-- Active objectives with no request outstanding and no active control job.
SELECT o.objective_id
FROM objectives o
WHERE o.status = 'active'
  AND o.control_requested_seq <= o.reconciled_seq
  AND NOT EXISTS (
      SELECT 1 FROM jobs j
      WHERE j.organization_id = o.organization_id
        AND j.session_key = 'objective:' || o.objective_id
        AND j.status IN ('queued', 'leased', 'running'))
ORDER BY o.updated_at
LIMIT %(limit)s;

-- name: objective_phase_added_by
-- The phase a `factory.dispatch` job added to the objective, if it added one: a redelivery of
-- that job, refused a second phase, reports it. Read only then; the stream's (stream, seq)
-- index bounds the scan to the objective's receipts.
SELECT (data ->> 'phase')::int FROM receipts
WHERE stream = %(stream)s AND type = 'objective.phase_added' AND data ->> 'jobId' = %(job_id)s
ORDER BY seq
LIMIT 1;

-- name: jobs_by_ids
-- Their folded states, the heartbeats in their lease rows (job_leases) taken in as every read of
-- a job takes them: the watchdog judges a job stale or stalled by its last heartbeat, lease
-- and update time, which a plain heartbeat writes only there.
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = ANY(%(job_ids)s::text[]);

-- name: job_statuses
-- The status of each of these jobs, not its state (a task's try holds its input, its output's
-- tail and its result: an objective's view read up to a thousand of them for their status).
SELECT job_id, status FROM jobs WHERE job_id = ANY(%(job_ids)s::text[]);

-- name: active_control_jobs
-- Active control jobs of these objectives (one row per objective that has one).
SELECT DISTINCT j.session_key
FROM jobs j
JOIN unnest(%(organization_ids)s::text[], %(session_keys)s::text[]) AS k(organization_id, session_key)
  ON j.organization_id = k.organization_id AND j.session_key = k.session_key
WHERE j.status IN ('queued', 'leased', 'running');

-- name: api_list_objectives
-- One page of objectives, newest first, keyset-paginated on (created_at, objective_id): each
-- one's summary (`ObjectiveSummary`), counted here. The whole state of up to 500 objectives of
-- 1 000 tasks each was read and validated to show two numbers of each.
SELECT objective_id, organization_id, title, status, phase,
       COALESCE(jsonb_array_length(state -> 'tasks'), 0),
       (SELECT count(*) FROM jsonb_array_elements(state -> 'tasks') AS t
        WHERE t ->> 'status' = 'completed'),
       state ->> 'error', created_at, updated_at
FROM objectives
WHERE (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
  AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (created_at, objective_id)
          < (%(before_created_at)s::timestamptz, %(before_objective_id)s::text))
ORDER BY created_at DESC, objective_id DESC
LIMIT %(limit)s;

-- name: objectives_lock
LOCK TABLE objectives IN EXCLUSIVE MODE;

-- name: objectives_clear
DELETE FROM objectives;

-- name: objectives_states
SELECT objective_id, state FROM objectives WHERE objective_id = ANY(%(keys)s::text[]);

-- name: objectives_unchained
SELECT objective_id FROM objectives t
WHERE NOT EXISTS (SELECT 1 FROM receipts r WHERE r.stream = %(prefix)s || t.objective_id);
