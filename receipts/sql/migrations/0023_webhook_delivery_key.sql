-- What an organization is shown of a delivery's id (receipts/webhook_ids.py): `delivery_id` is
-- one sequence for every organization, so the gap between two of one organization's would
-- count the deliveries owed to the others meanwhile. Each subscription keys a permutation of
-- the ids with this random key of its own, never shown and never rotated (its cursors hold).
ALTER TABLE webhooks
    ADD COLUMN IF NOT EXISTS delivery_key text NOT NULL DEFAULT gen_random_uuid()::text;
