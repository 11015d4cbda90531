-- Receipts: the authoritative, append-only chain. seq is gapless per stream, position global.
CREATE TABLE IF NOT EXISTS receipts (
    position    bigserial PRIMARY KEY,
    stream      text        NOT NULL,
    seq         integer     NOT NULL CHECK (seq >= 1),
    type        text        NOT NULL,
    data        jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT receipts_stream_seq_key UNIQUE (stream, seq)
);

-- A steer absorbed by enqueue is found again by its command id (= the enqueue's jobId).
CREATE INDEX IF NOT EXISTS receipts_command_id_idx
    ON receipts ((data ->> 'commandId'))
    WHERE type = 'queue.command';

-- The jobs projection: the folded state plus the columns the scans and lists filter on.
-- Written only in the transaction that appends the receipt that changes it.
CREATE TABLE IF NOT EXISTS jobs (
    job_id            text PRIMARY KEY,
    seq               integer     NOT NULL,
    organization_id   text,
    session_key       text,
    agent_id          text        NOT NULL,
    lane              text        NOT NULL
        CHECK (lane IN ('chat', 'collect', 'steer', 'follow_up')),
    kind              text        NOT NULL,
    status            text        NOT NULL
        CHECK (status IN ('queued', 'leased', 'running', 'completed', 'failed', 'canceled')),
    attempt           integer     NOT NULL CHECK (attempt >= 0),
    max_attempts      integer     NOT NULL CHECK (max_attempts BETWEEN 1 AND 8),
    abort_requested   boolean     NOT NULL DEFAULT false,
    available_at      timestamptz,
    lease_expires_at  timestamptz,
    last_heartbeat_at timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    state             jsonb       NOT NULL
);

CREATE INDEX IF NOT EXISTS jobs_session_idx
    ON jobs (organization_id, session_key, created_at DESC)
    WHERE session_key IS NOT NULL AND status IN ('queued', 'leased', 'running');
CREATE INDEX IF NOT EXISTS jobs_status_updated_idx ON jobs (status, updated_at);
CREATE INDEX IF NOT EXISTS jobs_lease_idx
    ON jobs (lease_expires_at) WHERE status IN ('leased', 'running');
CREATE INDEX IF NOT EXISTS jobs_list_idx ON jobs (organization_id, created_at DESC, job_id DESC);
