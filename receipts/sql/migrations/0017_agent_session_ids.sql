-- Owner session ids are scoped by organization (`<id>~<organization tag>`, as job ids are); an
-- admin may name a session by the organization's own id, found through this index.
CREATE INDEX IF NOT EXISTS agent_sessions_caller_id_idx
    ON agent_sessions (split_part(session_id, '~', 1));
