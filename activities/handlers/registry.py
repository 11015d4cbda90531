"""The registry of built-in agent handlers: an agent id to the code that runs its jobs."""

from __future__ import annotations

from activities.handlers import factory, monitor
from activities.handlers.agent_turn import run_agent_turn
from activities.handlers.context import Handler, kinds_handler


def default_handlers() -> dict[str, Handler]:
    """Return the registry of the four agent ids: factory, factory-control, factory-monitor, codex.

    `factory` creates objectives and adds phases; `factory-control` reconciles, watches and
    audits them; `factory-monitor` mirrors a task's job onto its objective; `codex` runs tasks
    and the validate and publish steps.
    """
    return {
        "factory": kinds_handler(
            "factory",
            {"factory.run": factory.factory_run, "factory.dispatch": factory.factory_dispatch},
        ),
        "factory-control": kinds_handler(
            "factory-control",
            {
                "factory.objective.control": factory.objective_control,
                "factory.objective.watchdog": factory.objective_watchdog,
                "factory.objective.audit": factory.objective_audit,
            },
        ),
        "factory-monitor": kinds_handler(
            "factory-monitor", {"factory.task.monitor": monitor.task_monitor}
        ),
        "codex": kinds_handler(
            "codex",
            {
                "factory.task.run": factory.run_objective_task,
                "factory.integration.validate": factory.run_integration_step,
                "factory.integration.publish": factory.run_integration_step,
                # `agent_job.turn`: one turn of a background agent job (docs/agent-jobs.md).
                "agent_job.turn": run_agent_turn,
            },
        ),
    }
