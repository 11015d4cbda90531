"""The workers run workflows unsandboxed (roles/runtime.py); the sandbox's guard against
non-determinism is kept here: real histories of every workflow, replayed under the SDK's
sandboxed runner, must replay without a nondeterminism or sandbox-restriction error."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.watchdog_tick import WatchdogActivities
from receipts import operations as ops
from receipts.kinds import QUEUE_CODEX
from receipts.store import Store
from roles.delivery.runtime import WORKFLOW_RUNNER
from tests.integration.delivery.conftest import running_stack, wait_for_status
from tests.integration.helpers import put
from workflows.attempt import JobAttemptWorkflow
from workflows.driver import JobDriver, JobDriverWorkflow
from workflows.watchdog_tick import WatchdogTickWorkflow


def task(*argv: str, **extra: Any) -> dict[str, Any]:
    return {"task": {"command": list(argv)}, **extra}


async def closed_histories(client: Client, query: str, expected: int) -> list[WorkflowHistory]:
    """Every closed run matching `query` (continued-as-new runs included), once `expected`
    of them are visible."""
    for _ in range(150):
        runs = [w async for w in client.list_workflows(query) if w.close_time is not None]
        if len(runs) >= expected:
            return [
                await client.get_workflow_handle(w.id, run_id=w.run_id).fetch_history()
                for w in runs
            ]
        await asyncio.sleep(0.2)
    raise AssertionError(f"fewer than {expected} closed runs for {query}")


def workflow_type(history: WorkflowHistory) -> str:
    return history.events[0].workflow_execution_started_event_attributes.workflow_type.name


async def replay_sandboxed(histories: list[WorkflowHistory]) -> None:
    replayer = Replayer(
        workflows=[JobDriver, JobDriverWorkflow, JobAttemptWorkflow, WatchdogTickWorkflow]
    )
    assert isinstance(replayer.config()["workflow_runner"], SandboxedWorkflowRunner)
    for history in histories:
        await replayer.replay_workflow(history)  # raises on any replay failure


async def test_the_role_workers_run_workflows_unsandboxed(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    assert isinstance(WORKFLOW_RUNNER, UnsandboxedWorkflowRunner)
    async with running_stack(client, fresh_store, fresh_db, dispatcher=False) as stack:
        for worker in stack.workers.values():
            assert worker.config()["workflow_runner"] is WORKFLOW_RUNNER


async def test_delivery_histories_replay_under_the_sandbox(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with running_stack(client, fresh_store, fresh_db, queues=(QUEUE_CODEX,)):
        done = (await put(fresh_store, agent="codex", payload_extra=task("true"))).job
        # A retryable failure: the driver continues as new for the second attempt.
        retried = (
            await put(
                fresh_store,
                agent="codex",
                maxAttempts=2,
                payload_extra=task("false", retryable=True),
            )
        ).job
        aborted = (await put(fresh_store, agent="codex", payload_extra=task("sleep", "30"))).job
        await wait_for_status(fresh_store, aborted.job_id, ("running",))
        await ops.add_command(
            fresh_store, aborted.job_id, type="abort", reason="stop", organization_id="org-a"
        )
        for job, status in ((done, "completed"), (retried, "failed"), (aborted, "canceled")):
            assert (await wait_for_status(fresh_store, job.job_id)).status == status
        histories: list[WorkflowHistory] = []
        # Driver runs: 1; 2 (continued as new); 1. Collected while the workers run: a driver
        # closes only after its job has settled.
        for job, runs in ((done, 1), (retried, 2), (aborted, 1)):
            query = f"ReceiptJobId = '{job.job_id}'"
            histories += await closed_histories(client, query, runs)
    assert len(histories) == 4
    # The starter's read plans each first run; only the continued-as-new run of the retried
    # job reads the job itself (`prepare_delivery`, a local activity: one marker).
    assert sorted(markers(h, LOCAL_ACTIVITY_MARKER) for h in histories) == [0, 0, 0, 1]
    # Every run schedules `execute_attempt` itself, with no patch marker and no
    # `TemporalChangeVersion` upsert (the `JobDriver` type has no branch to record).
    assert [markers(h, PATCH_MARKER) for h in histories] == [0, 0, 0, 0]
    assert [search_attribute_upserts(h) for h in histories] == [0, 0, 0, 0]
    assert {workflow_type(h) for h in histories} == {"JobDriver"}
    assert all(attempt_activities(h) == 1 for h in histories)
    await replay_sandboxed(histories)
    record_to = os.environ.get("RECEIPT_RECORD_HISTORIES")
    if record_to:  # refresh tests/integration/delivery/histories/ from a run of this build
        names = {done.job_id: "completed", retried.job_id: "retried", aborted.job_id: "aborted"}
        for i, history in enumerate(histories):
            name = names[history.workflow_id]
            path = Path(record_to) / f"jobdriver-{name}-{i}.json"
            recorded = {"workflowId": history.workflow_id, "history": history.to_json_dict()}
            path.write_text(json.dumps(recorded, indent=1) + "\n")


async def test_a_driver_that_posts_callbacks_replays_under_the_sandbox(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    """With callback URLs the driver posts `dispatched` beside the attempt: a receiver slow to
    answer it (here 3 s) no longer holds the job's start, and the terminal post waits for it,
    so the receiver still hears `dispatched` first. No patch marker (the order is the run's
    input, `dispatched_beside`), and the history replays under the sandbox."""
    from tests.integration.delivery.receiver import Receiver

    async with (
        Receiver(hold={"dispatched": 3.0}) as receiver,
        running_stack(
            client, fresh_store, fresh_db, queues=(QUEUE_CODEX,),
            RECEIPT_EVENT_CALLBACK_URL=receiver.url,
        ),
    ):  # fmt: skip
        job = (await put(fresh_store, agent="codex", payload_extra=task("true"))).job
        assert (await wait_for_status(fresh_store, job.job_id)).status == "completed"
        await receiver.wait_for(2)
        (history,) = await closed_histories(client, f"ReceiptJobId = '{job.job_id}'", 1)
    settled = await fresh_store.get_job(job.job_id)
    assert settled is not None
    events = [json.loads(r.body)["event"] for r in receiver.requests]
    assert events == ["dispatched", "completed"]
    # The job ran and settled while its `dispatched` post waited for its answer.
    assert settled.updated_at.timestamp() < receiver.requests[0].answered_at
    assert markers(history, PATCH_MARKER) == 0
    assert sorted(activities_scheduled(history)[:2]) == ["execute_attempt", "post_callbacks"]
    assert activities_scheduled(history)[2:] == ["post_callbacks"]
    await replay_sandboxed([history])
    record_to = os.environ.get("RECEIPT_RECORD_HISTORIES")
    if record_to:  # tests/integration/delivery/histories/jobdriver-callbacks-beside-0.json
        recorded = {"workflowId": history.workflow_id, "history": history.to_json_dict()}
        path = Path(record_to) / "jobdriver-callbacks-beside-0.json"
        path.write_text(json.dumps(recorded, indent=1) + "\n")


LOCAL_ACTIVITY_MARKER = "core_local_activity"
PATCH_MARKER = "core_patch"


def search_attribute_upserts(history: WorkflowHistory) -> int:
    return sum(
        e.HasField("upsert_workflow_search_attributes_event_attributes") for e in history.events
    )


def markers(history: WorkflowHistory, name: str) -> int:
    return sum(
        e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == name
        for e in history.events
    )


def activities_scheduled(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


def attempt_activities(history: WorkflowHistory) -> int:
    return sum(
        e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute_attempt"
        for e in history.events
    )


def prepared(history: WorkflowHistory) -> str | None:
    """The `DriverAction` the run's own read of the job (`prepare_delivery`, a local activity)
    returned, from its marker; None for a run planned by its starter."""
    for e in history.events:
        marker = e.marker_recorded_event_attributes
        if e.HasField("marker_recorded_event_attributes") and marker.marker_name == (
            LOCAL_ACTIVITY_MARKER
        ):
            action: str = json.loads(marker.details["result"].payloads[0].data)["action"]
            return action
    return None


def timers(history: WorkflowHistory) -> int:
    return sum(e.HasField("timer_started_event_attributes") for e in history.events)


def continued_as_new(history: WorkflowHistory) -> bool:
    return history.events[-1].HasField("workflow_execution_continued_as_new_event_attributes")


def attempt_children(history: WorkflowHistory) -> int:
    return sum(
        e.HasField("start_child_workflow_execution_initiated_event_attributes")
        for e in history.events
    )


def failed_child_starts(history: WorkflowHistory) -> int:
    return sum(
        e.HasField("start_child_workflow_execution_failed_event_attributes") for e in history.events
    )


async def test_a_watchdog_tick_history_replays_under_the_sandbox(
    client: Client, fresh_store: Store
) -> None:
    queue = f"replay-{uuid.uuid4().hex[:8]}"
    activities = WatchdogActivities(fresh_store)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[WatchdogTickWorkflow],
        activities=[activities.enqueue_watchdog],
        workflow_runner=WORKFLOW_RUNNER,
    ):
        handle = await client.start_workflow(
            WatchdogTickWorkflow.run, id=f"replay-watchdog-{uuid.uuid4().hex}", task_queue=queue
        )
        job_id = await handle.result()
    assert job_id.startswith("watchdog:")
    assert await fresh_store.get_job(job_id) is not None
    await replay_sandboxed([await handle.fetch_history()])


# Histories recorded by earlier builds and by this one: a completed job, a retried one across a
# continue-as-new, one aborted while running. The `*-attempt-*` and `*-driver-*` files were
# recorded when each attempt was a `JobAttemptWorkflow` child; the `activity-*` files by the
# build that made the attempt an activity of the `JobDriverWorkflow` driver (a patch marker per
# run); the `jobdriver-*` files by the build that started `JobDriver`, the driver type without
# the patch (`RECEIPT_RECORD_HISTORIES=<dir>` on the test above writes them), and
# `jobdriver-callbacks-0` by that build with a callback URL (`dispatched` posted before the
# attempt is scheduled), `jobdriver-callbacks-beside-0` by the build that posts it beside the
# attempt (its input's `dispatched_beside`; the test above writes it). The
# `jobdriver-<branch>-<run>` files of the branches a plain delivery never takes (a live lease
# or a retry delay waited out, a dead delivery's lease ended, an abort honoured or a settled job
# found by the driver's own read; `jobdriver-callbacks-continued-0`, `dispatched` beside an
# attempt that left the job queued) are written by test_replay_branches.py.
# `attempt-open-driver-0` is the one legacy branch no current build can run afresh (a new
# `JobDriverWorkflow` run takes the patch, and dispatch starts `JobDriver`): a driver whose
# attempt child was still open, an earlier generation's (its start failed, the driver waited a
# heartbeat cadence and continued as new). It was recorded by the last build that started
# children (9675604^), its generation-1 driver started while generation 0's abandoned child ran
# (as its starter's check of that child could race the child's start). Workers of a
# later version must still replay them all, or drivers open across a deploy would stall on a
# nondeterminism error until their run timeout: a change that breaks this test needs
# `workflow.patched` (or a new workflow type, or a versioned task queue), not new files.
RECORDED = Path(__file__).parent / "histories"


async def test_histories_recorded_by_this_and_earlier_versions_still_replay() -> None:
    files = sorted(RECORDED.glob("*.json"))
    assert len(files) == 26
    histories = []
    for path in files:
        recorded = json.loads(path.read_text())
        histories.append(
            WorkflowHistory.from_json(recorded["workflowId"], json.dumps(recorded["history"]))
        )
    assert {workflow_type(h) for h in histories} == {
        "JobDriver",
        "JobDriverWorkflow",
        "JobAttemptWorkflow",
    }
    drivers = [h for h in histories if workflow_type(h) == "JobDriverWorkflow"]
    # Both legacy shapes: five drivers that started attempt children, four that ran attempt
    # activities (after the patch marker).
    assert sorted((attempt_children(h), attempt_activities(h)) for h in drivers) == [
        *[(0, 1)] * 4,
        *[(1, 0)] * 5,
    ]
    assert sorted(markers(h, PATCH_MARKER) for h in drivers) == [0] * 5 + [1] * 4
    # One child's start failed, its id still open: the driver waited (a timer) and continued as
    # new, the only legacy branch with no other history.
    refused = [h for h in drivers if failed_child_starts(h)]
    assert [(timers(h), continued_as_new(h)) for h in refused] == [(1, True)]
    current = [h for h in histories if workflow_type(h) == "JobDriver"]
    assert not any(markers(h, PATCH_MARKER) for h in current)
    dispatching = [h for h in current if attempt_activities(h)]
    assert [attempt_activities(h) for h in dispatching] == [1] * 7
    # Three of them posted callbacks: one `dispatched` before it scheduled the attempt, as an
    # earlier build did; two beside it, as this build does (one completed the job, one left it
    # queued and awaited `dispatched` before continuing as new).
    beside, continued, before = sorted(
        (h for h in dispatching if "post_callbacks" in activities_scheduled(h)),
        key=lambda h: (activities_scheduled(h)[0], continued_as_new(h)),
    )
    assert activities_scheduled(before) == ["post_callbacks", "execute_attempt", "post_callbacks"]
    assert activities_scheduled(beside) == ["execute_attempt", "post_callbacks", "post_callbacks"]
    assert sorted(activities_scheduled(continued)) == ["execute_attempt", "post_callbacks"]
    assert continued_as_new(continued) and not continued_as_new(beside)
    # The runs that read the job and did not dispatch: what the read decided, the timers, the
    # continue-as-new, the activities (a callback posted for a settled job).
    assert sorted(
        (prepared(h), timers(h), continued_as_new(h), activities_scheduled(h))
        for h in current
        if not attempt_activities(h)
    ) == [
        ("aborted", 0, False, ["post_callbacks"]),
        ("active", 1, True, []),
        ("not_available", 1, True, []),
        ("stale_failed", 0, False, ["post_callbacks"]),
        ("stale_failed", 0, True, []),
        ("terminal", 0, False, ["post_callbacks"]),
    ]
    await replay_sandboxed(histories)
