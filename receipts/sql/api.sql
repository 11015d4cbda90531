-- Statements of the HTTP API (roles/api.py). Parameters are psycopg %(name)s.

-- name: api_list_jobs
-- One page of jobs, newest first, keyset-paginated on (created_at, job_id). A NULL filter
-- matches everything; `all_organizations` is true only for admin callers, every other caller
-- sees exactly its own organization.
SELECT state
FROM jobs
WHERE (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
  AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s::text)
  AND (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(session_key)s::text IS NULL OR session_key = %(session_key)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (created_at, job_id) < (%(before_created_at)s::timestamptz, %(before_job_id)s::text))
ORDER BY created_at DESC, job_id DESC
LIMIT %(limit)s;


-- name: api_org_open_jobs
-- An organization's queued jobs and its active ones (queued, leased, running), read before an
-- enqueue to apply the per-organization caps (jobs_org_open_idx, migration 0006).
SELECT count(*) FILTER (WHERE status = 'queued') AS queued, count(*) AS active
FROM jobs
WHERE organization_id = %(organization_id)s::text
  AND status IN ('queued', 'leased', 'running');

-- name: api_jobs_by_caller_id
-- The jobs an admin may mean by an organization's own id (`<id>` of `<id>~<tag>`, or an
-- unscoped id): two rows are enough to tell "one" from "ambiguous" (jobs_caller_id_idx, 0006).
SELECT state
FROM jobs
WHERE split_part(job_id, '~', 1) = %(job_id)s::text
ORDER BY job_id
LIMIT 2;
