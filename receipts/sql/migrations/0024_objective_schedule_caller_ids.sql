-- Objective and schedule ids are scoped by organization (`<id>~<organization tag>`, as job ids
-- are); an admin may name one by the organization's own id, found through these indexes.
CREATE INDEX IF NOT EXISTS objectives_caller_id_idx
    ON objectives (split_part(objective_id, '~', 1));
CREATE INDEX IF NOT EXISTS schedules_caller_id_idx
    ON schedules (split_part(schedule_id, '~', 1));
