-- The agent jobs that work in one workspace (a job and the jobs continuing it), found by its
-- owner: a continuation is created only while none of them is unfinished or has a turn still
-- running (receipts/agent_jobs/lifecycle.py `create_in`), so two turns never share a workspace.
CREATE INDEX IF NOT EXISTS agent_jobs_workspace_idx
    ON agent_jobs ((state->>'workspaceOwnerJobId'));
