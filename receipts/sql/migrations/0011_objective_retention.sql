-- Retention of settled objectives (receipts/retention.py, `prune_objective_victims`): a prune
-- takes settled objectives by last change, oldest first; this index keeps that scan to the
-- settled ones, however many objectives there are.
CREATE INDEX IF NOT EXISTS objectives_settled_idx
    ON objectives (updated_at, objective_id) WHERE status <> 'active';

-- The jobs of one agent job or objective are a key range (`<agentJobId>:attempt:` up to
-- `<agentJobId>:attempt;`, `objective:<id>:` up to `objective:<id>;`), which holds only in byte
-- order: under a linguistic collation (en_US, ICU) punctuation is ignored at the first level
-- and the range misses its own jobs. Retention compares `job_id COLLATE "C"`, and this index
-- serves those ranges whatever the database's collation (the primary key's does not).
CREATE INDEX IF NOT EXISTS jobs_id_bytewise_idx ON jobs ((job_id COLLATE "C"));

-- Whether an objective has a live job. A job is the objective's when its id is in the
-- objective's range (`objective:<id>:` up to `objective:<id>;`, byte order), it belongs to the
-- objective's organization and its payload names the objective: a job id is chosen by whoever
-- posts it, so the range alone would let another organization's job pin or join an objective.
CREATE OR REPLACE FUNCTION objective_has_live_job(p_objective_id text, p_organization_id text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM jobs j
        WHERE j.job_id COLLATE "C" >= 'objective:' || p_objective_id || ':'
          AND j.job_id COLLATE "C" < 'objective:' || p_objective_id || ';'
          AND j.organization_id = p_organization_id
          AND j.state -> 'payload' ->> 'objectiveId' = p_objective_id
          AND j.status IN ('queued', 'leased', 'running'))
$$;
