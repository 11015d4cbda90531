"""The AI gateway as a hostile tenant uses it: one organization's calls against another's for a
shared credential pool, a turn's calls against its revocation, and the usage of a streamed call
that does not ask for it (a real gateway on its Unix sockets, a fake provider on loopback)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import httpx
import pytest

from activities import gateway as gateway_module
from activities.gateway import Gateway, Grant
from activities.gateway_providers import Credential, Provider, Secret
from tests.fake_provider import USAGE_IN, USAGE_OUT, FakeProvider, running


def pool(binding: str, url: str, slots: int, *keys: str) -> Provider:
    credentials = tuple(Credential(f"c{n}", Secret(key), slots) for n, key in enumerate(keys))
    return Provider(binding, "openai", url, credentials)


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    keys = {"sk-ok": "ok", "sk-slow-1": "slow", "sk-slow-2": "slow", "sk-trickle": "trickle"}
    with running(FakeProvider(keys, slow_s=1.0, usage_when_asked=True)) as fake:
        yield fake


@pytest.fixture
async def gw(fake: FakeProvider) -> AsyncIterator[Gateway]:
    providers = {
        "openai": pool("openai", fake.openai_url, 4, "sk-ok"),
        "two": pool("two", fake.openai_url, 1, "sk-slow-1", "sk-slow-2"),
        "one": pool("one", fake.openai_url, 2, "sk-slow-1"),
        "trickle": pool("trickle", fake.openai_url, 2, "sk-trickle"),
    }
    async with httpx.AsyncClient() as http:
        gateway = Gateway(providers, http)
        yield gateway
        await gateway.close()


def turn(gateway: Gateway, binding: str, job: str, org: str = "org-a") -> Grant:
    return gateway.grant(
        job_id=job, attempt=1, agent_id="coder", organization_id=org, binding=binding
    )


async def call(grant: Grant, timeout: float = 30, **body: object) -> httpx.Response:
    transport = httpx.AsyncHTTPTransport(uds=str(grant.socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        return await http.post(
            "/v1/chat/completions",
            json={"model": "m", **body},
            headers={"Authorization": f"Bearer {grant.token}"},
            timeout=timeout,
        )


async def timed(grant: Grant) -> tuple[int, float]:
    started = time.monotonic()
    answer = await call(grant)
    return answer.status_code, time.monotonic() - started


async def ended(grant: Grant) -> tuple[int, float]:
    answer = await call(grant)
    return answer.status_code, time.monotonic()


def job_starting_at(index: int, size: int, prefix: str) -> str:
    """A job id whose least-busy tie-break starts at credential `index` (`Pool.choose`)."""
    for n in range(1000):
        job = f"{prefix}-{n}"
        if int(hashlib.sha256(job.encode()).hexdigest(), 16) % size == index:
            return job
    raise AssertionError("no such job id")


async def test_a_streamed_chat_completion_is_in_the_turn_s_usage_though_it_asks_for_none(
    gw: Gateway, fake: FakeProvider
) -> None:
    """OpenAI sends a streamed chat completion's usage only to a call that asks for it
    (`stream_options.include_usage`): a command that leaves it out had its calls counted at
    zero tokens, its turn's usage receipt and the token metrics blind to what it spent."""
    grant = turn(gw, "openai", "job-usage")
    streamed = await call(grant, stream=True, messages=[])
    assert streamed.status_code == 200
    assert (grant.calls, grant.input_tokens, grant.output_tokens) == (1, USAGE_IN, USAGE_OUT)


async def test_a_binding_that_says_so_gets_its_streamed_calls_as_the_command_sent_them(
    fake: FakeProvider,
) -> None:
    """`streamUsage: false` (an OpenAI-compatible server that refuses `stream_options`): the
    gateway no longer adds it; the call's body reaches the provider as the command sent it."""
    plain = pool("plain", fake.openai_url, 4, "sk-ok")
    providers = {"plain": replace(plain, stream_usage=False), "asks": plain}
    async with httpx.AsyncClient() as http:
        gateway = Gateway(providers, http)
        try:
            for binding in ("plain", "asks"):
                answer = await call(turn(gateway, binding, f"job-{binding}"), stream=True)
                assert answer.status_code == 200
        finally:
            await gateway.close()
    sent = [json.loads(body) for body in fake.bodies]
    assert sent[0] == {"model": "m", "stream": True}
    assert sent[1]["stream_options"] == {"include_usage": True}


async def test_a_job_s_call_does_not_wait_on_its_busy_credential_while_another_is_free(
    gw: Gateway, fake: FakeProvider
) -> None:
    """Affinity is a preference: a job's credential held by another organization's call made
    the job's next call wait for it while the pool's other credential sat idle."""
    victim = turn(gw, "two", job_starting_at(0, 2, "victim"), org="org-b")
    hog = turn(gw, "two", job_starting_at(0, 2, "hog"), org="org-a")
    assert (await timed(victim))[0] == 200  # its affinity: credential 0
    long_call = asyncio.create_task(timed(hog))  # credential 0 again (least busy, its start)
    await asyncio.sleep(0.3)
    status, elapsed = await timed(victim)
    await long_call
    assert status == 200
    assert elapsed < 1.6, f"waited {elapsed:.1f}s for a busy credential, another idle"


async def test_another_organization_s_call_goes_before_one_organization_s_queued_calls(
    gw: Gateway, fake: FakeProvider
) -> None:
    """One organization's turns queue more calls than the pool has slots: another organization's
    call that arrives then is served at the next free slot, not behind all of them."""
    hogs = [turn(gw, "one", f"hog-{n}", org="org-a") for n in range(2)]
    flood = [asyncio.create_task(ended(g)) for g in hogs for _ in range(4)]  # 2 slots, 8 calls
    await asyncio.sleep(0.3)
    status, victim_ended = await ended(turn(gw, "one", "victim", org="org-b"))
    hogs_ended = sorted(at for _, at in await asyncio.gather(*flood))
    assert status == 200
    before = sum(at < victim_ended for at in hogs_ended)
    assert before <= 3, f"org-b's call ended after {before} of org-a's 8, queued after it"


async def test_a_call_waiting_for_a_slot_is_answered_in_time_with_a_retryable_error(
    gw: Gateway, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call found every slot of the pool taken waited without bound and without a word: the
    command saw only its own client's timeout. Past the wait it is the provider's way of saying
    "busy": 429 with retry-after, no quota recorded (the pool is busy, not spent)."""
    monkeypatch.setattr(gateway_module, "SLOT_WAIT_S", 0.5, raising=False)
    fake.slow_s = 3.0
    hog = turn(gw, "one", "hog", org="org-a")
    held = [asyncio.create_task(timed(hog)) for _ in range(2)]
    await asyncio.sleep(0.3)
    victim = turn(gw, "one", "victim", org="org-b")
    started = time.monotonic()
    answer = await call(victim)
    elapsed = time.monotonic() - started
    await asyncio.gather(*held)
    assert elapsed < 2.0, f"waited {elapsed:.1f}s"
    assert answer.status_code == 429 and "retry-after" in answer.headers
    assert "busy" in answer.json()["error"]["message"]
    assert victim.quota_until is None and victim.in_flight == 0


async def test_a_call_still_waiting_for_a_slot_when_its_turn_ends_is_not_sent(
    gw: Gateway, fake: FakeProvider
) -> None:
    """The turn's command exits with calls queued for a credential; its grant is revoked. A call
    that had not reached the provider then went on to it later anyway, for nobody, holding a
    slot other turns wait for, its cost in no turn's usage."""
    fake.slow_s = 1.5
    grant = turn(gw, "one", "job-gone")
    transport = httpx.AsyncHTTPTransport(uds=str(grant.socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        pending = [
            asyncio.create_task(
                http.post(
                    "/v1/chat/completions",
                    json={"model": "m"},
                    headers={"Authorization": f"Bearer {grant.token}"},
                    timeout=30,
                )
            )
            for _ in range(5)  # 2 reach the provider, 3 wait for a slot
        ]
        await asyncio.sleep(0.5)
        for task in pending:  # the command exits: its connections close
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    sent_before_revoke = len(fake.calls)
    await gw.drain(grant, timeout_s=0.1)
    await asyncio.sleep(4.0)
    assert sent_before_revoke == 2
    assert len(fake.calls) == 2, f"{len(fake.calls) - 2} calls sent after the turn ended"


async def test_a_provider_that_stops_answering_is_a_timeout_the_command_reads(
    gw: Gateway,
    fake: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No answer in time was "the provider could not be reached: " (502, no reason); a stream
    the provider stopped mid-way was cut without a word to the command's client, and the worker
    logged a traceback for each."""
    monkeypatch.setattr(gateway_module, "UPSTREAM_TIMEOUT", httpx.Timeout(5.0, read=0.5))
    fake.slow_s, fake.trickle_s = 2.0, 2.0
    late = await call(turn(gw, "one", "job-late"))
    assert late.status_code == 504
    assert late.json()["error"]["message"] == "the provider did not answer in time"
    with caplog.at_level(logging.ERROR):
        stream = await call(turn(gw, "trickle", "job-cut"), stream=True)
    assert stream.status_code == 200
    last = stream.text.strip().splitlines()[-1]
    assert last.startswith("data: ") and '"error"' in last and "did not answer in time" in last
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_call_waiting_for_a_slot_takes_another_credential_s_slot_that_frees_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two credentials of one slot: one holds a long stream, the other a short call. A third
    call waited on the credential its job's tie-break named, behind the long stream, while the
    other credential's slot freed at once: 429 'busy' at SLOT_WAIT_S with a slot idle."""
    from fastapi.responses import Response

    monkeypatch.setattr(gateway_module, "SLOT_WAIT_S", 2.0)
    hold = {"c0": 5.0, "c1": 0.3}

    async def answer(self: Gateway, pool: object, state: object, *args: object) -> Response:
        await asyncio.sleep(hold[state.credential.id])  # type: ignore[attr-defined]
        return Response(status_code=200)

    monkeypatch.setattr(Gateway, "_call", answer)
    providers = {"two": pool("two", "http://127.0.0.1:9", 1, "sk-1", "sk-2")}
    async with httpx.AsyncClient() as http:
        gw = Gateway(providers, http)
        try:
            send = gw._send_with_a_credential
            long = turn(gw, "two", job_starting_at(0, 2, "long"), org="org-a")
            short = turn(gw, "two", job_starting_at(1, 2, "short"), org="org-a")
            victim = turn(gw, "two", job_starting_at(0, 2, "victim"), org="org-b")
            pool_ = gw.pools["two"]
            args: tuple[str, bytes, dict[str, str], str, str] = (
                "/v1/chat/completions",
                b"{}",
                {},
                "openai",
                "m",
            )
            held = [
                asyncio.create_task(send(pool_, long, *args)),
                asyncio.create_task(send(pool_, short, *args)),
            ]
            await asyncio.sleep(0.05)
            started = time.monotonic()
            answered = await send(pool_, victim, *args)
            elapsed = time.monotonic() - started
            await asyncio.gather(*held)
        finally:
            await gw.close()
    assert answered.status_code == 200, f"{answered.status_code} after {elapsed:.1f}s"
    assert elapsed < 1.0, f"waited {elapsed:.1f}s with a slot free"


async def test_a_call_refused_by_the_free_credential_keeps_its_place_on_the_busy_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two credentials of one slot: c1 holds a long call; c0 refused call `x` (a 401 on its path,
    which fails the call on c0 alone) and is idle. `x` waits on c1, and `z` (c0 rests for its
    model) queues there after it. c0's free slot, which `x` may not take, made `x` leave c1's
    queue every LOOK_AGAIN_S and queue again behind `z`: the later call went first."""
    from datetime import UTC, datetime, timedelta

    from fastapi.responses import Response

    from activities import gateway_pool

    monkeypatch.setattr(gateway_pool, "LOOK_AGAIN_S", 0.1)
    hold = {"long": 0.5, "x": 0.05, "z": 0.05}
    on_c1: list[str] = []

    async def answer(
        self: Gateway, pool: object, state: object, grant: Grant, *args: object
    ) -> Response | None:
        name = grant.job_id.split("-")[0]
        if state.credential.id == "c0":  # type: ignore[attr-defined]
            return None  # refused for this call alone: it goes on to the next credential
        on_c1.append(name)
        await asyncio.sleep(hold[name])
        return Response(status_code=200)

    monkeypatch.setattr(Gateway, "_call", answer)
    providers = {"two": pool("two", "http://127.0.0.1:9", 1, "sk-1", "sk-2")}
    async with httpx.AsyncClient() as http:
        gw = Gateway(providers, http)
        try:
            send = gw._send_with_a_credential
            pool_ = gw.pools["two"]
            now = datetime.now(UTC)
            pool_.states[0].rest("m2", now + timedelta(seconds=60), now)  # for z's model only
            rest: tuple[str, bytes, dict[str, str], str] = (
                "/v1/chat/completions",
                b"{}",
                {},
                "openai",
            )
            long = turn(gw, "two", job_starting_at(1, 2, "long"), org="org-c")
            x = turn(gw, "two", job_starting_at(0, 2, "x"), org="org-a")
            z = turn(gw, "two", job_starting_at(1, 2, "z"), org="org-b")
            calls = [asyncio.create_task(send(pool_, long, *rest, "m"))]
            await asyncio.sleep(0.02)
            calls.append(asyncio.create_task(send(pool_, x, *rest, "m")))
            await asyncio.sleep(0.03)
            calls.append(asyncio.create_task(send(pool_, z, *rest, "m2")))
            answers = await asyncio.gather(*calls)
        finally:
            await gw.close()
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert on_c1 == ["long", "x", "z"], on_c1


async def test_a_call_waiting_behind_a_long_call_takes_a_larger_credential_s_free_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """c0 of one slot holds a long call; c1 of three has two calls and a slot free. `choose`
    took the least loaded (c0: 1 against 2), the wait left it for c1's free slot every
    LOOK_AGAIN_S, and `choose` sent it back to c0 each time: 429 'busy' at SLOT_WAIT_S with a
    slot free all along."""
    from fastapi.responses import Response

    from activities import gateway_pool

    monkeypatch.setattr(gateway_pool, "LOOK_AGAIN_S", 0.1)
    monkeypatch.setattr(gateway_module, "SLOT_WAIT_S", 2.0)

    async def answer(self: Gateway, pool: object, state: object, *args: object) -> Response:
        await asyncio.sleep(4.0 if state.credential.id == "c0" else 0.05)  # type: ignore[attr-defined]
        return Response(status_code=200)

    monkeypatch.setattr(Gateway, "_call", answer)
    credentials = (Credential("c0", Secret("sk-1"), 1), Credential("c1", Secret("sk-2"), 3))
    providers = {"two": Provider("two", "openai", "http://127.0.0.1:9", credentials)}
    async with httpx.AsyncClient() as http:
        gw = Gateway(providers, http)
        try:
            pool_ = gw.pools["two"]
            rest: tuple[str, bytes, dict[str, str], str, str] = (
                "/v1/chat/completions",
                b"{}",
                {},
                "openai",
                "m",
            )
            long = turn(gw, "two", job_starting_at(0, 2, "long"), org="org-c")
            held = asyncio.create_task(gw._send_with_a_credential(pool_, long, *rest))
            await asyncio.sleep(0.02)
            assert pool_.states[0].slots.busy == 1
            for _ in range(2):  # two calls of c1 running
                assert await pool_.states[1].slots.acquire("org-d", 1)
            victim = turn(gw, "two", job_starting_at(0, 2, "victim"), org="org-b")
            started = time.monotonic()
            answered = await gw._send_with_a_credential(pool_, victim, *rest)
            elapsed = time.monotonic() - started
            held.cancel()
        finally:
            await gw.close()
    assert answered.status_code == 200, f"{answered.status_code} after {elapsed:.1f}s"
    assert elapsed < 1.0, f"waited {elapsed:.1f}s with a slot free"
