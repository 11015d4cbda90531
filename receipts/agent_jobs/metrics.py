"""The background agent jobs' Prometheus metrics (the dispatcher's passes, turns, wakeups,
slots in use); the runtime's own are receipts/metrics.py."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

AGENT_JOB_PASSES = Histogram(
    "receipt_agent_job_dispatch_pass_seconds", "Agent-job dispatcher pass durations."
)
AGENT_JOB_ACTIONS = Counter(
    "receipt_agent_job_dispatch_actions",
    "What agent-job dispatcher passes did (claimed, settled, timed_out, no_slot, held; failed: "
    "a job's step raised, logged, the pass went on).",
    ["action"],
)
AGENT_JOB_TURNS_SETTLED = Counter(
    "receipt_agent_job_turns_settled",
    "Settled turns by the status the agent job moved to (running: a follow-up turn).",
    ["status"],
)
AGENT_JOB_WAKEUP_CALLBACKS = Counter(
    "receipt_agent_job_wakeup_callbacks",
    "Wakeup event callbacks by outcome (posted, failed).",
    ["outcome"],
)
AGENT_JOB_EVENTS = Counter(
    "receipt_agent_job_events",
    "Agent-job events by kind: created, answered, canceled, input_timeout (failed waiting for "
    "its owner's answer), wakeup (its owner's session woken), turn_not_run (a turn delivered "
    "after its job stopped: no command run).",
    ["event"],
)
AGENT_JOBS_RUNNING = Gauge(
    "receipt_agent_jobs_running",
    "Running agent jobs (slots in use) by agent (`other`: one the agents registry does not "
    "name, as the driver that gauges it reads RECEIPT_AGENTS_FILE: mount the file there too).",
    ["agent"],
)
