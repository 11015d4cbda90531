"""Objectives end to end on real PostgreSQL and a real Temporal dev server."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from receipts.kinds import QUEUE_CODEX
from receipts.objectives import store as objectives
from receipts.objectives.model import (
    ObjectiveState,
    monitor_job_id,
    objective_stream,
    step_monitor_job_id,
)
from receipts.store import Store
from receipts.timing import TimingSettings
from roles.infra.settings import load as load_settings
from tests.eventually import eventually
from tests.integration.api_support import AS_ADMIN, api_client, conforms
from tests.integration.delivery.conftest import running_stack, wait_for_status
from tests.integration.factory.conftest import (
    objective_dir,
    outbox_running,
    run_objective,
    wait_objective,
)

HERE = Path(__file__).parent


def sh(script: str, **task: Any) -> dict[str, Any]:
    return {"input": {"command": ["sh", "-c", script]}, **task}


def diamond(objective_id: str) -> dict[str, Any]:
    return {
        "objectiveId": objective_id,
        "title": "diamond",
        "goal": "four tasks in dependency order",
        "tasks": [
            {"taskId": "a", **sh("echo a >> order.txt")},
            {"taskId": "b", "dependsOn": ["a"], **sh("sleep 0.3; echo b >> order.txt")},
            {"taskId": "c", "dependsOn": ["a"], **sh("echo c >> order.txt")},
            {"taskId": "d", "dependsOn": ["b", "c"], **sh("echo d >> order.txt")},
        ],
        "validate": {"command": ["sh", "-c", "grep -q d order.txt && echo validate >> order.txt"]},
        "publish": {"command": ["sh", "-c", "echo publish >> order.txt"]},
    }


async def stream(store: Store, objective_id: str) -> list[Any]:
    return await store.read_stream(objective_stream(objective_id))


async def test_a_diamond_runs_in_dependency_order_then_validate_and_publish(
    client: Client, fresh_store: Store, fresh_db: str, workspace_root: Path
) -> None:
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, diamond("dia-1"))
        state = await wait_objective(fresh_store, "dia-1", audited=True)
    assert state.status == "completed", state.error
    lines = (objective_dir(workspace_root, "dia-1") / "order.txt").read_text().split()
    assert lines[0] == "a" and sorted(lines[1:3]) == ["b", "c"]
    assert lines[3:] == ["d", "validate", "publish"]
    receipts = await stream(fresh_store, "dia-1")
    seq_of = {}
    for r in receipts:
        if r.type in ("objective.task.dispatched", "objective.task.settled"):
            seq_of.setdefault((r.type, r.data["taskId"]), r.seq)
        if r.type in ("objective.step.dispatched", "objective.step.settled"):
            seq_of.setdefault((r.type, r.data["step"]), r.seq)
    deps = {"b": ["a"], "c": ["a"], "d": ["b", "c"]}
    for task, needs in deps.items():
        for need in needs:
            assert (
                seq_of[("objective.task.dispatched", task)]
                > seq_of[("objective.task.settled", need)]
            )
    assert (
        seq_of[("objective.step.dispatched", "validate")] > seq_of[("objective.task.settled", "d")]
    )
    assert (
        seq_of[("objective.step.dispatched", "publish")]
        > seq_of[("objective.step.settled", "validate")]
    )
    # Each task ran once, as the job its deterministic id names, and the audit names it.
    assert [t.job_id for t in state.tasks] == [
        f"objective:dia-1:task:{t}:try:1" for t in ("a", "b", "c", "d")
    ]
    assert state.audit is not None
    assert state.audit["totals"]["completed"] == 4
    assert {t["tries"][0]["jobId"] for t in state.audit["tasks"]} == {t.job_id for t in state.tasks}
    for task in state.tasks:
        job = await fresh_store.get_job(task.job_id or "")
        assert job is not None and job.status == "completed"
    # The settled, audited objective answers as its schema says (tries, steps, audit).
    async with api_client(fresh_db, store=fresh_store) as api:
        view = await api.get("/objectives/dia-1", headers=AS_ADMIN)
        assert view.status_code == 200, view.text
        assert [t["jobStatus"] for t in view.json()["tasks"]] == ["completed"] * 4
        conforms(view, "/objectives/{objectiveId}", "get")


async def test_a_failing_task_is_retried_within_its_budget(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    flaky = "if [ -f tried ]; then echo second; else touch tried; exit 3; fi"
    objective = {
        "objectiveId": "retry-1",
        "title": "flaky",
        "goal": "succeeds on the second try",
        "tasks": [{"taskId": "flaky", "maxAttempts": 2, **sh(flaky)}],
    }
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        state = await wait_objective(fresh_store, "retry-1")
    assert state.status == "completed", state.error
    task = state.task("flaky")
    assert task is not None
    assert [(t.number, t.status) for t in task.tries] == [(1, "failed"), (2, "completed")]
    assert task.tries[1].job_id == "objective:retry-1:task:flaky:try:2"


async def test_a_task_out_of_budget_fails_the_objective_and_its_dependants_never_start(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    objective = {
        "objectiveId": "fail-1",
        "title": "fails",
        "goal": "the objective fails naming the task",
        "tasks": [
            {"taskId": "broken", "maxAttempts": 2, **sh("exit 4")},
            {"taskId": "after", "dependsOn": ["broken"], **sh("touch ran")},
        ],
        "validate": {"command": ["true"]},
    }
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        state = await wait_objective(fresh_store, "fail-1", audited=True)
    assert state.status == "failed"
    assert state.failed_task == "broken"
    assert "task 'broken' failed after 2 tries" in (state.error or "")
    after = state.task("after")
    assert after is not None and after.status == "pending" and after.tries == ()
    types = [r.type for r in await stream(fresh_store, "fail-1")]
    assert types.count("objective.task.dispatched") == 2
    assert "objective.step.dispatched" not in types
    assert await fresh_store.get_job("objective:fail-1:task:after:try:1") is None
    assert state.audit is not None and state.audit["failures"][0]["taskId"] == "broken"


@pytest.mark.parametrize(
    ("tasks", "problem"),
    [
        (
            [
                {"taskId": "x", "dependsOn": ["z"], "input": {"command": ["true"]}},
                {"taskId": "y", "dependsOn": ["x"], "input": {"command": ["true"]}},
                {"taskId": "z", "dependsOn": ["y"], "input": {"command": ["true"]}},
            ],
            "dependency cycle: x -> z -> y -> x",
        ),
        (
            [{"taskId": "x", "dependsOn": ["ghost"], "input": {"command": ["true"]}}],
            "task 'x' depends on unknown task 'ghost'",
        ),
        (
            [{"taskId": "x", "input": {"command": ["true"]}}] * 2,
            "duplicate task id 'x'",
        ),
        (None, "no tasks and no planner is configured"),
    ],
)
async def test_an_invalid_graph_fails_the_run_and_writes_no_objective(
    client: Client,
    fresh_store: Store,
    fresh_db: str,
    tasks: Any,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RECEIPT_FACTORY_PLANNER_COMMAND", raising=False)
    objective: dict[str, Any] = {"objectiveId": "bad-1", "title": "bad", "goal": "cannot run"}
    if tasks is not None:
        objective["tasks"] = tasks
    async with running_stack(client, fresh_store, fresh_db, queues=("receipt-chat",)):
        job = await run_objective(fresh_store, objective)
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "failed" and done.attempt == 1
    assert problem in (done.error or "")
    assert await objectives.get(fresh_store, "bad-1") is None
    assert await stream(fresh_store, "bad-1") == []


async def test_the_planner_runs_in_the_sandbox_and_supplies_the_tasks_when_there_are_none(
    client: Client,
    fresh_store: Store,
    fresh_db: str,
    workspace_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sandbox sees the system and the workspace, not this checkout: the system's python
    # runs the planner's source, which notes whether it sees the checkout.
    source = (HERE / "planner.py").read_text()
    command = f"/usr/bin/python3 -c {shlex.quote(source)} {shlex.quote(str(HERE))}"
    monkeypatch.setenv("RECEIPT_FACTORY_PLANNER_COMMAND", command)
    objective = {"objectiveId": "plan-1", "title": "planned", "goal": "hello-planner"}
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        state = await wait_objective(fresh_store, "plan-1")
    assert state.status == "completed", state.error
    assert state.planned
    assert [t.task_id for t in state.tasks] == ["write", "check"]
    workspace = objective_dir(workspace_root, "plan-1")
    note = json.loads((workspace / "planned-by.json").read_text())
    assert note["cwd"] == str(workspace) and note["sees"] is False
    if os.geteuid() == 0:
        assert note["uid"] != 0  # the sandbox's unprivileged uid, not the worker's


async def test_a_planned_task_off_the_organizations_allow_list_fails_the_run(
    client: Client, fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The planner read the tenant's goal, so what it writes is held to the organization's list
    # as a request's own tasks are: it writes `sh` and `grep`, the list has only `grep`.
    source = (HERE / "planner.py").read_text()
    monkeypatch.setenv(
        "RECEIPT_FACTORY_PLANNER_COMMAND", f"/usr/bin/python3 -c {shlex.quote(source)}"
    )
    monkeypatch.setenv("RECEIPT_ORG_EXECUTABLES", json.dumps({"org-a": ["grep"]}))
    objective = {"objectiveId": "plan-off-list", "title": "planned", "goal": "hello"}
    async with running_stack(client, fresh_store, fresh_db, queues=("receipt-chat",)):
        job = await run_objective(fresh_store, objective)
        done = await wait_for_status(fresh_store, job.job_id)
    assert done.status == "failed" and done.attempt == 1
    assert "the planner's graph is refused: planner.tasks[0].input.command[0] must be one of" in (
        done.error or ""
    ), done.error
    assert await objectives.get(fresh_store, "plan-off-list") is None


async def test_a_new_phase_cancels_unstarted_tasks_and_lets_running_ones_finish(
    client: Client, fresh_store: Store, fresh_db: str, workspace_root: Path
) -> None:
    objective = {
        "objectiveId": "phase-1",
        "title": "phases",
        "goal": "superseded",
        "tasks": [
            {"taskId": "slow", **sh("sleep 2; echo slow > slow.txt")},
            {"taskId": "later", "dependsOn": ["slow"], **sh("touch later.txt")},
        ],
    }
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        await wait_objective_task(fresh_store, "phase-1", "slow", ("dispatched", "running"))
        from receipts.enqueue import enqueue, parse_enqueue

        await enqueue(
            fresh_store,
            parse_enqueue(
                "factory",
                {
                    "payload": {
                        "kind": "factory.dispatch",
                        "objectiveId": "phase-1",
                        "authContext": {"userId": "u-1", "organizationId": "org-a"},
                        "tasks": [{"taskId": "next", **sh("touch next.txt")}],
                    }
                },
            ),
        )
        state = await wait_objective(fresh_store, "phase-1")
    assert state.status == "completed", state.error
    assert state.phase == 2
    statuses = {t.task_id: (t.phase, t.status) for t in state.tasks}
    assert statuses == {
        "slow": (1, "completed"),
        "later": (1, "canceled"),
        "next": (2, "completed"),
    }
    assert (objective_dir(workspace_root, "phase-1") / "slow.txt").exists()
    assert not (objective_dir(workspace_root, "phase-1") / "later.txt").exists()


async def wait_objective_task(
    store: Store, objective_id: str, task_id: str, statuses: tuple[str, ...]
) -> None:
    def reached(state: ObjectiveState | None) -> bool:
        task = state.task(task_id) if state else None
        return task is not None and task.status in statuses

    await eventually(
        lambda: objectives.get(store, objective_id),
        reached,
        what=f"{objective_id}/{task_id} reaching {statuses}",
    )


async def test_cancel_aborts_the_running_task_and_settles_the_objective_canceled(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    objective = {
        "objectiveId": "cancel-1",
        "title": "cancel",
        "goal": "stopped",
        "tasks": [
            {"taskId": "long", **sh("sleep 60")},
            {"taskId": "after", "dependsOn": ["long"], **sh("true")},
        ],
    }
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        await wait_objective_task(fresh_store, "cancel-1", "long", ("running",))
        async with fresh_store.transaction() as tx:
            await objectives.request_cancel(tx, "cancel-1", "changed my mind")
        state = await wait_objective(fresh_store, "cancel-1", timeout=60, audited=True)
        with pytest.raises(objectives.ObjectiveTerminal):
            async with fresh_store.transaction() as tx:
                await objectives.request_cancel(tx, "cancel-1", "again")
    assert (state.status, state.error) == ("canceled", "changed my mind")
    long_job = await fresh_store.get_job("objective:cancel-1:task:long:try:1")
    assert long_job is not None and long_job.status == "canceled"
    assert long_job.canceled_reason == "objective canceled"
    assert await fresh_store.get_job("objective:cancel-1:task:after:try:1") is None


async def test_a_prompt_task_runs_the_codex_command_with_the_prompt_on_stdin(
    client: Client,
    fresh_store: Store,
    fresh_db: str,
    workspace_root: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objective = {
        "objectiveId": "prompt-1",
        "title": "prompt",
        "goal": "a coding agent reads the prompt",
        "tasks": [{"taskId": "agent", "input": {"prompt": "write the answer"}}],
    }
    monkeypatch.delenv("RECEIPT_CODEX_COMMAND", raising=False)
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        unset = await wait_objective(fresh_store, "prompt-1")
        # A codex worker started with the command set (a worker reads it at start).
        monkeypatch.setenv("RECEIPT_CODEX_COMMAND", "tee prompt.txt")
        stack.handler_settings = load_settings().handlers
        await stack.stop_worker(QUEUE_CODEX)
        await stack.start_worker(QUEUE_CODEX)
        await run_objective(fresh_store, {**objective, "objectiveId": "prompt-2"})
        await wait_objective(fresh_store, "prompt-2")
        # The task's monitor mirrors its output onto the objective; it may end after the
        # objective settled (control records the settlement too).
        await wait_for_status(fresh_store, monitor_job_id("prompt-2", "agent", 1))
        done = await objectives.get(fresh_store, "prompt-2")
    assert unset.status == "failed"
    assert done is not None
    assert "RECEIPT_CODEX_COMMAND is not set" in (unset.error or "")
    assert done.status == "completed", done.error
    assert (
        objective_dir(workspace_root, "prompt-2") / "prompt.txt"
    ).read_text() == "write the answer"
    agent = done.task("agent")
    assert agent is not None and agent.last_output == "write the answer"
    assert agent.output_lines == 1


async def test_every_live_job_is_watched_and_its_output_mirrored_steps_too(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """The contract's live-execution flag: each job of a live kind control dispatches (a task
    try, validate, publish) gets a monitor beside it mirroring its start and output."""
    objective = {
        "objectiveId": "live-1",
        "title": "live",
        "goal": "watch every live job",
        "tasks": [{"taskId": "t", "input": {"command": ["sh", "-c", "echo task out"]}}],
        "publish": {"command": ["sh", "-c", "echo publishing now; sleep 1"]},
    }
    async with running_stack(client, fresh_store, fresh_db) as stack, outbox_running(stack):
        await run_objective(fresh_store, objective)
        await wait_objective(fresh_store, "live-1")
        monitors = [monitor_job_id("live-1", "t", 1), step_monitor_job_id("live-1", "publish")]
        for monitor in monitors:
            assert (await wait_for_status(fresh_store, monitor)).status == "completed"
        state = await objectives.get(fresh_store, "live-1")
    assert state is not None and state.status == "completed"
    assert state.task("t").last_output == "task out"  # type: ignore[union-attr]
    publish = state.publish_step
    assert publish is not None and publish.last_output == "publishing now"
    assert publish.started_at is not None and publish.status == "completed"
    types = [r.type for r in await stream(fresh_store, "live-1")]
    assert types.count("objective.step.started") == 1
    assert "objective.step.progress" in types


async def test_a_monitor_hands_the_watch_on_before_its_timeout_and_misses_nothing(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """A task longer than a monitor's execution timeout is watched to its end: each monitor
    part hands on to the next a quarter of its execution timeout before it (here a 10 s lease:
    a part lives about 7 s, over 2 s to spare; a 6 s lease left 1.25 s, which a full run on the
    2 shared cores once overran), and the last line and the settlement are mirrored once."""
    script = "for i in $(seq 1 15); do echo line $i; sleep 1; done"
    objective = {
        "objectiveId": "long-1",
        "title": "long",
        "goal": "outlive one monitor",
        "tasks": [{"taskId": "t", "input": {"command": ["sh", "-c", script]}}],
    }
    timing = TimingSettings(job_lease_ms=10_000)
    async with (
        running_stack(client, fresh_store, fresh_db, timing=timing) as stack,
        outbox_running(stack),
    ):
        await run_objective(fresh_store, objective)
        await wait_objective(fresh_store, "long-1", timeout=90)
        # The parts the watch took: each hands on to the next until the task ended (how many
        # depends on when the first started on a loaded machine: two or three for 15 s).
        first = monitor_job_id("long-1", "t", 1)
        ended = [await wait_for_status(fresh_store, first, timeout=30)]
        while (handed := (ended[-1].result or {}).get("handedOffTo")) is not None:
            assert handed == f"{first}:part:{len(ended) + 1}"
            ended.append(await wait_for_status(fresh_store, handed, timeout=30))
        state = await objectives.get(fresh_store, "long-1")
    assert len(ended) >= 2  # the task outlived one monitor's execution timeout
    assert [job.status for job in ended] == ["completed"] * len(ended)
    assert all(job.attempt == 1 for job in ended)  # no timeout, no redelivery
    assert state is not None and state.task("t").last_output == "line 15"  # type: ignore[union-attr]
    types = [r.type for r in await stream(fresh_store, "long-1")]
    assert types.count("objective.task.started") == 1
    assert types.count("objective.task.settled") == 1
