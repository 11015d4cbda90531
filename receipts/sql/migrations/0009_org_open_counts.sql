-- The per-organization caps (roles/api/admission.py) read an organization's open jobs
-- at every enqueue. Counting its jobs rows cost each enqueue time in proportion to the queue's
-- depth (tools/bench/README.md, "Where the API's time went"); these counters make that read a sum of at
-- most 16 rows. A trigger keeps them in the transaction that changes a job's status, whatever
-- the path (append, projection rebuild, retention), so they are exactly the count of the rows.
--
-- A transaction adds its changes to the slot of its own backend (pg_backend_pid() % 16): the
-- writers of one organization rarely wait for each other's commit, and a transaction holds at
-- most one counter row per organization, so two transactions that change several jobs of one
-- organization cannot deadlock on them. A slot alone may go negative; the sum cannot.

-- No write to jobs while the triggers are created and the counts of its rows taken.
LOCK TABLE jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE IF NOT EXISTS org_open_jobs (
    organization_id text     NOT NULL,
    slot            smallint NOT NULL CHECK (slot BETWEEN 0 AND 15),
    queued          bigint   NOT NULL DEFAULT 0,  -- status 'queued'
    active          bigint   NOT NULL DEFAULT 0,  -- status 'queued', 'leased' or 'running'
    PRIMARY KEY (organization_id, slot)
) WITH (fillfactor = 50);  -- room on each page for the updates in place (HOT)

CREATE OR REPLACE FUNCTION org_open_jobs_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    queued_delta bigint := 0;
    active_delta bigint := 0;
    organization text;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        organization := OLD.organization_id;
        IF OLD.status IN ('queued', 'leased', 'running') THEN
            active_delta := active_delta - 1;
        END IF;
        IF OLD.status = 'queued' THEN
            queued_delta := queued_delta - 1;
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        organization := NEW.organization_id;
        IF NEW.status IN ('queued', 'leased', 'running') THEN
            active_delta := active_delta + 1;
        END IF;
        IF NEW.status = 'queued' THEN
            queued_delta := queued_delta + 1;
        END IF;
    END IF;
    INSERT INTO org_open_jobs AS c (organization_id, slot, queued, active)
    VALUES (organization, pg_backend_pid() % 16, queued_delta, active_delta)
    ON CONFLICT (organization_id, slot) DO UPDATE
        SET queued = c.queued + EXCLUDED.queued, active = c.active + EXCLUDED.active;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION org_open_jobs_clear() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM org_open_jobs;
    RETURN NULL;
END
$$;

-- Each trigger fires only for a row whose counts change (an organization's job entering,
-- leaving, or moving between queued and leased/running), so a heartbeat or a settled job's
-- rewrite costs nothing. The projection's organization_id never changes after the insert.
DROP TRIGGER IF EXISTS jobs_org_open_insert ON jobs;
CREATE TRIGGER jobs_org_open_insert AFTER INSERT ON jobs FOR EACH ROW
    WHEN (NEW.organization_id IS NOT NULL AND NEW.status IN ('queued', 'leased', 'running'))
    EXECUTE FUNCTION org_open_jobs_count();

DROP TRIGGER IF EXISTS jobs_org_open_update ON jobs;
CREATE TRIGGER jobs_org_open_update AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.organization_id IS NOT NULL
          AND ((OLD.status = 'queued') IS DISTINCT FROM (NEW.status = 'queued')
               OR (OLD.status IN ('queued', 'leased', 'running'))
                  IS DISTINCT FROM (NEW.status IN ('queued', 'leased', 'running'))))
    EXECUTE FUNCTION org_open_jobs_count();

DROP TRIGGER IF EXISTS jobs_org_open_delete ON jobs;
CREATE TRIGGER jobs_org_open_delete AFTER DELETE ON jobs FOR EACH ROW
    WHEN (OLD.organization_id IS NOT NULL AND OLD.status IN ('queued', 'leased', 'running'))
    EXECUTE FUNCTION org_open_jobs_count();

DROP TRIGGER IF EXISTS jobs_org_open_truncate ON jobs;
CREATE TRIGGER jobs_org_open_truncate AFTER TRUNCATE ON jobs FOR EACH STATEMENT
    EXECUTE FUNCTION org_open_jobs_clear();

-- The counts of the jobs already there.
DELETE FROM org_open_jobs;
INSERT INTO org_open_jobs (organization_id, slot, queued, active)
SELECT organization_id, 0, count(*) FILTER (WHERE status = 'queued'), count(*)
FROM jobs
WHERE organization_id IS NOT NULL AND status IN ('queued', 'leased', 'running')
GROUP BY organization_id;

-- The count this replaces was the only reader of this index; every status change paid for it.
DROP INDEX IF EXISTS jobs_org_open_idx;
