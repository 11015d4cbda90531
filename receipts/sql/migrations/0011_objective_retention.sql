-- Retention of settled objectives (receipts/retention.py, `prune_objective_victims`): a prune
-- takes settled objectives by last change, oldest first; this index keeps that scan to the
-- settled ones, however many objectives there are.
CREATE INDEX IF NOT EXISTS objectives_settled_idx
    ON objectives (updated_at, objective_id) WHERE status <> 'active';
