-- Objective ids scoped by organization (receipts/tenancy.py): an organization's objective `X` is
-- `X~<tag>` to the runtime, and the jobs named after it keep the tag at their end
-- (`objective:X:task:a:try:1~<tag>`), so its key range is the one of its caller id: `objective:X:`
-- up to `objective:X;`. Ids without a tag (objectives created before this migration, and
-- objectives the runtime makes for itself) keep theirs: split_part returns the whole id.
CREATE OR REPLACE FUNCTION objective_has_live_job(p_objective_id text, p_organization_id text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM jobs j
        WHERE j.job_id COLLATE "C" >= 'objective:' || split_part(p_objective_id, '~', 1) || ':'
          AND j.job_id COLLATE "C" < 'objective:' || split_part(p_objective_id, '~', 1) || ';'
          AND j.organization_id = p_organization_id
          AND j.state -> 'payload' ->> 'objectiveId' = p_objective_id
          AND j.status IN ('queued', 'leased', 'running'))
$$;
