-- Reads whose cost grew with the history or with other organizations' rows (measured on 300 000
-- jobs in three organizations, 1.5 M receipts; README "Upgrading to bounded reads" says how a
-- large installation builds these concurrently first).

-- The console's failed groups and a bulk retry's candidates (console_failed_groups,
-- retry_candidates) of one organization, by last change: its failed or canceled jobs only. The
-- all-status index they named went in 0007, and the largest organization's page read every job
-- (a sequential scan of the table).
CREATE INDEX IF NOT EXISTS jobs_retryable_idx
    ON jobs (organization_id, status, updated_at, job_id)
    WHERE status IN ('failed', 'canceled');

-- Retention keeps an agent job while a delivery about one of its turns is pending: a range of
-- the subject (`<agentJobId>:attempt:`, byte order), probed here, not every pending delivery of
-- its organization read once per agent job of the batch (a backlog at a dead endpoint times
-- the batch).
CREATE INDEX IF NOT EXISTS webhook_deliveries_pending_subject_idx
    ON webhook_deliveries ((subject COLLATE "C")) WHERE status = 'pending';

-- The wakeup redrive (agent_wakeups_unposted) reads the wakeups of the last day, not all.
CREATE INDEX IF NOT EXISTS agent_job_wakeups_created_idx ON agent_job_wakeups (created_at);

-- An organization's unfinished agent jobs, counted at each create (agent_jobs_open_count).
CREATE INDEX IF NOT EXISTS agent_jobs_open_idx
    ON agent_jobs (organization_id) WHERE status IN ('queued', 'running', 'waiting_on_user');

-- A concurrent build by hand that failed or was cancelled leaves an INVALID index of its name,
-- which `IF NOT EXISTS` takes as built (0020 says the same of 0011's): built again here.
DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['jobs_retryable_idx', 'webhook_deliveries_pending_subject_idx',
                                'agent_job_wakeups_created_idx', 'agent_jobs_open_idx'] LOOP
        IF EXISTS (SELECT 1 FROM pg_index
                   WHERE indexrelid = to_regclass(name) AND NOT indisvalid) THEN
            EXECUTE format('REINDEX INDEX %I', name);
        END IF;
    END LOOP;
END $$;
