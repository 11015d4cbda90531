-- Named statements. Each begins with a `-- name:` line; parameters are psycopg %(name)s.

-- name: migrations_lock
SELECT pg_advisory_xact_lock(hashtextextended('receipt:migrations', 0));

-- name: migrations_lock_timeout
-- Each lock a migration takes from here on (a table's, for an index or a column) is waited for
-- at most this long: a migration queued behind a long transaction holds every write to that
-- table queued behind itself.
SELECT set_config('lock_timeout', %(ms)s, true);

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

-- name: session_settings
-- Session settings of a new pooled connection (jit, statement_timeout, ...).
SELECT set_config(u.name, u.value, false)
FROM unnest(%(names)s::text[], %(values)s::text[]) AS u(name, value);

-- name: session_settings_held
-- The settings of `names` a session has from the server, its database and its role (what a
-- pool behind a transaction pooler gets: it sets none of its own), in the units
-- `session_settings` writes them (statement_timeout in ms).
SELECT name, setting FROM pg_settings WHERE name = ANY(%(names)s::text[]);

-- name: listen_probe
-- A notice to a listener's own channel, from another connection: heard, its LISTEN holds a
-- session (receipts/listen.py `Listener._prove`).
SELECT pg_notify(%(channel)s, 'probe');

-- name: lock_key
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- name: try_lock_key
-- The same lock, not waited for: true when taken (a single-flight pass), false when held.
SELECT pg_try_advisory_xact_lock(hashtextextended(%(key)s, 0));

-- A job's folded state is its projection row's `state`, overlaid with its lease row's `patch`
-- when a heartbeat wrote that after the row (migrations/0007_history.sql). Every read of a job's
-- state goes through this overlay.

-- name: job_lock
-- The job's row lock alone; `Tx.job_for_update` reads the row in the next statement. A read in
-- this one's snapshot, taken before a wait for the lock, misses the lease row a guarded plain
-- heartbeat (guarded.sql) wrote meanwhile: it locks the jobs row without updating it, so the row
-- is not re-read after the wait. The job's head read there is stale, and an append at it fails
-- as a conflict (a singleton steer answered 409 "jobId already in use", a command refused).
SELECT 1 FROM jobs WHERE job_id = %(job_id)s FOR UPDATE;

-- name: session_active_lock
-- `session_active_for_update`'s row locks alone, in jobId order (read by the next statement).
SELECT 1 FROM jobs j
WHERE j.organization_id IS NOT DISTINCT FROM %(organization_id)s
  AND j.session_key = %(session_key)s
  AND j.status IN ('queued', 'leased', 'running')
ORDER BY j.job_id
FOR UPDATE;

-- name: job_for_update
SELECT now(), CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = %(job_id)s
FOR UPDATE OF j;

-- name: job_get
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = %(job_id)s;

-- name: job_get_with_now
SELECT now(), (SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
               FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
               WHERE j.job_id = %(job_id)s);

-- name: job_by_command
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM receipts r JOIN jobs j ON j.job_id = substr(r.stream, 6)
LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE r.type = 'queue.command' AND r.data ->> 'commandId' = %(command_id)s
  AND r.stream LIKE 'jobs/%%'
ORDER BY r.position
LIMIT 1;

-- name: command_payloads
-- The payloads of a job's commands, by reference (receipts/commands.py): the `queue.command`
-- receipts at `seqs` on the job's stream, and by `commandId` those a state folded before
-- references kept without their seq (receipts_command_id_idx).
SELECT r.seq, r.data ->> 'commandId', r.data -> 'payload'
FROM receipts r
WHERE r.stream = %(stream)s AND r.seq = ANY(%(seqs)s::integer[]) AND r.type = 'queue.command'
UNION ALL
SELECT r.seq, r.data ->> 'commandId', r.data -> 'payload'
FROM receipts r
WHERE r.type = 'queue.command' AND r.data ->> 'commandId' = ANY(%(command_ids)s::text[])
  AND r.stream = %(stream)s;

-- name: command_payload_bytes
-- The bytes of the payloads (their JSON text) of a job's commands, by reference as
-- `command_payloads` reads them, without reading them out (an agent job's cap on the follow-ups
-- it holds for its next turn: receipts/agent_jobs/interventions.py).
SELECT coalesce(sum(octet_length(sent.payload::text)), 0)
FROM (
    SELECT r.data -> 'payload' AS payload
    FROM receipts r
    WHERE r.stream = %(stream)s AND r.seq = ANY(%(seqs)s::integer[]) AND r.type = 'queue.command'
    UNION ALL
    SELECT r.data -> 'payload'
    FROM receipts r
    WHERE r.type = 'queue.command' AND r.data ->> 'commandId' = ANY(%(command_ids)s::text[])
      AND r.stream = %(stream)s
) AS sent;

-- name: session_active_for_update
SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.organization_id IS NOT DISTINCT FROM %(organization_id)s
  AND j.session_key = %(session_key)s
  AND j.status IN ('queued', 'leased', 'running')
ORDER BY j.job_id
FOR UPDATE OF j;

-- name: insert_receipts
-- The receipts of one append (`Tx._insert`: seqs numbered under the stream's lock or the job's
-- row lock) at the database time. Every append statement includes it as its `inserted` CTE.
-- The receipts' types and data travel as binary text arrays (the `b` placeholders): the text form
-- of an array escapes every quote of every JSON document, client side, a regex substitution each.
INSERT INTO receipts (stream, seq, type, data, recorded_at)
SELECT %(stream)s, u.seq, u.type, u.data, now()
FROM unnest(%(seqs)s::integer[], %(types)b::text[], %(datas)b::jsonb[]) AS u(seq, type, data)
RETURNING position, seq;

-- name: append_job
-- Insert the job's new receipts and upsert its projection row in one statement, then NOTIFY.
WITH inserted AS (
    -- include: insert_receipts
), projected AS (
    -- include: jobs_insert
    ON CONFLICT (job_id) DO UPDATE SET
        seq = EXCLUDED.seq, status = EXCLUDED.status, attempt = EXCLUDED.attempt,
        abort_requested = EXCLUDED.abort_requested, available_at = EXCLUDED.available_at,
        lease_expires_at = EXCLUDED.lease_expires_at,
        last_heartbeat_at = EXCLUDED.last_heartbeat_at, updated_at = EXCLUDED.updated_at,
        state = EXCLUDED.state, worker_queue = EXCLUDED.worker_queue
    RETURNING 1
), lease_ended AS (
    -- The job left leased/running: its lease row has nothing more to say.
    DELETE FROM job_leases WHERE %(lease_ended)s AND job_id = %(job_id)s
), slot_freed AS (
    -- Settled now: its organization's dispatch slot is free for the next job (migration 0008).
    DELETE FROM dispatch_slots WHERE %(settled)s AND job_id = %(job_id)s
), owed AS (
    -- Settled now, with a callback URL configured: its terminal callbacks are owed until
    -- posted (callback_outbox).
    INSERT INTO callback_outbox (job_id, event)
    SELECT %(job_id)s, %(status)s WHERE %(owed)s
    ON CONFLICT (job_id) DO NOTHING
), hooked AS (
    -- Settled now: a delivery owed to each of its organization's webhooks subscribed to
    -- `job.<status>` (receipts/sql/webhooks.sql; none subscribed: nothing written).
    -- include: webhook_owed_job
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM projected),
       (SELECT count(*) FROM (SELECT pg_notify(c, %(note)s) FROM unnest(%(channels)s::text[]) AS c) AS sent);

-- name: append_job_heartbeat
-- A heartbeat that changes only the lease's expiry, the last heartbeat time and the stream's
-- head: insert its receipts and update the job's narrow lease row (HOT), not the jobs row.
WITH inserted AS (
    -- include: insert_receipts
), leased AS (
    INSERT INTO job_leases (job_id, seq, expires_at, patch)
    VALUES (%(job_id)s, %(seq)s, %(lease_expires_at)s, %(patch)s)
    ON CONFLICT (job_id) DO UPDATE SET
        seq = EXCLUDED.seq, expires_at = EXCLUDED.expires_at, patch = EXCLUDED.patch
    RETURNING 1
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM leased),
       (SELECT count(*) FROM (SELECT pg_notify(c, %(note)s) FROM unnest(%(channels)s::text[]) AS c) AS sent);

-- name: job_write_found
-- A fenced write a delivery may be repeating (its earlier try's answer was lost): the job's
-- receipt of `type` that carries its `writeId`, if that try committed.
SELECT 1 FROM receipts
WHERE stream = %(stream)s AND type = %(type)s AND data ->> 'writeId' = %(write_id)s
LIMIT 1;

-- name: read_stream
SELECT stream, seq, type, data, recorded_at, position
FROM receipts
WHERE stream = %(stream)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s;

-- name: read_stream_tail
-- The stream's newest `limit` receipts, in order.
SELECT * FROM (
    SELECT stream, seq, type, data, recorded_at, position
    FROM receipts
    WHERE stream = %(stream)s
    ORDER BY seq DESC
    LIMIT %(limit)s) AS newest
ORDER BY seq;

-- name: read_all
SELECT stream, seq, type, data, recorded_at, position
FROM receipts
WHERE position > %(after_position)s
ORDER BY position
LIMIT %(limit)s;

-- name: advance_id_sequences
-- `receipt restored` only (docs/operations.md, *Backups*): a database restored to an earlier
-- point would issue again the receipt positions and webhook delivery ids the lost history took
-- (an organization was shown those delivery ids); each sequence moves `gap` past its last value.
SELECT setval(s::regclass, nextval(s::regclass) + %(gap)s)
FROM (VALUES (pg_get_serial_sequence('receipts', 'position')),
             (pg_get_serial_sequence('webhook_deliveries', 'delivery_id'))) AS t (s);

-- name: read_streams
-- Every stream of one kind (`jobs/`, `objectives/`, `agent-jobs/`), for `receipt
-- rebuild-projections` only (never a periodic scan).
SELECT stream, seq, type, data, recorded_at, position
FROM receipts
WHERE starts_with(stream, %(prefix)s)
ORDER BY stream, seq;

-- The projection tables' statements (receipts/projections.py): `<table>_lock` (a rebuild),
-- `<table>_clear`, `<table>_states` (the id and state of each row of `keys`: a batch of a
-- verify), `<table>_unchained` (the ids of rows whose stream holds no receipt).

-- name: jobs_lock
LOCK TABLE jobs IN EXCLUSIVE MODE;

-- name: jobs_states
SELECT j.job_id, CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = ANY(%(keys)s::text[]);

-- name: jobs_unchained
SELECT j.job_id FROM jobs j
WHERE NOT EXISTS (SELECT 1 FROM receipts r WHERE r.stream = %(prefix)s || j.job_id);

-- name: jobs_rows
-- Each job row's columns beside its state, in the order of receipts/projections.py `JOBS.columns`
-- (a verify compares them with the fold's row): `patched` when a newer lease row holds the lease
-- (a heartbeat), whose expiry is then the lease row's.
SELECT j.job_id, coalesce(l.seq > j.seq, false), j.seq, j.organization_id, j.session_key,
       j.agent_id, j.lane, j.kind, j.status, j.attempt, j.max_attempts, j.abort_requested,
       j.available_at,
       CASE WHEN l.seq > j.seq THEN l.expires_at ELSE j.lease_expires_at END,
       j.last_heartbeat_at, j.created_at, j.updated_at, j.worker_queue
FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
WHERE j.job_id = ANY(%(keys)s::text[]);

-- name: jobs_clear
WITH leases AS (DELETE FROM job_leases)
DELETE FROM jobs;

-- name: jobs_insert
-- A job's projection row (receipts/projections.py `JOBS`): a rebuild inserts it, `append_job`
-- upserts it.
INSERT INTO jobs (job_id, seq, organization_id, session_key, agent_id, lane, kind, status,
                  attempt, max_attempts, abort_requested, available_at, lease_expires_at,
                  last_heartbeat_at, created_at, updated_at, state, worker_queue)
VALUES (%(job_id)s, %(seq)s, %(organization_id)s, %(session_key)s, %(agent_id)s, %(lane)s,
        %(kind)s, %(status)s, %(attempt)s, %(max_attempts)s, %(abort_requested)s,
        %(available_at)s, %(lease_expires_at)s, %(last_heartbeat_at)s, %(created_at)s,
        %(updated_at)s, %(state)s, %(worker_queue)s);

-- name: expired_leases
-- The leased set only (jobs_lease_idx); a heartbeat's newer expiry is on the lease row.
SELECT j.job_id FROM jobs j
LEFT JOIN job_leases l ON l.job_id = j.job_id AND l.seq > j.seq
WHERE j.status IN ('leased', 'running')
  AND coalesce(l.expires_at, j.lease_expires_at) < now()
ORDER BY coalesce(l.expires_at, j.lease_expires_at)
LIMIT %(limit)s;

-- name: migrations_exist
SELECT to_regclass('schema_migrations') IS NOT NULL;

-- name: migrated
SELECT coalesce(max(version), 0) FROM schema_migrations;

-- name: jobs_by_status
-- Active jobs by status (jobs_active_status_idx): flat however many jobs have settled.
SELECT status, count(*) FROM jobs
WHERE status IN ('queued', 'leased', 'running')
GROUP BY status;

-- name: queued_oldest_age
-- The oldest queued job that may be delivered now, per lane and worker queue, as seconds by
-- the database clock: waiting since its enqueue or since its availableAt (a delayed or
-- backed-off job). Walks a partial index of active jobs only (jobs_queued_idx or
-- jobs_active_status_idx), so its cost follows the queue, not the history.
SELECT lane, worker_queue,
       extract(epoch FROM now() - min(greatest(created_at, coalesce(available_at, created_at))))
FROM jobs
WHERE status = 'queued' AND (available_at IS NULL OR available_at <= now())
GROUP BY lane, worker_queue;

-- name: stream_head
-- The last seq of any stream (its (stream, seq) index answers it); callers hold the stream's lock.
SELECT coalesce(max(seq), 0) FROM receipts WHERE stream = %(stream)s;

-- name: append_stream
-- Insert receipts of one stream (seqs computed under the stream's lock), then NOTIFY its name.
WITH inserted AS (
    -- include: insert_receipts
)
SELECT (SELECT array_agg(position ORDER BY seq) FROM inserted),
       (SELECT count(*) FROM (SELECT pg_notify(c, %(note)s) FROM unnest(%(channels)s::text[]) AS c) AS sent);

-- name: ping
SELECT 1;

-- name: snapshot_read_only
-- A verify's transaction: one snapshot of the chain and the projections, no lock (a share lock
-- stopped every enqueue and settle for the whole verify, and heartbeats passed it anyway).
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;
