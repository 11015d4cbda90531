-- The per-organization caps on queued and active jobs count an organization's open
-- jobs at every enqueue; this partial index keeps that count off its finished history.
CREATE INDEX IF NOT EXISTS jobs_org_open_idx
    ON jobs (organization_id, status)
    WHERE status IN ('queued', 'leased', 'running');

-- Job ids are scoped by organization (`<id>~<organization tag>`); an admin may name a job by
-- the organization's own id, found through this index.
CREATE INDEX IF NOT EXISTS jobs_caller_id_idx ON jobs (split_part(job_id, '~', 1));
