"""One delivery of an attempt and the writes it makes to its job: each under the attempt's
fence (`receipts/operations.py`), each retried through a storage outage."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from activities.storage_retry import with_storage_retry
from receipts import operations as ops
from receipts.errors import UnansweredStorageError
from receipts.jobs import Job
from receipts.mutate import Known
from receipts.store import Store


@dataclass(frozen=True)
class AttemptFence:
    """Delivery `worker_id` of attempt `attempt` of job `job_id`. Every write names both, so the
    store refuses it once another delivery or attempt holds the lease (docs/design.md, fences)."""

    store: Store
    job_id: str
    attempt: int
    worker_id: str

    async def _write(
        self, what: str, operation: Callable[..., Awaitable[ops.Outcome]], **fields: Any
    ) -> ops.Outcome:
        return await with_storage_retry(
            lambda: operation(
                self.store,
                self.job_id,
                worker_id=self.worker_id,
                attempt=self.attempt,
                **fields,
            ),
            what=what,
        )

    async def _write_again(
        self, what: str, operation: Callable[..., Awaitable[ops.Outcome]], **fields: Any
    ) -> ops.Outcome:
        """`_write` for a write a second receipt would repeat (a progress, a consumption),
        named by an id of its own (`write_id`, in its receipt, the same on every try of it):
        each storage retry after a try whose answer was lost (`UnansweredStorageError`: it may
        have committed) tells `operation` it is one (`again`), for it to find that write by
        its id. A try refused before it wrote (no connection free, a lock not taken) is no
        such write; nor is a receipt alike of another write, of this delivery (a progress said
        twice alike is two) or of the one it took the lease from (its consumption of a command
        is not this one's)."""
        lost = False
        write_id = uuid.uuid4().hex

        async def once(*args: Any, **kwargs: Any) -> ops.Outcome:
            nonlocal lost
            try:
                return await operation(*args, write_id=write_id, again=lost, **kwargs)
            except UnansweredStorageError:
                lost = True
                raise

        return await self._write(what, once, **fields)

    async def start(self, lease_ms: int, process: dict[str, Any]) -> ops.Outcome:
        """Lease a queued job with its first heartbeat, or take a redelivered attempt's lease
        over with a start-fence heartbeat (one transaction)."""
        return await self._write(
            "start attempt", ops.start_attempt, lease_ms=lease_ms, process=process
        )

    async def heartbeat(self, lease_ms: int) -> ops.Outcome:
        """Append `job.heartbeat`: the lease runs `lease_ms` from the database clock."""
        return await self._write("heartbeat", ops.heartbeat, lease_ms=lease_ms)

    async def progress(self, data: Any) -> bool:
        """Append `job.progress`; False when the fence refused it."""
        return (await self._write_again("progress", ops.progress, data=data)).ok

    async def consume(self, command_id: str) -> bool:
        """Append `queue.command.consumed` for a pending command; False when refused."""
        consume = ops.consume_command
        return (await self._write_again("consume command", consume, command_id=command_id)).ok

    async def complete(self, result: Any, known: Known | None = None) -> ops.Outcome:
        """Settle `completed` with the handler's result (`known`: the re-read it decided on);
        refused `abort_requested` when the job it decides on holds an abort (it wins)."""
        return await self._write(
            "settle", ops.complete, result=result, known=known, abort_wins=True
        )

    async def fail(
        self, error: str, *, retryable: bool, what: str = "settle", **options: Any
    ) -> ops.Outcome:
        """Settle `failed`: requeued while retryable with attempts left (or with
        `refund_attempt`), else terminal. `options` are `operations.fail`'s: `status`, `result`,
        `retry_delay_ms`, `refund_attempt`."""
        return await self._write(what, ops.fail, error=error, retryable=retryable, **options)

    async def cancel(self, reason: str | None, known: Known | None = None) -> ops.Outcome:
        """Settle `canceled` (the attempt honoured an abort)."""
        return await self._write("settle", ops.cancel, reason=reason, known=known)

    async def read(self) -> Job | None:
        """The job as the projection holds it now."""
        return await with_storage_retry(lambda: self.store.get_job(self.job_id), what="read job")

    async def reread(self) -> tuple[Job | None, datetime]:
        """The job and the database clock, for the settle's re-read."""
        return await with_storage_retry(
            lambda: self.store.get_job_with_now(self.job_id), what="re-read"
        )
