"""The Factory's Prometheus metrics (objective control, its outbox, audits, the watchdog); the
runtime's own are receipts/metrics.py."""

from __future__ import annotations

from prometheus_client import Counter

FACTORY_CONTROL_DELIVERIES = Counter(
    "receipt_factory_control_deliveries",
    "Objective control requests handed to a control job, by enqueue outcome.",
    ["outcome"],
)
FACTORY_TASKS_DISPATCHED = Counter(
    "receipt_factory_tasks_dispatched", "Task tries dispatched by objective control."
)
FACTORY_TASKS_HELD = Counter(
    "receipt_factory_tasks_held",
    "Ready tasks objective control left pending because their organization held its caps of "
    "open jobs (RECEIPT_ORG_MAX_QUEUED, RECEIPT_ORG_MAX_ACTIVE), counted at each pass that held "
    "them; logged factory.tasks_held.",
)
FACTORY_OBJECTIVES_SETTLED = Counter(
    "receipt_factory_objectives_settled",
    "Objectives settled by objective control, by status.",
    ["status"],
)
FACTORY_STEPS_DISPATCHED = Counter(
    "receipt_factory_steps_dispatched",
    "Validate and publish runs dispatched by objective control, by step.",
    ["step"],
)
FACTORY_ABORTS = Counter(
    "receipt_factory_aborts",
    "Aborts objective control posted to an objective's jobs, by why: the objective canceled, a "
    "task of its phase failed or was canceled, a queued try superseded by a new phase.",
    ["why"],
)
FACTORY_PHASES_ADDED = Counter(
    "receipt_factory_phases_added", "Phases of tasks factory.dispatch added to live objectives."
)
FACTORY_AUDITS_WRITTEN = Counter(
    "receipt_factory_audits_written",
    "Settled objectives audited by their audit job (the redrive's are counted apart).",
)
FACTORY_AUDITS_REFUSED = Counter(
    "receipt_factory_audits_refused",
    "Audit jobs refused because their objective was not settled (posted or retried by hand): "
    "nothing written, the settled objective's audit keeps its place.",
)
FACTORY_CONTROL_PASSES_EXHAUSTED = Counter(
    "receipt_factory_control_passes_exhausted",
    "Control jobs whose passes did not settle down (another control job follows from the outbox).",
)
FACTORY_WATCHDOG_TIMEOUTS = Counter(
    "receipt_factory_watchdog_timeouts",
    "Watchdog scans that ran out of time before reading their whole window.",
)
FACTORY_AUDITS_RECOVERED = Counter(
    "receipt_factory_audits_recovered",
    "Settled objectives audited by the outbox redrive because their audit job ended (failed "
    "its attempts, or aborted) without auditing them.",
)
FACTORY_OUTBOX_UNDELIVERED = Counter(
    "receipt_factory_outbox_undelivered",
    "Objectives whose control requests the outbox redrive could not deliver in a pass (logged "
    "factory.outbox_delivery_failed; the others went on, and the pass counts as failed).",
)
FACTORY_AUDITS_UNRECOVERED = Counter(
    "receipt_factory_audits_unrecovered",
    "Lost audits the outbox redrive could not write (logged; the others went on).",
)
FACTORY_CONTROL_STALE_PLANS = Counter(
    "receipt_factory_control_stale_plans",
    "Control passes whose write found the objective moved on since they read it (a phase added,"
    " another pass): rolled back, planned again.",
)
FACTORY_PLANS_REFUSED = Counter(
    "receipt_factory_plans_refused",
    "Planner graphs refused because a command they name is off the organization's allow-list "
    "(RECEIPT_ORG_EXECUTABLES): the factory.run job fails, no objective is written.",
)
FACTORY_WATCHDOG_FIRED = Counter(
    "receipt_factory_watchdog_fired",
    "Reconciles the objective watchdog requested, by reason.",
    ["reason"],
)
OBJECTIVE_WRITES_REFUSED = Counter(
    "receipt_objective_writes_refused",
    "Objective writes (and monitor hand-offs) a handler asked for after its delivery lost the "
    "attempt's fence (nothing written), by the fence's refusal.",
    ["reason"],
)
