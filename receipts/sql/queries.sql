-- Named statements. Each begins with a `-- name:` line; parameters are psycopg %(name)s.

-- name: migrations_lock
SELECT pg_advisory_xact_lock(hashtextextended('receipt:migrations', 0));

-- name: migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_applied
SELECT version FROM schema_migrations ORDER BY version;

-- name: migration_record
INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s)
ON CONFLICT (version) DO NOTHING;

-- name: now
SELECT now();

-- name: lock_key
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: job_for_update
SELECT now(), state FROM jobs WHERE job_id = %(job_id)s FOR UPDATE;

-- name: job_get
SELECT state FROM jobs WHERE job_id = %(job_id)s;

-- name: job_get_with_now
SELECT now(), (SELECT state FROM jobs WHERE job_id = %(job_id)s);

-- name: job_by_command
SELECT j.state
FROM receipts r JOIN jobs j ON j.job_id = substr(r.stream, 6)
WHERE r.type = 'queue.command' AND r.data ->> 'commandId' = %(command_id)s
  AND r.stream LIKE 'jobs/%%'
ORDER BY r.position
LIMIT 1;

-- name: session_active_for_update
SELECT state FROM jobs
WHERE organization_id IS NOT DISTINCT FROM %(organization_id)s
  AND session_key = %(session_key)s
  AND status IN ('queued', 'leased', 'running')
ORDER BY job_id
FOR UPDATE;

-- name: append_job
-- Insert the job's new receipts and upsert its projection row in one statement, then NOTIFY.
WITH inserted AS (
    INSERT INTO receipts (stream, seq, type, data, recorded_at)
    SELECT %(stream)s, u.seq, u.type, u.data, now()
    FROM unnest(%(seqs)s::integer[], %(types)s::text[], %(datas)s::jsonb[]) AS u(seq, type, data)
    RETURNING position, seq
), projected AS (
    INSERT INTO jobs (job_id, seq, organization_id, session_key, agent_id, lane, kind, status,
                      attempt, max_attempts, abort_requested, available_at, lease_expires_at,
                      last_heartbeat_at, created_at, updated_at, state)
    VALUES (%(job_id)s, %(seq)s, %(organization_id)s, %(session_key)s, %(agent_id)s, %(lane)s,
            %(kind)s, %(status)s, %(attempt)s, %(max_attempts)s, %(abort_requested)s,
            %(available_at)s, %(lease_expires_at)s, %(last_heartbeat_at)s, %(created_at)s,
            %(updated_at)s, %(state)s)
    ON CONFLICT (job_id) DO UPDATE SET
        seq = EXCLUDED.seq, status = EXCLUDED.status, attempt = EXCLUDED.attempt,
        abort_requested = EXCLUDED.abort_requested, available_at = EXCLUDED.available_at,
        lease_expires_at = EXCLUDED.lease_expires_at,
        last_heartbeat_at = EXCLUDED.last_heartbeat_at, updated_at = EXCLUDED.updated_at,
        state = EXCLUDED.state
    RETURNING 1
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM projected),
       pg_notify('receipts', %(note)s);

-- name: read_stream
SELECT stream, seq, type, data, recorded_at, position
FROM receipts
WHERE stream = %(stream)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s;

-- name: read_all
SELECT stream, seq, type, data, recorded_at, position
FROM receipts
WHERE position > %(after_position)s
ORDER BY position
LIMIT %(limit)s;

-- name: read_job_streams
SELECT stream, seq, type, data, recorded_at, position
FROM receipts
WHERE stream LIKE 'jobs/%%'
ORDER BY stream, seq;

-- name: projection_rows
SELECT job_id, seq, organization_id, session_key, agent_id, lane, kind, status, attempt,
       max_attempts, abort_requested, available_at, lease_expires_at, last_heartbeat_at,
       created_at, updated_at, state
FROM jobs
ORDER BY job_id;

-- name: projection_clear
DELETE FROM jobs;

-- name: projection_insert
INSERT INTO jobs (job_id, seq, organization_id, session_key, agent_id, lane, kind, status,
                  attempt, max_attempts, abort_requested, available_at, lease_expires_at,
                  last_heartbeat_at, created_at, updated_at, state)
VALUES (%(job_id)s, %(seq)s, %(organization_id)s, %(session_key)s, %(agent_id)s, %(lane)s,
        %(kind)s, %(status)s, %(attempt)s, %(max_attempts)s, %(abort_requested)s,
        %(available_at)s, %(lease_expires_at)s, %(last_heartbeat_at)s, %(created_at)s,
        %(updated_at)s, %(state)s);

-- name: expired_leases
SELECT job_id FROM jobs
WHERE status IN ('leased', 'running') AND lease_expires_at < now()
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: migrated
SELECT coalesce(max(version), 0) FROM schema_migrations;

-- name: projection_lock
LOCK TABLE jobs IN EXCLUSIVE MODE;

-- name: projection_share_lock
LOCK TABLE jobs IN SHARE MODE;

-- name: projection_states
SELECT job_id, state FROM jobs;

-- name: jobs_by_status
SELECT status, count(*) FROM jobs GROUP BY status;

-- name: stream_head
-- The last seq of any stream (its (stream, seq) index answers it); callers hold the stream's lock.
SELECT coalesce(max(seq), 0) FROM receipts WHERE stream = %(stream)s;

-- name: append_stream
-- Insert receipts of one stream (seqs computed under the stream's lock), then NOTIFY its name.
WITH inserted AS (
    INSERT INTO receipts (stream, seq, type, data, recorded_at)
    SELECT %(stream)s, u.seq, u.type, u.data, now()
    FROM unnest(%(seqs)s::integer[], %(types)s::text[], %(datas)s::jsonb[]) AS u(seq, type, data)
    RETURNING position, seq
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted), pg_notify('receipts', %(note)s);
