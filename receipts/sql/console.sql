-- Statements of retries and the operator console (receipts/retry.py, roles/api/console/).

-- name: console_status_counts
-- Jobs per status under the console's filters (the same visibility rule as api_list_jobs).
SELECT status, count(*)
FROM jobs
WHERE (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
  AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s::text)
  AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(session_key)s::text IS NULL OR session_key = %(session_key)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
GROUP BY status;

-- name: console_failed_groups
-- Failed jobs not yet retried, grouped by agent and error, largest group first.
SELECT agent_id, coalesce(state ->> 'error', ''), count(*), max(updated_at)
FROM jobs
WHERE status = 'failed'
  AND state ->> 'retriedAs' IS NULL
  AND (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
  AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
GROUP BY agent_id, coalesce(state ->> 'error', '')
ORDER BY count(*) DESC, max(updated_at) DESC
LIMIT %(limit)s;

-- name: retry_candidates
-- Settled jobs matching a bulk retry's filter that were never retried, oldest first.
SELECT job_id
FROM jobs
WHERE status = %(status)s::text
  AND state ->> 'retriedAs' IS NULL
  AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s::text)
  AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(error)s::text IS NULL OR state ->> 'error' = %(error)s::text)
ORDER BY updated_at, job_id
LIMIT %(limit)s;
