-- Statements of retries and the operator console (receipts/retry.py, roles/api/console/).

-- name: console_status_counts
-- Jobs per status under the console's filters (the same visibility rule as api_list_jobs), of
-- the newest `window` of them (jobs_list_idx, jobs_created_idx): bounded work per page however
-- long the history retention keeps (a count of every job read them all on each load).
SELECT status, count(*)
FROM (
    SELECT status FROM jobs
    WHERE (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
      AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s::text)
      AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
      AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
      AND (%(session_key)s::text IS NULL OR session_key = %(session_key)s::text)
      AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
    ORDER BY created_at DESC, job_id DESC
    LIMIT %(window)s
) newest
GROUP BY status;

-- name: console_failed_groups
-- Failed jobs not yet retried, grouped by agent and error, largest group first (no agent job's
-- turn: its job retries its own turns, so a group of them could never be retried here).
-- Of the `window` most recently failed (an organization's: jobs_retryable_idx, migration 0025;
-- every organization's: jobs_terminal_idx): bounded work per page.
SELECT agent_id, coalesce(state ->> 'error', ''), count(*), max(updated_at)
FROM (
    SELECT agent_id, state, updated_at FROM jobs
    WHERE status = 'failed'
      AND state ->> 'retriedAs' IS NULL
      AND kind <> 'agent_job.turn'
      AND (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
      AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
    ORDER BY updated_at DESC
    LIMIT %(window)s
) newest
GROUP BY agent_id, coalesce(state ->> 'error', '')
ORDER BY count(*) DESC, max(updated_at) DESC
LIMIT %(limit)s;

-- name: retry_candidates
-- Settled jobs matching a bulk retry's filter that were never retried, oldest first (no agent
-- job's turn): an organization's failed or canceled jobs only (jobs_retryable_idx, 0025).
SELECT job_id
FROM jobs
WHERE status = %(status)s::text
  AND state ->> 'retriedAs' IS NULL
  AND kind <> 'agent_job.turn'  -- an agent job retries its own turns (receipts/retry.py)
  AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s::text)
  AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s::text)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(lane)s::text IS NULL OR lane = %(lane)s::text)
  AND (%(error)s::text IS NULL OR state ->> 'error' = %(error)s::text)
  AND NOT (job_id = ANY(%(tried)s::text[]))  -- tried by this run already (refused: left)
ORDER BY updated_at, job_id
LIMIT %(limit)s;

-- name: console_session_create
-- A signed-in console session (migrations/0013): the digest of its cookie's id, its token's
-- digest, its CSRF token, an absolute expiry `ttl_s` seconds from now.
INSERT INTO console_sessions (session_digest, token_digest, csrf, expires_at)
VALUES (%(session_digest)s, %(token_digest)s, %(csrf)s,
        now() + make_interval(secs => %(ttl_s)s::double precision));

-- name: console_session_use
-- A session used by a request: its token's digest and CSRF token when it is neither past its
-- expiry nor idle for `idle_s` seconds, and its idle clock restarted; no row otherwise.
UPDATE console_sessions
SET last_used_at = now()
WHERE session_digest = %(session_digest)s
  AND expires_at > now()
  AND last_used_at > now() - make_interval(secs => %(idle_s)s::double precision)
RETURNING token_digest, csrf;

-- name: console_session_peek
-- A session a page's poll uses: its token's digest and CSRF token when it is neither past its
-- expiry nor idle for `idle_s` seconds; its idle clock is not restarted (a poll, as a stream, is
-- not the operator using the page).
SELECT token_digest, csrf FROM console_sessions
WHERE session_digest = %(session_digest)s
  AND expires_at > now()
  AND last_used_at > now() - make_interval(secs => %(idle_s)s::double precision);

-- name: console_session_live
-- Whether a session still stands (signed in, neither past its expiry nor idle for `idle_s`
-- seconds), read by an open console event stream; its idle clock is not restarted (a stream is
-- not the operator using the page).
SELECT 1 FROM console_sessions
WHERE session_digest = %(session_digest)s
  AND expires_at > now()
  AND last_used_at > now() - make_interval(secs => %(idle_s)s::double precision);

-- name: console_session_state
-- Why a session was refused: 'expired', 'idle', or no row (unknown or signed out).
SELECT CASE WHEN expires_at <= now() THEN 'expired' ELSE 'idle' END
FROM console_sessions
WHERE session_digest = %(session_digest)s;

-- name: console_session_delete
-- Sign-out, or a session found expired, idle or of a revoked token: the row is gone, so its
-- cookie never works again.
DELETE FROM console_sessions WHERE session_digest = %(session_digest)s;

-- name: console_sessions_prune
-- Every expired or idle session (at each sign-in), so the table holds live sessions only.
DELETE FROM console_sessions
WHERE expires_at <= now()
   OR last_used_at <= now() - make_interval(secs => %(idle_s)s::double precision);
