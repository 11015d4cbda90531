-- Background agent jobs (docs/agent-jobs.md): the projection of agent-jobs/<id>, the owner
-- sessions' organizations and the wakeup source ids. Written only in the transaction of the
-- receipt that changes them.
CREATE TABLE IF NOT EXISTS agent_jobs (
    agent_job_id         text PRIMARY KEY,
    seq                  integer     NOT NULL CHECK (seq >= 1),
    organization_id      text        NOT NULL,
    agent_id             text        NOT NULL,
    owner_session_id     text        NOT NULL,
    source_tool_call_id  text        NOT NULL,
    status               text        NOT NULL
        CHECK (status IN ('queued', 'running', 'waiting_on_user', 'succeeded', 'failed',
                          'stopped')),
    attempt              integer     NOT NULL CHECK (attempt BETWEEN 0 AND 5),
    turn                 integer     NOT NULL CHECK (turn >= 0),
    consecutive_failures integer     NOT NULL CHECK (consecutive_failures BETWEEN 0 AND 5),
    available_at         timestamptz,
    answer_pending       boolean     NOT NULL DEFAULT false,
    cancel_requested     boolean     NOT NULL DEFAULT false,
    queue_job_id         text,
    created_at           timestamptz NOT NULL,
    updated_at           timestamptz NOT NULL,
    state                jsonb       NOT NULL,
    -- A running job always names the queue job of its live turn.
    CONSTRAINT agent_jobs_running_turn CHECK (status <> 'running' OR queue_job_id IS NOT NULL)
);

-- Slot occupancy: the running jobs of one agent (counted under the agent's slot lock).
CREATE INDEX IF NOT EXISTS agent_jobs_running_idx ON agent_jobs (agent_id)
    WHERE status = 'running';
-- The dispatcher's candidates: queued, or answered and waiting for a slot.
CREATE INDEX IF NOT EXISTS agent_jobs_ready_idx ON agent_jobs (updated_at)
    WHERE status = 'queued' OR (status = 'waiting_on_user' AND answer_pending);
CREATE INDEX IF NOT EXISTS agent_jobs_waiting_idx ON agent_jobs (updated_at)
    WHERE status = 'waiting_on_user';
CREATE INDEX IF NOT EXISTS agent_jobs_list_idx
    ON agent_jobs (organization_id, created_at DESC, agent_job_id DESC);
CREATE INDEX IF NOT EXISTS agent_jobs_created_idx ON agent_jobs (created_at DESC, agent_job_id DESC);
-- A retried create (same tool call of the same session) finds the job it made.
CREATE UNIQUE INDEX IF NOT EXISTS agent_jobs_source_idx
    ON agent_jobs (organization_id, owner_session_id, source_tool_call_id);

-- An owner session belongs to the organization of the first agent job that named it.
CREATE TABLE IF NOT EXISTS agent_sessions (
    session_id      text PRIMARY KEY,
    organization_id text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- One wakeup per <agentJobId>:<status>:<attempt>:<turn>.
CREATE TABLE IF NOT EXISTS agent_job_wakeups (
    source_id    text PRIMARY KEY,
    agent_job_id text        NOT NULL,
    session_id   text        NOT NULL,
    session_seq  integer     NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS agent_job_wakeups_job_idx ON agent_job_wakeups (agent_job_id);
