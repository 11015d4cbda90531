-- The AI gateway's meter of each organization's tokens per UTC day (migration 0022,
-- activities/gateway_budget.py).

-- name: token_usage_add
-- Each organization's calls and tokens since the last flush, added to today's row (the
-- database's day, in UTC).
INSERT INTO organization_token_usage AS u
    (organization_id, day, calls, input_tokens, output_tokens)
SELECT o, (now() AT TIME ZONE 'UTC')::date, c, i, x
FROM unnest(%(organizations)s::text[], %(calls)s::bigint[], %(inputs)s::bigint[],
            %(outputs)s::bigint[]) AS t(o, c, i, x)
ON CONFLICT (organization_id, day) DO UPDATE SET
    calls = u.calls + EXCLUDED.calls,
    input_tokens = u.input_tokens + EXCLUDED.input_tokens,
    output_tokens = u.output_tokens + EXCLUDED.output_tokens,
    updated_at = now();

-- name: token_usage_today
-- An organization's tokens (in and out) today, and the database's clock.
SELECT coalesce((SELECT input_tokens + output_tokens FROM organization_token_usage
                 WHERE organization_id = %(organization_id)s
                   AND day = (now() AT TIME ZONE 'UTC')::date), 0),
       now();
