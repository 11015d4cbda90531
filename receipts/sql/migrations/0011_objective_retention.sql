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
