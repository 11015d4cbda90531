"""The storage retry around every settlement (J35): 5 attempts, 150 ms × attempt between them,
transient storage errors only."""

from __future__ import annotations

import asyncio

import pytest

from activities.storage_retry import STORAGE_ATTEMPTS, STORAGE_BACKOFF_S, with_storage_retry
from receipts import metrics
from receipts.errors import ConflictError, StorageError, TransientStorageError


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoffs slept, instead of sleeping them."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return slept


def failing(errors: list[Exception], result: str = "settled") -> tuple[list[int], object]:
    calls: list[int] = []

    async def operation() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    return calls, operation


def test_the_spec_numbers() -> None:
    assert (STORAGE_ATTEMPTS, STORAGE_BACKOFF_S) == (5, 0.150)


async def test_transient_errors_are_retried_with_150_ms_times_the_attempt(
    sleeps: list[float],
) -> None:
    calls, operation = failing([TransientStorageError("connection lost")] * 4)
    assert await with_storage_retry(operation) == "settled"  # type: ignore[arg-type]
    assert len(calls) == 5
    assert sleeps == pytest.approx([0.150, 0.300, 0.450, 0.600])


async def test_the_fifth_transient_failure_propagates(sleeps: list[float]) -> None:
    before = metrics.value("receipt_settlement_retries_total")
    calls, operation = failing([TransientStorageError("down")] * 5)
    with pytest.raises(TransientStorageError, match="down"):
        await with_storage_retry(operation)  # type: ignore[arg-type]
    assert len(calls) == 5 and len(sleeps) == 4
    assert metrics.value("receipt_settlement_retries_total") - before == 4


@pytest.mark.parametrize("error", [ConflictError("duplicate"), StorageError("bad sql"), KeyError()])
async def test_other_errors_are_never_retried(sleeps: list[float], error: Exception) -> None:
    calls, operation = failing([error])
    with pytest.raises(type(error)):
        await with_storage_retry(operation)  # type: ignore[arg-type]
    assert len(calls) == 1 and sleeps == []
