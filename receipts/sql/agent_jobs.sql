-- Background agent jobs (see migrations/0005_agent_jobs.sql and docs/agent-jobs.md).

-- name: agent_job_for_update
SELECT now(), state FROM agent_jobs WHERE agent_job_id = %(agent_job_id)s FOR UPDATE;

-- name: agent_job_get
SELECT state FROM agent_jobs WHERE agent_job_id = %(agent_job_id)s;

-- name: agent_jobs_open_count
-- An organization's unfinished agent jobs, counted up to `cap` (bounded work however many).
SELECT count(*) FROM (
    SELECT 1 FROM agent_jobs
    WHERE organization_id = %(organization_id)s
      AND status IN ('queued', 'running', 'waiting_on_user')
    LIMIT %(cap)s
) AS held;

-- name: agent_jobs_workspace_busy
-- A job working in the workspace of `workspace_owner` (its owner or a job continuing it) that
-- is unfinished, or finished with a turn still running (a job stopped mid-turn): the first one,
-- with its status and that turn. None: the workspace is free to continue.
SELECT a.agent_job_id, a.status, t.job_id
FROM agent_jobs a
LEFT JOIN jobs t ON t.job_id = a.state->>'liveTurnJobId'
                AND t.status NOT IN ('completed', 'failed', 'canceled')
WHERE a.state->>'workspaceOwnerJobId' = %(workspace_owner)s
  AND (a.status NOT IN ('succeeded', 'failed', 'stopped') OR t.job_id IS NOT NULL)
ORDER BY a.created_at
LIMIT 1;

-- name: agent_job_by_source
SELECT state FROM agent_jobs
WHERE organization_id = %(organization_id)s AND owner_session_id = %(owner_session_id)s
  AND source_tool_call_id = %(source_tool_call_id)s;

-- name: agent_job_upsert
INSERT INTO agent_jobs (agent_job_id, seq, organization_id, agent_id, owner_session_id,
                        source_tool_call_id, status, attempt, turn, consecutive_failures,
                        available_at, answer_pending, cancel_requested, queue_job_id,
                        created_at, updated_at, state)
VALUES (%(agent_job_id)s, %(seq)s, %(organization_id)s, %(agent_id)s, %(owner_session_id)s,
        %(source_tool_call_id)s, %(status)s, %(attempt)s, %(turn)s, %(consecutive_failures)s,
        %(available_at)s, %(answer_pending)s, %(cancel_requested)s, %(queue_job_id)s,
        %(created_at)s, %(updated_at)s, %(state)s)
ON CONFLICT (agent_job_id) DO UPDATE SET
    seq = EXCLUDED.seq, status = EXCLUDED.status, attempt = EXCLUDED.attempt,
    turn = EXCLUDED.turn, consecutive_failures = EXCLUDED.consecutive_failures,
    available_at = EXCLUDED.available_at, answer_pending = EXCLUDED.answer_pending,
    cancel_requested = EXCLUDED.cancel_requested, queue_job_id = EXCLUDED.queue_job_id,
    updated_at = EXCLUDED.updated_at, state = EXCLUDED.state;

-- name: agent_slots_running
-- Occupancy, derived: the agent's running jobs of one organization (the caller holds their slot
-- lock; agent_jobs_running_idx).
SELECT count(*) FROM agent_jobs
WHERE agent_id = %(agent_id)s AND status = 'running'
  AND organization_id IS NOT DISTINCT FROM %(organization_id)s;

-- name: agent_job_organization
SELECT organization_id FROM agent_jobs WHERE agent_job_id = %(agent_job_id)s;

-- name: agent_session_claim
INSERT INTO agent_sessions (session_id, organization_id)
VALUES (%(session_id)s, %(organization_id)s)
ON CONFLICT (session_id) DO NOTHING;

-- name: agent_session_get
SELECT organization_id FROM agent_sessions WHERE session_id = %(session_id)s;

-- name: agent_sessions_by_caller_id
-- The sessions an admin may mean by an organization's own id (`<id>` of `<id>~<tag>`, or an
-- unscoped id): two rows tell "one" from "ambiguous" (agent_sessions_caller_id_idx, 0017).
SELECT session_id FROM agent_sessions
WHERE split_part(session_id, '~', 1) = %(session_id)s::text
ORDER BY session_id
LIMIT 2;

-- name: agent_wakeup_record
INSERT INTO agent_job_wakeups (source_id, agent_job_id, session_id, session_seq)
VALUES (%(source_id)s, %(agent_job_id)s, %(session_id)s, %(session_seq)s)
ON CONFLICT (source_id) DO NOTHING
RETURNING source_id;

-- name: agent_wakeup_exists
SELECT 1 FROM agent_job_wakeups WHERE source_id = %(source_id)s;

-- name: agent_jobs_ready
-- Agent jobs waiting only for a slot, oldest first, with their agents and organizations: of each
-- agent in each organization, the oldest, as many as its free running slots (`slots` less its
-- running jobs). So neither full slots nor one organization held at its cap hides the jobs
-- behind them past the limit: a backlog of one agent or organization never starves another.
WITH running AS (
    SELECT agent_id, organization_id, count(*) AS n FROM agent_jobs WHERE status = 'running'
    GROUP BY agent_id, organization_id
), ready AS (
    SELECT a.agent_job_id, a.agent_id, a.organization_id, a.updated_at,
           %(slots)s - coalesce(r.n, 0) AS free,
           row_number() OVER (PARTITION BY a.agent_id, a.organization_id
                              ORDER BY a.updated_at, a.agent_job_id) AS rank
    FROM agent_jobs a LEFT JOIN running r
      ON r.agent_id = a.agent_id
     AND coalesce(r.organization_id, '') = coalesce(a.organization_id, '')
    WHERE (a.status = 'queued' AND (a.available_at IS NULL OR a.available_at <= now()))
       OR (a.status = 'waiting_on_user' AND a.answer_pending)
)
SELECT agent_job_id, agent_id, organization_id FROM ready WHERE rank <= free
ORDER BY updated_at, agent_job_id
LIMIT %(limit)s;

-- name: agent_jobs_next_available_at
SELECT min(available_at) FROM agent_jobs WHERE status = 'queued' AND available_at > now();

-- name: agent_jobs_settled_turns
-- Running agent jobs whose turn's queue job is terminal: their settlement is due.
SELECT a.agent_job_id FROM agent_jobs a JOIN jobs j ON j.job_id = a.queue_job_id
WHERE a.status = 'running' AND j.status IN ('completed', 'failed', 'canceled')
ORDER BY a.updated_at
LIMIT %(limit)s;

-- name: agent_jobs_input_overdue
SELECT agent_job_id FROM agent_jobs
WHERE status = 'waiting_on_user' AND NOT answer_pending
  AND updated_at <= now() - make_interval(secs => %(timeout_ms)s / 1000.0)
ORDER BY updated_at
LIMIT %(limit)s;

-- name: agent_jobs_list
SELECT state FROM agent_jobs
WHERE (%(all_organizations)s OR organization_id = %(caller_organization_id)s)
  AND (%(organization_id)s::text IS NULL OR organization_id = %(organization_id)s)
  AND (%(status)s::text IS NULL OR status = %(status)s)
  AND (%(agent_id)s::text IS NULL OR agent_id = %(agent_id)s)
  AND (%(owner_session_id)s::text IS NULL OR owner_session_id = %(owner_session_id)s)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (created_at, agent_job_id) < (%(before_created_at)s, %(before_id)s))
ORDER BY created_at DESC, agent_job_id DESC
LIMIT %(limit)s;

-- name: agent_jobs_running_by_agent
-- The slots in use: running jobs per agent of each organization (the slot lock's scope).
SELECT organization_id, agent_id, count(*) FROM agent_jobs WHERE status = 'running'
GROUP BY organization_id, agent_id ORDER BY organization_id, agent_id;

-- name: agent_jobs_lock
LOCK TABLE agent_jobs IN EXCLUSIVE MODE;

-- name: agent_jobs_clear
DELETE FROM agent_jobs;

-- name: agent_job_turns_ran
-- Whether any of an agent job's earlier turns ended its work (completed with the outcome `done`
-- or `needs_input`: the agent ran): a refund of its live turn then keeps the job's startedAt.
SELECT EXISTS (
    SELECT 1 FROM jobs
    WHERE job_id = ANY(%(job_ids)s) AND status = 'completed'
      AND state -> 'result' ->> 'outcome' IN ('done', 'needs_input')
);

-- name: agent_jobs_states
SELECT agent_job_id, state FROM agent_jobs WHERE agent_job_id = ANY(%(keys)s::text[]);

-- name: agent_jobs_unchained
SELECT agent_job_id FROM agent_jobs t
WHERE NOT EXISTS (SELECT 1 FROM receipts r WHERE r.stream = %(prefix)s || t.agent_job_id);

-- name: agent_wakeups_unposted
-- Wakeups of the last day whose event callback to a URL is neither posted, given up (5 tries)
-- nor being posted (claimed within 30 s; see callback_claim), and none of whose session's
-- earlier wakeups of the day is still owed to that URL (neither posted nor given up): a
-- receiver hears a session's wakeups in its order, a retried `waiting_on_user` never after the
-- `succeeded` that followed it (agent_job_wakeups_session_idx, 0021).
SELECT w.source_id, w.session_id, w.session_seq FROM agent_job_wakeups w
WHERE w.created_at >= now() - interval '1 day'
  AND NOT EXISTS (SELECT 1 FROM callback_posts c
                  WHERE c.job_id = w.source_id AND c.event = 'session.wakeup' AND c.url = %(url)s
                    AND (c.status = 'posted' OR c.attempts >= 5
                         OR c.posted_at >= now() - interval '30 seconds'))
  AND NOT EXISTS (SELECT 1 FROM agent_job_wakeups e
                  WHERE e.session_id = w.session_id AND e.session_seq < w.session_seq
                    AND e.created_at >= now() - interval '1 day'
                    AND NOT EXISTS (SELECT 1 FROM callback_posts c
                                    WHERE c.job_id = e.source_id AND c.event = 'session.wakeup'
                                      AND c.url = %(url)s
                                      AND (c.status = 'posted' OR c.attempts >= 5)))
ORDER BY w.created_at
LIMIT %(limit)s;

-- name: agent_job_wakeup_receipts
-- One agent job's wakeups on its owner's session stream, by the rows that name them
-- (agent_job_wakeups_job_idx), not by reading the session's whole stream.
SELECT r.stream, r.seq, r.type, r.data, r.recorded_at, r.position
FROM agent_job_wakeups w
JOIN receipts r ON r.stream = 'sessions/' || w.session_id AND r.seq = w.session_seq
WHERE w.agent_job_id = %(agent_job_id)s
ORDER BY r.seq;
