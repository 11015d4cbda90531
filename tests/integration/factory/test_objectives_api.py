"""The objective routes: create, list, show, events, cancel; another organization sees 404."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from receipts.jobs import Job
from receipts.objectives import model as objective_model
from receipts.objectives import store as objectives
from receipts.objectives.model import ObjectiveState, objective_stream
from receipts.store import Draft, Store
from receipts.tenancy import scoped_id
from tests.integration.api_support import AS_A, AS_ADMIN, AS_B, api_client, conforms, events
from tests.integration.factory.test_outbox_and_watchdog import (
    TASK,
    create_objective,
    running_task_job,
)


async def test_another_organization_cannot_read_list_stream_or_cancel(
    fresh_store: Store, fresh_db: str
) -> None:
    await create_objective(fresh_store, "ten-1", TASK)
    async with api_client(fresh_db, store=fresh_store) as api:
        for method, path, headers in [
            ("GET", "/objectives/ten-1", {}),
            ("GET", "/objectives/ten-1/events", {}),
            ("GET", "/objectives/ten-1/events", {"Accept": "text/event-stream"}),
            ("POST", "/objectives/ten-1/cancel", {}),
        ]:
            response = await api.request(method, path, headers={**AS_B, **headers})
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"]["code"] == "not_found"
        listed = await api.get("/objectives", headers=AS_B)
        assert listed.status_code == 200 and listed.json()["objectives"] == []

        mine = await api.get("/objectives/ten-1", headers=AS_A)
        assert mine.status_code == 200
        view = mine.json()
        assert view["phase"] == 1 and view["tasks"][0]["taskId"] == "t"
        assert view["tasks"][0]["status"] == "pending" and view["tasks"][0]["jobId"] is None
        listed = await api.get("/objectives", headers=AS_A)
        assert [o["objectiveId"] for o in listed.json()["objectives"]] == ["ten-1"]
        admin = await api.get("/objectives?organizationId=org-a", headers=AS_ADMIN)
        assert [o["objectiveId"] for o in admin.json()["objectives"]] == ["ten-1"]
        events = await api.get("/objectives/ten-1/events", headers=AS_A)
        assert [r["type"] for r in events.json()["receipts"]] == ["objective.created"]

        canceled = await api.post("/objectives/ten-1/cancel", headers=AS_A, json={"reason": "no"})
        assert canceled.status_code == 202
    state = await objectives.get(fresh_store, "ten-1")
    assert state is not None and state.cancel_requested and state.control_job_id


async def test_an_invalid_graph_is_refused_with_its_reason_and_nothing_is_written(
    fresh_store: Store, fresh_db: str
) -> None:
    body = {
        "objectiveId": "bad-api",
        "title": "t",
        "goal": "g",
        "tasks": [
            {"taskId": "a", "dependsOn": ["b"], "input": {"command": ["true"]}},
            {"taskId": "b", "dependsOn": ["a"], "input": {"command": ["true"]}},
        ],
    }
    async with api_client(fresh_db, store=fresh_store) as api:
        response = await api.post("/objectives", headers=AS_A, json=body)
        assert response.status_code == 422
        assert response.json()["error"]["message"] == "dependency cycle: a -> b -> a"
        other = await api.post(
            "/objectives",
            headers=AS_A,
            json={**body, "authContext": {"userId": "u", "organizationId": "org-b"}},
        )
        assert other.status_code == 403
    assert await fresh_store.read_stream(objective_stream("bad-api")) == []
    assert await fresh_store.get_job("objective:bad-api:run") is None


async def test_post_enqueues_the_run_job_and_answers_with_the_objective_urls(
    fresh_store: Store, fresh_db: str
) -> None:
    body = {"objectiveId": "ok-api", "title": "t", "goal": "g", "tasks": TASK}
    async with api_client(fresh_db, store=fresh_store) as api:
        response = await api.post("/objectives", headers=AS_A, json=body)
        again = await api.post("/objectives", headers=AS_A, json=body)
    assert response.status_code == 202
    accepted = response.json()
    assert accepted["objectiveUrl"] == "/objectives/ok-api"
    assert accepted["eventsUrl"] == "/objectives/ok-api/events"
    assert accepted["job"]["jobId"] == "objective:ok-api:run"
    assert accepted["job"]["kind"] == "factory.run"
    assert again.json()["outcome"] == "existing"


async def test_two_organizations_name_the_same_objective_id_and_get_two_objectives(
    fresh_store: Store, fresh_db: str
) -> None:
    # Objective ids are scoped by organization as job ids are: neither collides with nor
    # probes the other's, and each organization sees its own under the id it chose.
    async with api_client(fresh_db, store=fresh_store) as api:
        for headers, title in ((AS_A, "a's"), (AS_B, "b's")):
            body = {"objectiveId": "same", "title": title, "goal": "g", "tasks": TASK}
            created = await api.post("/objectives", headers=headers, json=body)
            assert created.status_code == 202, created.text
            assert created.json()["outcome"] == "created"
            assert created.json()["objectiveId"] == "same"
            assert created.json()["job"]["jobId"] == "objective:same:run"
        a_job = await api.get("/jobs/objective:same:run", headers=AS_A)
        b_job = await api.get("/jobs/objective:same:run", headers=AS_B)
        assert a_job.json()["payload"]["objective"]["title"] == "a's"
        assert b_job.json()["payload"]["objective"]["title"] == "b's"
        assert a_job.json()["payload"]["objectiveId"] == "same"  # the caller's id, no tag
        admin = await api.get("/jobs?kind=factory.run", headers=AS_ADMIN)
        runtime = {j["jobId"] for j in admin.json()["jobs"]}
        assert runtime == {
            scoped_id("org-a", "objective:same:run"),
            scoped_id("org-b", "objective:same:run"),
        }
    a_run = await fresh_store.get_job(scoped_id("org-a", "objective:same:run"))
    assert a_run is not None and a_run.payload["objectiveId"] == scoped_id("org-a", "same")


async def test_the_objective_routes_answer_as_their_schemas_say(
    fresh_store: Store, fresh_db: str
) -> None:
    body = {"objectiveId": "doc-1", "title": "t", "goal": "g", "tasks": TASK}
    async with api_client(fresh_db, store=fresh_store) as api:
        for headers in (AS_A, AS_ADMIN):  # an organization's view and the runtime's
            if headers is AS_ADMIN:
                body = {**body, "authContext": {"userId": "u", "organizationId": "org-a"}}
                body["objectiveId"] = "doc-2"
            created = await api.post("/objectives", headers=headers, json=body)
            assert created.status_code == 202, created.text
            conforms(created, "/objectives", "post")
        await create_objective(fresh_store, "doc-3", TASK)
        for headers in (AS_A, AS_ADMIN):
            listed = await api.get("/objectives", headers=headers)
            assert listed.status_code == 200 and listed.json()["objectives"], listed.text
            conforms(listed, "/objectives", "get")
        for headers in (AS_A, AS_ADMIN):  # the helper wrote it under its id: no tag
            objective_id = "doc-3"
            shown = await api.get(f"/objectives/{objective_id}", headers=headers)
            assert shown.status_code == 200, shown.text
            conforms(shown, "/objectives/{objectiveId}", "get")
            events = await api.get(f"/objectives/{objective_id}/events", headers=headers)
            assert events.status_code == 200 and events.json()["receipts"], events.text
            conforms(events, "/objectives/{objectiveId}/events", "get")
        canceled = await api.post("/objectives/doc-3/cancel", headers=AS_A, json={})
        assert canceled.status_code == 202, canceled.text
        conforms(canceled, "/objectives/{objectiveId}/cancel", "post")


async def test_a_cancel_is_written_once_bounded_and_refused_in_the_callers_own_words(
    fresh_store: Store, fresh_db: str
) -> None:
    """A repeated cancel is answered 202 as the objective stands, nothing written again (150
    cancels wrote 450 receipts and 149 commands to the control job, past its cap of 100); a
    reason past RECEIPT_MAX_COMMAND_BYTES is 422; the 409 on a settled objective names it by
    the caller's id, not the runtime's `<id>~<tag>`."""
    from receipts.store import Draft

    runtime_id = scoped_id("org-a", "c409")
    await create_objective(fresh_store, runtime_id, TASK)
    async with api_client(fresh_db, store=fresh_store, max_command_bytes=64) as api:
        long = await api.post("/objectives/c409/cancel", headers=AS_A, json={"reason": "x" * 65})
        assert long.status_code == 422 and long.json()["error"]["field"] == "reason"
        first = await api.post("/objectives/c409/cancel", headers=AS_A, json={"reason": "no"})
        assert first.status_code == 202, first.text
        written = await fresh_store.read_stream(objective_stream(runtime_id))
        state = await objectives.get(fresh_store, runtime_id)
        assert state is not None and state.control_job_id is not None
        control = await fresh_store.get_job(state.control_job_id)
        assert control is not None
        for _ in range(5):
            again = await api.post("/objectives/c409/cancel", headers=AS_A, json={"reason": "no"})
            assert again.status_code == 202
        assert await fresh_store.read_stream(objective_stream(runtime_id)) == written
        after = await fresh_store.get_job(state.control_job_id)
        assert after is not None and after.commands == control.commands
        async with fresh_store.transaction() as tx:
            await objectives.update(
                tx, runtime_id, lambda _: [Draft("objective.settled", {"status": "canceled"})]
            )
        settled = await api.post("/objectives/c409/cancel", headers=AS_A, json={})
    assert settled.status_code == 409
    assert settled.json()["error"]["message"] == "objective 'c409' is canceled"


async def test_objective_and_agent_job_bodies_are_read_under_the_configured_json_limits(
    fresh_store: Store, fresh_db: str
) -> None:
    """RECEIPT_MAX_JSON_DEPTH (and the other JSON limits) held for jobs, schedules and retries;
    the objective and agent-job routes read their bodies under the defaults."""
    nested = {"title": "t", "goal": "g", "tasks": [{"taskId": "t", "input": {"prompt": "p"}}]}
    async with api_client(fresh_db, store=fresh_store, max_json_depth=3) as api:
        objective = await api.post("/objectives", headers=AS_A, json=nested)
        agent_job = await api.post("/agent-jobs", headers=AS_A, json={"a": {"b": {"c": {}}}})
    for refused in (objective, agent_job):
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["message"] == "the JSON body nests deeper than 3 levels"


async def test_the_urls_post_answers_work_before_the_run_job_created_the_objective(
    fresh_store: Store, fresh_db: str
) -> None:
    """Right after the 202, `objectiveUrl` and `cancelUrl` answered a bare 404 until the run
    job had run: the caller could not cancel, and the objective then ran anyway. The read says
    why it is not there; the cancel aborts the run job (canceled at once while it waits)."""
    body = {"objectiveId": "early", "title": "t", "goal": "g", "tasks": TASK}
    async with api_client(fresh_db, store=fresh_store) as api:
        accepted = (await api.post("/objectives", headers=AS_A, json=body)).json()
        early = await api.get(accepted["objectiveUrl"], headers=AS_A)
        assert early.status_code == 404
        message = early.json()["error"]["message"]
        assert "its run job 'objective:early:run' is queued" in message, message
        canceled = await api.post(accepted["cancelUrl"], headers=AS_A, json={"reason": "no"})
        assert canceled.status_code == 202, canceled.text
        assert canceled.json() == {
            "objectiveId": "early",
            "status": "canceled",
            "cancelRequested": True,
        }
        later = await api.get(accepted["objectiveUrl"], headers=AS_A)
    assert "ended canceled without creating it" in later.json()["error"]["message"]
    run = await fresh_store.get_job(scoped_id("org-a", "objective:early:run"))
    assert run is not None and run.status == "canceled"
    assert await objectives.get(fresh_store, scoped_id("org-a", "early")) is None


async def test_a_cancel_needs_jobs_write_only_before_and_after_the_objective_exists(
    fresh_store: Store, fresh_db: str
) -> None:
    """As the README's scopes table says (and as a job's commands): a created objective's
    cancel asked for `jobs:read` too (403), its run job's did not."""
    from tests.integration.api_support import TOKENS

    await create_objective(fresh_store, scoped_id("org-a", "w-only"), TASK)
    tokens = f"{TOKENS}\nwrite-only-tok-0123456789ab org-a jobs:write"
    as_writer = {"Authorization": "Bearer write-only-tok-0123456789ab"}
    async with api_client(fresh_db, store=fresh_store, tokens=tokens) as api:
        canceled = await api.post("/objectives/w-only/cancel", headers=as_writer, json={})
        assert canceled.status_code == 202, canceled.text
        assert (await api.get("/objectives/w-only", headers=as_writer)).status_code == 403


async def test_a_resumed_event_stream_folds_only_what_follows_the_objective_as_it_stands(
    fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stream's end is decided on the folded objective: it was folded from seq 1 at every
    # open, so a resume at the head of a long objective (a task's output is mirrored once a
    # second: an hour of 200 tasks is 720 000 receipts) folded its whole history again, on the
    # api's event loop. It starts from the objective as its projection stands.
    await create_objective(fresh_store, "long-1", TASK)
    drafts = [objectives.control_request("reconcile") for _ in range(100)]
    for _ in range(30):
        async with fresh_store.transaction() as tx:
            await objectives.update(tx, "long-1", lambda _: drafts)
    folded: list[int] = []
    real_apply = objective_model.apply

    def counted(state: Any, receipt: Any) -> Any:
        folded.append(receipt.seq)
        return real_apply(state, receipt)

    monkeypatch.setattr(objective_model, "apply", counted)
    stream = {**AS_A, "Accept": "text/event-stream"}
    async with api_client(fresh_db, store=fresh_store) as api:
        ended = asyncio.create_task(
            _read_events(api, "/objectives/long-1/events", {**stream, "Last-Event-ID": "3001"})
        )
        await asyncio.sleep(0.5)  # the stream is open, past its backlog, waiting
        async with fresh_store.transaction() as tx:
            settled = Draft("objective.settled", {"status": "canceled", "error": "no"})
            await objectives.update(tx, "long-1", lambda _: [settled])
        received, end = await asyncio.wait_for(ended, 20)
        assert [r["seq"] for r in received] == [3002]
        assert end == {"objectiveId": "long-1", "status": "canceled"}
        assert len(folded) <= 2, f"folded {len(folded)} receipts"
        # A resume behind the head sends what follows it and folds only what the projection
        # had not (nothing: it stands at the head).
        folded.clear()
        received, end = await _read_events(
            api, "/objectives/long-1/events", {**stream, "Last-Event-ID": "2999"}
        )
        assert [r["seq"] for r in received] == [3000, 3001, 3002]
        assert end == {"objectiveId": "long-1", "status": "canceled"} and folded == []


async def _read_events(
    api: httpx.AsyncClient, path: str, headers: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    received: list[dict[str, Any]] = []
    async with api.stream("GET", path, headers=headers) as response:
        async for event in events(response):
            if event.name == "end":
                return received, json.loads(event.data)
            received.append(json.loads(event.data))
    return received, None


async def test_a_list_counts_tasks_without_reading_any_objectives_state(
    fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A page showed two numbers of each objective from its whole state: up to 500 states of
    # up to 1 000 tasks read and validated (100 objectives of 200 tasks: 1.3 to 5 s a page).
    three = [{"taskId": k, "input": {"command": ["true"]}} for k in "abc"]
    await create_objective(fresh_store, "sum-1", three)
    await create_objective(fresh_store, "sum-2", TASK)
    done = [
        Draft("objective.task.dispatched", {"taskId": "a", "try": 1, "jobId": "j-a"}),
        Draft(
            "objective.task.settled",
            {"taskId": "a", "try": 1, "jobId": "j-a", "status": "completed"},
        ),
        Draft("objective.settled", {"status": "failed", "error": "task 'b' failed"}),
    ]
    async with fresh_store.transaction() as tx:
        await objectives.update(tx, "sum-1", lambda _: done)
    validated = validations(monkeypatch, ObjectiveState)
    async with api_client(fresh_db, store=fresh_store) as api:
        listed = await api.get("/objectives", headers=AS_A)
        paged = await api.get("/objectives?limit=1", headers=AS_A)
        rest = await api.get(
            f"/objectives?limit=1&cursor={paged.json()['nextCursor']}", headers=AS_A
        )
    assert listed.status_code == 200, listed.text
    shown = {o["objectiveId"]: o for o in listed.json()["objectives"]}
    assert (shown["sum-1"]["tasks"], shown["sum-1"]["completedTasks"]) == (3, 1)
    assert (shown["sum-1"]["status"], shown["sum-1"]["error"]) == ("failed", "task 'b' failed")
    assert (shown["sum-2"]["tasks"], shown["sum-2"]["completedTasks"]) == (1, 0)
    assert shown["sum-2"]["error"] is None and shown["sum-2"]["phase"] == 1
    assert [o["objectiveId"] for o in paged.json()["objectives"]] == ["sum-2"]
    assert [o["objectiveId"] for o in rest.json()["objectives"]] == ["sum-1"]
    assert rest.json()["nextCursor"] is None
    assert validated == []


async def test_an_objective_or_task_id_ending_in_a_newline_is_refused(
    fresh_store: Store, fresh_db: str
) -> None:
    # `$` matches before a final newline: "nl\n" passed as an objective id (202, its run job
    # `objective:nl\n:run` then 404 at the jobUrl the answer gave) and "a\n" as a task id, whose
    # try's job no /jobs route reaches (job ids are held to JOB_ID_PATTERN, fully).
    task = {"taskId": "a", "input": {"command": ["true"]}}
    async with api_client(fresh_db, store=fresh_store) as api:
        for objective_id, task_id, field in (
            ("nl\n", "a", "objectiveId"),
            ("nl-1", "a\n", "tasks[0].taskId"),
        ):
            body = {"objectiveId": objective_id, "title": "t", "goal": "g"}
            body["tasks"] = [{**task, "taskId": task_id}]
            response = await api.post("/objectives", headers=AS_A, json=body)
            assert response.status_code == 422, response.text
            assert response.json()["error"]["field"] == field
        dispatch = {
            "payload": {
                "kind": "factory.dispatch",
                "objectiveId": "nl\n",
                "authContext": {"userId": "u", "organizationId": "org-a"},
                "tasks": [task],
            }
        }
        posted = await api.post("/agents/factory/jobs", headers=AS_A, json=dispatch)
        assert posted.status_code == 422, posted.text
        canceled = await api.post("/objectives/nl%0A/cancel", headers=AS_A)
        assert canceled.status_code == 422, canceled.text
    for objective_id in ("nl\n", "nl-1"):
        assert await fresh_store.read_stream(objective_stream(objective_id)) == []
        runtime = scoped_id("org-a", f"objective:{objective_id}:run")
        assert await fresh_store.get_job(runtime) is None


async def test_an_objectives_view_reads_its_jobs_statuses_not_their_states(
    fresh_store: Store, fresh_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The view shows each task's job status: it read every try's whole job (its input, its
    # output's tail, its result), up to a thousand of them a request.
    two = [{"taskId": k, "input": {"command": ["true"]}} for k in "ab"]
    await create_objective(fresh_store, "view-1", two)
    job, _ = await running_task_job(fresh_store, "view-1")
    dispatched = {"taskId": "a", "try": 1, "jobId": job.job_id}
    async with fresh_store.transaction() as tx:
        await objectives.update(
            tx, "view-1", lambda _: [Draft("objective.task.dispatched", dispatched)]
        )
    read = validations(monkeypatch, Job)
    async with api_client(fresh_db, store=fresh_store) as api:
        shown = await api.get("/objectives/view-1", headers=AS_A)
    assert shown.status_code == 200, shown.text
    tasks = {t["taskId"]: t for t in shown.json()["tasks"]}
    assert (tasks["a"]["jobId"], tasks["a"]["jobStatus"], tasks["a"]["attempt"]) == (
        job.job_id,
        "running",
        1,
    )
    assert (tasks["b"]["jobId"], tasks["b"]["jobStatus"], tasks["b"]["attempt"]) == (None, None, 0)
    assert read == []


def validations(monkeypatch: pytest.MonkeyPatch, model: Any) -> list[Any]:
    """What `model.model_validate` is called with from now on (the calls still validate)."""
    seen: list[Any] = []
    real = model.model_validate

    def counted(value: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(value)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(model, "model_validate", counted)
    return seen


async def test_an_admin_names_an_objective_by_the_id_one_organization_gave_it(
    fresh_store: Store, fresh_db: str
) -> None:
    """As a job or a session: an admin names an objective by its runtime id, or by the id its
    organization gave it while one organization has that id (the README's `receipt objectives
    get demo-diamond` with `make up`'s admin token); 409 naming the field when several do."""
    await create_objective(fresh_store, scoped_id("org-a", "mine"), TASK)
    await create_objective(fresh_store, scoped_id("org-a", "both"), TASK)
    await create_objective(fresh_store, scoped_id("org-b", "both"), TASK, org="org-b")
    async with api_client(fresh_db, store=fresh_store) as api:
        shown = await api.get("/objectives/mine", headers=AS_ADMIN)
        assert shown.status_code == 200, shown.text
        assert shown.json()["objectiveId"] == scoped_id("org-a", "mine")
        streamed = await api.get("/objectives/mine/events", headers=AS_ADMIN)
        assert streamed.status_code == 200 and streamed.json()["receipts"], streamed.text
        for method, path in [
            ("GET", "/objectives/both"),
            ("GET", "/objectives/both/events"),
            ("POST", "/objectives/both/cancel"),
        ]:
            ambiguous = await api.request(method, path, headers=AS_ADMIN)
            assert ambiguous.status_code == 409, (method, path, ambiguous.text)
            error = ambiguous.json()["error"]
            assert error["code"] == "ambiguous_objective_id" and error["field"] == "objectiveId"
        assert (await api.get("/objectives/none-such", headers=AS_ADMIN)).status_code == 404
        canceled = await api.post("/objectives/mine/cancel", headers=AS_ADMIN, json={})
        assert canceled.status_code == 202, canceled.text
    state = await objectives.get(fresh_store, scoped_id("org-a", "mine"))
    assert state is not None and state.cancel_requested
