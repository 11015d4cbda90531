"""Schedules over the API and their firings against real PostgreSQL: clear refusals that write
nothing, tenant isolation, pause/resume/change/delete as receipts, and what a firing does —
`<scheduleId>:<fire time>` enqueued once however often it fires, the overlap policies, nothing
while paused. The Temporal side (a real Schedule firing every few seconds, a Temporal restart)
is tests/e2e/test_schedules_roles.py."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from receipts import metrics
from receipts import operations as ops
from receipts.schedules import firing
from receipts.schedules import store as schedules
from receipts.schedules.model import schedule_stream
from receipts.store import Store
from receipts.tenancy import scoped_id
from roles.api.routes import schedules as routes
from tests.integration.api_support import (
    AS_A,
    AS_ADMIN,
    AS_B,
    api_client,
    enqueue_body,
    published,
)


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url, schedule_min_interval_s=2, org_max_schedules=50) as client:
        yield client


def new_schedule_id() -> str:
    return f"sch-{uuid.uuid4().hex[:10]}"


def body(org: str = "org-a", **extra: Any) -> dict[str, Any]:
    job = enqueue_body(org, payload_extra={"task": {"command": ["true"]}})
    return {
        "scheduleId": new_schedule_id(),
        "interval": "5s",
        "agentId": "codex",
        "job": job,
        **extra,
    }


async def create(
    client: httpx.AsyncClient, headers: dict[str, str] = AS_A, **extra: Any
) -> dict[str, Any]:
    response = await client.post("/schedules", json=body(**extra), headers=headers)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_a_schedule_is_created_listed_shown_with_its_next_fire_times(
    client: httpx.AsyncClient,
) -> None:
    made = await create(client, cron="*/15 * * * *", interval=None, timezone="Europe/Paris")
    sid = made["scheduleId"]
    assert "~" not in sid  # the organization sees its own id
    assert made["status"] == "active" and made["overlap"] == "skip"
    assert len(made["nextFireTimes"]) == 5
    first = datetime.fromisoformat(made["nextFireTimes"][0])
    assert first.minute % 15 == 0 and first > datetime.now(UTC)
    shown = (await client.get(f"/schedules/{sid}", headers=AS_A)).json()
    assert shown["cron"] == "*/15 * * * *" and shown["lastRuns"] == []
    listed = (await client.get("/schedules?limit=200", headers=AS_A)).json()
    assert sid in [s["scheduleId"] for s in listed["schedules"]]
    # a re-post of the same definition is the same schedule; another definition is 409
    again = await client.post(
        "/schedules",
        json={k: made[k] for k in ("scheduleId", "cron", "timezone", "agentId", "job")},
        headers=AS_A,
    )
    assert again.status_code == 200, again.text
    clash = await client.post("/schedules", json=body(scheduleId=sid), headers=AS_A)
    assert clash.status_code == 409 and clash.json()["error"]["field"] == "scheduleId"


@pytest.mark.parametrize(
    ("change", "field", "said"),
    [
        ({"cron": "61 * * * *", "interval": None}, "cron", "minute: 61 is out of range 0-59"),
        ({"cron": "* * *", "interval": None}, "cron", "has 3 fields"),
        ({"cron": "0 0 30 2 *", "interval": None}, "cron", "matches no time"),
        ({"cron": "* * * * *"}, "cron", "exactly one of cron"),
        ({"interval": None}, "cron", "exactly one of cron"),
        ({"interval": "1s"}, "interval", "shorter than the shortest interval allowed, 2 s"),
        ({"timezone": "Mars/Olympus"}, "timezone", "not an IANA time zone"),
        # A directory of the zone database, a name longer than a file name: 422, not a 500.
        ({"timezone": "Europe"}, "timezone", "not an IANA time zone"),
        ({"timezone": "America/Argentina"}, "timezone", "not an IANA time zone"),
        ({"timezone": "Europe/" + "x" * 300}, "timezone", "at most 200 characters"),
        # Never parsed nor echoed back whole.
        ({"cron": "1," * 50_000 + "1 * * * *", "interval": None}, "cron", "at most 200 char"),
        ({"interval": "1" * 201 + "s"}, "interval", "at most 200 characters"),
        ({"overlap": "queue"}, "overlap", "skip"),
        # A steer lands in the session's active job, the one cancel_previous would abort.
        (
            {
                "overlap": "cancel_previous",
                "job": enqueue_body(
                    payload_extra={"task": {"command": ["true"]}},
                    sessionKey="s-1",
                    singletonMode="steer",
                ),
            },
            "overlap",
            "cancel_previous cannot go with job.singletonMode steer",
        ),
        ({"agentId": ""}, "agentId", ""),
    ],
)
async def test_a_bad_definition_is_refused_naming_the_field_and_nothing_is_written(
    client: httpx.AsyncClient, store: Store, change: dict[str, Any], field: str, said: str
) -> None:
    sent = {**body(), **change}
    sent = {k: v for k, v in sent.items() if v is not None}
    response = await client.post("/schedules", json=sent, headers=AS_A)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field and said in error["message"], error
    assert len(error["message"]) < 500  # the value is never echoed back whole
    assert await schedules.get(store, scoped_id("org-a", sent["scheduleId"])) is None


def test_the_shortest_interval_bounds_a_cron_too() -> None:
    """`RECEIPT_SCHEDULE_MIN_INTERVAL_S` is a floor on how often a schedule fires, however it
    says when: a cron whose closest two firings are nearer is refused naming the field."""
    from receipts.errors import InvalidInput

    hourly = schedules.Limits(min_interval_s=3600)
    job = enqueue_body(payload_extra={"task": {"command": ["true"]}})

    def check(expression: str) -> None:
        fields = {"cron": expression, "agentId": "codex", "job": job}
        schedules.validate(fields, "org-a", hourly, admin=False)

    check("0 * * * *")
    check("15 6 * * mon")
    for dense, gap in [
        ("* * * * *", "60 s"),
        ("0,30 * * * *", "1800 s"),
        ("0,59 0,23 * * *", "60 s"),
    ]:
        with pytest.raises(InvalidInput) as refused:
            check(dense)
        assert refused.value.field == "cron"
        assert f"fires {gap} apart at its closest" in refused.value.message


@pytest.mark.parametrize(
    "posted_on", [datetime(2026, 7, 1, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC)]
)
def test_the_shortest_interval_holds_across_a_daylight_saving_change(
    monkeypatch: pytest.MonkeyPatch, posted_on: datetime
) -> None:
    """The floor holds on the day a daylight-saving change makes two firings closer than any
    other day's, whatever day the definition is posted: at :36 and :54 of every hour, 18 min
    apart at the closest, in Lord Howe's zone, whose clocks go from 02:00 to 02:30 on 4 October
    2026, 01:54 and 02:36 are 12 min apart. Posted in July, the firings read to find the closest
    two (2 881 of them, 60 days) did not reach October: it was accepted, and refused in October."""
    from receipts.errors import InvalidInput

    class PostedOn(datetime):
        @classmethod
        def now(cls, tz: object = None) -> PostedOn:
            return cls(*posted_on.timetuple()[:6], tzinfo=UTC)

    monkeypatch.setattr(schedules, "datetime", PostedOn)
    job = enqueue_body(payload_extra={"task": {"command": ["true"]}})
    fields = {
        "cron": "36,54 * * * *",
        "timezone": "Australia/Lord_Howe",
        "agentId": "codex",
        "job": job,
    }
    with pytest.raises(InvalidInput) as refused:
        schedules.validate(fields, "org-a", schedules.Limits(min_interval_s=1080), admin=False)
    assert "fires 720 s apart at its closest" in refused.value.message


async def test_the_job_is_validated_as_its_enqueue_would_be(client: httpx.AsyncClient) -> None:
    named = body()
    named["job"]["jobId"] = "mine"
    response = await client.post("/schedules", json=named, headers=AS_A)
    assert response.status_code == 422 and response.json()["error"]["field"] == "job.jobId"
    bad_kind = body()
    bad_kind["job"]["payload"]["kind"] = "nope"
    response = await client.post("/schedules", json=bad_kind, headers=AS_A)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "job.payload.kind"
    foreign = body(org="org-b")
    response = await client.post("/schedules", json=foreign, headers=AS_A)
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "job.payload.authContext.organizationId"


async def test_strict_agent_ids_refuse_a_schedule_of_an_unknown_agent_as_its_enqueue(
    db_url: str,
) -> None:
    """`RECEIPT_STRICT_AGENT_IDS=1` refuses an agent id without a handler at post time (404
    `unknown_agent`): a schedule's job is validated as its enqueue would be, so a schedule of
    one is refused too, nothing written, not accepted to fire jobs no worker runs."""
    async with api_client(db_url, strict_agent_ids=True, schedule_min_interval_s=2) as strict:
        sent = body(agentId="nobody-handles-me")
        refused = await strict.post("/schedules", json=sent, headers=AS_A)
        assert refused.status_code == 404, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["field"]) == ("unknown_agent", "agentId")
        shown = await strict.get(f"/schedules/{sent['scheduleId']}", headers=AS_A)
        assert shown.status_code == 404
        assert (await strict.post("/schedules", json=body(), headers=AS_A)).status_code == 201


async def test_reads_show_a_jobs_environment_by_its_names_only(
    client: httpx.AsyncClient, store: Store
) -> None:
    """As every read of a job: `task.env` values may be secrets, a schedule's reads redact them
    (its firings still pass them: the stored definition keeps them)."""
    secret = {"task": {"command": ["true"], "env": {"API_TOKEN": "s3cret-value"}}}
    made = await create(client, job=enqueue_body("org-a", payload_extra=secret))
    sid = made["scheduleId"]
    shown = (await client.get(f"/schedules/{sid}", headers=AS_A)).json()
    listed = (await client.get("/schedules?limit=200", headers=AS_A)).json()["schedules"]
    views = [made, shown, next(s for s in listed if s["scheduleId"] == sid)]
    for view in views:
        assert view["job"]["payload"]["task"]["env"] == {"API_TOKEN": "[redacted]"}
    stored = await schedules.get(store, scoped_id("org-a", sid))
    assert (
        stored is not None and stored.job["payload"]["task"]["env"]["API_TOKEN"] == "s3cret-value"
    )


async def test_another_organization_can_neither_see_nor_change_it(
    client: httpx.AsyncClient,
) -> None:
    sid = (await create(client))["scheduleId"]
    assert (await client.get(f"/schedules/{sid}", headers=AS_B)).status_code == 404
    patched = await client.patch(f"/schedules/{sid}", json={"paused": True}, headers=AS_B)
    assert patched.status_code == 404
    assert (await client.delete(f"/schedules/{sid}", headers=AS_B)).status_code == 404
    listed = (await client.get("/schedules?limit=200", headers=AS_B)).json()["schedules"]
    assert sid not in [s["scheduleId"] for s in listed]
    # an admin sees it under the runtime's id
    admin_view = await client.get(f"/schedules/{scoped_id('org-a', sid)}", headers=AS_ADMIN)
    assert admin_view.status_code == 200 and admin_view.json()["status"] == "active"


async def test_pause_resume_change_and_delete_are_receipts(
    client: httpx.AsyncClient, store: Store
) -> None:
    sid = (await create(client))["scheduleId"]
    paused = await client.patch(
        f"/schedules/{sid}", json={"paused": True, "note": "deploy"}, headers=AS_A
    )
    assert paused.status_code == 200, paused.text
    assert paused.json()["status"] == "paused" and paused.json()["nextFireTimes"] == []
    # a pause of a paused schedule writes nothing, and keeps its note
    again = await client.patch(f"/schedules/{sid}", json={"paused": True}, headers=AS_A)
    assert again.json()["note"] == "deploy"
    # a note alone would change nothing: refused naming the field
    alone = await client.patch(f"/schedules/{sid}", json={"note": "why"}, headers=AS_A)
    assert alone.status_code == 422 and alone.json()["error"]["field"] == "note", alone.text
    # a new note for a paused schedule is a new reason, recorded
    reason = await client.patch(
        f"/schedules/{sid}", json={"paused": True, "note": "incident"}, headers=AS_A
    )
    assert reason.json()["note"] == "incident"
    resumed = await client.patch(
        f"/schedules/{sid}", json={"paused": False, "cron": "0 * * * *"}, headers=AS_A
    )
    assert resumed.json()["status"] == "active" and resumed.json()["cron"] == "0 * * * *"
    assert resumed.json()["intervalS"] is None
    bad = await client.patch(f"/schedules/{sid}", json={"cron": "0 25 * * *"}, headers=AS_A)
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "cron"
    assert (await client.delete(f"/schedules/{sid}", headers=AS_A)).status_code == 204
    assert (await client.get(f"/schedules/{sid}", headers=AS_A)).status_code == 404
    chain = await store.read_stream(schedule_stream(scoped_id("org-a", sid)))
    assert [r.type for r in chain] == [
        "schedule.created",
        "schedule.paused",
        "schedule.paused",
        "schedule.changed",
        "schedule.resumed",
        "schedule.deleted",
    ]
    assert chain[2].data == {"note": "incident"}
    # a deleted schedule's id is not reused: its firings' job ids name it
    reused = await client.post("/schedules", json=body(scheduleId=sid), headers=AS_A)
    assert reused.status_code == 409


async def test_a_deleted_schedules_id_is_not_reused_even_for_its_own_definition(
    client: httpx.AsyncClient,
) -> None:
    """README: `DELETE /schedules/{id}` (204; an id is not reused). A re-post of the very
    definition it had answers 409, not a 200 showing a schedule that will never fire again."""
    sent = body()
    assert (await client.post("/schedules", json=sent, headers=AS_A)).status_code == 201
    assert (await client.post("/schedules", json=sent, headers=AS_A)).status_code == 200
    sid = sent["scheduleId"]
    assert (await client.delete(f"/schedules/{sid}", headers=AS_A)).status_code == 204
    again = await client.post("/schedules", json=sent, headers=AS_A)
    assert again.status_code == 409 and again.json()["error"]["field"] == "scheduleId", again.text
    assert (await client.get(f"/schedules/{sid}", headers=AS_A)).status_code == 404


async def test_two_changes_at_once_are_both_kept(client: httpx.AsyncClient) -> None:
    """Each PATCH merges its fields onto the schedule as it is when it writes: one sent beside
    another is not overwritten by the other's copy of the rest."""
    for _ in range(5):
        sid = (await create(client))["scheduleId"]
        answers = await asyncio.gather(
            client.patch(f"/schedules/{sid}", json={"overlap": "allow"}, headers=AS_A),
            client.patch(f"/schedules/{sid}", json={"interval": "2h"}, headers=AS_A),
        )
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        shown = (await client.get(f"/schedules/{sid}", headers=AS_A)).json()
        assert (shown["overlap"], shown["intervalS"]) == ("allow", 7200)


async def test_an_organization_may_not_schedule_the_runtimes_own_kind(
    client: httpx.AsyncClient,
) -> None:
    """A post of `factory.objective.watchdog` is 403 for an organization: its schedule was
    201, and each firing scanned every organization's active objectives."""
    watchdog = enqueue_body("org-a")
    watchdog["payload"]["kind"] = "factory.objective.watchdog"
    refused = await client.post(
        "/schedules",
        json=body(agentId="factory-control", job=watchdog, interval="60s"),
        headers=AS_A,
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["field"] == "job.payload.kind"
    listed = (await client.get("/schedules", headers=AS_A)).json()["schedules"]
    assert all(s["job"]["payload"]["kind"] != "factory.objective.watchdog" for s in listed)


async def test_an_organization_holds_at_most_its_cap_of_schedules(db_url: str) -> None:
    async with api_client(db_url, org_max_schedules=2, schedule_min_interval_s=2) as capped:
        org = f"org-cap-{uuid.uuid4().hex[:6]}"
        admin_made = [
            await capped.post("/schedules", json=body(org=org), headers=AS_ADMIN) for _ in range(3)
        ]
    assert [r.status_code for r in admin_made] == [201, 201, 409]
    assert admin_made[2].json()["error"]["code"] == "too_many_schedules"
    assert "Retry-After" not in admin_made[2].headers
    assert "RECEIPT_ORG_MAX_SCHEDULES" in admin_made[2].json()["error"]["message"]


# --------------------------------------------------------------------------------- firings


async def made(
    store: Store,
    overlap: str = "skip",
    command: list[str] | None = None,
    org: str = "org-a",
    timeout_ms: int | None = None,
    **when: str,
) -> str:
    extra: dict[str, Any] = {"task": {"command": command or ["true"]}}
    if timeout_ms is not None:
        extra["timeoutMs"] = timeout_ms
    job = enqueue_body(org, payload_extra=extra)
    definition, _ = schedules.validate(
        {**(when or {"interval": "5s"}), "agentId": "codex", "job": job, "overlap": overlap},
        org,
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    state, _ = await schedules.create(store, org, new_schedule_id(), definition, schedules.Limits())
    return state.schedule_id


T = datetime(2026, 12, 4, 17, 30, tzinfo=UTC)


async def test_a_firing_enqueues_its_fire_times_job_once_however_often_it_fires(
    store: Store,
) -> None:
    sid = await made(store)
    assert await firing.fire(store, sid, T) == "enqueued"
    assert await firing.fire(store, sid, T) == "repeated"  # a doubled firing
    state = await schedules.get(store, sid)
    assert state is not None and state.fired == 1
    job_id = state.last_job_id
    assert job_id == scoped_id("org-a", f"{state.caller_schedule_id}:20261204T173000Z")
    job = await store.get_job(job_id)
    assert job is not None and job.status == "queued" and job.organization_id == "org-a"
    assert job.payload["task"] == {"command": ["true"]}


async def test_a_late_firing_is_handled_once_and_leaves_the_last_job_the_newest(
    store: Store,
) -> None:
    """Temporal may deliver a firing late (its fire activity retries through a database outage
    for up to 30 minutes): one the recent firings the projection keeps no longer hold is still
    recognised as handled, and a late one enqueued is the job that runs now, the one the
    overlap policy asks after next."""
    sid = await made(store, "allow")
    times = [T + timedelta(seconds=5 * n) for n in range(12)]
    for at in times:
        assert await firing.fire(store, sid, at) == "enqueued"
    assert await firing.fire(store, sid, times[0]) == "repeated"  # past the 10 recent ones
    late = T - timedelta(seconds=5)  # never fired: Temporal delivers it now
    assert await firing.fire(store, sid, late) == "enqueued"
    state = await schedules.get(store, sid)
    assert state is not None and state.fired == 13
    assert state.last_job_id is not None and state.last_job_id.startswith(
        f"{state.caller_schedule_id}:20261204T172955Z"
    )
    # The late firing pushed times[2] out of the recent ten: delivered again, still one job.
    assert state.firing_at(times[2]) is None
    assert await firing.fire(store, sid, times[2]) == "repeated"


async def test_a_redelivered_firing_is_one_job_whatever_order_firings_were_recorded_in(
    store: Store,
) -> None:
    """After an outage retried firings commit in any order: the newest fire time, recorded
    first and then pushed out of the recent ten by older ones, is still one job when Temporal
    delivers it again."""
    sid = await made(store, "allow")
    newest = T + timedelta(seconds=5 * 29)
    assert await firing.fire(store, sid, newest) == "enqueued"
    for n in range(10):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    state = await schedules.get(store, sid)
    assert state is not None and state.firing_at(newest) is None
    assert await firing.fire(store, sid, newest) == "repeated"
    assert (await schedules.get(store, sid)).fired == 11  # type: ignore[union-attr]


async def test_a_row_folded_before_the_latest_fire_time_was_kept_still_fires_once(
    fresh: tuple[Store, str],
) -> None:
    """A projection row written before `latestFireTime` existed: the stream is read for any
    fire time not among the recent ones (a late firing must not make the newest look new).
    A database of its own: the row it alters differs from its chain until a rebuild."""
    import psycopg

    store, db_url = fresh
    sid = await made(store, "allow")
    newest = T + timedelta(seconds=5 * 29)
    assert await firing.fire(store, sid, newest) == "enqueued"
    for n in range(10):
        assert await firing.fire(store, sid, T + timedelta(seconds=5 * n)) == "enqueued"
    with psycopg.connect(db_url) as conn:  # as an older version wrote it
        conn.execute(
            "UPDATE schedules SET state = state - 'latestFireTime' WHERE schedule_id = %s", (sid,)
        )
    assert await firing.fire(store, sid, T - timedelta(seconds=5)) == "enqueued"  # a late one
    state = await schedules.get(store, sid)
    assert state is not None and state.latest_fire_time is None  # unknown until a rebuild
    assert await firing.fire(store, sid, newest) == "repeated"
    assert (await schedules.get(store, sid)).fired == 12  # type: ignore[union-attr]


async def test_a_late_firing_is_the_job_skip_then_asks_after(store: Store) -> None:
    sid = await made(store, "skip")
    assert await firing.fire(store, sid, T) == "enqueued"
    first = (await schedules.get(store, sid)).last_job_id  # type: ignore[union-attr]
    assert first is not None
    await ops.cancel_queued(store, first, reason="done with it")
    assert await firing.fire(store, sid, T - timedelta(seconds=5)) == "enqueued"  # late
    assert await firing.fire(store, sid, T + timedelta(seconds=5)) == "skipped"  # it runs


async def test_skip_records_the_firing_while_the_previous_job_is_active(store: Store) -> None:
    sid = await made(store, "skip")
    assert await firing.fire(store, sid, T) == "enqueued"
    assert await firing.fire(store, sid, T + timedelta(seconds=5)) == "skipped"
    state = await schedules.get(store, sid)
    assert state is not None and (state.fired, state.skipped) == (1, 1)
    assert state.recent[0].running_job_id == state.last_job_id
    # once the previous job is terminal, the next firing enqueues again
    assert state.last_job_id is not None
    await ops.cancel_queued(store, state.last_job_id, reason="done with it")
    assert await firing.fire(store, sid, T + timedelta(seconds=10)) == "enqueued"


async def test_allow_enqueues_beside_and_cancel_previous_aborts_the_active_job(
    store: Store,
) -> None:
    allow = await made(store, "allow")
    assert await firing.fire(store, allow, T) == "enqueued"
    assert await firing.fire(store, allow, T + timedelta(seconds=5)) == "enqueued"
    cancel = await made(store, "cancel_previous")
    assert await firing.fire(store, cancel, T) == "enqueued"
    first = (await schedules.get(store, cancel)).last_job_id  # type: ignore[union-attr]
    assert await firing.fire(store, cancel, T + timedelta(seconds=5)) == "enqueued"
    state = await schedules.get(store, cancel)
    assert state is not None and state.recent[0].canceled_job_id == first
    previous = await store.get_job(first or "")
    assert previous is not None and previous.status == "canceled"


async def test_skip_holds_when_firings_arrive_together(store: Store) -> None:
    """Temporal catching up after an outage (or firings retried together): under `skip`, the
    firings see each other, whatever order they commit in: one job, the others skipped."""
    sid = await made(store, "skip")
    outcomes = await asyncio.gather(
        *(firing.fire(store, sid, T + timedelta(seconds=5 * n)) for n in range(4))
    )
    assert sorted(outcomes) == ["enqueued", "skipped", "skipped", "skipped"]
    state = await schedules.get(store, sid)
    assert state is not None and (state.fired, state.skipped) == (1, 3)


async def queued_of(store: Store, organization_id: str) -> int:
    row = await store.fetch_one("enqueue_caps", {"organization_id": organization_id})
    assert row is not None
    return int(row[1])


async def test_cancel_previous_aborts_nothing_for_a_firing_it_does_not_make(store: Store) -> None:
    org = f"org-{uuid.uuid4().hex[:8]}"  # its own counts: other tests enqueue beside it
    sid = await made(store, "cancel_previous", org=org)
    assert await firing.fire(store, sid, T) == "enqueued"
    first = (await schedules.get(store, sid)).last_job_id  # type: ignore[union-attr]
    full = firing.Caps(max_queued=0, max_active=10**9)
    assert await firing.fire(store, sid, T + timedelta(seconds=5), full) == "skipped_cap"
    previous = await store.get_job(first or "")
    assert previous is not None and previous.status == "queued" and not previous.commands
    # At a cap it holds with its own queued job, a firing replaces that job: its place frees.
    own = firing.Caps(max_queued=await queued_of(store, org), max_active=10**9)
    assert await firing.fire(store, sid, T + timedelta(seconds=10), own) == "enqueued"
    replaced = await store.get_job(first or "")
    assert replaced is not None and replaced.status == "canceled"


async def test_allow_at_the_cap_skips_the_firing_and_keeps_the_previous_job(store: Store) -> None:
    """Only `cancel_previous` frees the place of the queued job it replaces: under `allow` the
    previous job stays queued, so a firing at the organization's cap is skipped (`cap`), not
    enqueued past it."""
    org = f"org-{uuid.uuid4().hex[:8]}"  # its own counts: other tests enqueue beside it
    sid = await made(store, "allow", org=org)
    assert await firing.fire(store, sid, T) == "enqueued"
    own = firing.Caps(max_queued=await queued_of(store, org), max_active=10**9)
    assert await firing.fire(store, sid, T + timedelta(seconds=5), own) == "skipped_cap"
    assert await queued_of(store, org) == 1


async def test_a_firing_the_definition_does_not_make_is_not_enqueued(store: Store) -> None:
    """Temporal holds the old timing until the sync reaches it: a firing of the old definition
    after an edit enqueues nothing (and records nothing)."""
    sid = await made(store, cron="0 3 * * *", timezone="UTC")
    assert await firing.fire(store, sid, datetime(2026, 12, 4, 14, 0, tzinfo=UTC)) == (
        "off_schedule"
    )
    assert await firing.fire(store, sid, datetime(2026, 12, 5, 3, 0, tzinfo=UTC)) == "enqueued"
    # A run triggered by hand in the Temporal UI, seconds past a minute the cron names.
    by_hand = datetime(2026, 12, 6, 3, 0, 27, tzinfo=UTC)
    assert await firing.fire(store, sid, by_hand) == "off_schedule"
    every = await made(store, interval="5s")
    assert await firing.fire(store, every, T + timedelta(seconds=2)) == "off_schedule"
    state = await schedules.get(store, sid)
    assert state is not None and (state.fired, state.skipped) == (1, 0)


async def test_an_hour_the_fall_back_repeats_fires_once(store: Store) -> None:
    """`30 1 * * *` in New York: 01:30 happens twice on 2026-11-01 (05:30Z and 06:30Z), and
    Temporal fires at both: one job. In Paris Temporal fires 02:30 at its second occurrence
    only (01:30Z on 2026-10-25): that one is the day's firing."""
    york = await made(store, "allow", cron="30 1 * * *", timezone="America/New_York")
    assert await firing.fire(store, york, datetime(2026, 11, 1, 5, 30, tzinfo=UTC)) == ("enqueued")
    assert await firing.fire(store, york, datetime(2026, 11, 1, 6, 30, tzinfo=UTC)) == ("repeated")
    assert await firing.fire(store, york, datetime(2026, 11, 2, 6, 30, tzinfo=UTC)) == ("enqueued")
    paris = await made(store, "allow", cron="30 2 * * *", timezone="Europe/Paris")
    assert await firing.fire(store, paris, datetime(2026, 10, 25, 1, 30, tzinfo=UTC)) == (
        "enqueued"
    )
    state = await schedules.get(store, york)
    assert state is not None and state.fired == 2
    # More firings in that hour than the projection keeps: each second occurrence still repeats.
    often = await made(store, "allow", cron="*/5 1 * * *", timezone="America/New_York")
    hour = datetime(2026, 11, 1, 5, 0, tzinfo=UTC)
    for n in range(12):
        assert await firing.fire(store, often, hour + timedelta(minutes=5 * n)) == "enqueued"
    for n in range(12):
        again = hour + timedelta(hours=1, minutes=5 * n)
        assert await firing.fire(store, often, again) == "repeated", again


async def test_a_paused_or_deleted_schedule_fires_nothing(store: Store) -> None:
    sid = await made(store)
    await schedules.change(store, sid, paused=True)
    assert await firing.fire(store, sid, T) == "none"
    await schedules.change(store, sid, paused=False)
    assert await firing.fire(store, sid, T) == "enqueued"
    await schedules.change(store, sid, delete=True)
    assert await firing.fire(store, sid, T + timedelta(seconds=5)) == "none"
    assert await firing.fire(store, "sch-none~nothing", T) == "none"


async def test_the_projection_rebuilds_from_the_chain_and_resyncs_every_schedule(
    store: Store,
) -> None:
    sid = await made(store)
    state = await schedules.get(store, sid)
    assert state is not None
    await schedules.mark_synced(store, sid, state.definition_seq)
    assert sid not in [s.schedule_id for s, _ in await schedules.unsynced(store, 10_000)]
    await schedules.resync(store, [sid])
    assert sid in [s.schedule_id for s, _ in await schedules.unsynced(store, 10_000)]


async def test_a_firing_past_the_organizations_cap_of_open_jobs_is_skipped(store: Store) -> None:
    sid = await made(store, "allow")
    full = firing.Caps(max_queued=0, max_active=10**9)
    assert await firing.fire(store, sid, T, full) == "skipped_cap"
    state = await schedules.get(store, sid)
    assert state is not None and state.recent[0].reason == "cap" and state.fired == 0
    room = firing.Caps(max_queued=10**9, max_active=10**9)
    assert await firing.fire(store, sid, T + timedelta(seconds=5), room) == "enqueued"


async def test_a_firing_past_the_organizations_cap_of_active_jobs_is_skipped(
    store: Store,
) -> None:
    """README: a firing past `RECEIPT_ORG_MAX_ACTIVE` (as past `RECEIPT_ORG_MAX_QUEUED`) is
    recorded `schedule.skipped` with reason `cap` and enqueues nothing."""
    sid = await made(store, "allow")
    full = firing.Caps(max_queued=10**9, max_active=0)
    assert await firing.fire(store, sid, T, full) == "skipped_cap"
    state = await schedules.get(store, sid)
    assert state is not None and state.recent[0].reason == "cap" and state.fired == 0


async def test_a_firing_is_held_to_the_timeout_cap_and_the_allow_list_as_they_are_now(
    store: Store,
) -> None:
    """A firing is held to what the api holds a direct enqueue to: `timeoutMs` clamped to
    `RECEIPT_MAX_TIMEOUT_MS`, and the organization's allow-list of executables as it is when it
    fires — a program taken off the list after the schedule was made stops its firings, each
    recorded skipped with the reason and counted."""
    sid = await made(store, "allow", command=["git", "status"], timeout_ms=7_200_000)
    on_list = firing.Caps(10**9, 10**9, max_timeout_ms=60_000, executables={"org-a": ["git"]})
    assert await firing.fire(store, sid, T, on_list) == "enqueued"
    state = await schedules.get(store, sid)
    assert state is not None and state.last_job_id is not None
    job = await store.get_job(state.last_job_id)
    assert job is not None and job.payload["timeoutMs"] == 60_000

    before = metrics.value("receipt_schedule_firings_total", outcome="skipped_executables")
    tightened = dataclasses.replace(on_list, executables={"org-a": ["pytest"]})
    later = T + timedelta(seconds=5)
    assert await firing.fire(store, sid, later, tightened) == "skipped_executables"
    state = await schedules.get(store, sid)
    assert state is not None and (state.fired, state.skipped) == (1, 1)
    skipped = state.firing_at(later)
    assert skipped is not None and skipped.reason == "executables" and skipped.job_id is None
    assert (
        await store.get_job(scoped_id("org-a", f"{state.caller_schedule_id}:20261204T173005Z"))
        is None
    )
    after = metrics.value("receipt_schedule_firings_total", outcome="skipped_executables")
    assert after - before == 1
    # Another organization's list does not hold this one's firings.
    elsewhere = dataclasses.replace(on_list, executables={"org-b": ["pytest"]})
    assert await firing.fire(store, sid, T + timedelta(seconds=10), elsewhere) == "enqueued"


async def test_a_change_committed_before_the_lock_fires_as_changed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change of the job committing between a firing's first read and its lock (here: right
    after that read) fires the new job, not the old body under the new definition."""
    sid = await made(store, "allow", command=["echo", "old"])
    job = enqueue_body("org-a", payload_extra={"task": {"command": ["echo", "new"]}})
    new, _ = schedules.validate(
        {"interval": "5s", "agentId": "codex", "job": job},
        "org-a",
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    read = schedules.get

    async def read_then_changed(reads: Store, schedule_id: str) -> Any:
        state = await read(reads, schedule_id)
        assert await schedules.change(store, schedule_id, definition=new) is not None
        return state

    monkeypatch.setattr(firing, "get", read_then_changed)
    assert await firing.fire(store, sid, T) == "enqueued"
    state = await schedules.get(store, sid)
    assert state is not None and state.last_job_id is not None
    fired = await store.get_job(state.last_job_id)
    assert fired is not None and fired.payload["task"] == {"command": ["echo", "new"]}


async def test_the_reads_refuse_a_token_without_jobs_read_as_documented(db_url: str) -> None:
    """`GET /schedules` and `GET /schedules/{id}` answer 403 to a token without `jobs:read`,
    and say so in the document (every answer the API tests receive is checked against it),
    as every other schedule and webhook route does."""
    writer = "token-org-a-writer-0123456789"
    as_writer = {"Authorization": f"Bearer {writer}"}
    async with api_client(db_url, tokens=f"{writer} org-a jobs:write") as api:
        for path in ("/schedules", f"/schedules/{new_schedule_id()}"):
            answer = await api.get(path, headers=as_writer)
            assert answer.status_code == 403, (path, answer.text)
            assert "jobs:read" in answer.json()["error"]["message"]
    for path, operations in published()["paths"].items():
        if path.startswith(("/schedules", "/webhooks")):
            for method, operation in operations.items():
                assert "403" in operation["responses"], (method, path)


async def test_two_creates_racing_for_an_organizations_last_place_take_one(store: Store) -> None:
    org = f"org-race-{uuid.uuid4().hex[:6]}"
    job = enqueue_body(org, payload_extra={"task": {"command": ["true"]}})
    definition, _ = schedules.validate(
        {"interval": "5s", "agentId": "codex", "job": job},
        org,
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    one = schedules.Limits(max_per_organization=1)

    async def attempt(sid: str) -> bool:
        try:
            await schedules.create(store, org, sid, definition, one)
        except schedules.LimitReached:
            return False
        return True

    results = await asyncio.gather(*(attempt(new_schedule_id()) for _ in range(6)))
    assert sorted(results) == [False] * 5 + [True]


async def test_resuming_needs_the_rights_its_firings_need(db_url: str) -> None:
    full, enqueue_only = "token-org-a-full-0123456789", "token-org-a-nocmd-0123456789"
    tokens = f"{full} org-a\n{enqueue_only} org-a jobs:read jobs:write"
    as_full = {"Authorization": f"Bearer {full}"}
    as_limited = {"Authorization": f"Bearer {enqueue_only}"}
    async with api_client(db_url, tokens=tokens, schedule_min_interval_s=2) as limited:
        sid = (await limited.post("/schedules", json=body(), headers=as_full)).json()["scheduleId"]
        pause = await limited.patch(f"/schedules/{sid}", json={"paused": True}, headers=as_limited)
        assert pause.status_code == 200  # pausing runs nothing
        resume = await limited.patch(
            f"/schedules/{sid}", json={"paused": False}, headers=as_limited
        )
        assert resume.status_code == 403 and "commands:run" in resume.json()["error"]["message"]
        assert (await limited.get(f"/schedules/{sid}", headers=as_full)).json()[
            "status"
        ] == "paused"
        resumed = await limited.patch(f"/schedules/{sid}", json={"paused": False}, headers=as_full)
        assert resumed.status_code == 200 and resumed.json()["status"] == "active"
        # A schedule of steers, to any agent, may land in a job that runs commands.
        steer = enqueue_body("org-a", sessionKey="s-1", singletonMode="steer")
        steers = body(agentId="helper", job=steer)
        refused = await limited.post("/schedules", json=steers, headers=as_limited)
        assert refused.status_code == 403
        assert refused.json()["error"]["field"] == "job.singletonMode"
        assert (await limited.post("/schedules", json=steers, headers=as_full)).status_code == 201


async def test_the_schedule_sync_runs_in_one_replica_at_a_time(
    fresh: tuple[Store, str], temporal_env: Any
) -> None:
    """Two worker-control replicas synced at once: a slow one wrote a schedule's older state to
    Temporal after the other had written and marked the newer (resumed in the receipts, paused
    in Temporal, for good). A pass takes a single-flight lock; another replica's pass skips."""
    import psycopg

    from receipts.settings import Settings
    from receipts.sql import query
    from roles.delivery.schedules import SYNC_LOCK_KEY, ScheduleSync, temporal_id

    store, url = fresh
    settings = Settings(RECEIPT_TASK_QUEUE_PREFIX=f"s{uuid.uuid4().hex[:8]}-")  # type: ignore[call-arg]
    sync = ScheduleSync(temporal_env.client, store, settings, check_s=3600)
    schedule_id = await made(store)
    skipped = metrics.SCHEDULE_SYNCS.labels("skipped")
    before = skipped._value.get()
    with psycopg.connect(url) as other, other.transaction():
        other.execute(query("lock_key").encode(), {"key": SYNC_LOCK_KEY})  # another's pass
        held = await sync.run_once()
        assert (held.created, held.failed) == (0, 0)
        assert skipped._value.get() == before + 1
        assert [s.schedule_id for s, _ in await schedules.unsynced(store, 10)] == [schedule_id]
    done = await sync.run_once()
    assert done.created == 1 and await schedules.unsynced(store, 10) == []
    await temporal_env.client.get_schedule_handle(temporal_id(settings, schedule_id)).delete()


async def test_a_temporal_schedule_the_receipts_do_not_hold_is_deleted(
    fresh: tuple[Store, str], temporal_env: Any
) -> None:
    """A database restored to an earlier point holds no receipt of a schedule made after that
    point, while Temporal still holds its Schedule: each firing found no schedule and enqueued
    nothing, for ever (the restore audit). The sync's check deletes it; the schedules the
    receipts hold, and another deployment's (another prefix), are kept."""
    from temporalio.client import (
        Schedule,
        ScheduleActionStartWorkflow,
        ScheduleIntervalSpec,
        ScheduleSpec,
    )
    from temporalio.service import RPCError

    from receipts.settings import Settings
    from roles.delivery.schedules import ScheduleSync, temporal_id

    store, _ = fresh
    prefix = f"s{uuid.uuid4().hex[:8]}-"
    settings = Settings(RECEIPT_TASK_QUEUE_PREFIX=prefix)  # type: ignore[call-arg]
    sync = ScheduleSync(temporal_env.client, store, settings, check_s=0)
    kept = await made(store)
    assert (await sync.run_once()).created == 1
    lost_history = Schedule(
        action=ScheduleActionStartWorkflow("nothing", id="never", task_queue="nowhere"),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(hours=1))]),
    )
    orphan = temporal_id(settings, "made-after-the-restore-point~tag")
    others = f"other-{prefix}receipt-schedule-theirs"  # not under this deployment's prefix
    for sid in (orphan, others):
        await temporal_env.client.create_schedule(sid, lost_history)

    async def listed() -> set[str]:
        return {s.id async for s in await temporal_env.client.list_schedules()}

    try:
        for _ in range(100):  # Temporal's listing shows a new schedule a moment later
            if {orphan, temporal_id(settings, kept)} <= await listed():
                break
            await asyncio.sleep(0.1)
        done = await sync.run_once()
        assert (done.orphaned, done.restored) == (1, 0)
        after = await listed()
        assert temporal_id(settings, kept) in after and others in after
        with pytest.raises(RPCError):  # gone, not only unlisted
            await temporal_env.client.get_schedule_handle(orphan).describe()
    finally:
        for sid in (temporal_id(settings, kept), others):
            await temporal_env.client.get_schedule_handle(sid).delete()


async def test_schedule_changes_take_the_organizations_enqueue_tokens(db_url: str) -> None:
    """Creating, changing and deleting schedules took no token: one tenant's create-delete
    churn (1 000 pairs in 5 s) put a thousand rows ahead of every other organization's in the
    schedule sync. Each change takes one of the organization's enqueue tokens (429 past them)."""
    async with api_client(
        db_url, schedule_min_interval_s=2, org_enqueue_rate=1e-6, org_enqueue_burst=3
    ) as limited:
        made = await create(limited)
        schedule_id = made["scheduleId"]
        paused = await limited.patch(
            f"/schedules/{schedule_id}", json={"paused": True}, headers=AS_A
        )
        assert paused.status_code == 200
        assert (await limited.delete(f"/schedules/{schedule_id}", headers=AS_A)).status_code == 204
        refused = await limited.post("/schedules", json=body(), headers=AS_A)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1


async def test_a_change_or_a_delete_past_the_tokens_is_a_documented_429(db_url: str) -> None:
    """PATCH and DELETE /schedules/{id} each take one of the organization's enqueue tokens and
    answer 429 past them (README, Schedules: Limits), but the OpenAPI document listed no 429 for
    either, so a client generated from it was told they are never refused (api_client holds
    every answer to the document)."""
    async with api_client(
        db_url, schedule_min_interval_s=2, org_enqueue_rate=1e-6, org_enqueue_burst=1
    ) as limited:
        schedule_id = (await create(limited))["scheduleId"]
        changed = await limited.patch(
            f"/schedules/{schedule_id}", json={"paused": True}, headers=AS_A
        )
        deleted = await limited.delete(f"/schedules/{schedule_id}", headers=AS_A)
        assert (changed.status_code, deleted.status_code) == (429, 429)
    for method in ("patch", "delete"):
        assert "429" in published()["paths"]["/schedules/{scheduleId}"][method]["responses"]


async def test_a_steer_firing_is_held_to_the_jobs_command_caps(store: Store) -> None:
    """A schedule of steers (`singletonMode: steer`) added one command to the session's active
    job at each firing, past RECEIPT_MAX_COMMANDS_PER_JOB, which a direct steer is held to. A
    firing the job cannot hold is recorded skipped (`commands`)."""
    org = "org-a"
    job = enqueue_body(
        org,
        payload_extra={"task": {"command": ["true"]}},
        sessionKey=f"steered-{uuid.uuid4().hex[:8]}",
        singletonMode="steer",
    )
    definition, _ = schedules.validate(
        {"interval": "5s", "agentId": "codex", "job": job, "overlap": "allow"},
        org,
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    state, _ = await schedules.create(store, org, new_schedule_id(), definition, schedules.Limits())
    caps = firing.Caps(max_queued=100, max_active=100, max_commands=2)
    outcomes = [
        await firing.fire(store, state.schedule_id, T + timedelta(seconds=5 * n), caps)
        for n in range(4)
    ]
    assert outcomes == ["enqueued", "enqueued", "enqueued", "skipped_commands"]
    fired = await schedules.get(store, state.schedule_id)
    assert fired is not None and fired.last_job_id is not None
    active = await store.get_job(fired.last_job_id)
    assert active is not None and len(active.commands) == 2
    skipped = [r for r in await store.read_stream(schedule_stream(state.schedule_id))]
    assert skipped[-1].type == "schedule.skipped" and skipped[-1].data["reason"] == "commands"


async def test_schedules_temporal_refuses_do_not_hold_back_the_others(
    fresh: tuple[Store, str], temporal_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync read its batch (100) of the oldest unsynced schedules and passed over those
    waiting out a backoff: a batch of schedules Temporal kept refusing (one organization's cap
    is 100) filled every read, and no other schedule reached Temporal. The read reaches past
    them."""
    import psycopg

    from receipts.settings import Settings
    from roles.delivery import schedules as sync_module
    from roles.delivery.schedules import ScheduleSync, temporal_id

    monkeypatch.setattr(sync_module, "BATCH", 2)
    store, url = fresh
    settings = Settings(RECEIPT_TASK_QUEUE_PREFIX=f"s{uuid.uuid4().hex[:8]}-")  # type: ignore[call-arg]
    sync = ScheduleSync(temporal_env.client, store, settings, check_s=3600)
    broken = [await made(store, cron="*/5 * * * *") for _ in range(2)]
    good = await made(store)
    with psycopg.connect(url, autocommit=True) as conn:  # a zone no build of it can use
        conn.execute(
            "UPDATE schedules SET state = jsonb_set(state, '{timezone}', '\"Mars/Base\"') "
            "WHERE schedule_id = ANY(%s)",
            (broken,),
        )
    first = await sync.run_once()
    assert (first.created, first.failed) == (0, 2)  # the oldest two, refused: their backoff
    second = await sync.run_once()
    assert second.created == 1
    assert [s.schedule_id for s, _ in await schedules.unsynced(store, 10)] == broken
    await temporal_env.client.get_schedule_handle(temporal_id(settings, good)).delete()


async def test_a_firing_that_raises_is_logged_and_counted(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A try of the fire activity that raised (the database away) was visible only in Temporal,
    and a firing lost after its 30 minutes of tries left no count: each is logged
    `schedule.fire_failed` and counted `error`, and raises for Temporal to try again."""
    from temporalio.testing import ActivityEnvironment

    from activities.schedules import ScheduleActivities
    from receipts import assembly

    away = await assembly.open_store(db_url, min_size=1, max_size=1)
    await away.close()  # every read of it fails
    before = metrics.value("receipt_schedule_firings_total", outcome="error")
    with pytest.raises(Exception):  # noqa: B017 (whatever the closed pool raises)
        await ActivityEnvironment().run(
            ScheduleActivities(away).fire_schedule, "s-away", "2026-12-06T10:00:00+00:00"
        )
    assert metrics.value("receipt_schedule_firings_total", outcome="error") == before + 1
    [failed] = [r for r in caplog.records if getattr(r, "event", "") == "schedule.fire_failed"]
    assert (failed.scheduleId, getattr(failed, "try")) == ("s-away", 1)


async def test_a_page_of_schedules_reads_its_firings_jobs_in_one_query(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /schedules read each schedule's firings' jobs with a query of its own: 200 reads,
    one after another, for a page of 200. One read serves the page, each schedule its own."""
    ids = [await made(store) for _ in range(3)]
    for sid in ids:
        assert await firing.fire(store, sid, T) == "enqueued"
    page = [state for sid in ids if (state := await schedules.get(store, sid)) is not None]
    reads: list[list[str]] = []
    real = routes.objectives.jobs_by_ids

    async def counted(store: Store, job_ids: list[str]) -> Any:
        reads.append(list(job_ids))
        return await real(store, job_ids)

    monkeypatch.setattr(routes.objectives, "jobs_by_ids", counted)
    views = await routes.schedule_views(store, page)
    assert len(reads) == 1 and len(reads[0]) == 3
    for state, view in zip(page, views, strict=True):
        [run] = view["lastRuns"]
        assert run["jobId"] == state.last_job_id and run["jobStatus"] == "queued"


async def test_an_admin_names_a_schedule_by_the_id_one_organization_gave_it(
    client: httpx.AsyncClient,
) -> None:
    """As a job: an admin names a schedule by its runtime id, or by the id its organization
    gave it while one organization has that id (the README's `receipt schedules get
    nightly-report` with `make up`'s admin token); 409 naming the field when several do."""
    sid = (await create(client))["scheduleId"]
    shown = await client.get(f"/schedules/{sid}", headers=AS_ADMIN)
    assert shown.status_code == 200, shown.text
    assert shown.json()["scheduleId"] == scoped_id("org-a", sid)
    paused = await client.patch(f"/schedules/{sid}", json={"paused": True}, headers=AS_ADMIN)
    assert paused.status_code == 200 and paused.json()["status"] == "paused", paused.text
    both = new_schedule_id()
    await create(client, scheduleId=both)
    await create(client, AS_B, scheduleId=both, job=body("org-b")["job"])
    for method in ("GET", "PATCH", "DELETE"):
        ambiguous = await client.request(
            method,
            f"/schedules/{both}",
            headers=AS_ADMIN,
            json={"paused": True} if method == "PATCH" else None,
        )
        assert ambiguous.status_code == 409, (method, ambiguous.text)
        error = ambiguous.json()["error"]
        assert error["code"] == "ambiguous_schedule_id" and error["field"] == "scheduleId"
    assert (await client.delete(f"/schedules/{sid}", headers=AS_ADMIN)).status_code == 204
    assert (await client.get(f"/schedules/{sid}", headers=AS_A)).status_code == 404
    # A deleted schedule is no name: once org-b's is deleted, org-a's is the one meant.
    assert (await client.delete(f"/schedules/{both}", headers=AS_B)).status_code == 204
    left = await client.get(f"/schedules/{both}", headers=AS_ADMIN)
    assert left.status_code == 200 and left.json()["scheduleId"] == scoped_id("org-a", both)


async def test_a_steer_firing_never_aborts_the_job_it_steers(store: Store) -> None:
    """A schedule of steers under `cancel_previous` aborted the session's running job, then
    steered the job it had just aborted: recorded `enqueued`, nothing new ran; and a steer the
    job could not hold was recorded skipped with the abort committed ("a skipped firing aborts
    nothing"). Refused at create (above); one stored before fires as `allow`."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    job = enqueue_body(
        org,
        payload_extra={"task": {"command": ["true"]}},
        sessionKey=f"steered-{uuid.uuid4().hex[:8]}",
        singletonMode="steer",
    )
    definition, _ = schedules.validate(
        {"interval": "5s", "agentId": "codex", "job": job, "overlap": "allow"},
        org,
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    stored = dataclasses.replace(definition, overlap="cancel_previous")  # as made before
    state, _ = await schedules.create(store, org, new_schedule_id(), stored, schedules.Limits())
    sid = state.schedule_id
    caps = firing.Caps(max_queued=100, max_active=100, max_commands=1)
    assert await firing.fire(store, sid, T, caps) == "enqueued"
    first = (await schedules.get(store, sid)).last_job_id  # type: ignore[union-attr]
    assert first is not None
    assert (await ops.start_attempt(store, first, attempt=1, worker_id="w", lease_ms=60_000)).ok
    later = [await firing.fire(store, sid, T + timedelta(seconds=5 * n), caps) for n in (1, 2)]
    assert later == ["enqueued", "skipped_commands"]
    running = await store.get_job(first)
    assert running is not None and running.status == "running" and not running.abort_requested
    assert [c.type for c in running.commands] == ["steer"]


async def test_a_resume_is_admitted_on_the_definition_it_resumes(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume checks the rights its firings need on the schedule as read: a change committed
    between that read and the resume (here: right after it) made its jobs run commands, and a
    token without `commands:run` resumed it. The resume is refused as the change is and made
    again on the schedule as it is then: 403, still paused."""
    limited = "token-org-a-nocmd-0123456789"
    as_limited = {"Authorization": f"Bearer {limited}"}
    codex, _ = schedules.validate(
        {"interval": "5s", "agentId": "codex", "job": body()["job"]},
        "org-a",
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    read = schedules.get
    changed: list[str] = []

    async def read_then_changed(reads: Store, schedule_id: str) -> Any:
        state = await read(reads, schedule_id)
        if not changed:  # another token's change, committed once
            changed.append(schedule_id)
            assert await schedules.change(store, schedule_id, definition=codex) is not None
        return state

    tokens = f"{limited} org-a jobs:read jobs:write"
    async with api_client(db_url, store=store, tokens=tokens, schedule_min_interval_s=2) as api:
        made = await api.post(
            "/schedules", json=body(agentId="helper", paused=True), headers=as_limited
        )
        assert made.status_code == 201, made.text
        sid = made.json()["scheduleId"]
        monkeypatch.setattr(schedules, "get", read_then_changed)
        resume = await api.patch(f"/schedules/{sid}", json={"paused": False}, headers=as_limited)
        monkeypatch.undo()
    assert resume.status_code == 403 and "commands:run" in resume.text, resume.text
    state = await schedules.get(store, scoped_id("org-a", sid))
    assert state is not None and (state.status, state.agent_id) == ("paused", "codex")


async def test_a_firing_is_held_to_the_gateway_allow_list_as_it_is_now(store: Store) -> None:
    """`RECEIPT_GATEWAY_URL_ALLOWLIST` was checked at create only: a URL taken off the list
    went on being named by every firing's job. As the allow-list of executables, it is the
    list as it is at each firing: off it, the firing is recorded skipped (`gateway`)."""
    job = enqueue_body("org-a", payload_extra={"task": {"command": ["true"]}})
    job["payload"]["authContext"]["receiptConnectGatewayUrl"] = "https://gw.example/v1"
    definition, _ = schedules.validate(
        {"interval": "5s", "agentId": "codex", "job": job, "overlap": "allow"},
        "org-a",
        schedules.Limits(min_interval_s=1),
        admin=False,
    )
    state, _ = await schedules.create(
        store, "org-a", new_schedule_id(), definition, schedules.Limits()
    )
    sid = state.schedule_id
    listed = firing.Caps(10**9, 10**9, gateway_urls=("https://gw.example",))
    assert await firing.fire(store, sid, T, listed) == "enqueued"
    later = T + timedelta(seconds=5)
    unlisted = dataclasses.replace(listed, gateway_urls=("https://other.example",))
    assert await firing.fire(store, sid, later, unlisted) == "skipped_gateway"
    fired = await schedules.get(store, sid)
    assert fired is not None and (fired.fired, fired.skipped) == (1, 1)
    skipped = fired.firing_at(later)
    assert skipped is not None and skipped.reason == "gateway" and skipped.job_id is None
    job_id = scoped_id("org-a", f"{state.caller_schedule_id}:20261204T173005Z")
    assert await store.get_job(job_id) is None


async def test_an_admin_schedules_the_runtimes_own_kind_with_a_null_auth_context(
    client: httpx.AsyncClient,
) -> None:
    """The watchdog's kind needs no `authContext`, and its enqueue takes `null` for it; the
    schedule's create read the organization out of it and answered 500."""
    job = {"payload": {"kind": "factory.objective.watchdog", "authContext": None}}
    sent = body(agentId="factory-control", job=job, interval="60s")
    made = await client.post("/schedules", json=sent, headers=AS_ADMIN)
    assert made.status_code == 201, made.text
    assert made.json()["organizationId"] is None
    gone = await client.delete(f"/schedules/{sent['scheduleId']}", headers=AS_ADMIN)
    assert gone.status_code == 204


async def test_a_deleted_schedule_of_the_runtime_hides_no_organizations_one(
    client: httpx.AsyncClient,
) -> None:
    """An admin names a schedule by the id its organization gave it; a deleted schedule of the
    runtime's own (unscoped) under that id answered 404 for it (a deleted one is no name)."""
    sid = new_schedule_id()
    job = {"payload": {"kind": "factory.objective.watchdog"}}
    runtime = body(scheduleId=sid, agentId="factory-control", job=job, interval="60s")
    assert (await client.post("/schedules", json=runtime, headers=AS_ADMIN)).status_code == 201
    assert (await client.delete(f"/schedules/{sid}", headers=AS_ADMIN)).status_code == 204
    assert (
        await client.post("/schedules", json=body(scheduleId=sid), headers=AS_A)
    ).status_code == 201
    shown = await client.get(f"/schedules/{sid}", headers=AS_ADMIN)
    assert shown.status_code == 200, shown.text
    assert shown.json()["scheduleId"] == scoped_id("org-a", sid)
