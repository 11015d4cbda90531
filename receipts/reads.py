"""The named reads every reader shares: the API, the console, the CLI (through the API), the
metrics and the recovery loops ask these, never a statement of their own, so each query's rule
(who may see a row, where a page starts, that a page is never a prepared generic plan) is
written once. An aggregate's own pages sit with it (`objectives.store.objectives_page`,
`agent_jobs.reads.jobs_page`) and take the same `Viewer` and `Position`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from receipts.errors import ReceiptError
from receipts.jobs import Job
from receipts.store import Store, translate_errors
from receipts.streams import Receipt
from receipts.tenancy import TENANT_SEPARATOR, scoped_id

T = TypeVar("T")


class Viewer(Protocol):
    """Who reads: one organization, or an operator (`admin`) who sees every organization."""

    @property
    def organization_id(self) -> str | None: ...

    @property
    def admin(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Position:
    """Where a page of a newest-first list starts: after the row created at `created_at` whose
    key is `key` (the keyset cursor; the API encodes it as an opaque string)."""

    created_at: datetime
    key: str


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """Up to `limit` rows, newest first, and whether more follow the last of them."""

    items: list[T]
    more: bool


def seen_by(viewer: Viewer, after: Position | None, key: str) -> dict[str, Any]:
    """The parameters every page statement takes besides its filters: what `viewer` may see
    (its organization's rows, or all for an operator) and where the page starts (`before_<key>`)."""
    return {
        "all_organizations": viewer.admin,
        "caller_organization_id": viewer.organization_id,
        "before_created_at": after.created_at if after else None,
        f"before_{key}": after.key if after else None,
    }


async def page(
    store: Store, name: str, params: dict[str, Any], limit: int, *, whole_rows: bool = False
) -> tuple[list[Any], bool]:
    """The first column (`whole_rows`: each row) of up to `limit` rows of the page statement
    `name`, and whether more follow. Never a server-side prepared statement: its generic plan
    cannot use the filter indexes (a NULL filter matches all), and would walk the
    organization's whole history."""
    with translate_errors():
        rows = await store.fetch(name, {**params, "limit": limit + 1}, prepare=False)
    return [row if whole_rows else row[0] for row in rows[:limit]], len(rows) > limit


@dataclass(frozen=True, slots=True)
class JobFilters:
    """The filters of a job list; None matches everything."""

    organization_id: str | None = None
    status: str | None = None
    agent_id: str | None = None
    lane: str | None = None
    session_key: str | None = None
    kind: str | None = None

    def params(self) -> dict[str, Any]:
        return {
            "organization_id": self.organization_id,
            "status": self.status,
            "agent_id": self.agent_id,
            "lane": self.lane,
            "session_key": self.session_key,
            "kind": self.kind,
        }


async def jobs_page(
    store: Store, viewer: Viewer, filters: JobFilters, *, after: Position | None, limit: int
) -> Page[Job]:
    """A page of the jobs `viewer` may see under `filters`, newest first."""
    params = {**seen_by(viewer, after, "job_id"), **filters.params()}
    states, more = await page(store, "api_list_jobs", params, limit)
    return Page([Job.model_validate(s) for s in states], more)


# How many jobs the console's counts and failed groups read at most: the newest (the most
# recently failed); a history past it is counted as that many.
CONSOLE_WINDOW = 10_000


async def job_counts(store: Store, viewer: Viewer, filters: JobFilters) -> dict[str, int]:
    """Jobs per status under `filters` (its status ignored), of those `viewer` may see: of
    the newest `CONSOLE_WINDOW` (their sum is that when there are more)."""
    params = {
        **seen_by(viewer, None, "job_id"),
        **filters.params(),
        "status": None,
        "window": CONSOLE_WINDOW,
    }
    with translate_errors():  # never a prepared generic plan (see `page`)
        rows = await store.fetch("console_status_counts", params, prepare=False)
    return {str(status): int(count) for status, count in rows}


@dataclass(frozen=True, slots=True)
class FailedGroup:
    """Failed jobs not yet retried that share an agent and an error."""

    agent: str
    error: str
    count: int
    latest: datetime


async def failed_groups(
    store: Store, viewer: Viewer, agent_id: str | None, limit: int
) -> list[FailedGroup]:
    """The largest groups of failed jobs `viewer` may see, largest first, among the
    `CONSOLE_WINDOW` most recently failed."""
    params = {
        **seen_by(viewer, None, "job_id"),
        "agent_id": agent_id,
        "limit": limit,
        "window": CONSOLE_WINDOW,
    }
    with translate_errors():  # never a prepared generic plan (see `page`)
        rows = await store.fetch("console_failed_groups", params, prepare=False)
    return [FailedGroup(*row) for row in rows]


class AmbiguousJobId(ReceiptError):
    """An operator named a job by an organization's own id, and several organizations use it."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"several organizations use job id {job_id!r}; name it by the id admin views show "
            f"({job_id}{TENANT_SEPARATOR}<organization tag>)"
        )
        self.job_id = job_id


def sees(viewer: Viewer, organization_id: str | None) -> bool:
    """True when `viewer` may read a row of `organization_id`."""
    return viewer.admin or (
        viewer.organization_id is not None and organization_id == viewer.organization_id
    )


def runtime_job_id(viewer: Viewer, job_id: str) -> str:
    """The runtime's id of the job `viewer` names `job_id` (operators name runtime ids)."""
    return job_id if viewer.admin else scoped_id(viewer.organization_id, job_id)


async def visible_job(store: Store, viewer: Viewer, job_id: str) -> Job | None:
    """The job `viewer` names `job_id`, when it may see it; None otherwise (another
    organization's job reads exactly as an unknown one).

    An organization names its jobs by its own ids (scoped here) or by runtime ids (`<id>~<tag>`,
    which the console links to); an operator by runtime ids, or by an organization's own id
    when only one organization uses it (`AmbiguousJobId` when several do).
    """
    if TENANT_SEPARATOR in job_id:
        job = await store.get_job(job_id)
    else:
        job = await store.get_job(runtime_job_id(viewer, job_id))
        if job is None and not viewer.admin:
            # Jobs the system creates for an organization (an agent job's turns, an objective's
            # tasks) keep their untagged ids; the visibility check below still applies.
            job = await store.get_job(job_id)
        if job is None and viewer.admin:
            with translate_errors():
                rows = await store.fetch("api_jobs_by_caller_id", {"job_id": job_id})
            if len(rows) > 1:
                raise AmbiguousJobId(job_id)
            job = Job.model_validate(rows[0][0]) if rows else None
    if job is None or not sees(viewer, job.organization_id):
        return None
    return job


async def stream_tail(store: Store, stream: str, limit: int) -> list[Receipt]:
    """The newest `limit` receipts of `stream`, in order (a runaway job's page starts there)."""
    with translate_errors():
        rows = await store.fetch("read_stream_tail", {"stream": stream, "limit": limit})
    return [Receipt.from_row(row) for row in rows]


async def expired_leases(store: Store, limit: int) -> list[str]:
    """The ids of leased or running jobs whose lease the database clock has passed, soonest
    expired first."""
    with translate_errors():
        return [row[0] for row in await store.fetch("expired_leases", {"limit": limit})]


async def active_by_status(store: Store) -> dict[str, int]:
    """Queued, leased and running jobs per status (flat however many have settled)."""
    with translate_errors():
        rows = await store.fetch("jobs_by_status", {})
    return {str(status): int(count) for status, count in rows}


async def queued_oldest_age(store: Store) -> dict[tuple[str, str | None], float]:
    """Seconds the oldest deliverable queued job of each (lane, worker queue) has waited, by
    the database clock (flat however many have settled; a NULL queue: a row not yet routed)."""
    with translate_errors():
        rows = await store.fetch("queued_oldest_age", {})
    return {(str(lane), queue): max(0.0, float(age)) for lane, queue, age in rows}


async def applied_migrations(store: Store) -> set[int]:
    """The schema migrations applied to the database."""
    with translate_errors():
        return {int(row[0]) for row in await store.fetch("migrations_applied", {})}
