"""The operator console in-process: sign-in cookie, CSRF, tenancy, pages, actions, offline docs."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from receipts import commands, operations
from receipts.enqueue import EnqueueRequest, enqueue
from receipts.kinds import TURN_KIND
from receipts.settings import Settings
from receipts.store import Store
from roles.api.limits import SESSIONS_BURST
from tests.integration.api_support import (
    AS_A,
    TOKEN_A,
    TOKEN_ADMIN,
    TOKEN_B,
    TOKENS,
    api_client,
    enqueue_body,
    rid,
)
from tests.integration.helpers import new_id, types


async def sign_in(client: httpx.AsyncClient, token: str) -> str:
    """Sign in; return the CSRF token of the session's forms."""
    answer = await client.post(
        "/console/login",
        content=f"token={token}",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 303, answer.text
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    page = await client.get("/console/jobs")
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found
    return found.group(1)


def form(fields: dict[str, str]) -> dict[str, object]:
    """The keyword arguments of a url-encoded form post."""
    return {
        "content": str(httpx.QueryParams(fields)),
        "headers": {"Content-Type": "application/x-www-form-urlencoded"},
    }


async def test_pages_need_a_signed_in_token_and_refuse_unknown_ones(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, store=store) as client:
        redirected = await client.get("/console/jobs")
        assert redirected.status_code == 303
        assert redirected.headers["location"] == "/console/login"
        login = await client.get("/console/login")
        assert login.status_code == 200 and 'name="token"' in login.text
        refused = await client.post("/console/login", **form({"token": "wrong"}))  # type: ignore[arg-type]
        assert refused.status_code == 401 and "unknown token" in refused.text
        assert "set-cookie" not in refused.headers
        bearer_only = await client.get("/console/jobs", headers=AS_A)
        assert bearer_only.status_code == 303  # the console signs in by cookie only


async def test_an_organization_sees_its_jobs_and_admin_sees_all(db_url: str, store: Store) -> None:
    agent = f"agent-{new_id()}"
    a_job, b_job = new_id(), new_id()
    async with api_client(db_url, store=store) as client:
        await client.post(f"/agents/{agent}/jobs", json=enqueue_body(jobId=a_job), headers=AS_A)
        await client.post(
            f"/agents/{agent}/jobs",
            json=enqueue_body(org="org-b", jobId=b_job),
            headers={"Authorization": f"Bearer {TOKEN_B}"},
        )
        await sign_in(client, TOKEN_A)
        page = await client.get("/console/jobs", params={"agentId": agent})
        assert a_job in page.text and b_job not in page.text
        assert re.search(r"queued <b>1</b>", page.text)
        foreign = await client.get(f"/console/jobs/{b_job}")
        assert foreign.status_code == 404 and b_job in foreign.text
        events = await client.get(f"/console/jobs/{b_job}/events")
        assert events.status_code == 404
        client.cookies.clear()
        await sign_in(client, TOKEN_ADMIN)
        page = await client.get("/console/jobs", params={"agentId": agent})
        assert a_job in page.text and b_job in page.text
        filtered = await client.get(
            "/console/jobs", params={"agentId": agent, "organizationId": "org-b"}
        )
        assert b_job in filtered.text and a_job not in filtered.text
    assert page.headers["content-security-policy"].startswith("default-src 'self'")


async def test_actions_need_the_csrf_token_and_act_on_the_job(db_url: str, store: Store) -> None:
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        csrf = await sign_in(client, TOKEN_A)
        forged = await client.post(
            f"/console/jobs/{job_id}/command",
            **form({"type": "abort", "reason": "forged"}),  # type: ignore[arg-type]
        )
        assert forged.status_code == 403 and "CSRF" in forged.text
        wrong_type = await client.post(
            f"/console/jobs/{job_id}/command",
            content='{"type": "abort"}',
            headers={"Content-Type": "application/json"},
        )
        assert wrong_type.status_code == 415
        assert "queue.command" not in await types(store, rid(job_id))
        steer = await client.post(
            f"/console/jobs/{job_id}/command",
            **form({"csrf": csrf, "type": "steer", "payload": "look at the logs"}),  # type: ignore[arg-type]
        )
        assert steer.status_code == 303 and "steer+appended" in steer.headers["location"]
        job = await store.get_job(rid(job_id))
        assert job is not None
        [steered] = await commands.with_payloads(store, job.job_id, job.commands[-1:])
        assert steered.payload == {"message": "look at the logs"}
        # The payload is held to the API's limits on a JSON body, whatever its depth.
        for depth in (900, 5000):
            deep = await client.post(
                f"/console/jobs/{job_id}/command",
                **form({"csrf": csrf, "type": "steer", "payload": "[" * depth + "]" * depth}),  # type: ignore[arg-type]
            )
            assert deep.status_code == 422 and "deep" in deep.text
        assert len((await store.get_job(rid(job_id))).commands) == 1  # type: ignore[union-attr]
        abort = await client.post(
            f"/console/jobs/{job_id}/command",
            **form({"csrf": csrf, "type": "abort", "reason": "operator"}),  # type: ignore[arg-type]
        )
        assert abort.status_code == 303
        job = await store.get_job(rid(job_id))
        assert job is not None and job.status == "canceled"
        retried = await client.post(
            f"/console/jobs/{job_id}/retry",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert retried.status_code == 303
        new_page = await client.get(retried.headers["location"])
        assert f"retry of {job_id}" in new_page.text and "Retry of" in new_page.text


async def test_a_token_makes_a_bounded_number_of_sessions(db_url: str) -> None:
    """Each sign-in is a stored session until it idles out (30 min), and only refused sign-ins
    were limited: one token made 519 sessions a second in process, as many rows. A token now
    makes SESSIONS_BURST at once, then one every 6 s (429); another token signs in meanwhile."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    async with api_client(db_url) as client:
        answers = [
            await client.post("/console/login", content=f"token={TOKEN_A}", headers=form)
            for _ in range(SESSIONS_BURST + 2)
        ]
        assert [a.status_code for a in answers] == [303] * SESSIONS_BURST + [429] * 2
        assert "signed in" in answers[-1].text
        other = await client.post("/console/login", content=f"token={TOKEN_B}", headers=form)
        assert other.status_code == 303


async def test_console_retries_take_the_organizations_rate_and_caps(
    db_url: str, store: Store
) -> None:
    """As the API's retries: an organization's console retries take its enqueue tokens and count
    against its caps; a refusal is said on the page, nothing is created."""
    org = f"org-{new_id()}"
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}
    async with api_client(
        db_url, store=store, tokens=tokens, org_enqueue_rate=1e-6, org_enqueue_burst=3
    ) as client:
        ids = []
        for _ in range(2):
            posted = await client.post("/agents/codex/jobs", json=enqueue_body(org), headers=as_org)
            ids.append(posted.json()["job"]["jobId"])
            assert (await operations.fail_undeliverable(store, rid(ids[-1], org), error="x")).ok
        csrf = await sign_in(client, f"token-{org}")
        first = await client.post(
            f"/console/jobs/{ids[0]}/retry",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert first.status_code == 303 and "retry+of" in first.headers["location"]
        second = await client.post(
            f"/console/jobs/{ids[1]}/retry",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert "RECEIPT_ORG_ENQUEUE_RATE" in second.headers["location"]
        bulk = await client.post("/console/failed/retry", **form({"csrf": csrf}))  # type: ignore[arg-type]
        assert "RECEIPT_ORG_ENQUEUE_RATE" in bulk.headers["location"]
    job = await store.get_job(rid(ids[1], org))
    assert job is not None and job.retried_as is None


async def test_malformed_forms_and_links_are_refused_not_failed(db_url: str, store: Store) -> None:
    """A CSRF token or notice tag that is not ASCII, and a NUL in a field, were 500s (hmac's
    str comparison raised; PostgreSQL refused the NUL): a 403, a page without the notice, a
    422 as the API answers."""
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        csrf = await sign_in(client, TOKEN_A)
        forged = await client.post("/console/logout", **form({"csrf": "é"}))  # type: ignore[arg-type]
        assert forged.status_code == 403 and "CSRF" in forged.text
        linked = await client.get("/console/failed", params={"notice": "hi", "ns": "é"})
        assert linked.status_code == 200 and 'class="notice"' not in linked.text
        nul = await client.post(
            f"/console/jobs/{job_id}/command",
            **form({"csrf": csrf, "type": "abort", "reason": "x\x00y"}),  # type: ignore[arg-type]
        )
        assert nul.status_code == 422 and "NUL" in nul.text
        assert "queue.command" not in await types(store, rid(job_id))


async def test_a_console_payload_of_nan_or_infinity_is_text_not_a_failure(
    db_url: str, store: Store
) -> None:
    """A steer's payload `NaN`, `Infinity` or `1e400`: Python's json read each as a float that
    `jsonb` refuses, and the append raised (StorageError: a 500 and a traceback per post). Read
    as the API reads a body, none is JSON: the command carries the text, as any other text."""
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        steerable = {"task": {"command": ["true"], "steerable": True}}
        await client.post(
            "/agents/codex/jobs",
            json=enqueue_body(jobId=job_id, payload_extra=steerable),
            headers=AS_A,
        )
        csrf = await sign_in(client, TOKEN_A)
        texts = ["NaN", "-Infinity", "1e400", '{"a": [1e400]}']
        for text in texts:
            steer = await client.post(
                f"/console/jobs/{job_id}/command",
                **form({"csrf": csrf, "type": "steer", "payload": text}),  # type: ignore[arg-type]
            )
            assert steer.status_code == 303 and "steer+appended" in steer.headers["location"]
        job = await store.get_job(rid(job_id))
        assert job is not None
        steered = await commands.with_payloads(store, job.job_id, job.commands)
        assert [c.payload for c in steered] == [{"message": text} for text in texts]


async def test_a_console_form_over_64_kib_is_refused_before_it_is_read_whole(
    db_url: str, store: Store
) -> None:
    """A console form is read bounded: one over `MAX_FORM_BYTES` is 413, signed in or not,
    and acts on nothing."""
    from roles.api.console.session import MAX_FORM_BYTES

    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        padding = "x" * (MAX_FORM_BYTES + 1)
        login = await client.post("/console/login", **form({"token": TOKEN_A, "pad": padding}))  # type: ignore[arg-type]
        assert login.status_code == 413 and "set-cookie" not in login.headers
        csrf = await sign_in(client, TOKEN_A)
        fields = {"csrf": csrf, "type": "abort", "reason": "r", "pad": padding}
        big = await client.post(f"/console/jobs/{job_id}/command", **form(fields))  # type: ignore[arg-type]
        assert big.status_code == 413
        assert "queue.command" not in await types(store, rid(job_id))


async def test_answering_an_agent_job_in_the_console_needs_commands_run(
    db_url: str, store: Store
) -> None:
    """The answer is the input of a turn that runs the agent's command, as a follow-up is."""
    tokens = f"{TOKENS}\nwrite-tok-0123456789abcdef org-a jobs:read jobs:write"
    async with api_client(db_url, store=store, tokens=tokens) as client:
        csrf = await sign_in(client, "write-tok-0123456789abcdef")
        answered = await client.post(
            "/console/agents/jobs/aj-x/answer",
            **form({"csrf": csrf, "answer": "main"}),  # type: ignore[arg-type]
        )
    assert answered.status_code == 403 and "commands:run" in answered.text


async def test_every_console_action_needs_the_scopes_its_api_route_does(
    db_url: str, store: Store
) -> None:
    """A token that may only read changes nothing from the console (`jobs:write`), and one
    without `commands:run` neither steers nor retries a job that runs commands: each action is
    403 naming the scope, and nothing is written."""
    tokens = (
        f"{TOKENS}\nread-tok-0123456789abcdef org-a jobs:read"
        "\nwrite-tok-0123456789abcdef org-a jobs:read jobs:write"
    )
    job_id = new_id()
    async with api_client(db_url, store=store, tokens=tokens) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        await operations.fail_undeliverable(store, rid(job_id), error="scoped")
        actions = {
            f"/console/jobs/{job_id}/command": {"type": "abort"},
            f"/console/jobs/{job_id}/retry": {},
            "/console/failed/retry": {"agentId": "codex", "error": '"scoped"'},
            "/console/objectives/o-x/cancel": {},
            "/console/schedules/s-x/pause": {},
        }
        csrf = await sign_in(client, "read-tok-0123456789abcdef")
        for path, fields in actions.items():
            refused = await client.post(path, **form({"csrf": csrf, **fields}))  # type: ignore[arg-type]
            assert refused.status_code == 403 and "jobs:write" in refused.text, path
        runs = {
            f"/console/jobs/{job_id}/command": {"type": "steer", "payload": "go"},
            f"/console/jobs/{job_id}/retry": {},
            "/console/failed/retry": {"agentId": "codex", "error": '"scoped"'},
        }
        csrf = await sign_in(client, "write-tok-0123456789abcdef")
        for path, fields in runs.items():
            refused = await client.post(path, **form({"csrf": csrf, **fields}))  # type: ignore[arg-type]
            assert refused.status_code == 403 and "commands:run" in refused.text, path
    written = await types(store, rid(job_id))
    assert "queue.command" not in written and "job.retried" not in written


async def test_job_page_shows_timeline_attempts_output_and_the_temporal_link(
    db_url: str, store: Store
) -> None:
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        worker = f"{job_id}:attempt:1/1"
        assert (
            await operations.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=60_000)
        ).ok
        await operations.progress(
            store, rid(job_id), worker_id=worker, attempt=1, data={"lines": ["hello from the job"]}
        )
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 200
    assert "hello from the job" in page.text
    assert "job.leased" in page.text and f"{worker} · attempt 1" in page.text
    assert "ReceiptJobId" in page.text and "/namespaces/default/workflows?" in page.text
    assert 'data-live="yes"' in page.text


async def test_the_temporal_link_carries_no_credentials_of_the_ui_url(
    db_url: str, store: Store
) -> None:
    """RECEIPT_TEMPORAL_UI_URL may name the UI's basic-auth user and password; the job page
    links an organization's reader to the UI too, and printed them in its link."""
    core = Settings(temporal_ui_url="https://ops:uiPassw0rd@temporal-ui.internal:8443/")
    async with api_client(db_url, store=store, core=core) as client:
        posted = await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/jobs/{posted.json()['job']['jobId']}")
    assert page.status_code == 200, page.text
    assert "https://temporal-ui.internal:8443/namespaces/default/workflows?" in page.text
    assert "uiPassw0rd" not in page.text and "ops:" not in page.text


async def test_a_temporal_ui_url_that_does_not_parse_leaves_the_job_page_up(
    db_url: str, store: Store
) -> None:
    """The link is built without the URL's user and password, by parsing it: one that does not
    parse (an IPv6 typo's unclosed [) made every job page a 500 with a traceback."""
    core = Settings(temporal_ui_url="http://ops:uiPassw0rd@[fd00::1:8233")
    async with api_client(db_url, store=store, core=core) as client:
        posted = await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/jobs/{posted.json()['job']['jobId']}")
    assert page.status_code == 200, page.text
    assert "uiPassw0rd" not in page.text


async def test_the_job_page_shows_task_env_names_never_their_values(
    db_url: str, store: Store
) -> None:
    """The API redacts `task.env` values from every read; the console's timeline printed the
    enqueue receipt's payload whole, secrets included, to any reader of the organization."""
    secret = "hunter2-" + new_id()
    task = {"command": ["true"], "env": {"API_KEY": secret}}
    async with api_client(db_url, store=store) as client:
        posted = await client.post(
            "/agents/codex/jobs", json=enqueue_body(payload_extra={"task": task}), headers=AS_A
        )
        job_id = posted.json()["job"]["jobId"]
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/jobs/{job_id}")
        await sign_in(client, TOKEN_ADMIN)
        admin_page = await client.get(f"/console/jobs/{rid(job_id)}")
    assert page.status_code == 200 and "job.enqueued" in page.text
    assert "API_KEY" in page.text and secret not in page.text
    assert admin_page.status_code == 200, admin_page.text
    assert "API_KEY" in admin_page.text and secret not in admin_page.text


async def test_a_long_jobs_page_shows_its_newest_receipts_and_streams_from_there(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runaway job's page shows where it is now, not its first receipts: the stream then
    replays only what came after them (20 000 receipts froze a browser for minutes)."""
    from roles.api.console import pages

    monkeypatch.setattr(pages, "TIMELINE_LIMIT", 10)
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        worker = f"{job_id}:attempt:1/1"
        assert (
            await operations.lease(store, rid(job_id), attempt=1, worker_id=worker, lease_ms=60_000)
        ).ok
        for n in range(30):
            await operations.progress(
                store, rid(job_id), worker_id=worker, attempt=1, data={"lines": [f"line {n}"]}
            )
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 200
    head = len(await store.read_stream(f"jobs/{rid(job_id)}"))
    assert "line 29" in page.text and "line 0\n" not in page.text
    assert f"/events?after={head}" in page.text  # the stream goes on from the newest


async def test_failed_work_groups_by_agent_and_error_and_retries_a_group(
    db_url: str, store: Store
) -> None:
    agent = f"agent-{new_id()}"
    async with api_client(db_url, store=store) as client:
        ids = []
        for error in ("disk full", "disk full", "timeout"):
            job_id = new_id()
            await client.post(
                f"/agents/{agent}/jobs", json=enqueue_body(jobId=job_id), headers=AS_A
            )
            await operations.fail_undeliverable(store, rid(job_id), error=error)
            ids.append(job_id)
        # An agent job's turn that failed alike is its job's to retry: not in a group here.
        turn = EnqueueRequest(
            agent_id=agent, payload={}, kind=TURN_KIND, organization_id="org-a", job_id=new_id()
        )
        await enqueue(store, turn)
        await operations.fail_undeliverable(store, str(turn.job_id), error="disk full")
        csrf = await sign_in(client, TOKEN_A)
        page = await client.get("/console/failed", params={"agentId": agent})
        assert (
            "disk full" in page.text and "Retry all 2" in page.text and "Retry all 1" in page.text
        )
        done = await client.post(
            "/console/failed/retry",
            **form({"csrf": csrf, "agentId": agent, "error": '"disk full"'}),  # type: ignore[arg-type]
        )
        assert done.status_code == 303 and "2+job" in done.headers["location"]
        not_json = await client.post(
            "/console/failed/retry",
            **form({"csrf": csrf, "agentId": agent, "error": "timeout"}),  # type: ignore[arg-type]
        )
        assert not_json.status_code == 422
        after = await client.get("/console/failed", params={"agentId": agent})
    assert "Retry all 2" not in after.text and "Retry all 1" in after.text
    assert "job.retried" in await types(store, rid(ids[0]))
    assert "job.retried" not in await types(store, rid(ids[2]))


async def test_counts_and_failed_groups_read_a_bounded_window_of_the_history(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs page counted every job of the history on each load, and failed work grouped every
    failed job (a parallel scan of the table: 0.2 s at a million settled jobs, a timeout at some
    tens of millions): both read the newest window now, and the page says so when it is full."""
    from receipts import reads

    monkeypatch.setattr(reads, "CONSOLE_WINDOW", 2)
    agent = f"agent-{new_id()}"
    async with api_client(db_url, store=store) as client:
        for _ in range(3):
            job_id = new_id()
            await client.post(
                f"/agents/{agent}/jobs", json=enqueue_body(jobId=job_id), headers=AS_A
            )
            await operations.fail_undeliverable(store, rid(job_id), error="disk full")
        await sign_in(client, TOKEN_A)
        jobs = await client.get("/console/jobs", params={"agentId": agent})
        failed = await client.get("/console/failed", params={"agentId": agent})
    assert re.search(r"failed <b>2</b>", jobs.text) and "of the newest 2" in jobs.text
    assert "Retry all 2" in failed.text and "of the 2 that failed last" in failed.text


async def test_docs_are_served_from_installed_assets(db_url: str, store: Store) -> None:
    async with api_client(db_url, store=store) as client:
        docs = await client.get("/docs")
        sources = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
        assert sources and all(s.startswith("/docs/assets/") for s in sources), sources
        for source in sources:
            asset = await client.get(source)
            assert asset.status_code == 200 and len(asset.content) > 200, source


async def test_agent_job_pages_name_an_organizations_sessions_as_the_api_does(
    db_url: str, store: Store
) -> None:
    """The console showed an organization its owner sessions' runtime ids (`<id>~<tag>`) and
    its `ownerSessionId` filter, given the id the API shows, listed nothing."""
    session = f"slack-{new_id()}"
    body = {
        "agentId": f"agent-{new_id()}",
        "ownerSessionId": session,
        "sourceActorEventId": "e",
        "sourceToolCallId": f"t-{new_id()}",
        "replyRoute": {"binding": "slack", "channel": "C1"},
        "input": {"prompt": "x"},
    }
    async with api_client(db_url, store=store) as client:
        made = await client.post("/agent-jobs", json=body, headers=AS_A)
        assert made.status_code == 201, made.text
        agent_job_id = made.json()["agentJob"]["agentJobId"]
        assert made.json()["agentJob"]["ownerSessionId"] == session
        await sign_in(client, TOKEN_A)
        listed = await client.get("/console/agents/jobs", params={"ownerSessionId": session})
        page = await client.get(f"/console/agents/jobs/{agent_job_id}")
    assert agent_job_id in listed.text
    for text in (listed.text, page.text):
        assert session in text and f"{session}~" not in text


async def test_agent_job_pages_answer_the_question_and_cancel(db_url: str, store: Store) -> None:
    from receipts.agent_jobs import lifecycle
    from tests.integration.test_agent_jobs import current, dispatcher, play_turn, request

    agent = f"agent-{new_id()}"
    asking, other = [(await lifecycle.create(store, request(agent)))[0] for _ in range(2)]
    foreign = (await lifecycle.create(store, request(agent, organization_id="org-b")))[0]
    await dispatcher(store).run_once()
    await play_turn(
        store,
        await current(store, asking.agent_job_id),
        {"outcome": "needs_input", "question": "Which branch?", "toolCallId": "call-7"},
    )
    await dispatcher(store).run_once()
    assert (await current(store, asking.agent_job_id)).status == "waiting_on_user"
    async with api_client(db_url, store=store) as client:
        csrf = await sign_in(client, TOKEN_A)
        listed = await client.get("/console/agents/jobs", params={"agentId": agent})
        assert asking.agent_job_id in listed.text and other.agent_job_id in listed.text
        assert foreign.agent_job_id not in listed.text
        hidden = await client.get(f"/console/agents/jobs/{foreign.agent_job_id}")
        assert hidden.status_code == 404
        page = await client.get(f"/console/agents/jobs/{asking.agent_job_id}")
        assert "Which branch?" in page.text and "request_user_input" in page.text
        assert f"{asking.agent_job_id}:waiting_on_user:1:1" in page.text  # the wakeup's source id
        assert f"{asking.agent_job_id}:attempt:1" in page.text  # the turn's queue job
        turn_page = await client.get(f"/console/jobs/{asking.agent_job_id}:attempt:1")
        assert turn_page.status_code == 200 and "agent_job.turn" in turn_page.text
        # The system created the turn with an untagged id: its organization reads it over the
        # API too, another organization cannot tell it from an unknown job.
        turn_id = f"{asking.agent_job_id}:attempt:1"
        assert (await client.get(f"/jobs/{turn_id}", headers=AS_A)).status_code == 200
        foreign_read = await client.get(
            f"/jobs/{turn_id}", headers={"Authorization": f"Bearer {TOKEN_B}"}
        )
        assert foreign_read.status_code == 404
        forged = await client.post(
            f"/console/agents/jobs/{asking.agent_job_id}/answer",
            **form({"answer": "main", "toolCallId": "call-7"}),  # type: ignore[arg-type]
        )
        assert forged.status_code == 403
        answered = await client.post(
            f"/console/agents/jobs/{asking.agent_job_id}/answer",
            **form({"csrf": csrf, "answer": "main", "toolCallId": "call-7"}),  # type: ignore[arg-type]
        )
        assert answered.status_code == 303 and "answered" in answered.headers["location"]
        resumed = await current(store, asking.agent_job_id)
        # The text as typed, as `receipt agent-jobs answer` and the API send it.
        assert resumed.answer == {"toolCallId": "call-7", "answer": "main"}
        stopped = await client.post(
            f"/console/agents/jobs/{other.agent_job_id}/cancel",
            **form({"csrf": csrf, "reason": "not needed"}),  # type: ignore[arg-type]
        )
        assert stopped.status_code == 303
        foreign_cancel = await client.post(
            f"/console/agents/jobs/{foreign.agent_job_id}/cancel",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert foreign_cancel.status_code == 404
    canceled = await current(store, other.agent_job_id)
    assert canceled.cancel_requested or canceled.status == "stopped"
    assert (await current(store, foreign.agent_job_id)).status == "running"
    async with api_client(db_url, store=store) as client:
        await sign_in(client, TOKEN_ADMIN)
        listed = await client.get("/console/agents/jobs", params={"agentId": agent})
    # The slots are each organization's three, counted apart.
    running = re.findall(r"<span>(\S+) · (\S+) <b>(\d)/3</b> running", listed.text)
    assert ("org-b", agent, "1") in running


async def test_an_agent_jobs_wakeups_show_however_long_its_owners_session(
    db_url: str, store: Store
) -> None:
    """The page finds a job's wakeups by index: a session with 10 000 receipts before them (the
    console read the session's stream, and only its first 10 000) still shows them."""
    import psycopg

    from receipts.agent_jobs import lifecycle
    from tests.integration.test_agent_jobs import current, dispatcher, play_turn, request

    owner = f"session-{new_id()}"
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO receipts (stream, seq, type, data) SELECT %s, n, 'session.note', "
            "'{}'::jsonb FROM generate_series(1, 10000) n",
            (f"sessions/{owner}",),
        )
    job, _ = await lifecycle.create(store, request(f"agent-{new_id()}", owner_session_id=owner))
    await dispatcher(store).run_once()
    await play_turn(
        store,
        await current(store, job.agent_job_id),
        {"outcome": "needs_input", "question": "Which branch?", "toolCallId": "call-1"},
    )
    await dispatcher(store).run_once()
    async with api_client(db_url, store=store) as client:
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/agents/jobs/{job.agent_job_id}")
    assert f"{job.agent_job_id}:waiting_on_user:1:1" in page.text
    assert "10001" in page.text  # its seq on the session


async def test_the_lists_page_back_to_their_oldest_row(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Objectives, agent jobs and schedules list PAGE_SIZE rows and link the older ones (an
    organization may hold 100 schedules; the console showed its newest 50 and no more)."""
    from receipts.agent_jobs import lifecycle
    from roles.api.console import agent_job_pages, objective_pages
    from tests.integration.helpers import create_objective
    from tests.integration.test_agent_jobs import request

    monkeypatch.setattr(objective_pages, "PAGE_SIZE", 2)
    monkeypatch.setattr(agent_job_pages, "PAGE_SIZE", 2)
    prefix = new_id("paged")
    made = [await create_objective(store, f"{prefix}-{n}") for n in range(3)]
    agent = f"agent-{new_id()}"
    agent_jobs = [(await lifecycle.create(store, request(agent)))[0].agent_job_id for _ in range(3)]
    async with api_client(db_url, store=store) as client:
        await sign_in(client, TOKEN_A)
        for path, params, ids in (
            ("/console/objectives", {}, made),
            ("/console/agents/jobs", {"agentId": agent}, agent_jobs),
        ):
            seen: list[str] = []
            page = await client.get(path, params=params)
            for _ in range(10):
                seen += [i for i in ids if i in page.text and i not in seen]
                older = re.search(r'<a href="\?([^"]+)" rel="next">Older', page.text)
                if older is None:
                    break
                page = await client.get(path + "?" + older.group(1).replace("&amp;", "&"))
            assert set(ids) <= set(seen), (path, seen)
        mangled = await client.get("/console/objectives", params={"cursor": "not-a-cursor"})
    assert mangled.status_code == 200 and made[-1] in mangled.text  # the newest page


async def test_the_schedules_page_lists_an_organizations_schedules_and_pauses_them(
    db_url: str, store: Store
) -> None:
    sid = f"console-{new_id()}"
    body = {
        "scheduleId": sid,
        "cron": "0 6 * * *",
        "agentId": "codex",
        "job": enqueue_body(payload_extra={"task": {"command": ["true"]}}),
    }
    async with api_client(db_url, store=store) as client:
        assert (await client.post("/schedules", json=body, headers=AS_A)).status_code == 201
        csrf = await sign_in(client, TOKEN_A)
        page = await client.get("/console/schedules")
        assert page.status_code == 200 and sid in page.text and "0 6 * * *" in page.text
        runtime = rid(sid)
        forged = await client.post(f"/console/schedules/{runtime}/pause", **form({}))  # type: ignore[arg-type]
        assert forged.status_code == 403
        paused = await client.post(
            f"/console/schedules/{runtime}/pause",
            **form({"csrf": csrf, "reason": "freeze"}),  # type: ignore[arg-type]
        )
        assert paused.status_code == 303 and "paused" in paused.headers["location"]
        shown = await client.get(f"/schedules/{sid}", headers=AS_A)
        assert shown.json()["status"] == "paused" and shown.json()["note"] == "freeze"
        # Paused again from a stale page, no reason typed: the note stays.
        again = await client.post(
            f"/console/schedules/{runtime}/pause",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert again.status_code == 303
        kept = await client.get(f"/schedules/{sid}", headers=AS_A)
        assert kept.json()["note"] == "freeze"
        client.cookies.clear()
        other = await sign_in(client, TOKEN_B)
        assert sid not in (await client.get("/console/schedules")).text
        foreign = await client.post(
            f"/console/schedules/{runtime}/resume",
            **form({"csrf": other}),  # type: ignore[arg-type]
        )
        assert foreign.status_code == 404
        still = await client.get(f"/schedules/{sid}", headers=AS_A)
        assert still.json()["status"] == "paused"


async def test_a_console_pause_takes_one_of_the_organizations_enqueue_tokens(
    db_url: str, store: Store
) -> None:
    """Each change is work for the schedule sync, as the API's PATCH: past its organization's
    burst, a console pause is refused with the rate's notice and writes nothing."""
    sid = f"console-{new_id()}"
    body = {
        "scheduleId": sid,
        "interval": "1h",
        "agentId": "codex",
        "job": enqueue_body(payload_extra={"task": {"command": ["true"]}}),
    }
    limited = {"org_enqueue_rate": 0.001, "org_enqueue_burst": 1}
    async with api_client(db_url, store=store, **limited) as client:
        assert (await client.post("/schedules", json=body, headers=AS_A)).status_code == 201
        csrf = await sign_in(client, TOKEN_A)
        paused = await client.post(
            f"/console/schedules/{rid(sid)}/pause",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert paused.status_code == 303 and "not+paused" in paused.headers["location"], (
            paused.headers["location"]
        )
        shown = await client.get(f"/schedules/{sid}", headers=AS_A)
    assert shown.json()["status"] == "active"


async def test_the_console_resumes_a_schedule_only_for_who_may_run_its_commands(
    db_url: str, store: Store
) -> None:
    """As the API's PATCH: a resume starts firings again, so a session whose token lacks
    `commands:run` cannot resume a schedule whose jobs run commands."""
    sid = f"console-{new_id()}"
    body = {
        "scheduleId": sid,
        "cron": "0 6 * * *",
        "agentId": "codex",
        "job": enqueue_body(payload_extra={"task": {"command": ["true"]}}),
        "paused": True,
    }
    tokens = "write-tok org-a jobs:read jobs:write\nrun-tok org-a jobs:read jobs:write commands:run"
    async with api_client(db_url, store=store, tokens=tokens) as client:
        runner = {"Authorization": "Bearer run-tok"}
        created = await client.post("/schedules", json=body, headers=runner)
        assert created.status_code == 201, created.text
        csrf = await sign_in(client, "write-tok")
        refused = await client.post(
            f"/console/schedules/{rid(sid)}/resume",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert refused.status_code == 303 and "not+resumed" in refused.headers["location"]
        assert "commands%3Arun" in refused.headers["location"]
        shown = await client.get(f"/schedules/{sid}", headers=runner)
        assert shown.json()["status"] == "paused"
        client.cookies.clear()
        csrf = await sign_in(client, "run-tok")
        resumed = await client.post(
            f"/console/schedules/{rid(sid)}/resume",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        assert resumed.status_code == 303 and "resumed" in resumed.headers["location"]
        assert (await client.get(f"/schedules/{sid}", headers=runner)).json()["status"] == "active"


async def test_the_console_resumes_only_the_definition_it_admitted(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change committed between the form's read of the schedule and its resume (here: right
    after the read) made its jobs run commands: a session without `commands:run` resumed it.
    The resume is refused when the definition moved; the schedule stays paused."""
    from receipts.schedules import store as schedules

    sid = f"console-{new_id()}"
    helper = enqueue_body(payload_extra={"task": {"command": ["true"]}})
    body = {"scheduleId": sid, "cron": "0 6 * * *", "agentId": "helper", "job": helper}
    codex, _ = schedules.validate(
        {**body, "agentId": "codex"}, "org-a", schedules.Limits(), admin=False
    )
    read = schedules.get
    changed: list[str] = []

    async def read_then_changed(reads: Store, schedule_id: str) -> object:
        state = await read(reads, schedule_id)
        if not changed:  # another token's change, committed once
            changed.append(schedule_id)
            assert await schedules.change(store, schedule_id, definition=codex) is not None
        return state

    tokens = "write-tok org-a jobs:read jobs:write"
    async with api_client(db_url, store=store, tokens=tokens) as client:
        writer = {"Authorization": "Bearer write-tok"}
        created = await client.post("/schedules", json={**body, "paused": True}, headers=writer)
        assert created.status_code == 201, created.text
        csrf = await sign_in(client, "write-tok")
        monkeypatch.setattr(schedules, "get", read_then_changed)
        refused = await client.post(
            f"/console/schedules/{rid(sid)}/resume",
            **form({"csrf": csrf}),  # type: ignore[arg-type]
        )
        monkeypatch.undo()
        assert refused.status_code == 303 and "not+resumed" in refused.headers["location"]
        shown = (await client.get(f"/schedules/{sid}", headers=writer)).json()
        assert (shown["status"], shown["agentId"]) == ("paused", "codex")


async def test_a_token_that_cannot_read_jobs_reads_nothing_in_the_console(
    db_url: str, store: Store
) -> None:
    """As the API's reads: an enqueue-only token (a CI producer's) cannot sign in, and a session
    of it (signed in before its scopes were narrowed) is refused every page and stream."""
    from receipts import console_sessions
    from roles.api.auth import token_digest

    tokens = f"{TOKEN_A} org-a\nwrite-only org-a jobs:write"
    async with api_client(db_url, store=store, tokens=tokens) as client:
        refused = await client.post("/console/login", **form({"token": "write-only"}))  # type: ignore[arg-type]
        assert refused.status_code == 401 and "jobs:read" in refused.text
        assert "set-cookie" not in refused.headers
        old = await console_sessions.create(
            store, token_digest("write-only"), ttl_s=3600, idle_s=600
        )
        client.cookies.set("receipt_console", old, path="/console")
        job_id = new_id()
        posted = await client.post(
            "/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A
        )
        assert posted.status_code == 202, posted.text
        for path in ("/console/jobs", f"/console/jobs/{rid(job_id)}", "/console/failed"):
            page = await client.get(path)
            assert page.status_code == 403 and "jobs:read" in page.text, path
            assert job_id not in page.text, path
        # It can still sign out (its session's row is deleted).
        csrf = await console_sessions.use(store, old, idle_s=600)
        assert not isinstance(csrf, str)
        out = await client.post("/console/logout", **form({"csrf": csrf.csrf}))  # type: ignore[arg-type]
        assert out.status_code == 303
        assert await console_sessions.use(store, old, idle_s=600) == "unknown"


async def test_a_sign_in_another_site_posted_is_refused_and_tries_are_bounded(
    db_url: str, store: Store
) -> None:
    """Login CSRF: a page elsewhere that posts a token of the attacker's must not sign the
    operator in as the attacker's organization; and guessing tokens costs time."""
    from roles.api.console import session as console_session

    async with api_client(db_url, store=store) as client:
        for headers in (
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
        ):
            answer = await client.post(
                "/console/login",
                content=f"token={TOKEN_B}",
                headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
            )
            assert answer.status_code == 403, (headers, answer.text)
            assert "set-cookie" not in answer.headers, headers
        own = await client.post(
            "/console/login",
            content=f"token={TOKEN_A}",
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Sec-Fetch-Site": "same-origin",
                "Origin": "http://test",
            },
        )
        assert own.status_code == 303, own.text
        console_session._sign_ins._buckets.clear()  # this test's own budget of tries
        wrong = [
            (await client.post("/console/login", **form({"token": f"guess-{n}"}))).status_code  # type: ignore[arg-type]
            for n in range(console_session.SIGN_IN_BURST + 2)
        ]
        assert wrong[: console_session.SIGN_IN_BURST] == [401] * console_session.SIGN_IN_BURST
        assert wrong[console_session.SIGN_IN_BURST :] == [429, 429]
        console_session._sign_ins._buckets.clear()
        # Tries at once are counted as they are: the budget is checked and spent with no await
        # between, after each body is read.
        at_once = await asyncio.gather(
            *(
                client.post("/console/login", **form({"token": f"guess-{n}"}))  # type: ignore[arg-type]
                for n in range(3 * console_session.SIGN_IN_BURST)
            )
        )
        statuses = sorted(answer.status_code for answer in at_once)
        assert statuses.count(401) == console_session.SIGN_IN_BURST, statuses
        console_session._sign_ins._buckets.clear()


async def test_a_notice_shows_only_from_the_sessions_own_action(db_url: str, store: Store) -> None:
    """A link from elsewhere cannot put its words on an operator's page: the notice an action
    redirects with carries a tag only the operator's session makes."""
    job_id = new_id()
    phishing = "session expired: re-enter your admin token at https://evil.example/login"
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        csrf = await sign_in(client, TOKEN_A)
        for query in ({"notice": phishing}, {"notice": phishing, "ns": "0" * 32}):
            page = await client.get(f"/console/jobs/{job_id}", params=query)
            assert page.status_code == 200 and "evil.example" not in page.text, query
        login = await client.get("/console/login", params={"error": phishing})
        assert "evil.example" not in login.text
        acted = await client.post(
            f"/console/jobs/{job_id}/command",
            **form({"csrf": csrf, "type": "abort", "reason": "stop"}),  # type: ignore[arg-type]
        )
        assert acted.status_code == 303
        shown = await client.get(acted.headers["location"])
    assert "abort appended" in shown.text


async def test_an_admins_job_id_two_organizations_use_is_answered_as_a_page(
    db_url: str, store: Store
) -> None:
    """An admin naming a job by an id two organizations use got the API's JSON 409 in the
    console: it is the console's error page now, saying why."""
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        for token in (TOKEN_A, TOKEN_B):
            posted = await client.post(
                "/agents/codex/jobs",
                json=enqueue_body(jobId=job_id, org="org-b" if token == TOKEN_B else "org-a"),
                headers={"Authorization": f"Bearer {token}"},
            )
            assert posted.status_code == 202, posted.text
        await sign_in(client, TOKEN_ADMIN)
        page = await client.get(f"/console/jobs/{job_id}")
    assert page.status_code == 409
    assert page.headers["content-type"].startswith("text/html")
    assert job_id in page.text


@pytest.mark.parametrize("job_id", [".", ".."])
async def test_the_console_s_links_reach_a_job_whose_id_is_a_dot_segment(
    fresh: tuple[Store, str], job_id: str
) -> None:
    """A job id may be `.` or `..`: the console's links and redirects named `/console/jobs/..`,
    which a browser resolves to `/console/`, and `/console/jobs/.` to the job list. A database
    of its own: in the worker's, test_api.py's job `.` of org-b, another agent's, was the one
    this post found (its id taken), and the list by this test's agent showed none."""
    store, db_url = fresh
    agent = f"agent-{new_id()}"
    as_b = {"Authorization": f"Bearer {TOKEN_B}"}
    async with api_client(db_url, store=store) as client:
        posted = await client.post(
            f"/agents/{agent}/jobs", json=enqueue_body(org="org-b", jobId=job_id), headers=as_b
        )
        assert posted.status_code == 202, posted.text
        csrf = await sign_in(client, TOKEN_B)
        listed = await client.get("/console/jobs", params={"agentId": agent})
        escaped = job_id.replace(".", "%2E")
        assert f'href="/console/jobs/{escaped}"' in listed.text
        page = await client.get(f"/console/jobs/{escaped}")
        assert page.status_code == 200 and f"/console/jobs/{escaped}/command" in page.text
        abort = await client.post(
            f"/console/jobs/{escaped}/command",
            **form({"csrf": csrf, "type": "abort", "reason": "operator"}),  # type: ignore[arg-type]
        )
        assert abort.status_code == 303
        assert abort.headers["location"].startswith(f"/console/jobs/{escaped}?")


async def test_a_long_agent_jobs_page_shows_its_newest_receipts(
    fresh: tuple[Store, str],
) -> None:
    """The agent-job page read the oldest 10 000 receipts of the job's stream: a job past that
    showed none of what it did lately (and read them all on every view). It shows the newest
    2 000, as a job's and an objective's pages do. (A database of its own: the receipts are
    written past the projection, which other tests compare with the chain.)"""
    from receipts.agent_jobs import lifecycle
    from receipts.agent_jobs import model as agent_model
    from tests.integration.test_agent_jobs import request

    store, db_url = fresh
    agent = f"agent-{new_id()}"
    job = (await lifecycle.create(store, request(agent)))[0]
    stream = agent_model.stream_of(job.agent_job_id)
    async with store.connection() as conn:  # 10 100 old summaries, then the newest
        await conn.execute(
            "INSERT INTO receipts (stream, seq, type, data, recorded_at)"
            " SELECT %s, n, 'agent_job.usage', jsonb_build_object('marker', 'old-' || n), now()"
            " FROM generate_series(2, 10101) AS n",
            (stream,),
        )
        await conn.execute(
            "INSERT INTO receipts (stream, seq, type, data, recorded_at)"
            " VALUES (%s, 10102, 'agent_job.usage', '{\"marker\": \"the-newest\"}', now())",
            (stream,),
        )
    async with api_client(db_url, store=store) as client:
        await sign_in(client, TOKEN_A)
        page = await client.get(f"/console/agents/jobs/{job.agent_job_id}")
    assert page.status_code == 200
    assert "the-newest" in page.text and "old-9000" in page.text
    assert "old-8000" not in page.text and "agent_job.created" not in page.text


async def test_a_command_form_sent_again_appends_its_command_once(
    db_url: str, store: Store
) -> None:
    # A browser sends a form again when its answer was lost (or on a second click): the form
    # the page rendered names its commands, so the same one is appended once.
    job_id = new_id()
    async with api_client(db_url, store=store) as client:
        await client.post("/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A)
        csrf = await sign_in(client, TOKEN_A)
        page = (await client.get(f"/console/jobs/{job_id}")).text
        keys = set(re.findall(r'name="form" value="([0-9a-f]{32})"', page))
        assert len(keys) <= 1  # one key for the page's forms
        key = keys.pop() if keys else ""
        steer = {"csrf": csrf, "form": key, "type": "steer", "payload": "look at the logs"}
        sent = await asyncio.gather(
            *(client.post(f"/console/jobs/{job_id}/command", **form(steer)) for _ in range(2))  # type: ignore[arg-type]
        )
        assert [s.status_code for s in sent] == [303, 303]
        job = await store.get_job(rid(job_id))
        assert job is not None and [c.type for c in job.commands] == ["steer"]
        # Another steer typed on the page left open is its own command, not the first's again.
        other = {**steer, "payload": "and the traces"}
        answer = await client.post(f"/console/jobs/{job_id}/command", **form(other))  # type: ignore[arg-type]
        assert answer.status_code == 303 and "already" not in answer.headers["location"]
        job = await store.get_job(rid(job_id))
        assert job is not None and [c.type for c in job.commands] == ["steer", "steer"]
        # The abort of the same page is its own command, and is taken once too.
        abort = {"csrf": csrf, "form": key, "type": "abort", "reason": "operator"}
        for _ in range(2):
            answer = await client.post(f"/console/jobs/{job_id}/command", **form(abort))  # type: ignore[arg-type]
            assert answer.status_code == 303 and "refused" not in answer.headers["location"]
        job = await store.get_job(rid(job_id))
        assert job is not None and job.status == "canceled"
        assert [c.type for c in job.commands] == ["steer", "steer", "abort"]
