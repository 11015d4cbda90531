-- Delivery bookkeeping, callbacks and the ledger (see migrations/0002_delivery.sql).

-- name: delivery_job_and_latest
SELECT (SELECT CASE WHEN l.seq > j.seq THEN j.state || l.patch ELSE j.state END
        FROM jobs j LEFT JOIN job_leases l ON l.job_id = j.job_id
        WHERE j.job_id = %(job_id)s),
       d.generation, d.workflow_id, now()
FROM (SELECT 1) AS one
LEFT JOIN deliveries d ON d.job_id = %(job_id)s;

-- name: delivery_record
INSERT INTO deliveries (job_id, generation, workflow_id)
VALUES (%(job_id)s, %(generation)s, %(workflow_id)s)
ON CONFLICT (job_id) DO UPDATE SET
    generation = GREATEST(deliveries.generation, EXCLUDED.generation),
    workflow_id = CASE WHEN EXCLUDED.generation >= deliveries.generation
                       THEN EXCLUDED.workflow_id ELSE deliveries.workflow_id END,
    dispatched_at = now();

-- name: redrive_claim
-- One observed queue state, claimed by one pass; a key claimed longer ago than the cooldown is
-- claimed again: the delivery it started closed with the job unchanged (Temporal lost it, or
-- the claiming process died before starting it), and nothing else would deliver that state.
-- Within the cooldown concurrent passes still deliver it once; the starter refuses a second
-- driver while one is open.
INSERT INTO delivery_redrives (redrive_key, job_id) VALUES (%(redrive_key)s, %(job_id)s)
ON CONFLICT (redrive_key) DO UPDATE SET created_at = now()
WHERE delivery_redrives.created_at <= now() - make_interval(secs => %(cooldown_ms)s / 1000.0)
RETURNING xmax <> 0 AS again;  -- an update of the old claim, not an insert

-- name: redrive_release
DELETE FROM delivery_redrives WHERE redrive_key = %(redrive_key)s;

-- name: delivery_touch
UPDATE deliveries SET dispatched_at = now() WHERE job_id = %(job_id)s;

-- name: dispatch_page_read
-- The scans' page of the queue (`undelivered_queued`, `redrive_candidates`): the `page` queued
-- jobs after the cursor, each with whether it is deliverable (dispatch_page, migrations/0026).
SELECT * FROM dispatch_page(%(queues)s::text[], %(caps)s::integer[],
                            %(after_created_at)s::timestamptz, %(after_job_id)s::text,
                            %(page)s::integer)

-- name: dispatch_page_next
-- The scans' CTEs after `page` and `picked`: how many jobs the page read and picked, and where
-- the next page starts: after the last job picked when the limit cut the page short, else after
-- the page's last job; none once the page read the newest (the next from the oldest).
counted AS (
    SELECT (SELECT count(*) FROM page) AS read, (SELECT count(*) FROM picked) AS picked
), last AS (
    SELECT x.created_at, x.job_id FROM counted c, LATERAL (
        SELECT p.created_at, p.job_id FROM picked p WHERE c.picked >= %(limit)s
        UNION ALL
        SELECT q.created_at, q.job_id FROM page q
        WHERE c.picked < %(limit)s AND c.read >= %(page)s
    ) x
    ORDER BY x.created_at DESC, x.job_id DESC
    LIMIT 1
)

-- name: undelivered_queued
-- One page of the dispatcher's rescan: of the `page` queued jobs after the cursor (dispatch_page,
-- migrations/0026), the deliverable ones never dispatched — those for which receipts/plan.py
-- `next_step(job, now(), slots=…)` is DELIVER or ABORT (`needs_delivery`) and no delivery was
-- recorded — at most `limit`, organizations interleaved. One row: the jobs read, where the next
-- page starts (after the last job picked when `limit` cut the page, else after its last job;
-- NULL once it read the newest), and the jobs picked.
-- tests/integration/test_plan.py checks that this, `redrive_candidates` and
-- `next_available_at` (the earliest NOT_AVAILABLE) agree with it.
-- The delivery is probed per deliverable job of the page (a LIMIT keeps the planner from
-- hashing all `deliveries`, which holds a row for every job ever dispatched).
WITH page AS MATERIALIZED (
    -- include: dispatch_page_read
), picked AS MATERIALIZED (
    SELECT q.job_id, q.created_at, q.share_rank FROM page q
    WHERE q.deliverable
      AND (SELECT 1 FROM deliveries d WHERE d.job_id = q.job_id LIMIT 1) IS NULL
    ORDER BY q.created_at, q.job_id
    LIMIT %(limit)s
),
-- include: dispatch_page_next
SELECT c.read, l.created_at, l.job_id,
       coalesce((SELECT array_agg(p.job_id ORDER BY p.share_rank, p.created_at, p.job_id)
                 FROM picked p), '{}'),
       NULL::integer[], NULL::integer[]
FROM counted c LEFT JOIN last l ON true;

-- name: next_available_at
SELECT min(j.available_at) FROM jobs j
WHERE j.status = 'queued' AND j.available_at > now()
  AND (SELECT 1 FROM deliveries d WHERE d.job_id = j.job_id LIMIT 1) IS NULL;

-- name: redrive_candidates
-- One page of the queued redrive: of the `page` queued jobs after the cursor, those `next_step`
-- would deliver (as above) older than the minimum age (by their latest receipt's database time)
-- and not dispatched within the cooldown, at most `limit`; one row as `undelivered_queued`'s.
WITH page AS MATERIALIZED (
    -- include: dispatch_page_read
), picked AS MATERIALIZED (
    SELECT q.job_id, q.created_at, q.share_rank, q.updated_at, q.seq, q.attempt FROM page q
    LEFT JOIN LATERAL (SELECT dd.dispatched_at FROM deliveries dd WHERE dd.job_id = q.job_id
                       LIMIT 1) d ON true
    WHERE q.deliverable
      AND q.updated_at <= now() - make_interval(secs => %(min_age_ms)s / 1000.0)
      AND (d.dispatched_at IS NULL
           OR d.dispatched_at <= now() - make_interval(secs => %(cooldown_ms)s / 1000.0))
    ORDER BY q.created_at, q.job_id
    LIMIT %(limit)s
),
-- include: dispatch_page_next
SELECT c.read, l.created_at, l.job_id,
       coalesce((SELECT array_agg(p.job_id ORDER BY p.share_rank, p.updated_at, p.job_id)
                 FROM picked p), '{}'),
       (SELECT array_agg(p.seq ORDER BY p.share_rank, p.updated_at, p.job_id) FROM picked p),
       (SELECT array_agg(p.attempt ORDER BY p.share_rank, p.updated_at, p.job_id)
        FROM picked p)
FROM counted c LEFT JOIN last l ON true;

-- name: dispatch_held_back
-- How many queued, deliverable jobs wait for a dispatch slot of their organization:
-- `dispatch_queue`'s rule (migrations/0008) counted per capped share, never ranked. A share's
-- waiting jobs (queued, available, no abort, no slot) are `n`; the first `cap - held` of them
-- may start, the rest are held back. Only capped shares' waiting jobs are read (a job of no
-- organization or of an uncapped queue not at all), counted without a sort, and `held` per
-- share from its slots. Through `dispatch_queue` the 5 s gauge read the queue twice and sorted
-- it (21 003 rows of `jobs` at 10 500 queued; tests/integration/test_dispatch_pages.py).
WITH capped AS (
    SELECT c.queue, c.cap FROM unnest(%(queues)s::text[], %(caps)s::integer[]) AS c(queue, cap)
    WHERE c.cap > 0
), waiting AS (
    SELECT j.organization_id, j.worker_queue, count(*) AS n
    FROM jobs j
    WHERE j.status = 'queued' AND j.organization_id IS NOT NULL
      AND j.worker_queue IN (SELECT capped.queue FROM capped)
      AND (j.available_at IS NULL OR j.available_at <= now()) AND NOT j.abort_requested
      AND NOT EXISTS (SELECT 1 FROM dispatch_slots s WHERE s.job_id = j.job_id)
    GROUP BY j.organization_id, j.worker_queue
)
SELECT coalesce(sum(greatest(w.n - greatest(c.cap - (
           SELECT count(*) FROM dispatch_slots s JOIN jobs a ON a.job_id = s.job_id
           WHERE s.organization_id = w.organization_id AND s.worker_queue = w.worker_queue
             AND a.status IN ('queued', 'leased', 'running')), 0), 0)), 0)::bigint
FROM waiting w JOIN capped c ON c.queue = w.worker_queue;

-- name: dispatch_claim
-- Under the lock of (organization, queue), in one statement (migrations/0010): the slots that
-- organization's other active jobs hold on the queue, whether this job holds one, and whether
-- one was taken for it now (when it held none and the cap was not reached).
SELECT held, mine, took
FROM dispatch_claim(%(job_id)s, %(organization_id)s, %(worker_queue)s, %(cap)s);

-- name: dispatch_release
-- The slot of a job still queued whose start failed (nothing delivers it): given back. A job a
-- delivery holds (leased, running) keeps its slot until it settles.
DELETE FROM dispatch_slots s
USING jobs j
WHERE s.job_id = %(job_id)s AND j.job_id = s.job_id AND j.status = 'queued'
RETURNING s.job_id;

-- name: dispatch_freed
-- The jobs a slot given back lets start: the oldest waiting jobs of the settled job's
-- organization on its queue, as many as its slots free there (dispatch_queue's rule, for one
-- share, through jobs_queued_share_idx). The inner LIMIT is the largest cap (`most`), known when
-- the statement is planned: with only `cap - held`, unknown then, PostgreSQL planned for a tenth
-- of the share and read and sorted the organization's whole backlog at every settle.
WITH share AS (
    SELECT x.organization_id, x.worker_queue, c.cap,
           (SELECT count(*) FROM dispatch_slots s JOIN jobs a ON a.job_id = s.job_id
            WHERE s.organization_id = x.organization_id AND s.worker_queue = x.worker_queue
              AND a.status IN ('queued', 'leased', 'running')) AS held
    FROM jobs x
    JOIN unnest(%(queues)s::text[], %(caps)s::integer[]) AS c(queue, cap)
      ON c.queue = x.worker_queue
    WHERE x.job_id = %(job_id)s AND x.organization_id IS NOT NULL AND c.cap > 0
)
SELECT w.job_id FROM share, LATERAL (
    SELECT oldest.job_id FROM (
        SELECT j.job_id, j.created_at FROM jobs j
        WHERE j.organization_id = share.organization_id AND j.worker_queue = share.worker_queue
          AND j.status = 'queued' AND (j.available_at IS NULL OR j.available_at <= now())
          AND NOT j.abort_requested
          AND NOT EXISTS (SELECT 1 FROM dispatch_slots s WHERE s.job_id = j.job_id)
        ORDER BY j.created_at, j.job_id
        LIMIT %(most)s
    ) oldest
    ORDER BY oldest.created_at, oldest.job_id
    LIMIT greatest(share.cap - share.held, 0)
) w;

-- name: callback_claim
-- Claim the post; a claim that never posted (a crash between claim and post, or a failed post)
-- may be claimed again after 30 s, up to 5 tries. `take_over`: at once (the retry of the
-- driver's own `dispatched` activity, whose killed try left the claim: nothing else posts it).
-- `dispatched` is never claimed for a URL once the job's terminal post to it was (the recovery
-- loop's, past `dispatched_wait_s`): a late `dispatched` would reach the receiver after it. Nor
-- is another event claimed while the job's `dispatched` to the URL is in flight (claimed within
-- the 30 s window): the recovery loop's read that found the terminal owed may be older than
-- that claim. Claims of one job and URL take turns (`deliveries.claim_callback`). The order is
-- checked once, by the SELECT: a row it holds back never reaches the conflict's update, and
-- the rows the check reads are never the conflicting row itself.
INSERT INTO callback_posts (job_id, event, url)
SELECT %(job_id)s, %(event)s, %(url)s
WHERE NOT EXISTS (SELECT 1 FROM callback_posts t
                  WHERE t.job_id = %(job_id)s AND t.url = %(url)s
                    AND CASE WHEN %(event)s::text = 'dispatched'
                             THEN t.event IN ('completed', 'failed', 'canceled')
                             ELSE t.event = 'dispatched' AND t.status = 'pending'
                                  AND t.posted_at > now() - interval '30 seconds' END)
ON CONFLICT (job_id, event, url) DO UPDATE SET posted_at = now(), status = 'pending'
WHERE callback_posts.status <> 'posted' AND callback_posts.attempts < 5
  AND (%(take_over)s OR callback_posts.posted_at < now() - interval '30 seconds')
RETURNING job_id;

-- name: callback_release
-- A claim whose post was cut off (its activity cancelled, its try failing before a result): it
-- may be claimed again at once, so the activity's retry posts it instead of skipping it.
UPDATE callback_posts SET posted_at = now() - interval '31 seconds'
WHERE job_id = %(job_id)s AND event = %(event)s AND url = %(url)s AND status = 'pending';

-- name: callback_result
UPDATE callback_posts SET status = %(status)s, attempts = attempts + 1,
    last_error = %(last_error)s, posted_at = now()
WHERE job_id = %(job_id)s AND event = %(event)s AND url = %(url)s;

-- name: ledger_workflow
INSERT INTO workflow_runs (workflow_id, run_id, job_id, workflow, task_queue, status, detail)
VALUES (%(workflow_id)s, %(run_id)s, %(job_id)s, %(workflow)s, %(task_queue)s, %(status)s,
        %(detail)s)
ON CONFLICT (workflow_id, run_id) DO UPDATE SET
    status = EXCLUDED.status, detail = EXCLUDED.detail, updated_at = now();

-- name: ledger_activity
INSERT INTO activity_runs (workflow_id, activity_id, attempt, job_id, activity, worker_id,
                           status, detail)
VALUES (%(workflow_id)s, %(activity_id)s, %(attempt)s, %(job_id)s, %(activity)s,
        %(worker_id)s, %(status)s, %(detail)s)
ON CONFLICT (workflow_id, activity_id, attempt) DO UPDATE SET
    status = EXCLUDED.status, detail = EXCLUDED.detail, updated_at = now();

-- name: callbacks_owed
-- Terminal callbacks owed (callback_outbox, written when the job settled), due first. The
-- driver posts `dispatched` beside the attempt, so a quick job settles before that post is
-- made: a job that ran an attempt waits while its `dispatched` is neither posted nor given up
-- for some URL, for at most `dispatched_wait_s` after it settled (its driver is gone that long:
-- the terminal post goes anyway), and while a `dispatched` post is in flight (claimed within
-- the claim window: its driver lives and is posting it). A receiver never hears `completed`
-- before `dispatched` while the driver that owes it lives. A waiting job is looked at again in
-- 5 s: its row leaves the head of the due index, so a pass reads what is due, not every job
-- still waiting (50 000 waiting rows read whole were 730 ms a pass).
WITH due AS (
    SELECT o.job_id, o.event,
           EXISTS (
               SELECT 1 FROM jobs j, unnest(%(urls)s::text[]) AS u(url)
               WHERE j.job_id = o.job_id AND j.attempt > 0
                 AND j.updated_at > now() - make_interval(secs => %(dispatched_wait_s)s)
                 AND NOT EXISTS (SELECT 1 FROM callback_posts c
                                 WHERE c.job_id = o.job_id AND c.event = 'dispatched'
                                   AND c.url = u.url AND c.status IN ('posted', 'failed')))
           OR EXISTS (
               SELECT 1 FROM callback_posts c
               WHERE c.job_id = o.job_id AND c.event = 'dispatched' AND c.status = 'pending'
                 AND c.posted_at > now() - interval '30 seconds') AS waiting
           , row_number() OVER (ORDER BY o.due_at) AS n
    FROM callback_outbox o
    WHERE o.due_at <= now()
    ORDER BY o.due_at
    LIMIT %(scan)s
), later AS (
    UPDATE callback_outbox o SET due_at = now() + interval '5 seconds'
    FROM due WHERE o.job_id = due.job_id AND due.waiting
), owed AS (
    SELECT job_id, event, n FROM due WHERE NOT waiting ORDER BY n LIMIT %(limit)s
)
-- How many due rows it read (all `scan` of them: more may be due behind them), and the owed.
SELECT (SELECT count(*) FROM due),
       ARRAY(SELECT job_id FROM owed ORDER BY n),
       ARRAY(SELECT event FROM owed ORDER BY n);

-- name: callback_owed_later
-- A post is still being made or failed: look at this job again after the claim window.
UPDATE callback_outbox SET due_at = now() + interval '30 seconds'
WHERE job_id = %(job_id)s;

-- name: callback_owed_done
-- Every configured URL has the job's terminal post (posted, or gave up after 5 tries): nothing
-- is owed any more.
DELETE FROM callback_outbox o
WHERE o.job_id = %(job_id)s
  AND NOT EXISTS (SELECT 1 FROM unnest(%(urls)s::text[]) AS u(url)
                  WHERE NOT EXISTS (SELECT 1 FROM callback_posts c
                                    WHERE c.job_id = o.job_id AND c.event = o.event
                                      AND c.url = u.url
                                      AND (c.status = 'posted' OR c.attempts >= 5)))
RETURNING o.job_id;

-- name: callbacks_owed_drop
-- No callback URL is configured: settled jobs owe nothing.
DELETE FROM callback_outbox WHERE due_at <= now();
