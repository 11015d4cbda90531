"""The AI gateway against a hostile turn's command: what it does to the worker (its event loop,
its logs) and to what its organization's calls are counted at (a real gateway on its Unix
sockets, a fake provider on loopback)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from activities.gateway import Gateway, Grant
from activities.gateway_http import BYTES_PER_TOKEN
from activities.gateway_pool import Slots
from activities.gateway_providers import Credential, Provider, Secret
from tests.fake_provider import FakeProvider, running


def pool(binding: str, url: str, key: str) -> Provider:
    return Provider(binding, "openai", url, (Credential("c0", Secret(key), 4),))


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    with running(FakeProvider({"sk-ok": "ok", "sk-trickle": "trickle"})) as fake:
        yield fake


@pytest.fixture
async def gw(fake: FakeProvider) -> AsyncIterator[Gateway]:
    providers = {
        "openai": pool("openai", fake.openai_url, "sk-ok"),
        "trickle": pool("trickle", fake.openai_url, "sk-trickle"),
        # Nothing listens there: a call is refused at once, as it reaches the provider.
        "nowhere": pool("nowhere", "http://127.0.0.1:9/v1", "sk-ok"),
    }
    async with httpx.AsyncClient() as http:
        gateway = Gateway(providers, http)
        yield gateway
        await gateway.close()


def turn(gateway: Gateway, binding: str, job: str) -> Grant:
    return gateway.grant(
        job_id=job, attempt=1, agent_id="coder", organization_id="org-a", binding=binding
    )


def client(grant: Grant) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=str(grant.socket))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60)


async def test_a_body_of_numbers_does_not_hold_the_worker_s_event_loop(gw: Gateway) -> None:
    """A streamed chat completion's body is written again (`stream_options.include_usage`), as
    is one whose network tools are taken out: read and written by the json module, a 23 MiB
    body of 1 000 000 floats held the worker's event loop 3 s — every turn's stream and
    heartbeat on the worker waited — and a command may send one per call."""
    grant = turn(gw, "nowhere", "job-numbers")
    numbers = b",".join([b"1.2345678901234567e-300"] * 999_000)
    body = b'{"model":"m","stream":true,"messages":[],"n":[' + numbers + b"]}"
    headers = {"Authorization": f"Bearer {grant.token}", "Content-Type": "application/json"}
    # What the event loop's thread spent between two of its ticks, in CPU time: a wall-clock
    # gap also holds the time the machine gave other processes (2.4 s once, under a loaded
    # test run, for a parse of 0.3 s), the CPU time only what the loop itself did.
    gaps: list[float] = []

    async def ticks() -> None:
        last = time.thread_time()
        while True:
            await asyncio.sleep(0.01)
            now = time.thread_time()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticks())
    try:
        async with client(grant) as http:
            answer = await http.post("/v1/chat/completions", content=body, headers=headers)
    finally:
        ticking.cancel()
    assert answer.status_code == 502  # rewritten, then sent to nowhere
    assert max(gaps) < 1.5, f"the event loop was held {max(gaps):.1f} s of CPU by one call's body"


async def test_a_command_hanging_up_mid_body_logs_no_error(
    gw: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Each connection closed while its body was arriving was an ERROR with a traceback
    (uvicorn's "Exception in ASGI application", Starlette's ClientDisconnect): a command
    opening and dropping connections wrote the worker's log without bound, where the gateway's
    refusals are logged once per 10 s."""
    grant = turn(gw, "openai", "job-hangup")
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {grant.token}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode()
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            _, writer = await asyncio.open_unix_connection(str(grant.socket))
            writer.write(head + b'{"model"')
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.close()
        for _ in range(100):
            if grant.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
    assert grant.in_flight == 0 and grant.body_bytes == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    async with client(grant) as http:  # the turn's calls go on
        answer = await http.post(
            "/v1/chat/completions",
            json={"model": "m"},
            headers={"Authorization": f"Bearer {grant.token}"},
        )
    assert answer.status_code == 200


async def test_a_stream_hung_up_on_before_its_usage_still_counts_its_prompt(
    gw: Gateway, fake: FakeProvider
) -> None:
    """Chat Completions and Responses send a stream's usage last. A command that read the first
    event and hung up had its call counted at zero tokens — its organization's budget, its
    turn's usage and the token metrics blind to a prompt the provider read and billed — on every
    call it made so. Its prompt is counted from its body's size."""
    fake.trickle_s = 0.05
    grant = turn(gw, "trickle", "job-cut")
    prompt = "x" * 400_000
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    async with client(grant) as http:
        async with http.stream(
            "POST",
            "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {grant.token}"},
        ) as answer:
            assert answer.status_code == 200
            async for _ in answer.aiter_raw():
                break  # the first event: hang up
    await gw.drain(grant, timeout_s=5)
    await asyncio.sleep(0.5)  # its server stops, its socket closes
    assert grant.calls == 1 and grant.in_flight == 0
    assert grant.input_tokens >= len(prompt) // BYTES_PER_TOKEN


async def test_a_network_tool_behind_an_escaped_repeated_tools_key_is_taken_out(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A body naming `tools` twice is written again from its parse (the gateway reads the last,
    a provider might read the first), but the repeat was found by searching the body's bytes
    for `"tools"`: a first one written `"tool\\u0073"` — `tools` to every JSON parser — went
    to the provider as it was, its web search in it."""
    grant = turn(gw, "openai", "job-escaped")
    body = (
        b'{"model":"m","input":[],"tool\\u0073":[{"type":"web_search"}],'
        b'"tools":[{"type":"function","name":"f","parameters":{}}]}'
    )
    headers = {"Authorization": f"Bearer {grant.token}", "content-type": "application/json"}
    async with client(grant) as http:
        answer = await http.post("/v1/responses", content=body, headers=headers)
    assert answer.status_code == 200
    assert len(fake.bodies) == 1 and b"web_search" not in fake.bodies[0], fake.bodies[0]


async def test_one_job_s_streams_do_not_hold_every_slot_from_another_organization(
    gw: Gateway, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn has 8 calls in flight and a credential 8 slots by default: one job's streams,
    long or read slowly, held all of them for as long as its turn ran (its timeout), and every
    other organization's call on the binding waited SLOT_WAIT_S and was told "busy" (429). Once
    a second organization has called a credential, one organization holds at most all but one
    of its slots."""
    from activities import gateway as gateway_module

    monkeypatch.setattr(gateway_module, "SLOT_WAIT_S", 1.0)
    fake.trickle_s = 0.2
    victim = gw.grant(
        job_id="job-victim", attempt=1, agent_id="coder", organization_id="org-b",
        binding="trickle",
    )  # fmt: skip
    body = {"model": "m", "stream": True}
    as_victim = {"Authorization": f"Bearer {victim.token}"}
    async with client(victim) as other:
        async with other.stream("POST", "/v1/chat/completions", json=body, headers=as_victim) as a:
            assert a.status_code == 200  # org-b has called the credential, then hangs up
    await asyncio.sleep(0.3)
    hog = turn(gw, "trickle", "job-hog")
    headers = {"Authorization": f"Bearer {hog.token}"}
    async with client(hog) as http:
        held = []
        for _ in range(4):  # the credential's every slot
            stream = http.stream("POST", "/v1/chat/completions", json=body, headers=headers)
            held.append((stream, await stream.__aenter__()))
        try:
            async with client(victim) as other:
                async with other.stream(
                    "POST", "/v1/chat/completions", json=body, headers=as_victim, timeout=5
                ) as answer:
                    status = answer.status_code  # its head only: a trickle never ends
        finally:
            for stream, _ in held:
                await stream.__aexit__(None, None, None)
    await asyncio.sleep(0.3)
    assert status == 200, "another organization's call was told every slot is busy"
    # The hog's fourth call waited for a slot its organization may not take, and was told so.
    assert [r.status_code for _, r in held] == [200, 200, 200, 429]


def test_a_credential_one_organization_calls_keeps_every_slot_for_it() -> None:
    slots = Slots(3)
    for _ in range(3):
        assert slots.free and slots._may_take("org-a")
        slots._take("org-a")
        slots.callers.add("org-a")
    assert slots.busy == 3 and slots.cap == 3
    slots.callers.add("org-b")
    assert slots.cap == 2 and not slots._may_take("org-a")
    single = Slots(1)
    single.callers.update({"org-a", "org-b"})
    assert single.cap == 1
