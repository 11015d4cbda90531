"""A start that finds the job's last driver closed reads the job again before starting the next
generation. The job was read first and its driver described after: a driver that settled the job
and closed in between left a read that still said running, and a driver was started for a settled
job (as `delivery.started` at INFO, a generation advance). Draining a 4 000-job backlog, three
such drivers were started for jobs settled a second or two before; one job got two (a second
starter met the first one's closed generation 1 and stepped past it to generation 2)."""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError

from receipts.deliveries import LatestDelivery
from receipts.jobs import Job, Lease
from receipts.settings import Settings
from receipts.timing import TimingSettings
from roles.delivery import starter as starting
from tests.unit.test_plan import NOW
from tests.unit.test_plan import job as plan_job


def job(**changes: object) -> Job:
    """A job of an agent no worker handles (test_plan's, renamed)."""
    return plan_job(**{"agent_id": "chatty", **changes})


RUNNING = job(
    status="running",
    attempt=1,
    lease=Lease(worker_id="j:attempt:1/1", attempt=1, expires_at=NOW, leased_at=NOW),
)
SETTLED = job(status="failed", attempt=1)


class ClosedDrivers:
    """Temporal where every driver asked about has closed; the starts made are kept, and a
    start of an id in `taken` is refused as already started."""

    def __init__(self, taken: set[str] | None = None) -> None:
        self.taken = taken or set()
        self.started: list[str] = []

    def get_workflow_handle(self, workflow_id: str) -> Any:
        async def describe() -> Any:
            return SimpleNamespace(status=WorkflowExecutionStatus.COMPLETED)

        return SimpleNamespace(describe=describe)

    async def start_workflow(self, *_: Any, id: str, **__: Any) -> Any:
        if id in self.taken:
            raise WorkflowAlreadyStartedError(id, "JobDriver")
        self.started.append(id)
        return SimpleNamespace(result_run_id="run")


def reads(monkeypatch: pytest.MonkeyPatch, *answers: tuple[Job, LatestDelivery | None]) -> None:
    """`job_and_latest` answers these in turn (the last one again after them)."""
    left = list(answers)

    async def job_and_latest(*_: Any) -> tuple[Job, LatestDelivery | None, datetime]:
        found, latest = left.pop(0) if len(left) > 1 else left[0]
        return found, latest, NOW

    monkeypatch.setattr(starting.deliveries, "job_and_latest", job_and_latest)


def starter(client: ClosedDrivers) -> starting.DriverStarter:
    return starting.DriverStarter(client, None, Settings(), TimingSettings())  # type: ignore[arg-type]


async def test_a_job_settled_as_its_driver_closed_gets_no_next_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read running with generation 0 open; by the describe, that driver settled it and closed."""
    reads(monkeypatch, (RUNNING, LatestDelivery(0, "j")), (SETTLED, LatestDelivery(0, "j")))
    client = ClosedDrivers()
    result = await starter(client).start("j")
    assert (result.created, result.reason) == (False, "terminal")
    assert client.started == []


async def test_a_generation_another_starter_took_and_closed_is_not_stepped_past_when_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Generation 1 was started (and closed, the job settled) by another starter between this
    one's read and its start: this one does not start generation 2."""
    reads(
        monkeypatch,
        (RUNNING, LatestDelivery(0, "j")),
        (RUNNING, LatestDelivery(0, "j")),  # still running when generation 0 is found closed
        (SETTLED, LatestDelivery(1, "j:gen:1")),
    )
    client = ClosedDrivers(taken={"j:gen:1"})
    result = await starter(client).start("j")
    assert (result.created, result.reason) == (False, "terminal")
    assert client.started == []


async def test_a_job_still_running_after_its_driver_closed_gets_the_next_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The redelivery itself is unchanged: a driver gone with the job still running."""
    reads(monkeypatch, (RUNNING, LatestDelivery(0, "j")))
    client = ClosedDrivers()
    result = await starter(client).start("j")
    assert (result.created, result.generation) == (True, 1)
    assert client.started == ["j:gen:1"]


async def _recorded(*_: Any) -> None:
    return None


@pytest.fixture(autouse=True)
def _no_bookkeeping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(starting.deliveries, "record", _recorded)
    monkeypatch.setattr(starting.deliveries, "ledger_workflow", lambda *_, **__: None)
