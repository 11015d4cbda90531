-- History stays out of the hot path (docs/history.md): periodic scans read active work only,
-- heartbeats update a narrow lease row, settled callbacks owed wait in an outbox, and retention
-- finds old terminal jobs through an index of its own.

-- Queue depth counts active jobs only; the queued-work scans (redrive, undelivered, next
-- availableAt) walk the queued set only. Both replace the all-status (status, updated_at) index.
CREATE INDEX IF NOT EXISTS jobs_active_status_idx
    ON jobs (status) WHERE status IN ('queued', 'leased', 'running');
CREATE INDEX IF NOT EXISTS jobs_queued_idx
    ON jobs (updated_at) WHERE status = 'queued';

-- Retention (receipt prune, RECEIPT_RETENTION) finds terminal jobs by their settle time.
CREATE INDEX IF NOT EXISTS jobs_terminal_idx
    ON jobs (updated_at, job_id) WHERE status IN ('completed', 'failed', 'canceled');

-- An organization's list filtered by lane, and its list of active jobs, without walking its
-- whole history through jobs_list_idx.
CREATE INDEX IF NOT EXISTS jobs_list_lane_idx
    ON jobs (organization_id, lane, created_at DESC, job_id DESC);
CREATE INDEX IF NOT EXISTS jobs_list_active_idx
    ON jobs (organization_id, created_at DESC, job_id DESC)
    WHERE status IN ('queued', 'leased', 'running');

-- The lease as a heartbeat leaves it: a narrow row updated in place (HOT: no indexed column
-- changes, and the free space fillfactor leaves on each page holds the new version). `patch` is
-- the part of the job's folded state a heartbeat changes (seq, updatedAt, lastHeartbeatAt,
-- lease); it applies when its seq is newer than the jobs row's. The row goes when the lease ends.
CREATE TABLE IF NOT EXISTS job_leases (
    job_id     text PRIMARY KEY,
    seq        integer     NOT NULL,
    expires_at timestamptz NOT NULL,
    patch      jsonb       NOT NULL
) WITH (fillfactor = 10);

-- Terminal callbacks owed: written in the transaction that settles the job, deleted once every
-- configured URL has its post (or gave up). The recovery pass reads only this table.
CREATE TABLE IF NOT EXISTS callback_outbox (
    job_id  text PRIMARY KEY,
    event   text        NOT NULL,
    due_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS callback_outbox_due_idx ON callback_outbox (due_at);

-- Jobs settled in the last day may still owe their callback (the window the old scan used).
INSERT INTO callback_outbox (job_id, event, due_at)
SELECT j.job_id, j.status, j.updated_at FROM jobs j
WHERE j.status IN ('completed', 'failed', 'canceled')
  AND j.updated_at >= now() - interval '1 day'
  AND NOT EXISTS (SELECT 1 FROM callback_posts c
                  WHERE c.job_id = j.job_id AND c.event = j.status
                    AND (c.status = 'posted' OR c.attempts >= 5))
ON CONFLICT (job_id) DO NOTHING;

DROP INDEX IF EXISTS jobs_status_updated_idx;

-- Retention prunes a settled agent job (migration 0005) with its turns' queue jobs.
CREATE INDEX IF NOT EXISTS agent_jobs_terminal_idx
    ON agent_jobs (updated_at, agent_job_id) WHERE status IN ('succeeded', 'failed', 'stopped');
