-- Factory (objectives) statements.

-- name: objective_streams
SELECT DISTINCT stream FROM receipts
WHERE stream LIKE 'objectives/%%'
ORDER BY stream
LIMIT %(limit)s;
