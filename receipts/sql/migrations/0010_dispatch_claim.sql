-- Claiming a dispatch slot in one statement (receipts/fairness.py `claim`): the lock of
-- (organization, queue), the stale slots' removal, the count and the take ran as a five-statement
-- transaction from the driver, about 1.2 ms of its CPU per started job (tools/bench/README.md). The
-- function does the same under the same lock (`lock_key`'s hashing of the same key, so a starter
-- of the previous build and one of this build still exclude each other); the statement's own
-- transaction holds the lock until it returns.
--
-- The cap's rule is receipts/plan.py `Slots.full` (cap > 0 and held >= cap), as in
-- `dispatch_queue` (0008); `claim` checks that its plan and the slot taken here agree.

CREATE OR REPLACE FUNCTION dispatch_claim(
    p_job_id text, p_organization_id text, p_worker_queue text, p_cap integer
) RETURNS TABLE (held bigint, mine boolean, took boolean) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended('dispatch:' || p_organization_id || ':' || p_worker_queue, 0));
    -- A slot whose job settled without giving it back (taken in the moment it settled) or is
    -- gone is removed first.
    DELETE FROM dispatch_slots s
    WHERE s.organization_id = p_organization_id AND s.worker_queue = p_worker_queue
      AND NOT EXISTS (SELECT 1 FROM jobs a WHERE a.job_id = s.job_id
                      AND a.status IN ('queued', 'leased', 'running'));
    SELECT count(*) FILTER (WHERE s.job_id <> p_job_id),
           coalesce(bool_or(s.job_id = p_job_id), false)
    INTO held, mine
    FROM dispatch_slots s JOIN jobs j ON j.job_id = s.job_id
    WHERE s.organization_id = p_organization_id AND s.worker_queue = p_worker_queue
      AND j.status IN ('queued', 'leased', 'running');
    took := NOT mine AND NOT (p_cap > 0 AND held >= p_cap);
    IF took THEN
        INSERT INTO dispatch_slots (job_id, organization_id, worker_queue)
        VALUES (p_job_id, p_organization_id, p_worker_queue)
        ON CONFLICT (job_id) DO NOTHING;
    END IF;
    RETURN NEXT;
END $$;
