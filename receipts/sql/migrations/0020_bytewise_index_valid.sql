-- jobs_id_bytewise_idx (0011) may have been built by hand before 0011, concurrently, as README
-- "Upgrading to objective retention" advises a large installation. A concurrent build that fails
-- or is cancelled leaves an INVALID index of that name, which 0011's `IF NOT EXISTS` took as
-- built: no query ever used it, and retention's key ranges read the whole jobs table per agent
-- job. An invalid one is built again here (writes to jobs, and queries planned on it, wait while
-- it is: 0.25 s at 200 000 jobs); a valid one is left as it is, without a lock.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index
               WHERE indexrelid = to_regclass('jobs_id_bytewise_idx') AND NOT indisvalid) THEN
        REINDEX INDEX jobs_id_bytewise_idx;
    END IF;
END $$;
