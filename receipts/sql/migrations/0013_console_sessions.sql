-- The operator console's sign-in sessions (roles/api/console/session.py). The cookie holds a
-- random id; a row keeps only its SHA-256, so reading this table yields no usable cookie. The
-- row names its token by the token's SHA-256 (what the api's token table keeps), and every use
-- resolves the principal again from the configured tokens: a token removed from the
-- configuration ends its sessions. In PostgreSQL, not in an api process's memory, so a session
-- survives an api restart and works on every api pod.
CREATE TABLE IF NOT EXISTS console_sessions (
    session_digest bytea PRIMARY KEY,
    token_digest bytea NOT NULL,
    csrf text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);

-- The prune at each sign-in deletes expired and idle rows.
CREATE INDEX IF NOT EXISTS console_sessions_expires_idx ON console_sessions (expires_at);
CREATE INDEX IF NOT EXISTS console_sessions_last_used_idx ON console_sessions (last_used_at);
