-- A session's wakeups are posted to each callback URL in the session's order: a wakeup waits
-- while an earlier one of its session is still owed to that URL (agent_wakeups_unposted). This
-- index finds a session's earlier wakeups without reading every wakeup of the day.
CREATE INDEX IF NOT EXISTS agent_job_wakeups_session_idx
    ON agent_job_wakeups (session_id, session_seq);
