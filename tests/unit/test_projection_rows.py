"""A projection's row is named by its write statement: each parameter is the folded state's
attribute of that name (or a derived column), `state` the whole state as JSON."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from receipts.agent_jobs.projection import AGENT_JOBS
from receipts.jobs import Job, Lease
from receipts.kinds import route
from receipts.objectives.store import OBJECTIVES
from receipts.projections import JOBS, _parameters
from receipts.streams import StreamState

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_a_job_row_has_every_column_of_the_statement_and_its_lease_expiry() -> None:
    lease = Lease(worker_id="w", attempt=1, expires_at=T0 + timedelta(minutes=5), leased_at=T0)
    job = Job(
        job_id="job-1",
        agent_id="codex",
        lane="collect",
        kind="factory.run",
        payload={"kind": "factory.run"},
        status="leased",
        attempt=1,
        lease=lease,
        created_at=T0,
        updated_at=T0,
        seq=2,
    )
    row = JOBS.row(job)
    assert list(row) == list(_parameters("jobs_insert"))
    assert row["lease_expires_at"] == lease.expires_at
    assert row["worker_queue"] == route("codex", "factory.run")  # fair dispatch counts by it
    assert (row["job_id"], row["seq"], row["status"], row["attempt"]) == ("job-1", 2, "leased", 1)
    assert row["state"].obj == job.to_json()
    assert JOBS.row(job.model_copy(update={"lease": None}))["lease_expires_at"] is None


def test_every_projection_names_only_columns_its_state_has() -> None:
    for projection in (JOBS, OBJECTIVES, AGENT_JOBS):
        assert issubclass(projection.model, StreamState)
        attributes = set(projection.model.model_fields) | {
            "state",
            "lease_expires_at",
            "worker_queue",
        }
        attributes |= {n for n in dir(projection.model) if not n.startswith("_")}
        assert set(_parameters(projection.write)) <= attributes, projection.table
        assert projection.model.ID_FIELD in projection.model.model_fields
