"""The AI gateway on its Unix socket, forwarding to a fake provider on loopback: both API
styles, streaming and not, the turn's token and nothing else, usage counted, quota turned into
a recovery time, a refused credential dropped, a dead pool named."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from activities.gateway import MAX_CALLS_PER_GRANT, MAX_CONNECTIONS, Gateway, Grant
from activities.gateway_providers import Credential, Provider, Secret
from activities.sandbox import SandboxSettings, probe, run_sandboxed
from activities.sandbox_gateway import Access
from activities.workspaces import job_workspace
from receipts import metrics
from roles.infra.ports import free_port
from tests.fake_provider import USAGE_IN, USAGE_OUT, FakeProvider, running


def provider(binding: str, api: str, base_url: str, *keys: str) -> Provider:
    credentials = tuple(Credential(f"c{n}", Secret(key), 4) for n, key in enumerate(keys))
    return Provider(binding, api, base_url, credentials)  # type: ignore[arg-type]


@pytest.fixture
def fake() -> Iterator[FakeProvider]:
    keys = {"sk-good": "ok", "sk-quota": "quota", "sk-other": "ok", "sk-no": "forbidden"}
    with running(FakeProvider({**keys, "sk-slow": "slow", "sk-chat": "chat-only"})) as fake:
        yield fake


@pytest.fixture
async def gw(fake: FakeProvider) -> AsyncIterator[Gateway]:
    providers = {
        "openai-main": provider("openai-main", "openai", fake.openai_url, "sk-good"),
        "anthropic-main": provider("anthropic-main", "anthropic", fake.anthropic_url, "sk-good"),
        "openai-tight": provider("openai-tight", "openai", fake.openai_url, "sk-quota", "sk-other"),
        "openai-spent": provider("openai-spent", "openai", fake.openai_url, "sk-quota"),
        "openai-revoked": provider("openai-revoked", "openai", fake.openai_url, "sk-revoked"),
        "openai-off": Provider("openai-off", "openai", fake.openai_url, ()),
        "openai-forbidden": provider("openai-forbidden", "openai", fake.openai_url, "sk-no"),
        "openai-slow": provider("openai-slow", "openai", fake.openai_url, "sk-slow"),
        "openai-chat": provider("openai-chat", "openai", fake.openai_url, "sk-chat"),
        "openai-tools": dataclasses.replace(
            provider("openai-tools", "openai", fake.openai_url, "sk-good"), network_tools=True
        ),
    }
    async with httpx.AsyncClient() as http:
        gateway = Gateway(providers, http)
        yield gateway
        await gateway.close()


def turn(gateway: Gateway, binding: str, job: str = "job-1", org: str = "org-a") -> Grant:
    return gateway.grant(
        job_id=job, attempt=1, agent_id="coder", organization_id=org, binding=binding
    )


def client(grant: Grant) -> httpx.AsyncClient:
    """A client on the turn's own socket, as its sandbox reaches it."""
    transport = httpx.AsyncHTTPTransport(uds=str(grant.socket))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=10)


async def call(grant: Grant, path: str = "/v1/chat/completions", **body: object) -> httpx.Response:
    """One call of the turn on its own socket, with its token (on model `m` unless named)."""
    headers = {"Authorization": f"Bearer {grant.token}", "x-api-key": grant.token}
    async with client(grant) as http:
        return await http.post(path, json={"model": "m", **body}, headers=headers)


async def test_both_api_styles_are_forwarded_streaming_or_not_and_counted(
    gw: Gateway, fake: FakeProvider
) -> None:
    openai, anthropic = turn(gw, "openai-main"), turn(gw, "anthropic-main")
    chat = await call(openai, model="m")
    streamed = await call(openai, model="m", stream=True)
    responses = await call(openai, "/v1/responses", model="m", stream=True, input=[])
    message = await call(anthropic, "/v1/messages", model="m")
    message_stream = await call(anthropic, "/v1/messages", model="m", stream=True)
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "hello"
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]")
    assert '"exec_command"' in responses.text and "response.completed" in responses.text
    assert message.json()["content"][0]["text"] == "hello"
    assert "message_delta" in message_stream.text
    # The provider saw the credential, never the turn's token; the turn saw neither key.
    assert {c.key for c in fake.calls} == {"sk-good"}
    assert [(c.path, c.stream) for c in fake.calls] == [
        ("/v1/chat/completions", False),
        ("/v1/chat/completions", True),
        ("/v1/responses", True),
        ("/v1/messages", False),
        ("/v1/messages", True),
    ]
    assert openai.summary() == {
        "binding": "openai-main",
        "calls": 3,
        "inputTokens": 3 * USAGE_IN,
        "outputTokens": 3 * USAGE_OUT,
    }
    assert (anthropic.calls, anthropic.input_tokens, anthropic.output_tokens) == (
        2,
        2 * USAGE_IN,
        2 * USAGE_OUT,
    )


async def test_a_token_opens_nothing_after_its_turn_nor_on_another_turn_s_socket(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A turn's token is good on its own socket only, and only until the turn ends; a provider
    key is no token; a path of the other API style is not served."""
    mine, theirs = turn(gw, "openai-main", "job-a"), turn(gw, "openai-main", "job-b")
    wrong_style = await call(mine, "/v1/messages")
    async with client(theirs) as http:  # job b's socket, job a's token
        elsewhere = await http.post(
            "/v1/chat/completions", json={}, headers={"Authorization": f"Bearer {mine.token}"}
        )
        stranger = await http.post(
            "/v1/chat/completions", json={}, headers={"Authorization": "Bearer sk-good"}
        )
    socket_dir = mine.socket.parent if mine.socket else None
    gw.revoke(mine)
    async with client(theirs) as http:
        after = await http.post(
            "/v1/chat/completions", json={}, headers={"Authorization": f"Bearer {mine.token}"}
        )
    await asyncio.sleep(0.5)
    assert wrong_style.status_code == 404
    assert (
        elsewhere.status_code == 401 and elsewhere.json()["error"]["type"] == "authentication_error"
    )
    assert stranger.status_code == 401 and after.status_code == 401
    assert socket_dir is not None and not socket_dir.exists()  # its way in is gone with it
    assert fake.calls == []


async def test_quota_rests_a_credential_retries_on_another_and_names_the_recovery_time(
    gw: Gateway, fake: FakeProvider
) -> None:
    tight, spent = turn(gw, "openai-tight", "job-2"), turn(gw, "openai-spent", "job-3")
    before = datetime.now(UTC)
    first = await call(tight)  # two credentials: the one at quota rests, the other answers
    refused = await call(spent)  # one, at quota: the provider's 429 with when it recovers
    assert first.status_code == 200 and tight.quota_until is None
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 29
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert spent.quota_until is not None
    assert before + timedelta(seconds=29) <= spent.quota_until <= before + timedelta(seconds=32)
    assert spent.dead_pool is None


async def test_a_refused_credential_and_an_empty_pool_are_a_dead_pool_without_recovery_time(
    gw: Gateway, fake: FakeProvider
) -> None:
    revoked, off = turn(gw, "openai-revoked"), turn(gw, "openai-off")
    unknown = turn(gw, "no-such-binding")
    answers = [await call(g) for g in (revoked, off, unknown)]
    assert [a.status_code for a in answers] == [503, 503, 503]
    assert revoked.dead_pool == "every credential of 'openai-revoked' was refused"
    assert off.dead_pool == "provider 'openai-off' has no usable credential"
    assert unknown.dead_pool == "no provider is configured for binding 'no-such-binding'"
    assert all(g.quota_until is None for g in (revoked, off, unknown))
    assert "sk-revoked" not in json.dumps([a.json() for a in answers])


async def test_a_401_on_one_path_fails_that_call_and_leaves_the_credential_to_the_others(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A restricted key refused (401) on /v1/responses serves chat still: a tenant calling the
    path its key lacks fails its own call, and another tenant's chat is answered (the credential
    was dropped for every call and every tenant, until the process restarted, before)."""
    hostile = turn(gw, "openai-chat", "job-h", org="org-h")
    refused = [await call(hostile, "/v1/responses", model="m", input=[]) for _ in range(3)]
    victim = turn(gw, "openai-chat", "job-v", org="org-v")
    served = await call(victim, model="m", messages=[])
    assert [r.status_code for r in refused] == [503, 503, 503]
    assert served.status_code == 200, served.text
    assert victim.dead_pool is None
    # Refused on every path of its API for two organizations: a revoked key, dropped.
    [state] = gw.pools["openai-chat"].states
    del fake.keys["sk-chat"]
    assert (await call(victim, model="m", messages=[])).status_code == 503
    assert (await call(victim, "/v1/responses", model="m", input=[])).status_code == 503
    assert state.dropped_until is None  # one organization's calls alone never drop it
    await call(hostile, "/v1/responses", model="m", input=[])
    assert state.dropped_until is not None
    before = len(fake.calls)
    assert (await call(victim, model="m", messages=[])).status_code == 503
    assert len(fake.calls) == before  # dropped: not sent
    # Ten minutes later it is tried again (a key restored, a refusal misattributed).
    fake.keys["sk-chat"] = "chat-only"
    state.dropped_until = datetime.now(UTC) - timedelta(seconds=1)
    assert (await call(victim, model="m", messages=[])).status_code == 200


async def test_a_revoked_key_is_dropped_where_one_organization_calls_the_binding(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A single-tenant install (or an open API: every call of one organization) never meets two
    organizations: a key refused on every path of its API is dropped on its one caller's calls
    (it stayed in the pool, the least busy and so chosen first, each call paying the refusal
    and a key-file read, and receipt_gateway_credentials_dead never rose)."""
    alone = turn(gw, "openai-chat", "job-alone")
    assert (await call(alone, model="m", messages=[])).status_code == 200
    [state] = gw.pools["openai-chat"].states
    del fake.keys["sk-chat"]
    assert (await call(alone, model="m", messages=[])).status_code == 503
    assert state.dropped_until is None  # one path: a restricted key may lack it
    assert (await call(alone, "/v1/responses", model="m", input=[])).status_code == 503
    assert state.dropped_until is not None


# --- from inside the command sandbox ---------------------------------------------------------

SANDBOXED_CALL = r"""
import json, os, urllib.request
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "m"}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
             "Content-Type": "application/json"},
)
answer = json.load(urllib.request.urlopen(request, timeout=10))
print("answer", answer["choices"][0]["message"]["content"])
provider = "http://127.0.0.1:%s/v1/chat/completions" % os.environ["FAKE_PORT"]
try:
    urllib.request.urlopen(provider, timeout=3)
except Exception as exc:
    print("provider unreachable:", type(exc).__name__)
key = ("sk-" + "good").encode()  # spelled apart: this script's own text is in /proc
system = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/proc", "/sys", "/dev")
found = ["env " + name for name, value in os.environ.items() if key.decode() in value]
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in system]
    for name in files:
        path = os.path.join(root, name)
        try:
            with open(path, "rb") as handle:
                if key in handle.read(1 << 20):
                    found.append(path)
        except OSError:
            pass
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as handle:
                if key in handle.read():
                    found.append(f"/proc/{pid}/{part}")
        except OSError:
            pass
print("keys found:", found)
"""


async def test_a_sandboxed_command_reaches_the_gateway_and_no_provider_key(
    gw: Gateway, fake: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's only way out is the forwarder to the gateway's socket: it calls the model
    with its turn's token, cannot reach the provider itself, and finds no key in its
    environment, its files or its processes."""
    monkeypatch.setenv("OPENAI_KEY_MAIN", "sk-good")  # the key where a worker keeps it
    settings = SandboxSettings.load(os.environ)
    ok, message = await probe(settings)
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: {message}")
    grant = turn(gw, "openai-main")
    assert grant.socket is not None
    access = Access(grant.socket, free_port())
    workspace = job_workspace("gateway-tests", f"gateway-{uuid.uuid4().hex[:8]}", settings)
    output: list[str] = []

    async def collect(text: str) -> None:
        output.append(text)

    ended = await run_sandboxed(
        ["/usr/bin/python3", "-c", SANDBOXED_CALL],
        workspace=workspace,
        env={**access.env(grant.token), "FAKE_PORT": str(fake.port)},
        on_output=collect,
        settings=settings,
        gateway=access,
    )
    text = "".join(output)
    assert ended.exit_code == 0, text
    assert "answer hello" in text
    assert "provider unreachable: URLError" in text
    assert "keys found: []" in text
    assert grant.calls == 1 and [c.key for c in fake.calls] == ["sk-good"]


async def test_a_refused_key_is_re_read_from_its_file_and_the_call_goes_through(
    fake: FakeProvider, tmp_path: Path
) -> None:
    """A rotated key: the file changed since the gateway read it; a 401 makes it read again."""
    key_file = tmp_path / "openai.key"
    key_file.write_text("sk-old-and-revoked\n")
    rotated = Provider(
        "rotated",
        "openai",
        fake.openai_url,
        (Credential("file", Secret("sk-old-and-revoked"), 4, key_file),),
    )
    key_file.write_text("sk-good\n")  # rotated after the gateway read it
    async with httpx.AsyncClient() as http:
        gw = Gateway({"rotated": rotated}, http)
        grant = turn(gw, "rotated")
        answer = await call(grant)
        await gw.close()
    assert answer.status_code == 200
    assert [c.key for c in fake.calls] == ["sk-old-and-revoked", "sk-good"]
    assert grant.dead_pool is None


async def test_a_forbidden_call_fails_alone_and_a_turn_s_calls_in_flight_are_bounded(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A 403 (a model the key may not use) is the command's answer, the credential stays in
    use; a turn cannot hold more than its share of the gateway's connections."""
    forbidden, slow = turn(gw, "openai-forbidden"), turn(gw, "openai-slow")
    first, second = await call(forbidden), await call(forbidden)
    async with client(slow) as http:
        bearer = {"Authorization": f"Bearer {slow.token}"}
        calls = [
            http.post("/v1/chat/completions", json={"model": "m"}, headers=bearer)
            for _ in range(MAX_CALLS_PER_GRANT + 2)
        ]
        answers = await asyncio.gather(*calls)
    assert (first.status_code, second.status_code) == (403, 403)  # tried again: not dropped
    assert forbidden.dead_pool is None
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * MAX_CALLS_PER_GRANT + [429, 429]
    assert slow.in_flight == 0 and slow.quota_until is None  # a cap is no quota


async def test_a_model_at_its_limit_rests_a_credential_for_that_model_only(
    gw: Gateway, fake: FakeProvider
) -> None:
    """Providers limit rates per model: one organization's calls to a model at its limit must
    not make another organization's calls to another model wait (they shared the credential's
    rest before)."""
    fake.limited_models.add("tiny-preview")
    try:
        one = turn(gw, "openai-main", "job-a")
        limited = await call(one, model="tiny-preview", messages=[])
        assert limited.status_code == 429 and one.quota_until is not None
        other = gw.grant(
            job_id="job-b", attempt=1, agent_id="coder", organization_id="org-b",
            binding="openai-main",
        )  # fmt: skip
        served = await call(other, model="gpt-test", messages=[])
        assert served.status_code == 200, served.text
        assert other.quota_until is None
        again = await call(other, model="tiny-preview", messages=[])
        assert again.status_code == 429  # that model rests, without a call to the provider
        # A turn that uses two models keeps the quota its main one met when the other is served.
        served = await call(one, model="gpt-test", messages=[])
        assert served.status_code == 200 and one.quota_until is not None
        # A large body is read for its model all the same: still that model's rest.
        large = await call(other, model="tiny-preview", messages=[{"content": "x" * 1_200_000}])
        assert large.status_code == 429
        third = gw.grant(
            job_id="job-c", attempt=1, agent_id="coder", organization_id="org-c",
            binding="openai-main",
        )  # fmt: skip
        assert (await call(third, model="gpt-test", messages=[])).status_code == 200
    finally:
        fake.limited_models.clear()
        for state in gw.pools["openai-main"].states:
            state.resting_models.clear()


async def test_a_body_nested_past_the_parser_is_refused_as_naming_no_model(gw: Gateway) -> None:
    """Reading a call's model must not fail the gateway on a body too deep to parse."""
    grant = turn(gw, "openai-main")
    headers = {"Authorization": f"Bearer {grant.token}", "Content-Type": "application/json"}
    async with client(grant) as http:
        answer = await http.post("/v1/chat/completions", content=b"[" * 100_000, headers=headers)
    assert answer.status_code == 400
    assert grant.in_flight == 0


async def post_raw(grant: Grant, body: bytes, path: str = "/v1/chat/completions") -> httpx.Response:
    headers = {"Authorization": f"Bearer {grant.token}", "Content-Type": "application/json"}
    async with client(grant) as http:
        return await http.post(path, content=body, headers=headers)


async def test_a_background_response_is_refused_before_the_provider(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A background response (Responses API) answers at once, queued, with no usage, and runs
    on at the provider past the turn: forwarded, its tokens were counted as none, so a command
    spent past its organization's budget at will. Refused 400 naming `background`, nothing
    sent; `background: false` is an ordinary call."""
    grant = turn(gw, "openai-main")
    sent = len(fake.calls)
    for flag in (True, "yes"):
        body = {"model": "gpt-test", "input": [], "background": flag}
        refused = await post_raw(grant, json.dumps(body).encode(), "/v1/responses")
        assert refused.status_code == 400, refused.text
        assert "`background`" in refused.json()["error"]["message"]
    assert len(fake.calls) == sent
    body = {"model": "gpt-test", "input": [], "background": False}
    assert (await post_raw(grant, json.dumps(body).encode(), "/v1/responses")).status_code == 200
    assert len(fake.calls) == sent + 1


async def test_a_search_model_is_refused_unless_the_binding_allows_network_tools(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A search model searches the web on every call, as the web search tool the gateway takes
    out does: through it a command could carry what it wrote to a host. Refused 400 naming the
    model, nothing sent, on a binding without network tools; a model merely named like one
    (`research-…`, `searcher`) is an ordinary call."""
    grant = turn(gw, "openai-main")
    sent = len(fake.calls)
    for model in ("gpt-4o-search-preview", "gpt-4o-mini-search-preview", "gpt-5-search-api"):
        refused = await call(grant, model=model, messages=[])
        assert refused.status_code == 400, refused.text
        assert model in refused.json()["error"]["message"]
    assert len(fake.calls) == sent
    for model in ("research-assistant", "searcher-1"):
        assert (await call(grant, model=model, messages=[])).status_code == 200
    allowed = turn(gw, "openai-tools", "job-tools")  # a binding with networkTools: true
    answer = await call(allowed, model="gpt-4o-search-preview", messages=[])
    assert answer.status_code == 200


async def test_a_call_s_model_is_its_body_s_top_level_one_else_the_call_is_refused(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A 429 rests a credential for the model the call names at its body's top level. Of a body
    over 1 MiB only the first 64 KiB were searched, for the first `"model"` at any depth: a
    model written after the messages rested the credential for every model, and a nested one
    (in metadata) rested the model it named — either way a tenant at its own model's limit made
    another tenant's model wait. A body naming no model is refused: it never rests every one."""
    fake.limited_models.add("tiny-preview")
    hostile = turn(gw, "openai-main", "job-h", org="org-h")
    victim = turn(gw, "openai-main", "job-v", org="org-v")
    long = [{"role": "user", "content": "x" * 1_200_000}]
    try:
        late = {"messages": long, "model": "tiny-preview"}
        assert (await post_raw(hostile, json.dumps(late).encode())).status_code == 429
        assert (await call(victim, model="gpt-test", messages=[])).status_code == 200
        nested = {"metadata": {"model": "gpt-test"}, "messages": long, "model": "tiny-preview"}
        assert (await post_raw(hostile, json.dumps(nested).encode())).status_code == 429
        assert (await call(victim, model="gpt-test", messages=[])).status_code == 200
        assert victim.quota_until is None
        sent = len(fake.calls)
        for body in ({"messages": long}, {"metadata": {"model": "gpt-test"}}, {"model": 5}, []):
            refused = await post_raw(hostile, json.dumps(body).encode())
            assert refused.status_code == 400, refused.text
            assert "`model`" in refused.json()["error"]["message"]
        assert len(fake.calls) == sent  # refused before the provider
        assert (await call(victim, model="gpt-test", messages=[])).status_code == 200
    finally:
        fake.limited_models.clear()
        for state in gw.pools["openai-main"].states:
            state.resting_models.clear()


async def raw_request(
    grant: Grant, head: bytes, body: bytes = b""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A request written by hand on the turn's socket (its head, and as much body as given)."""
    reader, writer = await asyncio.open_unix_connection(str(grant.socket))
    writer.write(head + body)
    await writer.drain()
    return reader, writer


async def test_bodies_still_arriving_count_as_calls_in_flight(gw: Gateway) -> None:
    """A call is counted from its first byte, not once its body is read: a turn that opens
    calls and never finishes their bodies holds neither more than its share of calls nor more
    bodies in the worker's memory."""
    grant = turn(gw, "openai-main")
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {grant.token}\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    held = [await raw_request(grant, head, b"{") for _ in range(MAX_CALLS_PER_GRANT)]
    try:
        for _ in range(100):
            if grant.in_flight == MAX_CALLS_PER_GRANT:
                break
            await asyncio.sleep(0.02)
        assert grant.in_flight == MAX_CALLS_PER_GRANT
        refused = await call(grant, model="gpt-test", messages=[])
        assert refused.status_code == 429
    finally:
        for _, writer in held:
            writer.close()
    for _ in range(100):
        if grant.in_flight == 0:
            break
        await asyncio.sleep(0.02)
    assert grant.in_flight == 0  # a body that never came is a call that ended


async def test_a_request_head_is_bounded_before_its_token_is_read(gw: Gateway) -> None:
    """Headers are read before the token is looked at: their size is bounded (h11's limit), so
    a command cannot grow the worker's memory by sending megabytes of them."""
    grant = turn(gw, "openai-main")
    pad = ("X-Pad: " + "a" * 8000 + "\r\n").encode()
    start = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
    reader, writer = await raw_request(grant, start)
    try:
        for _ in range(512):  # 4 MiB of headers, then the end of the head
            writer.write(pad)
            await writer.drain()
        writer.write(b"\r\n")
        await writer.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the gateway stopped reading: refused before the head ended
    try:
        answer = await asyncio.wait_for(reader.read(200), 10)
    except (BrokenPipeError, ConnectionResetError):
        answer = b""  # closed on it
    finally:
        writer.close()
    # Refused for its size, not read whole and then refused for its missing token (401).
    assert not answer.startswith((b"HTTP/1.1 401", b"HTTP/1.1 2")), answer


async def test_a_later_success_clears_the_quota_a_turn_met(gw: Gateway, fake: FakeProvider) -> None:
    grant = turn(gw, "openai-spent", "job-9")
    refused = await call(grant)
    assert refused.status_code == 429 and grant.quota_until is not None
    fake.keys["sk-quota"] = "ok"
    for state in gw.pools["openai-spent"].states:
        state.resting_models.clear()  # its reset came
    later = await call(grant)
    assert later.status_code == 200 and grant.quota_until is None


async def test_the_gateway_s_own_refusals_are_counted_logged_and_shaped_as_the_provider_s(
    gw: Gateway, fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """A forged token, a path or method the gateway does not serve, a body naming no model:
    each refused in the provider's error shape (an unknown path was Starlette's plain text),
    counted by reason in receipt_gateway_refused_total and logged (`gateway.refused`) — a forged
    token is what an operator wants to see; a flood of them is one line per 10 s per turn."""
    from receipts import metrics

    def refused(reason: str) -> float:
        return metrics.GATEWAY_REFUSED.labels("openai-main", reason)._value.get()

    before = {r: refused(r) for r in ("token", "unknown_path", "no_model")}
    grant = turn(gw, "openai-main", "job-refused")
    async with client(grant) as http:
        forged = [
            await http.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer x"})
            for _ in range(3)
        ]
        unknown = await http.post(
            "/v1/embeddings",
            json={"model": "m"},
            headers={"Authorization": f"Bearer {grant.token}"},
        )
        wrong_method = await http.get("/v1/chat/completions")
    no_model = await call(grant, model=None)
    assert [f.status_code for f in forged] == [401] * 3
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert "POST /v1/chat/completions" in unknown.json()["error"]["message"]
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert no_model.status_code == 400
    assert (refused("token"), refused("unknown_path"), refused("no_model")) == (
        before["token"] + 3,
        before["unknown_path"] + 2,
        before["no_model"] + 1,
    )
    logged = [r for r in caplog.records if getattr(r, "event", None) == "gateway.refused"]
    assert [getattr(r, "reason", None) for r in logged] == ["token", "unknown_path", "no_model"]
    assert fake.calls == []


async def test_tools_that_reach_the_network_from_the_provider_are_taken_out_unless_allowed(
    gw: Gateway, fake: FakeProvider
) -> None:
    """The command's sandbox has no network, but a remote MCP server, web search or web fetch
    run by the provider would reach any host with what the command puts in its call: taken out
    of the call (agent CLIs offer web search by default, so the call is not refused), counted by
    family, unless the binding allows them (`networkTools`); a function tool stays."""
    from receipts import metrics

    def removed(binding: str, family: str) -> float:
        return metrics.GATEWAY_TOOLS_REMOVED.labels(binding, family)._value.get()

    before = removed("openai-main", "mcp"), removed("anthropic-main", "mcp_servers")
    openai, anthropic = turn(gw, "openai-main", "job-t1"), turn(gw, "anthropic-main", "job-t2")
    function = {"type": "function", "name": "f", "parameters": {}}
    mcp = {"type": "mcp", "server_label": "x", "server_url": "https://attacker.example/mcp"}
    answers = [
        await call(openai, "/v1/responses", input=[], tools=[function, mcp]),
        await call(openai, "/v1/responses", input=[], tools=[{"type": "web_search"}]),
        await call(
            anthropic,
            "/v1/messages",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            mcp_servers=[{"type": "url", "url": "https://attacker.example/mcp", "name": "x"}],
            tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}],
        ),
    ]
    assert [a.status_code for a in answers] == [200] * 3
    assert [c.tools for c in fake.calls] == [("function",), (), ()]  # what reached the provider
    assert removed("openai-main", "mcp") == before[0] + 1
    assert removed("anthropic-main", "mcp_servers") == before[1] + 1
    allowed = turn(gw, "openai-tools", "job-t3")
    assert (await call(allowed, "/v1/responses", input=[], tools=[mcp])).status_code == 200
    assert fake.calls[-1].tools == ("mcp",)


async def test_a_call_the_command_left_running_is_in_the_turn_s_usage(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A command that gives up on a slow call and exits leaves it running at the provider,
    billed: the turn's end waits for it (`drain`), so its cost is in the turn's usage (it was
    counted after the summary went into the result: calls 0). One still running past the wait
    is counted as unsettled."""
    from receipts import metrics

    fake.slow_s, fake.slow_body_s = 1.5, 0.3  # its body comes well after the hang-up is known
    grant = turn(gw, "openai-slow", "job-drain")
    headers = {"Authorization": f"Bearer {grant.token}"}
    async with client(grant) as http:
        with pytest.raises(httpx.ReadTimeout):  # the command's client gives up, and exits
            await http.post(
                "/v1/chat/completions", json={"model": "m"}, headers=headers, timeout=0.3
            )
    assert grant.calls == 0 and grant.in_flight == 1
    await gw.drain(grant)
    assert (grant.calls, grant.input_tokens, grant.output_tokens) == (1, USAGE_IN, USAGE_OUT)
    assert gw.pools["openai-slow"].affinity == {}  # the turn's credential affinity went with it

    unsettled = metrics.GATEWAY_USAGE_UNSETTLED.labels("openai-slow")
    before = unsettled._value.get()
    late = turn(gw, "openai-slow", "job-drain-late")
    async with client(late) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post(
                "/v1/chat/completions",
                json={"model": "m"},
                headers={"Authorization": f"Bearer {late.token}"},
                timeout=0.3,
            )
    await gw.drain(late, timeout_s=0.1)
    assert late.calls == 0 and unsettled._value.get() == before + 1


async def test_a_turn_s_bodies_in_flight_are_bounded_together(
    gw: Gateway, fake: FakeProvider
) -> None:
    """Each body may be 32 MiB and a turn has 8 calls in flight, each body held until its answer
    is sent: 256 MiB a turn, several turns a worker (an OOM kill takes every tenant's turn on
    it). Together a turn's bodies in flight hold at most 64 MiB: past that a call is 413, and
    what each held is given back when it ends."""
    from activities.gateway_grant import MAX_GRANT_BODY_BYTES

    fake.slow_s = 1.0
    grant = turn(gw, "openai-slow", "job-bodies")
    pad = "x" * (MAX_GRANT_BODY_BYTES // 3 + 1024)
    answers = await asyncio.gather(*(call(grant, messages=[], pad=pad) for _ in range(3)))
    statuses = sorted(a.status_code for a in answers)
    assert 413 in statuses and 200 in statuses, statuses
    refused = next(a for a in answers if a.status_code == 413)
    assert f"at most {MAX_GRANT_BODY_BYTES} together" in refused.json()["error"]["message"]
    assert grant.body_bytes == 0 and grant.in_flight == 0
    assert (await call(grant, messages=[], pad=pad)).status_code == 200  # given back


async def test_a_turn_holds_at_most_its_bound_of_connections_open(gw: Gateway) -> None:
    """`limit_concurrency` bounds the requests being served, not the connections: a command
    opening connections and sending nothing held a descriptor each, until the worker had none
    left for any other job's sandbox or grant. Past the bound a connection is closed as made
    (counted); the turn's own calls and another turn's go on."""
    grant = turn(gw, "openai-main")
    before = metrics.value(
        "receipt_gateway_refused_total", binding="openai-main", reason="connections"
    )
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            _, writer = await asyncio.open_unix_connection(str(grant.socket))
            held.append(writer)
        await asyncio.sleep(0.2)  # every one made on the server's side
        descriptors = len(os.listdir("/proc/self/fd"))
        extra: list[asyncio.StreamWriter] = []
        for _ in range(50):
            reader, writer = await asyncio.open_unix_connection(str(grant.socket))
            extra.append(writer)
            assert await asyncio.wait_for(reader.read(1), 5) == b""  # closed as made
        for writer in extra:
            writer.close()
        await asyncio.sleep(0.2)
        assert len(os.listdir("/proc/self/fd")) <= descriptors + 10
        refused = metrics.value(
            "receipt_gateway_refused_total", binding="openai-main", reason="connections"
        )
        assert refused == before + 50
        assert (await call(turn(gw, "openai-main", job="job-2"))).status_code == 200
    finally:
        for writer in held:
            writer.close()
    await asyncio.sleep(0.2)
    assert (await call(grant)).status_code == 200


async def test_the_provider_is_called_on_the_path_the_route_matched_whatever_the_host(
    gw: Gateway, fake: FakeProvider
) -> None:
    """The upstream path is the one the gateway serves, never one rebuilt from the command's
    `Host` header (an unparsable one made it the socket's path)."""
    grant = turn(gw, "openai-main")
    headers = {"Authorization": f"Bearer {grant.token}", "Host": "gateway/v1/files?"}
    async with client(grant) as http:
        answer = await http.post("/v1/chat/completions", json={"model": "m"}, headers=headers)
    assert answer.status_code == 200, answer.text
    assert [c.path for c in fake.calls] == ["/v1/chat/completions"]


async def test_a_call_sent_as_its_turn_ends_is_refused_though_its_socket_still_listens(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A revoked grant's token opens nothing on its own socket either, in the moment before the
    socket closes (its server stops on its next tick)."""
    grant = turn(gw, "openai-main", "job-r")
    async with client(grant) as http:
        bearer = {"Authorization": f"Bearer {grant.token}"}
        before = await http.post("/v1/chat/completions", json={"model": "m"}, headers=bearer)
        gw.revoke(grant)
        try:  # the kept-alive connection, as the server has not yet closed it; refused for
            # its token before its body is read (no model named: else a 400)
            after: int | None = (
                await http.post("/v1/chat/completions", json={}, headers=bearer)
            ).status_code
        except httpx.HTTPError:
            after = None  # closed already: refused all the same
    await asyncio.sleep(0.5)  # its server stops, its socket closes
    assert before.status_code == 200
    assert after in (401, None)
    assert len(fake.calls) == 1


async def test_a_later_refusal_keeps_the_quota_a_turn_met(gw: Gateway, fake: FakeProvider) -> None:
    """Only an answered call clears the quota its model met: a later 4xx is the command's own
    failure, and the turn still settles as a placement delay."""
    grant = turn(gw, "openai-spent", "job-q")
    refused = await call(grant)
    assert refused.status_code == 429 and grant.quota_until is not None
    fake.keys["sk-quota"] = "forbidden"
    for state in gw.pools["openai-spent"].states:
        state.resting_models.clear()  # its reset came
    later = await call(grant)
    assert later.status_code == 403 and grant.quota_until is not None


async def test_a_network_tool_hidden_behind_a_repeated_tools_key_is_taken_out(
    gw: Gateway, fake: FakeProvider
) -> None:
    """JSON allows a key twice: the gateway reads the last `tools`, a provider might read the
    first; such a body is written again from its parse, so no network tool reaches it."""
    grant = turn(gw, "openai-main", "job-d")
    body = (
        b'{"model":"m","input":[],"tools":[{"type":"web_search"}],'
        b'"tools":[{"type":"function","name":"f","parameters":{}}]}'
    )
    headers = {"Authorization": f"Bearer {grant.token}", "content-type": "application/json"}
    async with client(grant) as http:
        answer = await http.post("/v1/responses", content=body, headers=headers)
    assert answer.status_code == 200
    assert len(fake.bodies) == 1 and b"web_search" not in fake.bodies[0]


async def test_a_turn_whose_calls_have_all_ended_settles_without_waiting(
    gw: Gateway, fake: FakeProvider
) -> None:
    """`drain` waits for calls still in flight only: a turn whose calls were all answered is
    not held its full drain time."""
    grant = turn(gw, "openai-main", "job-i")
    assert (await call(grant)).status_code == 200
    assert grant.in_flight == 0 and grant.idle.is_set()
    started = asyncio.get_running_loop().time()
    await gw.drain(grant, timeout_s=5.0)
    took = asyncio.get_running_loop().time() - started
    await asyncio.sleep(0.5)  # its server stops, its socket closes
    assert took < 1.0


async def test_a_transport_error_naming_the_key_reaches_the_command_redacted() -> None:
    """An error of the way to the provider is the command's answer (502): a key it names (a
    proxy's or a library's message quoting the request) is written `***`."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused: {request.headers['authorization']}", request=request)

    leaky = provider("leaky", "openai", "http://provider.invalid/v1", "sk-secret-key")
    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as http:
        gateway = Gateway({"leaky": leaky}, http)
        grant = turn(gateway, "leaky")
        answer = await call(grant)
        await gateway.close()
    assert answer.status_code == 502
    assert "sk-secret-key" not in answer.text and "***" in answer.text


@pytest.mark.parametrize("stream", [False, True])
async def test_a_provider_s_error_answer_naming_the_key_reaches_the_command_redacted(
    stream: bool,
) -> None:
    """A proxy or provider answering an error with the request quoted (its key with it): the
    answer is the command's, its key written `***` however the body came in pieces."""
    key = "sk-secret-key-0123456789"

    def quote(request: httpx.Request) -> httpx.Response:
        text = f'{{"error": {{"message": "bad header: {request.headers["authorization"]}"}}}}'
        pieces = [text[i : i + 7].encode() for i in range(0, len(text), 7)]  # the key split
        content = httpx.ByteStream(b"".join(pieces)) if not stream else _pieces(pieces)
        kind = "text/event-stream" if stream else "application/json"
        return httpx.Response(400, headers={"content-type": kind}, stream=content)

    leaky = provider("leaky", "openai", "http://provider.invalid/v1", key)
    async with httpx.AsyncClient(transport=httpx.MockTransport(quote)) as http:
        gateway = Gateway({"leaky": leaky}, http)
        grant = turn(gateway, "leaky")
        answer = await call(grant, stream=stream)
        await gateway.close()
    assert answer.status_code == 400
    assert key not in answer.text and "Bearer ***" in answer.text


class _pieces(httpx.AsyncByteStream):
    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


async def test_a_body_declared_past_the_bound_is_refused_before_it_is_sent(gw: Gateway) -> None:
    """A `content-length` past MAX_REQUEST_BYTES is answered 413 at once: the gateway does not
    wait for (nor hold) a body it will refuse."""
    grant = turn(gw, "openai-main")
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"
        f"Authorization: Bearer {grant.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {33 * 1024 * 1024}\r\n\r\n"
    ).encode()
    reader, writer = await raw_request(grant, head)
    try:
        answer = await asyncio.wait_for(reader.read(200), 3)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer


async def test_a_chunked_body_past_the_bound_is_refused_as_it_arrives(
    gw: Gateway, fake: FakeProvider
) -> None:
    """A body sent with no `content-length` is bounded as it arrives: past MAX_REQUEST_BYTES it
    is refused (413) though the turn's bodies together are within theirs."""
    grant = turn(gw, "openai-main")
    filler = b"a" * (1024 * 1024)

    async def body() -> AsyncIterator[bytes]:
        yield b'{"model":"m","pad":"'
        for _ in range(33):
            yield filler
        yield b'"}'

    headers = {"Authorization": f"Bearer {grant.token}", "content-type": "application/json"}
    async with client(grant) as http:
        try:
            status = await http.post("/v1/chat/completions", content=body(), headers=headers)
            answer: int | None = status.status_code
        except httpx.HTTPError:
            answer = None  # refused and closed while still sending
    assert answer in (413, None)
    assert fake.calls == []


async def test_an_anthropic_client_s_x_api_key_is_its_turn_s_token(
    gw: Gateway, fake: FakeProvider
) -> None:
    """Anthropic's clients send their key as `x-api-key` alone: the turn's token there opens the
    turn's socket as a bearer token does."""
    grant = turn(gw, "anthropic-main", "job-x")
    async with client(grant) as http:
        answer = await http.post(
            "/v1/messages", json={"model": "m"}, headers={"x-api-key": grant.token}
        )
    assert answer.status_code == 200 and [c.key for c in fake.calls] == ["sk-good"]


async def test_a_reset_a_moment_away_is_waited_for_once_then_named(
    gw: Gateway, fake: FakeProvider
) -> None:
    fake.quota_s = 1  # every credential rests for a second: waited for, then tried again
    grant = turn(gw, "openai-spent", "job-w")
    answer = await call(grant)
    assert answer.status_code == 429 and grant.quota_until is not None
    assert [c.key for c in fake.calls] == ["sk-quota", "sk-quota"]
