-- Schedules projection: the folded state of each `schedules/<id>` stream (receipts/schedules/).
-- `synced_seq` is not folded: worker-control's schedule sync writes it when the Temporal Schedule
-- matches the definition up to that seq. A rebuilt projection starts it at 0, so every schedule
-- is written to Temporal again: that is how a Temporal that lost its schedules gets them back.
CREATE TABLE IF NOT EXISTS schedules (
    schedule_id text PRIMARY KEY,
    seq bigint NOT NULL,
    organization_id text,
    status text NOT NULL CHECK (status IN ('active', 'paused', 'deleted')),
    definition_seq bigint NOT NULL,
    synced_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    state jsonb NOT NULL
);

-- The sync reads only the schedules Temporal does not match yet.
CREATE INDEX IF NOT EXISTS schedules_unsynced_idx
    ON schedules (updated_at) WHERE synced_seq < definition_seq;
CREATE INDEX IF NOT EXISTS schedules_list_idx
    ON schedules (organization_id, created_at DESC, schedule_id DESC) WHERE status <> 'deleted';
