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

