-- Queries of the development tools only (tools/bench, tools/chaos, the history tests): no
-- role runs them.

-- name: tooling_terminal_count
-- Bench: how many of these jobs have settled.
SELECT count(*) FROM jobs WHERE job_id = ANY(%(job_ids)s) AND status = ANY(%(statuses)s);

-- name: tooling_other_errors
-- Bench: how many of these settled jobs ended with an error other than the one expected.
SELECT count(*) FROM jobs
WHERE job_id = ANY(%(job_ids)s) AND status = 'failed' AND state->>'error' IS DISTINCT FROM %(error)s;

-- name: tooling_job_milestones
-- Bench: the enqueue, lease and settle receipts of these job streams, in chain order.
SELECT stream, type, extract(epoch FROM recorded_at)::float8 FROM receipts
WHERE stream = ANY(%(streams)s) AND type = ANY(%(types)s)
ORDER BY position;

-- name: tooling_clock
-- Bench: the database's clock, which stamps every receipt's recorded_at.
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: tooling_job_chain
-- Bench (recovery): a job's chain with what a takeover is read from, in chain order.
SELECT type, data->>'workerId', data @> '{"startFence": true}',
       extract(epoch FROM recorded_at)::float8
FROM receipts WHERE stream = %(stream)s
ORDER BY seq;

-- name: tooling_first_settlement_after
-- Chaos: when the first job settled (or its lease expired) after a fault.
SELECT min(recorded_at) FROM receipts
WHERE recorded_at > %(after)s
  AND type IN ('job.completed', 'job.failed', 'job.canceled', 'job.lease_expired');

-- name: tooling_lock_key_held
-- Chaos: whether some transaction holds the advisory lock of `key` now (taken by lock_key; a
-- bigint key shows in pg_locks as classid = its high half, objid = its low half).
SELECT EXISTS (
  SELECT 1 FROM pg_locks
  WHERE locktype = 'advisory' AND granted AND objsubid = 1
    AND ((classid::bigint << 32) | objid::bigint) = hashtextextended(%(key)s, 0)
);

-- name: tooling_create_database
-- Bench: a database of its own for one part of a run ({name} is an identifier, quoted by psycopg.sql).
CREATE DATABASE {name};

-- name: tooling_drop_database
-- Bench: drop the run's databases at the end, whoever is still connected.
DROP DATABASE IF EXISTS {name} WITH (FORCE);

-- name: preload_finished_jobs
-- Clone a template job (its whole chain and projection row, written by the real operations) as
-- `count` finished jobs `<prefix><n>`, the n-th settled `age_s + n * spacing_s` seconds before
-- the template. One statement: receipts, jobs rows, delivery rows and the callbacks posted (a
-- deployment with a callback URL) of every clone.
WITH ids AS (
    SELECT g, %(prefix)s::text || g AS job_id,
           make_interval(secs => %(age_s)s + g * %(spacing_s)s) AS shift
    FROM generate_series(1, %(count)s::integer) AS g
), chain AS (
    INSERT INTO receipts (stream, seq, type, data, recorded_at)
    SELECT 'jobs/' || ids.job_id, t.seq, t.type,
           replace(t.data::text, %(template_id)s, ids.job_id)::jsonb, t.recorded_at - ids.shift
    FROM ids CROSS JOIN receipts t
    WHERE t.stream = 'jobs/' || %(template_id)s
    ORDER BY ids.g, t.seq
), delivered AS (
    INSERT INTO deliveries (job_id, generation, workflow_id, dispatched_at)
    SELECT ids.job_id, 0, ids.job_id, now() - ids.shift FROM ids
), posted AS (
    INSERT INTO callback_posts (job_id, event, url, status, attempts, posted_at)
    SELECT ids.job_id, e.event, 'https://callbacks.example/hook', 'posted', 1, now() - ids.shift
    FROM ids CROSS JOIN (VALUES ('dispatched'), ('completed')) AS e (event)
)
INSERT INTO jobs (job_id, seq, organization_id, session_key, agent_id, lane, kind, status,
                  attempt, max_attempts, abort_requested, available_at, lease_expires_at,
                  last_heartbeat_at, created_at, updated_at, state)
SELECT ids.job_id, t.seq, t.organization_id, t.session_key, t.agent_id, t.lane, t.kind, t.status,
       t.attempt, t.max_attempts, t.abort_requested, t.available_at, t.lease_expires_at,
       t.last_heartbeat_at - ids.shift, t.created_at - ids.shift, t.updated_at - ids.shift,
       replace(t.state::text, %(template_id)s, ids.job_id)::jsonb
FROM ids CROSS JOIN jobs t
WHERE t.job_id = %(template_id)s;

-- name: table_update_stats
-- Updates and HOT updates of the tables a heartbeat may touch (pg_stat_user_tables; the
-- counters reach the view once the backend reports them, see pg_stat_force_next_flush).
SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE relname IN ('jobs', 'job_leases')
ORDER BY relname;

-- name: stats_flush
SELECT pg_stat_force_next_flush();

-- name: database_size
SELECT pg_database_size(current_database());

-- name: tooling_vacuum_analyze
-- History bench and tests: fresh statistics and visibility after a bulk load.
VACUUM ANALYZE;

-- name: tooling_activity_runs
-- A job's rows in the activity ledger (tests of the bookkeeping writer).
SELECT attempt, status FROM activity_runs WHERE job_id = %(job_id)s ORDER BY attempt;
