-- Objectives projection: the folded state of each `objectives/<id>` stream plus the columns
-- every scan, list and loop filters on. Written only in the transaction that appends the
-- receipt that changes it; nothing scans `receipts` by stream prefix.
CREATE TABLE IF NOT EXISTS objectives (
    objective_id          text PRIMARY KEY,
    organization_id       text        NOT NULL,
    seq                   integer     NOT NULL,
    status                text        NOT NULL
        CHECK (status IN ('active', 'completed', 'failed', 'canceled')),
    phase                 integer     NOT NULL CHECK (phase >= 1),
    title                 text        NOT NULL,
    control_requested_seq integer     NOT NULL DEFAULT 0,
    control_delivered_seq integer     NOT NULL DEFAULT 0,
    reconciled_seq        integer     NOT NULL DEFAULT 0,
    control_pending       boolean GENERATED ALWAYS AS
        (control_requested_seq > control_delivered_seq) STORED,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    state                 jsonb       NOT NULL
);

-- The outbox: requests not yet handed to a control job.
CREATE INDEX IF NOT EXISTS objectives_control_pending_idx
    ON objectives (updated_at) WHERE control_pending;
-- The watchdog, the resume pass and the outbox's second look read active objectives only.
CREATE INDEX IF NOT EXISTS objectives_active_idx
    ON objectives (updated_at, objective_id) WHERE status = 'active';
CREATE INDEX IF NOT EXISTS objectives_list_idx
    ON objectives (organization_id, created_at DESC, objective_id DESC);
CREATE INDEX IF NOT EXISTS objectives_created_idx ON objectives (created_at DESC, objective_id DESC);
