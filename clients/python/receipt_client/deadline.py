"""When a wait gives up: a deadline on the monotonic clock, shared by `Client` and
`AsyncClient` (their waits read it; neither sleeps past it)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from receipt_client.errors import WaitTimedOut
from receipt_client.models import ObjectiveView
from receipt_client.settings import STREAM_READ_TIMEOUT_S

# How far past the deadline a read of the event stream may end: a connection whose read timeout
# would outlast the deadline by more is resumed with a shorter one (at most one reconnection
# per SLACK_S, and only when a line arrives: the API sends a keepalive every 15 s). A read is
# given at least that long too, so a wait of 0 still reads a terminal job's stream to its end.
SLACK_S = 1.0
# A job in one of these has ended: a wait returns it at once.
TERMINAL_STATUSES = frozenset({"completed", "failed", "canceled"})


def objective_ended(objective: ObjectiveView) -> bool:
    """Whether the objective's event stream has ended: it is settled and audited, or settled
    with no audit owed (the API's own rule for its `end` event)."""
    settled = objective.status in TERMINAL_STATUSES
    return settled and (objective.audit is not None or objective.audit_job_id is None)


@dataclass(frozen=True, slots=True)
class Deadline:
    """`at` on `time.monotonic()`'s clock (None: never), and what is waited for (its error)."""

    at: float | None = None
    what: str = ""

    @classmethod
    def after(cls, timeout: float | None, what: str) -> Deadline:
        """`timeout` seconds from now (None: never; 0 or less: already past)."""
        if timeout is None:
            return NEVER
        return cls(time.monotonic() + timeout, what)

    def left(self) -> float | None:
        """Seconds until the deadline (None: never; 0 once past)."""
        return None if self.at is None else max(self.at - time.monotonic(), 0.0)

    def allows(self, seconds: float, cause: BaseException | None = None) -> None:
        """Raise `WaitTimedOut` (from `cause`, what was being retried) unless the deadline is
        still ahead after `seconds` more."""
        if self.at is None:
            return
        if time.monotonic() + seconds >= self.at:
            raise WaitTimedOut(f"{self.what} did not end in time; it goes on") from cause

    def read_timeout(self) -> float:
        """A stream's read timeout that ends by the deadline, within SLACK_S (past the API's
        keepalive without one)."""
        left = self.left()
        if left is None:
            return STREAM_READ_TIMEOUT_S
        return max(min(left, STREAM_READ_TIMEOUT_S), SLACK_S)

    def request_timeout(self) -> float | None:
        """A plain request's timeout that ends by the deadline, within SLACK_S (None: the
        client's own)."""
        left = self.left()
        return None if left is None else max(left, SLACK_S)

    def overrun(self) -> bool:
        """True once more than SLACK_S past the deadline: a stream that keeps sending (each line
        resets its read timeout) is read no longer."""
        return self.at is not None and time.monotonic() > self.at + SLACK_S

    def cuts(self, read: float) -> bool:
        """True when a read of up to `read` seconds started now could end more than `SLACK_S`
        past the deadline."""
        left = self.left()
        return left is not None and left < read - SLACK_S


NEVER = Deadline()
