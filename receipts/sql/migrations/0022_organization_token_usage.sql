-- What each organization's model calls spent through the AI gateway, per UTC day: the meter its
-- daily token budget is checked against (activities/gateway_budget.py). The gateway adds each
-- process's calls every few seconds; a day's row is small, one per organization. Not a receipt:
-- the turns' `agent_job.usage` receipts stay the record of what each job spent.
CREATE TABLE IF NOT EXISTS organization_token_usage (
    organization_id text NOT NULL,
    day date NOT NULL,
    calls bigint NOT NULL DEFAULT 0,
    input_tokens bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, day)
);
