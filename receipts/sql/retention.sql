-- Retention (receipts/retention.py, docs/history.md): terminal jobs settled before a cutoff are
-- deleted with every row that belongs to them, in batches, one transaction per batch.

-- name: retention_cutoff
SELECT now() - make_interval(secs => %(older_than_s)s);

-- name: prune_victims
-- A batch of terminal jobs settled before the cutoff (jobs_terminal_idx). Only terminal rows
-- are locked, and a row another transaction holds (a late receipt on a settled job) is skipped,
-- never waited for: a prune never holds or waits on a live job's lock. An agent job's turn
-- (kind agent_job.turn) goes only with its agent job (prune_agent_victims); a retry's copy of
-- one (`retryOf`, made before turns were refused a retry) is no agent job's, so goes as a job. A job of an
-- objective (`objective:<id>:…`, of its organization, naming it) goes only with that objective
-- (prune_objective_victims), never before it: its control passes and its audit read them, its
-- tries name them, and its run job is what a re-post of `POST /objectives` finds (with the run
-- job gone and the objective there, the re-post made a second run job). A job that
-- still owes a callback (its callback_outbox row) or a webhook delivery (pending) stays until
-- it is posted or given up: a retention shorter than the webhooks' retry window, or a receiver
-- down for longer than it, must not drop what is owed. A pass's batch starts after the last
-- batch's last victim (`after_*`): what a pass keeps back is looked at once a pass, not by
-- every batch after it.
-- include: prune_candidates
FOR UPDATE OF j SKIP LOCKED;

-- name: prune_candidates
-- The same jobs, read without locks, keyset-paginated on (updated_at, job_id) (dry run, export).
SELECT j.job_id, j.updated_at FROM jobs j
WHERE j.status IN ('completed', 'failed', 'canceled') AND j.updated_at < %(cutoff)s
  AND (j.kind <> 'agent_job.turn' OR j.state ->> 'retryOf' IS NOT NULL)
  AND NOT (j.job_id LIKE 'objective:%%' AND EXISTS (
      SELECT 1 FROM objectives o
      WHERE o.objective_id = j.state->'payload'->>'objectiveId'
        AND o.organization_id = j.organization_id))
  AND NOT EXISTS (SELECT 1 FROM callback_outbox c WHERE c.job_id = j.job_id)
  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
                  WHERE w.subject = j.job_id AND w.status = 'pending' AND w.event LIKE 'job.%%')
  AND (j.updated_at, j.job_id) > (%(after_updated_at)s, %(after_job_id)s)
ORDER BY j.updated_at, j.job_id
LIMIT %(batch)s;

-- name: prune_receipts
DELETE FROM receipts
WHERE stream = ANY (SELECT 'jobs/' || id FROM unnest(%(job_ids)s::text[]) AS v(id));

-- name: count_receipts
SELECT count(*) FROM receipts
WHERE stream = ANY (SELECT 'jobs/' || id FROM unnest(%(job_ids)s::text[]) AS v(id));

-- name: prune_deliveries
DELETE FROM deliveries WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_deliveries
SELECT count(*) FROM deliveries WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_delivery_redrives
DELETE FROM delivery_redrives WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_delivery_redrives
SELECT count(*) FROM delivery_redrives WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_callback_posts
DELETE FROM callback_posts WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_callback_posts
SELECT count(*) FROM callback_posts WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_callback_outbox
DELETE FROM callback_outbox WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_callback_outbox
SELECT count(*) FROM callback_outbox WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_workflow_runs
DELETE FROM workflow_runs WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_workflow_runs
SELECT count(*) FROM workflow_runs WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_activity_runs
DELETE FROM activity_runs WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_activity_runs
SELECT count(*) FROM activity_runs WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_job_leases
DELETE FROM job_leases WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_job_leases
SELECT count(*) FROM job_leases WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_jobs
DELETE FROM jobs WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: count_jobs
SELECT count(*) FROM jobs WHERE job_id = ANY (%(job_ids)s::text[]);

-- name: prune_agent_victims
-- A batch of settled agent jobs (succeeded, failed, stopped) last changed before the cutoff whose
-- turns' queue jobs (`<agentJobId>:attempt:<n>[:turn:<t>]`, a range of the jobs key) are all
-- settled too: an operator's stop leaves a live turn running, and its agent job waits for it.
-- After the last batch's last victim, as prune_victims.
-- include: prune_agent_candidates
FOR UPDATE OF a SKIP LOCKED;

-- name: prune_agent_candidates
-- The same agent jobs without locks, keyset-paginated (dry run).
SELECT a.agent_job_id, a.updated_at FROM agent_jobs a
WHERE a.status IN ('succeeded', 'failed', 'stopped') AND a.updated_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM jobs j
                  WHERE j.job_id COLLATE "C" >= a.agent_job_id || ':attempt:'
                    AND j.job_id COLLATE "C" < a.agent_job_id || ':attempt;'
                    AND j.status IN ('queued', 'leased', 'running'))
  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
                  WHERE w.subject = a.agent_job_id AND w.status = 'pending'
                    AND w.event = 'session.wakeup')
  -- nor while a turn's queue job owes its callback or a webhook delivery (the pending rows of
  -- the turns' range: webhook_deliveries_pending_subject_idx, 0025)
  AND NOT EXISTS (SELECT 1 FROM callback_outbox o
                  WHERE o.job_id COLLATE "C" >= a.agent_job_id || ':attempt:'
                    AND o.job_id COLLATE "C" < a.agent_job_id || ':attempt;')
  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
                  WHERE w.organization_id = a.organization_id AND w.status = 'pending'
                    AND w.subject COLLATE "C" >= a.agent_job_id || ':attempt:'
                    AND w.subject COLLATE "C" < a.agent_job_id || ':attempt;')
  -- nor while a wakeup of it still owes its event callback to a configured URL: the wakeup
  -- redrive (agent_wakeups_unposted) posts the wakeups of the last day not yet posted to it or
  -- given up (no URL configured: nothing is owed). `OFFSET 0` keeps each post's lookup a probe
  -- of callback_posts' key, not an anti-join over every callback ever posted.
  AND NOT EXISTS (SELECT 1 FROM agent_job_wakeups k
                  CROSS JOIN unnest(%(callback_urls)s::text[]) AS u(url)
                  WHERE k.agent_job_id = a.agent_job_id
                    AND k.created_at >= now() - interval '1 day'
                    AND NOT EXISTS (SELECT 1 FROM callback_posts c
                                    WHERE c.job_id = k.source_id AND c.event = 'session.wakeup'
                                      AND c.url = u.url
                                      AND (c.status = 'posted' OR c.attempts >= 5)
                                    OFFSET 0))
  AND (a.updated_at, a.agent_job_id) > (%(after_updated_at)s, %(after_job_id)s)
ORDER BY a.updated_at, a.agent_job_id
LIMIT %(batch)s;

-- name: agent_turn_jobs
-- The queue jobs of these agent jobs' turns (all settled: see prune_agent_victims), locked in
-- job id order. Each agent job's range is read through jobs_id_bytewise_idx (`OFFSET 0`, as in
-- objective_jobs: a join of the ids with jobs was planned as a nested loop comparing every job
-- with every id, 36 s for a batch of 1 000 at 200 000 jobs).
SELECT j.job_id FROM jobs j
WHERE j.job_id = ANY (ARRAY(SELECT t.job_id FROM unnest(%(agent_job_ids)s::text[]) AS a(id)
                            CROSS JOIN LATERAL (
                                SELECT t.job_id FROM jobs t
                                WHERE t.job_id COLLATE "C" >= a.id || ':attempt:'
                                  AND t.job_id COLLATE "C" < a.id || ':attempt;'
                                OFFSET 0) t))
ORDER BY j.job_id
FOR UPDATE OF j;

-- name: prune_agent_job_receipts
DELETE FROM receipts
WHERE stream = ANY (SELECT 'agent-jobs/' || id FROM unnest(%(agent_job_ids)s::text[]) AS v(id));

-- name: count_agent_job_receipts
SELECT count(*) FROM receipts
WHERE stream = ANY (SELECT 'agent-jobs/' || id FROM unnest(%(agent_job_ids)s::text[]) AS v(id));

-- name: prune_agent_wakeup_callbacks
-- The wakeups' event callbacks (callback_posts keyed by the wakeup's source id).
DELETE FROM callback_posts
WHERE job_id IN (SELECT source_id FROM agent_job_wakeups
                 WHERE agent_job_id = ANY (%(agent_job_ids)s::text[]));

-- name: count_agent_wakeup_callbacks
SELECT count(*) FROM callback_posts
WHERE job_id IN (SELECT source_id FROM agent_job_wakeups
                 WHERE agent_job_id = ANY (%(agent_job_ids)s::text[]));

-- name: prune_agent_session_receipts
-- The wakeups these agent jobs wrote on their owners' session streams (the session stays), but
-- a stream's head: a seq is never used twice, so a client that read up to it and resumes after
-- it misses no later wakeup.
DELETE FROM receipts r
USING agent_job_wakeups w
WHERE w.agent_job_id = ANY (%(agent_job_ids)s::text[])
  AND r.stream = 'sessions/' || w.session_id AND r.seq = w.session_seq
  AND r.seq < (SELECT max(h.seq) FROM receipts h WHERE h.stream = r.stream);

-- name: count_agent_session_receipts
SELECT count(*) FROM receipts r
JOIN agent_job_wakeups w ON r.stream = 'sessions/' || w.session_id AND r.seq = w.session_seq
WHERE w.agent_job_id = ANY (%(agent_job_ids)s::text[])
  AND r.seq < (SELECT max(h.seq) FROM receipts h WHERE h.stream = r.stream);

-- name: prune_agent_job_wakeups
DELETE FROM agent_job_wakeups WHERE agent_job_id = ANY (%(agent_job_ids)s::text[]);

-- name: count_agent_job_wakeups
SELECT count(*) FROM agent_job_wakeups WHERE agent_job_id = ANY (%(agent_job_ids)s::text[]);

-- name: prune_agent_jobs
DELETE FROM agent_jobs WHERE agent_job_id = ANY (%(agent_job_ids)s::text[]);

-- name: count_agent_jobs
SELECT count(*) FROM agent_jobs WHERE agent_job_id = ANY (%(agent_job_ids)s::text[]);

-- name: export_jobs
-- The jobs of one export batch with their receipts, in order.
SELECT j.job_id, j.state,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'stream', r.stream, 'seq', r.seq, 'type', r.type, 'data', r.data,
                     'recordedAt', r.recorded_at, 'position', r.position) ORDER BY r.seq)
                 FROM receipts r WHERE r.stream = 'jobs/' || j.job_id), '[]'::jsonb)
FROM jobs j
WHERE j.job_id = ANY (%(job_ids)s::text[])
ORDER BY j.updated_at, j.job_id;

-- name: export_agent_jobs
-- The agent jobs of one export batch with their own chains (`agent-jobs/<id>`), in order.
SELECT a.agent_job_id, a.state,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'stream', r.stream, 'seq', r.seq, 'type', r.type, 'data', r.data,
                     'recordedAt', r.recorded_at, 'position', r.position) ORDER BY r.seq)
                 FROM receipts r WHERE r.stream = 'agent-jobs/' || a.agent_job_id), '[]'::jsonb)
FROM agent_jobs a
WHERE a.agent_job_id = ANY (%(agent_job_ids)s::text[])
ORDER BY a.updated_at, a.agent_job_id;

-- name: agent_turn_job_ids
-- Export: the queue jobs of these agent jobs' turns, unlocked, with their agent job; each range
-- read through jobs_id_bytewise_idx (see agent_turn_jobs).
SELECT a.id, j.job_id FROM unnest(%(agent_job_ids)s::text[]) AS a(id)
CROSS JOIN LATERAL (
    SELECT j.job_id FROM jobs j
    WHERE j.job_id COLLATE "C" >= a.id || ':attempt:' AND j.job_id COLLATE "C" < a.id || ':attempt;'
    OFFSET 0
) j
ORDER BY j.job_id;

-- name: export_objectives
-- The objectives of one export batch with their own chains (`objectives/<id>`), in order.
SELECT o.objective_id, o.state,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'stream', r.stream, 'seq', r.seq, 'type', r.type, 'data', r.data,
                     'recordedAt', r.recorded_at, 'position', r.position) ORDER BY r.seq)
                 FROM receipts r WHERE r.stream = 'objectives/' || o.objective_id), '[]'::jsonb)
FROM objectives o
WHERE o.objective_id = ANY (%(objective_ids)s::text[])
ORDER BY o.updated_at, o.objective_id;

-- name: prune_objective_victims
-- A batch of settled objectives last changed before the cutoff none of whose jobs is live
-- (objectives_settled_idx, objective_has_live_job), after the last batch's last one (as
-- prune_victims: one the batch then keeps back, a job of it owing a delivery, is passed over).
-- include: prune_objective_candidates
FOR UPDATE OF o SKIP LOCKED;

-- name: prune_objective_candidates
-- The same objectives without locks, keyset-paginated (dry run).
SELECT o.objective_id, o.updated_at, o.seq FROM objectives o
WHERE o.status IN ('completed', 'failed', 'canceled') AND o.updated_at < %(cutoff)s
  AND NOT objective_has_live_job(o.objective_id, o.organization_id)
  AND NOT EXISTS (SELECT 1 FROM webhook_deliveries w
                  WHERE w.subject = o.objective_id AND w.status = 'pending'
                    AND w.event = 'objective.settled')
  AND (o.updated_at, o.objective_id) > (%(after_updated_at)s, %(after_job_id)s)
ORDER BY o.updated_at, o.objective_id
LIMIT %(batch)s;

-- name: objective_jobs
-- The jobs of these objectives (see objective_has_live_job, migrations/0012, for which are an
-- objective's: the range of its caller id, its organization, naming it), with
-- their status and last change, unlocked: the prune drops an objective one of whose jobs turned
-- live; the dry run and the export take them all (no job batch takes an objective's job). Each
-- objective's range is read through jobs_id_bytewise_idx, one objective at a time (`OFFSET 0`
-- keeps the planner from flattening the lateral read into a hash join over every job ever run;
-- the organization is a filter, not a second index).
SELECT o.objective_id, j.job_id, j.status, j.updated_at FROM objectives o
CROSS JOIN LATERAL (
    SELECT j.job_id, j.status, j.updated_at FROM jobs j
    WHERE j.job_id COLLATE "C" >= 'objective:' || split_part(o.objective_id, '~', 1) || ':'
      AND j.job_id COLLATE "C" < 'objective:' || split_part(o.objective_id, '~', 1) || ';'
      AND (j.organization_id = o.organization_id) IS TRUE
      AND j.state -> 'payload' ->> 'objectiveId' = o.objective_id
    OFFSET 0
) j
WHERE o.objective_id = ANY (%(objective_ids)s::text[])
ORDER BY j.job_id;

-- name: objective_streams_try_lock
-- The streams of these objectives, each locked as its writers lock it (`lock_key`), without
-- waiting: an objective whose stream a writer holds is left for a later batch.
SELECT v.id FROM unnest(%(objective_ids)s::text[]) AS v(id)
WHERE pg_try_advisory_xact_lock(hashtextextended('stream:objectives/' || v.id, 0));

-- name: jobs_try_lock
-- These jobs' rows, locked without waiting: the ones another transaction holds are left out.
SELECT job_id FROM jobs WHERE job_id = ANY (%(job_ids)s::text[])
FOR UPDATE SKIP LOCKED;

-- name: prune_objective_receipts
DELETE FROM receipts
WHERE stream = ANY (SELECT 'objectives/' || id FROM unnest(%(objective_ids)s::text[]) AS v(id));

-- name: count_objective_receipts
SELECT count(*) FROM receipts
WHERE stream = ANY (SELECT 'objectives/' || id FROM unnest(%(objective_ids)s::text[]) AS v(id));

-- name: prune_objectives
DELETE FROM objectives WHERE objective_id = ANY (%(objective_ids)s::text[]);

-- name: count_objectives
SELECT count(*) FROM objectives WHERE objective_id = ANY (%(objective_ids)s::text[]);

-- name: jobs_owing_deliveries
-- Which of these jobs still owe a callback or a webhook delivery (an objective's jobs go with it
-- only once none does).
SELECT job_id FROM callback_outbox WHERE job_id = ANY (%(job_ids)s::text[])
UNION
SELECT subject FROM webhook_deliveries
WHERE subject = ANY (%(job_ids)s::text[]) AND status = 'pending' AND event LIKE 'job.%%';

-- name: workspace_owners_active
-- Whose workspaces may be in use (activities/workspace_sweep.py): per organization, its
-- unsettled jobs (a standalone task's workspace is its job's), its active objectives, and the
-- workspace owners of its unfinished agent jobs or of those with a turn still running.
SELECT organization_id, 'jobs', job_id FROM jobs
WHERE status IN ('queued', 'leased', 'running') AND organization_id IS NOT NULL
UNION ALL
-- A task naming an objective works in its workspace, whether or not the objective is active.
SELECT organization_id, 'objectives', state -> 'payload' ->> 'objectiveId' FROM jobs
WHERE status IN ('queued', 'leased', 'running') AND organization_id IS NOT NULL
  AND state -> 'payload' ->> 'objectiveId' IS NOT NULL
UNION ALL
SELECT organization_id, 'objectives', objective_id FROM objectives WHERE status = 'active'
UNION ALL
SELECT a.organization_id, 'agent-jobs', coalesce(a.state ->> 'workspaceOwnerJobId', a.agent_job_id)
FROM agent_jobs a
LEFT JOIN jobs t ON t.job_id = a.state ->> 'liveTurnJobId'
                AND t.status IN ('queued', 'leased', 'running')
WHERE a.status NOT IN ('succeeded', 'failed', 'stopped') OR t.job_id IS NOT NULL;
