-- An admin's job list (every organization, newest first) pages on (created_at, job_id);
-- an organization's list uses jobs_list_idx from 0001.
CREATE INDEX IF NOT EXISTS jobs_created_idx ON jobs (created_at DESC, job_id DESC);
