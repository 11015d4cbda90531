-- Fair dispatch across organizations (docs/design.md §6, receipts/plan.py).

-- The worker queue a job is routed to (receipts/kinds.py `route`), written with the projection
-- row so the dispatch scans can share each queue out by organization. Rows written before this
-- migration hold NULL until their next receipt rewrites them (the starter routes every job it
-- starts itself; a NULL only means the scans do not hold that job back).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS worker_queue text;

-- A dispatch slot: taken by the driver starter, under the (organization, queue) lock, when it
-- starts the delivery of an organization's job; given back in the transaction that settles the
-- job. An organization holds at most RECEIPT_ORG_MAX_RUNNING_PER_GROUP slots per worker queue;
-- its other deliverable jobs stay queued (held back) until one is given back.
CREATE TABLE IF NOT EXISTS dispatch_slots (
    job_id          text PRIMARY KEY,
    organization_id text        NOT NULL,
    worker_queue    text        NOT NULL,
    taken_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS dispatch_slots_share_idx
    ON dispatch_slots (organization_id, worker_queue);

-- An organization's queued jobs on one queue, oldest first: the jobs a freed slot may start.
CREATE INDEX IF NOT EXISTS jobs_queued_share_idx
    ON jobs (organization_id, worker_queue, created_at) WHERE status = 'queued';

-- The queued, deliverable jobs (receipts/plan.py `next_step` DELIVER or ABORT before slots are
-- counted) and whether each is held back: every organization's share of a worker queue is
-- ranked oldest first (`share_rank`), and the first `cap - held` of a share may start, `cap`
-- being the queue's entry in `caps` (RECEIPT_ORG_MAX_RUNNING_PER_GROUP; absent or 0: no cap)
-- and `held` the slots the organization's active jobs hold there. A job that holds a slot
-- already, an abort, and a job with no organization are never held back. Ordering by
-- `share_rank` interleaves organizations: each one's oldest job comes before anyone's second.
CREATE OR REPLACE FUNCTION dispatch_queue(queues text[], caps integer[])
RETURNS TABLE (job_id text, seq integer, attempt integer, created_at timestamptz,
               updated_at timestamptz, organization_id text, worker_queue text,
               share_rank bigint, held_back boolean)
LANGUAGE sql STABLE AS $$
    WITH held AS (
        SELECT s.organization_id, s.worker_queue, count(*) AS n
        FROM dispatch_slots s JOIN jobs a ON a.job_id = s.job_id
        WHERE a.status IN ('queued', 'leased', 'running')
        GROUP BY s.organization_id, s.worker_queue
    ), queued AS (
        SELECT j.job_id, j.seq, j.attempt, j.created_at, j.updated_at, j.organization_id,
               j.worker_queue,
               (j.abort_requested OR j.organization_id IS NULL OR j.worker_queue IS NULL
                OR EXISTS (SELECT 1 FROM dispatch_slots s WHERE s.job_id = j.job_id)) AS unshared
        FROM jobs j
        WHERE j.status = 'queued' AND (j.available_at IS NULL OR j.available_at <= now())
    ), ranked AS (
        SELECT q.*, row_number() OVER (PARTITION BY q.organization_id, q.worker_queue, q.unshared
                                       ORDER BY q.created_at, q.job_id) AS share_rank
        FROM queued q
    )
    SELECT r.job_id, r.seq, r.attempt, r.created_at, r.updated_at, r.organization_id,
           r.worker_queue, r.share_rank,
           NOT (r.unshared OR coalesce(c.cap, 0) = 0
                OR r.share_rank <= c.cap - coalesce(h.n, 0)) AS held_back
    FROM ranked r
    LEFT JOIN unnest(queues, caps) AS c(queue, cap) ON c.queue = r.worker_queue
    LEFT JOIN held h ON h.organization_id = r.organization_id AND h.worker_queue = r.worker_queue
$$;
