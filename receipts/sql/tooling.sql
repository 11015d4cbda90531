-- Queries of the development tools only (tools/bench, tools/chaos): no role runs them.

-- name: tooling_terminal_count
-- Bench: how many of these jobs have settled.
SELECT count(*) FROM jobs WHERE job_id = ANY(%(job_ids)s) AND status = ANY(%(statuses)s);

-- name: tooling_job_milestones
-- Bench: the enqueue, lease and settle receipts of these job streams, in chain order.
SELECT stream, type, extract(epoch FROM recorded_at)::float8 FROM receipts
WHERE stream = ANY(%(streams)s) AND type = ANY(%(types)s)
ORDER BY position;

-- name: tooling_first_settlement_after
-- Chaos: when the first job settled (or its lease expired) after a fault.
SELECT min(recorded_at) FROM receipts
WHERE recorded_at > %(after)s
  AND type IN ('job.completed', 'job.failed', 'job.canceled', 'job.lease_expired');

-- name: tooling_create_database
-- Bench: a database of its own for one part of a run ({name} is an identifier, quoted by psycopg.sql).
CREATE DATABASE {name};

-- name: tooling_drop_database
-- Bench: drop the run's databases at the end, whoever is still connected.
DROP DATABASE IF EXISTS {name} WITH (FORCE);
