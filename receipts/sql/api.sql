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

-- name: enqueue_caps_many
-- `enqueue_caps` for a batch of new jobs (receipts/enqueue_batch.py): the database clock, and for
-- each organization named in `organization_ids` its queued and its active jobs, as three arrays
-- in the order of the organizations. One row, whatever the batch (no organization: empty arrays).
SELECT now(), coalesce(array_agg(held.organization_id), '{}'),
       coalesce(array_agg(held.queued), '{}'), coalesce(array_agg(held.active), '{}')
FROM (SELECT named.organization_id, coalesce(sum(c.queued), 0)::bigint AS queued,
             coalesce(sum(c.active), 0)::bigint AS active
      FROM unnest(%(organization_ids)s::text[]) AS named(organization_id)
      LEFT JOIN org_open_jobs c ON c.organization_id = named.organization_id
      GROUP BY named.organization_id) AS held;

-- name: enqueue_new_many
-- `enqueue_new` for a batch of new jobs (made-up ids, no session key; receipts/enqueue_batch.py),
-- one row per job in the parallel arrays (each named as its column): each job's `job.enqueued` receipt at the clock the
-- caller read and folded with, and its projection row. An organization's jobs are written only
-- if all of them fit its caps at this statement's time (no more than `max_queued` queued and
-- `max_active` active jobs once they are added); else none of them, and the caller reads and
-- decides again. The rows are inserted in the arrays' order (the caller's: by organization,
-- so that the counter rows the inserts lock are locked in one order). The first column lists
-- the jobs written.
WITH batch AS (
    SELECT * FROM unnest(
        %(job_id)s::text[], %(seq)s::integer[], %(organization_id)s::text[],
        %(session_key)s::text[], %(agent_id)s::text[], %(lane)s::text[], %(kind)s::text[],
        %(status)s::text[], %(attempt)s::integer[], %(max_attempts)s::integer[],
        %(abort_requested)s::boolean[], %(available_at)s::timestamptz[],
        %(lease_expires_at)s::timestamptz[], %(last_heartbeat_at)s::timestamptz[],
        %(created_at)s::timestamptz[], %(updated_at)s::timestamptz[], %(state)s::jsonb[],
        %(worker_queue)s::text[], %(stream)s::text[], %(data)s::jsonb[], %(note)s::text[],
        %(cap_organization_id)s::text[], %(max_queued)s::bigint[], %(max_active)s::bigint[]
    ) WITH ORDINALITY
      AS b(job_id, seq, organization_id, session_key, agent_id, lane, kind, status, attempt,
           max_attempts, abort_requested, available_at, lease_expires_at, last_heartbeat_at,
           created_at, updated_at, state, worker_queue, stream, data, note,
           cap_organization_id, max_queued, max_active, ordinal)
), wanted AS (
    SELECT cap_organization_id, count(*) AS jobs, min(max_queued) AS max_queued,
           min(max_active) AS max_active
    FROM batch WHERE cap_organization_id IS NOT NULL
    GROUP BY cap_organization_id
), refused AS (
    SELECT w.cap_organization_id
    FROM wanted w
    CROSS JOIN LATERAL (SELECT coalesce(sum(queued), 0) AS queued, coalesce(sum(active), 0) AS active
                        FROM org_open_jobs WHERE organization_id = w.cap_organization_id) AS held
    WHERE held.queued + w.jobs > w.max_queued OR held.active + w.jobs > w.max_active
), admitted AS (
    SELECT * FROM batch
    WHERE cap_organization_id IS NULL
       OR cap_organization_id NOT IN (SELECT cap_organization_id FROM refused)
), inserted AS (
    INSERT INTO receipts (stream, seq, type, data, recorded_at)
    SELECT stream, seq, 'job.enqueued', data, %(recorded_at)s FROM admitted ORDER BY ordinal
    RETURNING 1
), projected AS (
    INSERT INTO jobs (job_id, seq, organization_id, session_key, agent_id, lane, kind, status,
                      attempt, max_attempts, abort_requested, available_at, lease_expires_at,
                      last_heartbeat_at, created_at, updated_at, state, worker_queue)
    SELECT job_id, seq, organization_id, session_key, agent_id, lane, kind, status, attempt,
           max_attempts, abort_requested, available_at, lease_expires_at, last_heartbeat_at,
           created_at, updated_at, state, worker_queue
    FROM admitted
    ORDER BY ordinal
    RETURNING job_id
)
SELECT (SELECT array_agg(job_id) FROM projected),
       (SELECT count(*) FROM inserted),
       (SELECT count(*) FROM (SELECT pg_notify(c, a.note)
                              FROM admitted a, unnest(%(channels)s::text[]) AS c) AS sent);

-- name: api_jobs_by_caller_id
-- The jobs an admin may mean by an organization's own id (`<id>` of `<id>~<tag>`, or an
-- unscoped id): two rows are enough to tell "one" from "ambiguous" (jobs_caller_id_idx, 0006).
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE split_part(j.job_id, '~', 1) = %(job_id)s::text
ORDER BY j.job_id
LIMIT 2;
