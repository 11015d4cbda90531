-- Settled objectives whose audit was requested and has not landed (receipts/objectives/store.py
-- `recover_lost_audits`): normally none for more than the seconds an audit job takes, so the
-- outbox redrive reads this small index every few seconds, however many objectives settled.
CREATE INDEX IF NOT EXISTS objectives_audit_owed_idx
    ON objectives (updated_at, objective_id)
    WHERE status <> 'active' AND state ->> 'auditJobId' IS NOT NULL AND state ->> 'audit' IS NULL;
