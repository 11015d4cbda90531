"""Each organization's daily token budget at the AI gateway (`RECEIPT_GATEWAY_ORG_DAILY_BUDGET`):
what its model calls spent today, across every worker-codex process, and the refusal of a call
once that is spent.

Each process counts its calls' tokens as their answers end (`Meter.count`) and adds them to the
database's meter, `organization_token_usage` (one row per organization and UTC day, migration
0022), every FLUSH_MS (`Meter.flush`: a failed flush is logged and counted by its loop, and its
counts kept for the next). A call is checked before its body is read against the meter as last
read (at most REFRESH_S old) plus what this process counted since (those being flushed
included); a meter not read within READ_TIMEOUT_S (the database away) leaves the last read
standing, nothing before the first: no call waits on the database or fails for it. A read
whose day has ended is dropped by a flush (at most every PRUNE_S): the process keeps the
organizations that called today, not every one that ever called. A spent
budget is quota with a known recovery time, the database's next UTC midnight (timed from the
read on this process's monotonic clock, never its wall clock, which may be minutes off the
database's): the call gets the
provider's 429 with `retry-after`, and the turn settles `quota_exhausted` until then (a
placement delay, its attempt refunded) whatever its command reported, and whatever sooner
recovery a model's quota has. Calls running at once in several processes may pass
the budget by what they spend before the next read. A call is counted once, but a flush the
database committed whose answer never came back (the connection lost at that moment) is added
again by the next. An admin's jobs (no organization) have no budget.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from starlette.responses import Response

from activities.gateway_grant import BUDGET_QUOTA
from activities.gateway_http import error
from activities.gateway_providers import Budgets
from activities.gateway_usage import Usage
from receipts import metrics, token_usage
from receipts.store import Store

log = logging.getLogger("activities.gateway")

FLUSH_MS = 2_000  # a process's counts reach the database's meter this often
REFRESH_S = 5.0  # an organization's spend is read again after this long
READ_TIMEOUT_S = 2.0  # a read of the meter (the database away): the call is checked without it
PRUNE_S = 60.0  # a flush drops the reads whose day has ended at most this often
DAY = timedelta(days=1)


class Turn(Protocol):
    """What a budget's refusal reads and records of a turn's grant (`gateway_grant.Grant`)."""

    organization_id: str | None

    def met_quota(self, model: str, until: datetime) -> None: ...


@dataclass
class _Read:
    spent: int  # the database's meter at the read, plus what this process flushed since
    at: float  # time.monotonic()
    renews: datetime  # the next UTC midnight, by the database's clock
    # When that midnight comes on time.monotonic(): the database's clock says how far away it
    # is, never this process's wall clock (a worker minutes fast renewed the day early).
    renews_at: float

    @property
    def stale(self) -> bool:
        now = time.monotonic()
        return now - self.at > REFRESH_S or now >= self.renews_at

    def wait_s(self) -> int:
        """Whole seconds until the day renews (at least 1)."""
        return max(1, int(self.renews_at - time.monotonic() + 0.999))


class Meter:
    """One process's view of each organization's spend today, and its counts not yet flushed."""

    def __init__(self, store: Store, budgets: Budgets) -> None:
        self.store = store
        self.budgets = budgets
        self._unflushed: dict[str, list[int]] = {}  # organization: [calls, in, out]
        self._flushing: dict[str, list[int]] = {}  # taken by the flush under way, not yet written
        # Each organization's last read, until its day ends (`_prune`): a process serving many
        # organizations over days kept one for every organization that ever called.
        self._reads: dict[str, _Read] = {}
        self._pruned_at = time.monotonic()
        self._lock = asyncio.Lock()  # a flush and a read do not interleave

    def count(self, organization_id: str | None, usage: Usage) -> None:
        """A call's answer ended (`usage` its tokens; a failed call, none)."""
        if organization_id is None:
            return
        counts = self._unflushed.setdefault(organization_id, [0, 0, 0])
        counts[0] += 1
        counts[1] += usage.input_tokens
        counts[2] += usage.output_tokens

    async def flush(self) -> int:
        """Add the counts since the last flush to the database's meter; the organizations
        written. Raises (counts kept) when the database cannot take them."""
        async with self._lock:
            self._prune()
            # Still counted by `spent` while they are written (`_flushing`), then in the read.
            taken = self._flushing = self._unflushed
            self._unflushed = {}
            if not taken:
                return 0
            try:
                await token_usage.add(self.store, {o: (c[0], c[1], c[2]) for o, c in taken.items()})
            except BaseException:
                for organization, counts in taken.items():
                    kept = self._unflushed.setdefault(organization, [0, 0, 0])
                    self._unflushed[organization] = [
                        a + b for a, b in zip(kept, counts, strict=True)
                    ]
                raise
            finally:
                self._flushing = {}
            for organization, counts in taken.items():
                if (read := self._reads.get(organization)) is not None:
                    read.spent += counts[1] + counts[2]
            return len(taken)

    def unwritten(self) -> tuple[int, int, int]:
        """The organizations, calls and tokens (in and out) counted and not yet written (those
        a flush under way is writing included): what a stop that cannot write them drops."""
        counts = [*self._unflushed.values(), *self._flushing.values()]
        organizations = {*self._unflushed, *self._flushing}
        return len(organizations), sum(c[0] for c in counts), sum(c[1] + c[2] for c in counts)

    def _prune(self) -> None:
        """Drop the reads whose day has ended, at most every PRUNE_S: such a read is read again
        at its organization's next call, and unread it counts nothing (a new day starts from
        nothing either way), so what is kept is the organizations that called today."""
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_S:
            return
        self._pruned_at = now
        for organization in [o for o, read in self._reads.items() if now >= read.renews_at]:
            del self._reads[organization]

    async def spent(self, organization_id: str) -> tuple[int, datetime]:
        """The organization's tokens today (the meter as last read, and this process's counts
        since), and when the day renews."""
        spent, read = await self._spent(organization_id)
        return spent, read.renews

    async def _spent(self, organization_id: str) -> tuple[int, _Read]:
        read = self._reads.get(organization_id)
        if read is None or read.stale:
            read = self._reads[organization_id] = await self._read_again(organization_id)
        unflushed = self._unflushed.get(organization_id, [0, 0, 0])
        flushing = self._flushing.get(organization_id, [0, 0, 0])
        return read.spent + sum(unflushed[1:]) + sum(flushing[1:]), read

    async def _read_again(self, organization_id: str) -> _Read:
        """The meter read again, within READ_TIMEOUT_S (a flush's write included): a call is
        neither held on the database nor failed for it. Unread, the last read stands (from
        the day's start: nothing) until REFRESH_S later."""
        try:
            async with asyncio.timeout(READ_TIMEOUT_S), self._lock:
                read = self._reads.get(organization_id)
                if read is not None and not read.stale:  # read while this call waited
                    return read
                return await self._read(organization_id)
        except Exception as exc:  # TimeoutError included: the database away or slow
            metrics.GATEWAY_BUDGET_UNREAD.inc()
            log.warning(
                "an organization's token spend could not be read; its calls are checked "
                "against the last read",
                extra={"event": "gateway.budget_unread", "organizationId": organization_id,
                       "error": str(exc) or type(exc).__name__},
            )  # fmt: skip
            last, at = self._reads.get(organization_id), time.monotonic()
            if last is None:  # never read: this process's clock is all there is
                return _renewing(0, datetime.now(UTC))
            if at >= last.renews_at:  # the database's midnight passed since: a new day
                return _Read(0, at, last.renews + DAY, last.renews_at + DAY.total_seconds())
            return _Read(last.spent, at, last.renews, last.renews_at)

    async def _read(self, organization_id: str) -> _Read:
        spent, now = await token_usage.spent_today(self.store, organization_id)
        return _renewing(spent, now)

    async def refusal(self, grant: Turn, style: str) -> Response | None:
        """The provider-shaped 429 for a call of `grant`'s organization once its budget is
        spent (recorded as the turn's quota until the day renews); None while it is not."""
        budget = self.budgets.of(grant.organization_id)
        if budget <= 0 or grant.organization_id is None:
            return None
        spent, read = await self._spent(grant.organization_id)
        if spent < budget:
            return None
        grant.met_quota(BUDGET_QUOTA, read.renews)
        message = (
            f"the organization's daily token budget ({budget}) is spent ({spent} today); it "
            f"renews at {read.renews.isoformat()}"
        )
        return error(style, 429, "rate_limit_error", message, read.wait_s())


def _renewing(spent: int, now: datetime) -> _Read:
    """A read of `spent` at the clock `now` (the database's): the day renews at its next UTC
    midnight, that far from now on time.monotonic()."""
    renews = datetime(now.year, now.month, now.day, tzinfo=UTC) + DAY
    at = time.monotonic()
    return _Read(spent, at, renews, at + (renews - now).total_seconds())
