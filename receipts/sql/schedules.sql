-- Schedules (receipts/schedules/): the projection's statements, the API's page, the sync's.

-- name: schedule_upsert
-- The projection row of a folded schedule (keeps synced_seq: only the sync writes it).
INSERT INTO schedules (schedule_id, seq, organization_id, status, definition_seq, created_at,
                       updated_at, state)
VALUES (%(schedule_id)s, %(seq)s, %(organization_id)s, %(status)s, %(definition_seq)s,
        %(created_at)s, %(updated_at)s, %(state)s)
ON CONFLICT (schedule_id) DO UPDATE
SET seq = EXCLUDED.seq, status = EXCLUDED.status, definition_seq = EXCLUDED.definition_seq,
    updated_at = EXCLUDED.updated_at, state = EXCLUDED.state;

-- name: schedule_get
SELECT state FROM schedules WHERE schedule_id = %(schedule_id)s;

-- name: schedules_by_caller_id
-- The schedules an admin may mean by an organization's own id (`<id>` of `<id>~<tag>`, or an
-- unscoped id), deleted ones left out (a deleted schedule is 404 by any name, and must not make
-- a live one of another organization ambiguous): two rows tell "one" from "ambiguous"
-- (schedules_caller_id_idx, 0024).
SELECT schedule_id FROM schedules
WHERE split_part(schedule_id, '~', 1) = %(schedule_id)s::text AND status <> 'deleted'
ORDER BY schedule_id
LIMIT 2;

-- name: schedule_get_for_update
-- A writer's read, under its stream lock (as objective_get_for_update: a rebuild waits for it).
SELECT state FROM schedules WHERE schedule_id = %(schedule_id)s FOR NO KEY UPDATE;

-- name: schedules_live_count
-- An organization's schedules (deleted ones do not count), for its cap.
SELECT count(*) FROM schedules
WHERE organization_id IS NOT DISTINCT FROM %(organization_id)s::text AND status <> 'deleted';

-- name: api_list_schedules
-- One page of schedules (not deleted), newest first, keyset-paginated on (created_at, schedule_id).
SELECT state
FROM schedules
WHERE status <> 'deleted'
  AND (%(all_organizations)s::boolean OR organization_id = %(caller_organization_id)s::text)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (created_at, schedule_id)
          < (%(before_created_at)s::timestamptz, %(before_schedule_id)s::text))
ORDER BY created_at DESC, schedule_id DESC
LIMIT %(limit)s;

-- name: schedules_unsynced
-- The schedules whose Temporal Schedule does not match their definition yet, oldest change first.
SELECT state, definition_seq FROM schedules
WHERE synced_seq < definition_seq
ORDER BY updated_at
LIMIT %(limit)s;

-- name: schedule_synced
-- The Temporal Schedule matches the definition up to `seq` (never moves backwards).
UPDATE schedules SET synced_seq = %(seq)s
WHERE schedule_id = %(schedule_id)s AND synced_seq < %(seq)s;

-- name: schedules_live
-- Every schedule Temporal should hold (active or paused), for the check that it still does.
SELECT schedule_id FROM schedules WHERE status <> 'deleted';

-- name: schedules_resync
-- Temporal lost these schedules: write them again at the sync's next pass.
UPDATE schedules SET synced_seq = 0 WHERE schedule_id = ANY(%(schedule_ids)s::text[]);

-- name: schedules_lock
LOCK TABLE schedules IN EXCLUSIVE MODE;

-- name: schedules_clear
DELETE FROM schedules;

-- name: schedules_states
SELECT schedule_id, state FROM schedules WHERE schedule_id = ANY(%(keys)s::text[]);

-- name: schedules_unchained
SELECT schedule_id FROM schedules t
WHERE NOT EXISTS (SELECT 1 FROM receipts r WHERE r.stream = %(prefix)s || t.schedule_id);

-- name: schedule_firing_recorded
-- Whether the schedule's stream records a firing (or a skip) of `fire_time` (an ISO time as the
-- firing wrote it): asked only for the other occurrence of an hour a DST fall-back repeats, and
-- for a firing older than every recent one the projection keeps (delivered late).
SELECT 1 FROM receipts
WHERE stream = %(stream)s AND type IN ('schedule.fired', 'schedule.skipped')
  AND data->>'fireTime' = %(fire_time)s
LIMIT 1;

-- Compaction (receipts/schedules/compaction.py): a schedule's firing receipts recorded before the
-- cutoff and older than its newest `keep` firings; the definitions and the head are never
-- among them. Earlier compactions go with each new one (superseded by its totals).

-- name: schedule_compaction_candidates
-- Schedules after `after` (keyset) whose oldest firing receipt is due: it is read from the
-- stream's start (definitions, then firings), the boundary from its head.
SELECT s.schedule_id FROM schedules s
CROSS JOIN LATERAL (
    SELECT r.seq, r.recorded_at FROM receipts r
    WHERE r.stream = 'schedules/' || s.schedule_id
      AND r.type IN ('schedule.fired', 'schedule.skipped')
    ORDER BY r.seq LIMIT 1) oldest
WHERE s.schedule_id > %(after)s
  AND oldest.recorded_at < %(cutoff)s
  AND oldest.seq < coalesce((SELECT k.seq FROM receipts k
                             WHERE k.stream = 'schedules/' || s.schedule_id
                               AND k.type IN ('schedule.fired', 'schedule.skipped')
                             ORDER BY k.seq DESC OFFSET (%(keep)s - 1) LIMIT 1), 0)
ORDER BY s.schedule_id
LIMIT %(batch)s;

-- name: schedule_compaction_due
-- The seqs a compaction deletes, oldest first, at most `limit` (included by the two below).
SELECT r.seq FROM receipts r
WHERE r.stream = %(stream)s
  AND r.type IN ('schedule.fired', 'schedule.skipped')
  AND r.recorded_at < %(cutoff)s
  AND r.seq < coalesce((SELECT k.seq FROM receipts k
                        WHERE k.stream = %(stream)s
                          AND k.type IN ('schedule.fired', 'schedule.skipped')
                        ORDER BY k.seq DESC OFFSET (%(keep)s - 1) LIMIT 1), 0)
ORDER BY r.seq
LIMIT %(limit)s

-- name: schedule_compaction_delete
DELETE FROM receipts
WHERE stream = %(stream)s AND seq IN (
    -- include: schedule_compaction_due
)
RETURNING seq;

-- name: schedule_compaction_drop_compacted
-- The earlier compactions, below the one just appended (which holds the totals, at the head).
DELETE FROM receipts
WHERE stream = %(stream)s AND type = 'schedule.compacted' AND seq < %(below)s
RETURNING seq;

-- name: schedule_compaction_count
SELECT (SELECT count(*) FROM (
            -- include: schedule_compaction_due
        ) AS due),
       (SELECT count(*) FROM receipts WHERE stream = %(stream)s AND type = 'schedule.compacted');
