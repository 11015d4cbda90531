-- Statements of the HTTP API (roles/api.py). Parameters are psycopg %(name)s.

-- name: api_list_jobs
-- One page of jobs, newest first, keyset-paginated on (created_at, job_id). A NULL filter
-- matches everything; `all_organizations` is true only for admin callers, every other caller
-- sees exactly its own organization.
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE (%(all_organizations)s::boolean OR j.organization_id = %(caller_organization_id)s::text)
  AND (%(organization_id)s::text IS NULL OR j.organization_id = %(organization_id)s::text)
  AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(agent_id)s::text IS NULL OR j.agent_id = %(agent_id)s::text)
  AND (%(lane)s::text IS NULL OR j.lane = %(lane)s::text)
  AND (%(session_key)s::text IS NULL OR j.session_key = %(session_key)s::text)
  AND (%(kind)s::text IS NULL OR j.kind = %(kind)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (j.created_at, j.job_id) < (%(before_created_at)s::timestamptz, %(before_job_id)s::text))
ORDER BY j.created_at DESC, j.job_id DESC
LIMIT %(limit)s;


-- name: enqueue_caps
-- The database clock and an organization's queued jobs and its active ones (queued, leased,
-- running), read before an enqueue to apply the per-organization caps: the sum of its counter
-- slots (org_open_jobs, migration 0009), at most 16 rows however deep its queue. With no
-- organization, the clock and zeros.
SELECT now(), coalesce(sum(queued), 0)::bigint AS queued, coalesce(sum(active), 0)::bigint AS active
FROM org_open_jobs
WHERE organization_id = %(organization_id)s::text;

-- name: enqueue_new
-- A new job (a made-up id, no session key) in one statement outside a transaction
-- (receipts/enqueue.py `enqueue_new`): its `job.enqueued` receipt, recorded at the clock the
-- caller read and folded with, and its projection row, written only if the organization
-- (`cap_organization_id`, none: no caps) still holds fewer than `max_queued` queued and
-- `max_active` active jobs at this statement's time; else nothing, and the first column is NULL.
WITH guard AS (
    SELECT 1 FROM org_open_jobs
    WHERE organization_id = %(cap_organization_id)s::text
    HAVING %(cap_organization_id)s::text IS NULL
        OR (coalesce(sum(queued), 0) < %(max_queued)s AND coalesce(sum(active), 0) < %(max_active)s)
), inserted AS (
    -- include: insert_receipts_guarded
), projected AS (
    INSERT INTO jobs (job_id, seq, organization_id, session_key, agent_id, lane, kind, status,
                      attempt, max_attempts, abort_requested, available_at, lease_expires_at,
                      last_heartbeat_at, created_at, updated_at, state, worker_queue)
    SELECT %(job_id)s, %(seq)s, %(organization_id)s, %(session_key)s, %(agent_id)s, %(lane)s,
           %(kind)s, %(status)s, %(attempt)s, %(max_attempts)s, %(abort_requested)s,
           %(available_at)s, %(lease_expires_at)s, %(last_heartbeat_at)s, %(created_at)s,
           %(updated_at)s, %(state)s, %(worker_queue)s
    WHERE EXISTS (SELECT 1 FROM guard)
    RETURNING 1
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM projected),
       (SELECT count(*) FROM (SELECT pg_notify(c, %(note)s) FROM unnest(%(channels)s::text[]) AS c
                              WHERE EXISTS (SELECT 1 FROM guard)) AS sent);

-- name: api_jobs_by_caller_id
-- The jobs an admin may mean by an organization's own id (`<id>` of `<id>~<tag>`, or an
-- unscoped id): two rows are enough to tell "one" from "ambiguous" (jobs_caller_id_idx, 0006).
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE split_part(j.job_id, '~', 1) = %(job_id)s::text
ORDER BY j.job_id
LIMIT 2;
