"""Every Prometheus family of every role, in one place: the one way Receipt is observed.

The families are module-level, on prometheus_client's default registry, and each is counted
where its outcome is known (the attempt counts its start and settle, the starter its outcome,
a loop its pass): no callback lists, no hook objects handed down, no second registry. A role
serves the registry on its metrics port (roles/infra/health.py), the api on `/metrics`; a
family a process never counts shows zero (or, with labels, no series yet). Label values are bounded: a job's
agent is one of the built-in agents or `other` (`agent_label`), never an id a tenant chose.
The one other source on the same registry is the Temporal SDK's own `temporal_*` families,
drained from its runtime (roles/infra/sdk_metrics.py).

Tests read a family's value before and after what they do (`value`), never a fresh registry.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from receipts.kinds import has_handler

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
OTHER_AGENT = "other"


def agent_label(agent_id: str) -> str:
    """The `agent` label of an agent id: one with a handler (built in or installed by the
    operator), else `other` (a tenant chooses agent ids, and each new label value is a new
    series on every scrape)."""
    return agent_id if has_handler(agent_id) else OTHER_AGENT


def value(name: str, **labels: str) -> float:
    """The current value of the sample `name` with `labels` (0 when it has none yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- jobs: enqueue, attempts, settlement ---------------------------------------------------------

JOBS_ENQUEUED = Counter(
    "receipt_jobs_enqueued",
    "Enqueue requests by outcome (created, existing, steered).",
    ["lane", "kind", "agent", "outcome"],
)
IDEMPOTENCY_MISMATCHES = Counter(
    "receipt_jobs_idempotency_mismatches",
    "Re-posts of an existing jobId with another agent or payload (the existing job is returned "
    "unchanged, flagged async.idempotencyMismatch).",
    ["agent"],
)
ROUTE_DISAGREEMENTS = Counter(
    "receipt_route_contract_disagreements",
    "Enqueued jobs whose route and kind contract name different worker groups.",
    ["agent", "kind"],
)
ATTEMPTS_STARTED = Counter(
    "receipt_attempts_started", "Attempts that took a lease or a start-fence.", ["queue", "agent"]
)
REDELIVERIES = Counter(
    "receipt_attempt_redeliveries",
    "Attempts Temporal redelivered after losing their worker (start-fence takeovers).",
    ["queue", "agent"],
)
JOBS_SETTLED = Counter(
    "receipt_jobs_settled",
    "Attempts settled, by job status and attempt result status.",
    ["status", "result_status"],
)
JOBS_FINISHED = Counter(
    "receipt_jobs_finished",
    "Jobs an attempt's settlement made terminal, by agent and terminal status (the failure "
    "ratio by agent: failed over all).",
    ["agent", "status"],
)
HEARTBEAT_LAG = Histogram(
    "receipt_heartbeat_lag_seconds",
    "How late a heartbeat ran against its cadence.",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5),
)
HANDLERS_ABANDONED = Counter(
    "receipt_handlers_abandoned",
    "Handlers still running 5 s after the attempt cancelled them (an abort, a lost lease, the "
    "execution timeout, the worker's shutdown): the attempt went on without them.",
    ["agent"],
)
HANDLER_EXITS = Counter(
    "receipt_handler_exits",
    "SystemExit or KeyboardInterrupt raised by a task a handler started (which would have ended "
    "the worker's event loop): that task ended, and its attempt failed if still running.",
    ["agent"],
)
HANDLER_PROGRESS_UNWRITTEN = Counter(
    "receipt_handler_progress_unwritten",
    "Progress an installed handler's rate limit kept back that could not be written when the "
    "handler ended (the job settles as the handler ended regardless), by agent.",
    ["agent"],
)
HANDLER_DURATION = Histogram(
    "receipt_handler_duration_seconds", "Handler run time by agent.", ["agent"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
ENQUEUE_TO_START = Histogram(
    "receipt_enqueue_to_start_seconds",
    "Database time from a job's due time (its job.enqueued, or its availableAt when later) to "
    "its first attempt's lease: the wait for a worker, not a delay the job asked for nor a "
    "retry's backoff or earlier attempts.",
    buckets=LATENCY_BUCKETS,
)
ENQUEUE_TO_SETTLE = Histogram(
    "receipt_enqueue_to_settle_seconds",
    "Database time from job.enqueued to its terminal receipt.",
    buckets=LATENCY_BUCKETS,
)
STORAGE_RETRIES = Counter("receipt_settlement_retries", "Transient storage errors retried.")
GUARDED_REFUSALS = Counter(
    "receipt_guarded_refusals",
    "One-statement job appends refused because the job changed since it was read (then read "
    "and decided again): `changed` (head moved or lease expired), `conflict` (a concurrent "
    "append took the next seq).",
    ["reason"],
)
BOOKKEEPING_BATCH = Histogram(
    "receipt_bookkeeping_batch_rows",
    "Rows per flush of a process's bookkeeping writer (ledger rows, generation records).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 500),
)
ENQUEUE_BATCH = Histogram(
    "receipt_enqueue_batch_jobs",
    "New jobs per write of the api's group commit (receipts/enqueue_batch.py): 1 for a post "
    "written alone, more for the posts that arrived while one was being written.",
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
ENQUEUE_BATCH_ALONE = Counter(
    "receipt_enqueue_batch_alone",
    "Jobs of a batched write enqueued alone after all: their organization's caps moved since "
    "the read (`caps`), a settlement policy wants the append (`policy`), or the batch's "
    "statement failed (`error`; logged enqueue.batch_failed).",
    ["reason"],
)
DB_CONNECTIONS_REPLACED = Counter(
    "receipt_db_connections_replaced",
    "Pooled database connections that failed the check at checkout and were replaced: checked "
    "because idle past the check window (`idle`) or because the backend sent something while "
    "the connection sat idle (`input`: a restart, a failover, a terminated backend).",
    ["reason"],
)
DEPENDENCY_REACHABLE = Gauge(
    "receipt_dependency_reachable",
    "1 while this process reaches the dependency, 0 while it cannot: `database`, from the "
    "pool's attempts to connect (logged store.unreachable, store.reachable); `temporal`, from "
    "the role's readiness check (every 5 s; roles that run a Temporal worker).",
    ["dependency"],
)
LISTEN_LOST = Counter(
    "receipt_listen_lost",
    "Times the role's LISTEN connection failed or could not attach (logged listen.lost; tried "
    "again after 1 s, doubling to 30 s): meanwhile new jobs wait for the 60 s rescan.",
)
LEDGER_FAILURES = Counter(
    "receipt_ledger_write_failures", "Best-effort ledger writes that failed.", ["table"]
)
CALLBACKS = Counter(
    "receipt_callbacks",
    "Callback posts by event and outcome (posted, failed after its tries, or released: cut off "
    "before its result and claimable again at once), per URL.",
    ["event", "outcome"],
)
SANDBOX_MEMORY_KILLS = Counter(
    "receipt_sandbox_memory_kills",
    "Sandboxed commands the kernel killed at their cgroup's memory limit.",
)
SANDBOX_DISK_KILLS = Counter(
    "receipt_sandbox_disk_kills",
    "Sandboxed commands killed because their workspace grew past its bytes or files.",
)
SANDBOX_CGROUPS_LEFT = Counter(
    "receipt_sandbox_cgroups_left",
    "Sandbox cgroups that could not be removed after their command (still busy or not ours).",
)

# --- delivery: the starter and the queue -------------------------------------------------------

DRIVER_STARTS = Counter(
    "receipt_driver_starts", "Driver starter outcomes (created, active_delivery, ...).", ["outcome"]
)
ACTIVE_DELIVERY_REFUSALS = Counter(
    "receipt_active_delivery_refusals", "Starts refused because a delivery is still open."
)
HELD_BACK = Counter(
    "receipt_jobs_held_back",
    "Starts held back because the job's organization held every dispatch slot it may on the "
    "worker queue (RECEIPT_ORG_MAX_RUNNING_PER_GROUP); the job stays queued.",
    ["queue"],
)
GENERATION_ADVANCES = Counter(
    "receipt_generation_advances", "Deliveries started at a generation above 0."
)
QUEUE_DEPTH = Gauge(
    "receipt_queue_depth",
    "Active jobs by status (queued, leased, running; read from the projection by "
    "worker-control). Settled jobs: receipt_jobs_settled.",
    ["status"],
)
QUEUE_OLDEST_AGE = Gauge(
    "receipt_queue_oldest_age_seconds",
    "Database-clock age of the oldest queued job that may be delivered now, by lane and worker "
    "group (since it was enqueued, or since its availableAt for a delayed or backed-off job; 0 "
    "with none queued; read from the projection by worker-control).",
    ["lane", "group"],
)
WAITING_FOR_SLOT = Gauge(
    "receipt_jobs_waiting_for_slot",
    "Queued, deliverable jobs held back for a dispatch slot of their organization now (read by "
    "worker-control with the queue depth).",
)

# --- recovery loops and retention --------------------------------------------------------------

EVENT_LOOP_STALLS = Counter(
    "receipt_event_loop_stalls",
    "Times the process's event loop did not answer within RECEIPT_LOOP_STALL_MS: blocking code "
    "held it (logged loop.stalled with its stack).",
)
EVENT_LOOP_STALL_SECONDS = Histogram(
    "receipt_event_loop_stall_seconds",
    "How long each stall held the event loop, from the tick it did not answer to its answer.",
    buckets=(1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
)
LOOP_PASS = Histogram(
    "receipt_loop_pass_seconds", "Recovery loop pass durations.", ["loop"],
    buckets=LATENCY_BUCKETS,
)  # fmt: skip
LOOP_SLOW = Counter(
    "receipt_loop_slow_passes", "Loop passes over their observational deadline.", ["loop"]
)
LOOP_FAILED = Counter(
    "receipt_loop_failed_passes",
    "Loop passes that raised (logged loop.failed); the loop goes on at its next tick.",
    ["loop"],
)
LEASE_EXPIRATIONS = Counter(
    "receipt_lease_expirations", "job.lease_expired receipts appended by the scan."
)
REDRIVES = Counter("receipt_redrive_dispatches", "Queued-job redrive dispatches.")
WORKSPACES_REMOVED = Counter(
    "receipt_workspaces_removed",
    "Workspaces worker-codex removed (RECEIPT_WORKSPACE_RETENTION): idle past it with no active "
    "owner, or the leftover of an interrupted removal. Logged workspace.removed.",
    ["reason"],
)
WORKSPACE_REMOVALS_FAILED = Counter(
    "receipt_workspace_removals_failed",
    "Workspaces the sweep could not remove (logged workspace.remove_failed; tried next pass).",
)
CALLBACK_RECOVERIES_FAILED = Counter(
    "receipt_callback_recoveries_failed",
    "Owed callbacks the redrive pass could not recover (logged callback.recovery_failed; the "
    "others went on, and the row is looked at again).",
)
ATTEMPTS_DETACHED = Counter(
    "receipt_attempts_detached",
    "Attempts Temporal cancelled (the driver's window closed, its run ended) that ran on under "
    "their lease to settle through the fence, unless a redelivery took the lease over (then "
    "stopped); by Temporal's reason (not_found: the activity timed out, its driver's run ended, "
    "or it was redelivered). Logged attempt.detached.",
    ["reason"],
)
ATTEMPTS_CUT_OFF = Counter(
    "receipt_attempts_cut_off",
    "Attempts whose handler a worker stopped because Temporal had not answered it for nearly "
    "its heartbeat timeout (a redelivery's handler could start soon) and its job's lease was "
    "not its own: unreadable (PostgreSQL away too) or taken_over. Logged attempt.cut_off.",
    ["outcome"],
)
REDRIVE_FAILURES = Counter(
    "receipt_redrive_failures",
    "Queued-job redrives whose start failed (logged redrive.failed with the job id; the pass "
    "goes on, and a later one tries the job again).",
)
REDRIVES_AGAIN = Counter(
    "receipt_redrive_again",
    "Redrives of a queue state already redriven once whose delivery closed with the job unchanged "
    "(Temporal lost it, or the claiming process died before starting it).",
)
RETENTION_PRUNED = Counter(
    "receipt_retention_pruned_rows",
    "Rows the retention loop deleted, by table (jobs: terminal jobs pruned).",
    ["table"],
)
RETENTION_SKIPPED = Counter(
    "receipt_retention_skipped_passes",
    "Retention passes skipped because another process held the single-flight lock.",
)
RETENTION_BEHIND = Counter(
    "receipt_retention_behind_passes",
    "Retention passes that stopped at their batch budget with more to prune: retention is "
    "falling behind what settles.",
)

# --- the api and the role process --------------------------------------------------------------

API_LIMITED = Counter(
    "receipt_api_limited",
    "Requests the api refused at one of its limits (README, Security), by limit: rate, queued, "
    "active, streams_token, streams_total, commands, command_bytes, follow_up_bytes, "
    "body_shape, body_bytes, console_sign_in, console_sessions, in_flight, head_timeout.",
    ["limit"],
)
API_REGISTRY_UNREADABLE = Counter(
    "receipt_api_agents_registry_unreadable",
    "Agent-job creates naming a providerBinding refused 503 because the api could not read the "
    "agents registry (RECEIPT_AGENTS_FILE) to check it.",
)
GATEWAY_CALLS = Counter(
    "receipt_gateway_calls",
    "Model calls through the AI gateway by binding, agent and the provider's answer status.",
    ["binding", "agent", "status"],
)
GATEWAY_TOKENS = Counter(
    "receipt_gateway_tokens",
    "Tokens of model calls through the AI gateway by binding, agent and direction (in, out; in "
    "counts Anthropic's prompt-cache writes and reads).",
    ["binding", "agent", "direction"],
)
GATEWAY_QUOTA = Counter(
    "receipt_gateway_quota_exhausted",
    "Calls refused for quota with a known recovery time, by binding (the turn is delayed).",
    ["binding"],
)
GATEWAY_CREDENTIALS_DEAD = Counter(
    "receipt_gateway_credentials_dead",
    "Credentials the gateway dropped for 10 minutes, by binding: the provider refused them as "
    "unauthorized (401) on every path of their API, for calls of two organizations or more, "
    "with no other answer in between (a 403 never drops one).",
    ["binding"],
)
GATEWAY_REFUSED = Counter(
    "receipt_gateway_refused",
    "Calls the AI gateway refused itself, by binding and reason: token (not the turn's), "
    "no_pool (no usable provider), no_credential (every one refused), busy (every one's slots "
    "still taken after the call's 60 s wait), wrong_api, in_flight "
    "(8 per turn), too_large, too_many_values, no_model, unmetered (a background response: its "
    "tokens would pass the budget), network_model (a search model, its binding without network "
    "tools), unknown_path, connections (past the "
    "256 a turn may hold open: closed as made), budget (the organization's daily token budget "
    "spent: RECEIPT_GATEWAY_ORG_DAILY_BUDGET).",
    ["binding", "reason"],
)
GATEWAY_TOOLS_REMOVED = Counter(
    "receipt_gateway_tools_removed",
    "Tools the provider would run against the network (mcp, web_search, web_fetch, "
    "mcp_servers) taken out of model calls on a binding without networkTools, by binding and "
    "family.",
    ["binding", "family"],
)
GATEWAY_BUDGET_UNREAD = Counter(
    "receipt_gateway_budget_unread",
    "Reads of an organization's token spend (activities/gateway_budget.py) that failed or "
    "took over 2 s (the database away or slow): the call was checked against the last read.",
)
GATEWAY_USAGE_UNSETTLED = Counter(
    "receipt_gateway_usage_unsettled",
    "Model calls still running 10 s after their turn's command ended, by binding: billed by "
    "the provider, not in the turn's usage (they are in receipt_gateway_tokens when they end).",
    ["binding"],
)
GATEWAY_UNAUTHORIZED = Counter(
    "receipt_gateway_unauthorized",
    "Calls the provider refused as unauthorized (401) on one credential, by binding and path "
    "(the call goes on to the next credential; the key file was re-read first).",
    ["binding", "path"],
)
API_REQUESTS = Counter(
    "receipt_api_requests",
    "HTTP requests the api answered, by route template (`unmatched` for no route), method and "
    "status code.",
    ["route", "method", "status"],
)
API_REQUEST_DURATION = Histogram(
    "receipt_api_request_duration_seconds",
    "Time from a request's arrival to the end of its answer, by route template and method (an "
    "event stream counts until it closes; a 429 is left out: a refusal over the rate is held "
    "until the organization's next token, up to RECEIPT_RATE_REFUSAL_HOLD_MS).",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
API_EVENT_STREAMS = Gauge("receipt_api_event_streams", "Event streams the api serves now.")
API_REFUSALS_HELD = Gauge(
    "receipt_api_refusals_held",
    "Enqueues over their organization's rate the api holds now before it answers 429 "
    "(RECEIPT_RATE_REFUSAL_HOLD_MS, at most RECEIPT_RATE_REFUSALS_HELD_MAX).",
)
ROLE_READY = Gauge(
    "receipt_role_ready",
    "1 while the role's /readyz answers 200 (database reachable, Temporal worker polling; the "
    "api: database reachable and migrated).",
)
ROLE_TASKS_FAILED = Counter(
    "receipt_role_tasks_failed",
    "A role's background tasks (the dispatchers, the loops, the listener) that ended with an "
    "error, by task: it does not run again until the process restarts (logged role.task_failed).",
    ["task"],
)
SIGNAL_HANDLERS_RESTORED = Counter(
    "receipt_signal_handlers_restored",
    "SIGTERM or SIGINT handlers something in the process (a handler, a library it uses) replaced, "
    "put back to the role's drain (logged role.signal_handler_restored).",
    ["signal"],
)


CONSOLE_SESSIONS_REFUSED = Counter(
    "receipt_console_sessions_refused",
    "Console cookies refused, by reason: unknown (or signed out), expired, idle, revoked_token;"
    " and sign-ins another site posted (cross_site_sign_in).",
    ["reason"],
)

SCHEDULE_CHANGES = Counter(
    "receipt_schedule_changes",
    "Schedule definitions written, by action: created, changed (incl. pause, resume), deleted.",
    ["action"],
)
SCHEDULE_FIRINGS = Counter(
    "receipt_schedule_firings",
    "Schedule firings, by outcome: enqueued, skipped (overlap), skipped_cap (the "
    "organization's cap of open jobs), skipped_executables (a program off the organization's "
    "RECEIPT_ORG_EXECUTABLES), skipped_gateway (a gateway URL off RECEIPT_GATEWAY_URL_ALLOWLIST), "
    "skipped_commands (a steer the session's active job could not "
    "hold), repeated (a doubled firing, or an hour a DST change "
    "repeats), off_schedule (a time the definition no longer fires), none (paused or deleted "
    "before the sync caught up), error (a try that raised, the database away: Temporal tries "
    "it again for 30 minutes, then the firing is lost).",
    ["outcome"],
)
SCHEDULE_SYNCS = Counter(
    "receipt_schedule_syncs",
    "Temporal Schedules written by worker-control's schedule sync, by action: created, updated, "
    "deleted, restored (Temporal had lost it), orphaned (a Temporal Schedule the receipts do not "
    "hold, deleted), failed (a write Temporal refused: tried again "
    "after a backoff), list_failed (the check for lost ones could not list Temporal's); "
    "skipped: a pass another replica held.",
    ["action"],
)

WEBHOOK_DELIVERIES = Counter(
    "receipt_webhook_deliveries",
    "Tries of per-organization webhook deliveries, by event and outcome: delivered, retried "
    "(an error, an answer other than 2xx or an address the egress rules refuse: tried again), "
    "failed (given up), lapsed (posted or not, its record failed: its claim lapses and it is "
    "tried again; a record whose answer was lost is read back, and counted as what it "
    "recorded), superseded (posted after its claim lapsed and another deliverer took the "
    "delivery: not recorded), dropped (not posted: its subscription was deleted, or its claim "
    "lapsed to another deliverer, before the post).",
    ["event", "outcome"],
)
WEBHOOK_LOOKUPS_REFUSED = Counter(
    "receipt_webhook_lookups_refused",
    "Webhook host lookups refused because the organization already had "
    "activities/webhook_egress.py LOOKUPS_PER_OWNER hosts still resolving (a host whose DNS "
    "does not answer), or MAX_LOOKUPS of all organizations were: the try is retried later.",
)
WEBHOOK_CHANGES = Counter(
    "receipt_webhook_changes",
    "Changes to organizations' webhook subscriptions through the API, by action: created, "
    "deleted, secret_rotated, tested.",
    ["action"],
)
SCHEMA_AHEAD = Gauge(
    "receipt_schema_migrations_ahead",
    "Migrations the database holds that this build does not ship, as found at its start: a "
    "newer build applied them (an image rolled back). It runs against that schema.",
)
