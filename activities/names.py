"""Names of Receipt's Temporal workflows and activities, defined once.

Workflows schedule activities and start workflows by these names, and the definitions register
under them (`@workflow.defn(name=...)`, `@activity.defn(name=...)`). A leaf module with no
imports, in the activities package (the lower of the two), so workflow code, activity code and
the roles can all import it.
"""

from __future__ import annotations

# Workflows.
JOB_DRIVER_WORKFLOW = "JobDriver"
# The driver type of builds before 2026-12-03 (with the `attempt-as-activity` patch marker in
# every run): no longer started, still registered on the driver role so open runs finish.
LEGACY_JOB_DRIVER_WORKFLOW = "JobDriverWorkflow"
# The attempt child of builds before 2026-12: no longer started, still registered on the worker
# roles so attempts started by an older driver drain (see workflows/attempt.py).
JOB_ATTEMPT_WORKFLOW = "JobAttemptWorkflow"
WATCHDOG_TICK_WORKFLOW = "WatchdogTickWorkflow"
SCHEDULE_FIRE_WORKFLOW = "ScheduleFireWorkflow"

# Activities.
EXECUTE_ATTEMPT = "execute_attempt"
PREPARE_DELIVERY = "prepare_delivery"
POST_CALLBACKS = "post_callbacks"
ENQUEUE_WATCHDOG = "enqueue_watchdog"
FIRE_SCHEDULE = "fire_schedule"
