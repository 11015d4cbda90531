-- The dispatcher's rescan and the queued redrive read the queue a page at a time (docs/design.md
-- §6). Through `dispatch_queue` (0008) every pass ranked and sorted the whole queue (80-130 ms
-- at 10 500 queued jobs, every 15 s in every role, whatever it then acted on), and a redrive
-- pass looked at the same first 200 jobs while they kept coming back after their cooldown:
-- a lost delivery further back was never redriven.

-- The queued jobs in a fixed order (their creation, then id): a page starts after the last job
-- the previous page read (a cursor the pass keeps) and reads at most its size.
CREATE INDEX IF NOT EXISTS jobs_queued_created_idx
    ON jobs (created_at, job_id) WHERE status = 'queued';
-- A concurrent build by hand (README "Upgrading") that failed or was cancelled leaves an
-- INVALID index of its name, which `IF NOT EXISTS` takes as built and the planner never uses:
-- built again here, as 0025 does its own.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('jobs_queued_created_idx') AND NOT indisvalid) THEN
        REINDEX INDEX jobs_queued_created_idx;
    END IF;
END $$;

-- One page of the queue: the `page` queued jobs after (after_created_at, after_job_id) (NULL:
-- from the oldest), each with whether it is deliverable by `dispatch_queue`'s rule — available,
-- and not held back: a job of a capped share (an organization on a queue whose entry in `caps`
-- is > 0, with no slot, no abort) is deliverable while its rank among its share's waiting jobs,
-- oldest first, is within `cap - held`. That rank counts the share's jobs before the page too,
-- at most `cap` of them, read once per share (jobs_queued_share_idx), so it is the rank
-- `dispatch_queue` gives. Other jobs' `share_rank` is their rank in the page: organizations
-- interleave within a page, and pages go oldest first.
CREATE OR REPLACE FUNCTION dispatch_page(queues text[], caps integer[],
                                         after_created_at timestamptz, after_job_id text,
                                         page integer)
RETURNS TABLE (job_id text, seq integer, attempt integer, created_at timestamptz,
               updated_at timestamptz, share_rank bigint, deliverable boolean)
LANGUAGE sql STABLE AS $$
    WITH page AS MATERIALIZED (
        SELECT j.job_id, j.seq, j.attempt, j.created_at, j.updated_at, j.organization_id,
               j.worker_queue, (j.available_at IS NULL OR j.available_at <= now()) AS available,
               (j.abort_requested OR j.organization_id IS NULL OR j.worker_queue IS NULL
                OR EXISTS (SELECT 1 FROM dispatch_slots s WHERE s.job_id = j.job_id)) AS unshared
        FROM jobs j
        WHERE j.status = 'queued'
          -- The first condition is the second's, for the planner's estimate: from the row
          -- comparison alone it guessed a few rows after the cursor where there were thousands,
          -- and read and sorted them all rather than walk the index for `page`.
          AND j.created_at >= coalesce(after_created_at, '-infinity')
          AND (j.created_at, j.job_id) > (coalesce(after_created_at, '-infinity'),
                                          coalesce(after_job_id, ''))
        ORDER BY j.created_at, j.job_id
        LIMIT page
    ), ranked AS (
        SELECT p.*, coalesce(c.cap, 0) AS cap,
               row_number() OVER (PARTITION BY p.organization_id, p.worker_queue, p.unshared,
                                               p.available
                                  ORDER BY p.created_at, p.job_id) AS page_rank
        FROM page p
        LEFT JOIN unnest(queues, caps) AS c(queue, cap) ON c.queue = p.worker_queue
    ), shares AS MATERIALIZED (
        -- Each capped share in the page, from its first waiting job there: the slots its
        -- organization's active jobs hold on the queue, and its waiting jobs before the page.
        -- Materialized: read once, not again for every job of the page it is joined to.
        SELECT r.organization_id, r.worker_queue,
               (SELECT count(*) FROM dispatch_slots s JOIN jobs a ON a.job_id = s.job_id
                WHERE s.organization_id = r.organization_id AND s.worker_queue = r.worker_queue
                  AND a.status IN ('queued', 'leased', 'running')) AS held,
               (SELECT count(*) FROM (
                    SELECT 1 FROM jobs k
                    WHERE k.organization_id = r.organization_id
                      AND k.worker_queue = r.worker_queue AND k.status = 'queued'
                      AND k.created_at <= r.created_at
                      AND (k.created_at, k.job_id) < (r.created_at, r.job_id)
                      AND (k.available_at IS NULL OR k.available_at <= now())
                      AND NOT k.abort_requested
                      AND NOT EXISTS (SELECT 1 FROM dispatch_slots s WHERE s.job_id = k.job_id)
                    LIMIT r.cap) before) AS before
        FROM ranked r
        WHERE r.page_rank = 1 AND r.available AND NOT r.unshared AND r.cap > 0
    )
    SELECT r.job_id, r.seq, r.attempt, r.created_at, r.updated_at,
           r.page_rank + coalesce(s.before, 0) AS share_rank,
           r.available AND (r.unshared OR r.cap <= 0
                            OR r.page_rank + s.before <= r.cap - s.held) AS deliverable
    FROM ranked r
    LEFT JOIN shares s ON NOT r.unshared AND r.available
                      AND s.organization_id = r.organization_id
                      AND s.worker_queue = r.worker_queue
$$;
