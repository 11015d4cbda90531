-- Delivery bookkeeping: NOT ownership state. Losing these rows loses no job (docs/design.md §6).

-- The latest Temporal delivery generation started for a job (driver id <jobId>[:gen:<g>]).
CREATE TABLE IF NOT EXISTS deliveries (
    job_id        text PRIMARY KEY,
    generation    integer     NOT NULL CHECK (generation BETWEEN 0 AND 32),
    workflow_id   text        NOT NULL,
    dispatched_at timestamptz NOT NULL DEFAULT now()
);

-- One observed queue state is dispatched at most once however many scanners run.
CREATE TABLE IF NOT EXISTS delivery_redrives (
    redrive_key text PRIMARY KEY,
    job_id      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS delivery_redrives_job_idx ON delivery_redrives (job_id, created_at DESC);

-- Each job's callback is posted once per URL and event.
CREATE TABLE IF NOT EXISTS callback_posts (
    job_id    text NOT NULL,
    event     text NOT NULL,
    url       text NOT NULL,
    status    text NOT NULL DEFAULT 'pending',
    attempts  integer NOT NULL DEFAULT 0,
    last_error text,
    posted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, event, url)
);

-- Best-effort durable-execution ledger beside the receipts (never authoritative).
CREATE TABLE IF NOT EXISTS workflow_runs (
    workflow_id text NOT NULL,
    run_id      text NOT NULL,
    job_id      text,
    workflow    text NOT NULL,
    task_queue  text NOT NULL,
    status      text NOT NULL,
    detail      jsonb,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, run_id)
);
CREATE INDEX IF NOT EXISTS workflow_runs_job_idx ON workflow_runs (job_id);

CREATE TABLE IF NOT EXISTS activity_runs (
    workflow_id text    NOT NULL,
    activity_id text    NOT NULL,
    attempt     integer NOT NULL,
    job_id      text,
    activity    text    NOT NULL,
    worker_id   text,
    status      text    NOT NULL,
    detail      jsonb,
    started_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, activity_id, attempt)
);
CREATE INDEX IF NOT EXISTS activity_runs_job_idx ON activity_runs (job_id);
