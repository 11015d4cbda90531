"""Organization B of the hostile tenant (tools/chaos/hostile.py): enqueues past its rate from
raw kept-alive connections, the most event streams its token may hold and one more, bodies at
and past the cap, and a command against each sandbox limit. It runs in a process of its own
(`run_tenant_b`), so that A's client, whose latencies are the measurement, shares no event loop
with B's load: in one process, A's answers waited behind B's hundreds of answers a second."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from receipts.tenancy import scoped_id

ORG_B = "tenant-b"
MAX_BODY_BYTES = 256 * 1024
STREAMS_PER_CALLER = 20
OUTPUT_LINE = "hostile tenant output"
# B's commands, each against one limit: what it does, and the argv.
BOMBS: dict[str, list[str]] = {
    "fork": ["sh", "-c", "f() { f | f & }; f; sleep 4"],
    "file_size": ["sh", "-c", "head -c 1073741824 /dev/zero > big"],
    "cpu": ["sh", "-c", "while :; do :; done"],
    "output": ["yes", OUTPUT_LINE],
    "memory": ["python3", "-c", "b = bytearray(1 << 30)"],
}
BOMB_EVERY_S = 8.0  # B starts each kind of command once per this many seconds
FLOOD_CLIENTS = 6
FLOOD_PACE_S = 0.01  # each flood client posts at most this often: the flood is bounded
BODY_EVERY_S = 1.0  # B posts one maximum-size body and one over the cap per this many seconds
TOKEN_VARIABLE = "HOSTILE_B_TOKEN"  # how the process is handed B's token (not on its argv)
READY = "ready"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TenantB:
    """What B's process saw: its answers by status, the streams it held, what the one more was
    answered, its admitted commands' job ids by kind, and its own CPU seconds."""

    answers: Counter[str] = field(default_factory=Counter)
    streams_held: int = 0
    stream_refusal: str = ""
    bomb_jobs: dict[str, list[str]] = field(default_factory=dict)
    cpu_s: float = 0.0


def body_of(org: str, job_id: str, command: list[str], **payload: Any) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "maxAttempts": 1,
        "payload": {
            "kind": "factory.task.run",
            "authContext": {"userId": "hostile", "organizationId": org},
            "task": {"command": command},
            **payload,
        },
    }


def sized_body(org: str, size: int) -> bytes:
    """An enqueue body of exactly `size` bytes (a padded note in the payload)."""
    body = body_of(org, f"b-big-{uuid.uuid4().hex[:12]}", ["true"], note="")
    bare = len(json.dumps(body).encode())
    body["payload"]["note"] = "x" * (size - bare)
    encoded = json.dumps(body).encode()
    assert len(encoded) == size
    return encoded


def raw_post(token: str, body: bytes) -> bytes:
    """An enqueue of B's as HTTP/1.1 bytes (keep-alive)."""
    head = (
        "POST /agents/codex/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def raw_answer(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 answer (status line, headers, a Content-Length body); its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length:
        await reader.readexactly(length)
    return status


async def _b_post(
    api_url: str, http: httpx.AsyncClient, headers: dict[str, str], seen: TenantB, content: bytes
) -> httpx.Response | None:
    try:
        response = await http.post(
            f"{api_url}/agents/codex/jobs",
            content=content,
            headers=headers | {"Content-Type": "application/json"},
            timeout=30,
        )
    except httpx.HTTPError as exc:
        seen.answers[type(exc).__name__] += 1
        return None
    seen.answers[str(response.status_code)] += 1
    return response


async def tenant_b(
    api_url: str, http: httpx.AsyncClient, token: str, seen: TenantB, duration_s: float
) -> None:
    """B's flood for `duration_s`: enqueues past its rate, the most event streams its token may
    hold (and one more), bodies at and past the cap, and a command against each sandbox limit
    every BOMB_EVERY_S."""
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + duration_s
    stop = asyncio.Event()

    async def flood() -> None:
        # Raw HTTP/1.1 on one kept-alive connection, as wrk would load it: an httpx client
        # spends several times the CPU the api spends refusing its request, and on this
        # machine the load shares the cores it measures.
        port = int(api_url.rsplit(":", 1)[1])
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError as exc:
                seen.answers[type(exc).__name__] += 1
                await asyncio.sleep(0.5)
                continue
            try:
                while time.monotonic() < deadline:
                    body = json.dumps(
                        body_of(ORG_B, f"b-flood-{uuid.uuid4().hex[:12]}", ["true"])
                    ).encode()
                    writer.write(raw_post(token, body))
                    status = await raw_answer(reader)
                    seen.answers[str(status)] += 1
                    await asyncio.sleep(FLOOD_PACE_S)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                seen.answers[type(exc).__name__] += 1
            finally:
                writer.close()

    async def bodies() -> None:
        while time.monotonic() < deadline:
            await _b_post(api_url, http, headers, seen, sized_body(ORG_B, MAX_BODY_BYTES))
            await _b_post(api_url, http, headers, seen, sized_body(ORG_B, MAX_BODY_BYTES + 1))
            await asyncio.sleep(BODY_EVERY_S)

    async def bomb_round() -> None:
        for kind, argv in BOMBS.items():
            job_id = f"b-{kind}-{uuid.uuid4().hex[:8]}"
            body = json.dumps(body_of(ORG_B, job_id, argv)).encode()
            # B's own flood spends its rate: each command is posted again until admitted.
            while time.monotonic() < deadline:
                response = await _b_post(api_url, http, headers, seen, body)
                if response is not None and response.status_code == 202:
                    seen.bomb_jobs.setdefault(kind, []).append(scoped_id(ORG_B, job_id))
                    break
                await asyncio.sleep(0.1)

    async def bombs() -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(BOMB_EVERY_S)
            await bomb_round()

    async def hold_stream(url: str, opened: asyncio.Event) -> None:
        with contextlib.suppress(httpx.HTTPError):
            async with http.stream(
                "GET", url, headers=headers | {"Accept": "text/event-stream"}, timeout=None
            ) as response:
                seen.answers[f"stream {response.status_code}"] += 1
                if response.status_code == 200:
                    seen.streams_held += 1
                opened.set()
                if response.status_code == 200:
                    await stop.wait()
        opened.set()

    # The streams follow one job of B's held queued for an hour (a job's stream is live until
    # it settles), cancelled when the phase is over; posted before the flood, as the first
    # round of commands is.
    long_id = f"b-long-{uuid.uuid4().hex[:8]}"
    long_body = body_of(ORG_B, long_id, ["true"]) | {"delayMs": 3_600_000}

    async def post_long_job() -> None:
        response = None
        while (response is None or response.status_code == 429) and time.monotonic() < deadline:
            response = await _b_post(api_url, http, headers, seen, json.dumps(long_body).encode())
            if response is None or response.status_code == 429:
                await asyncio.sleep(0.2)

    async def streams() -> None:
        url = f"{api_url}/jobs/{long_id}/events"
        holders = []
        for _ in range(STREAMS_PER_CALLER):
            opened = asyncio.Event()
            holders.append(asyncio.create_task(hold_stream(url, opened)))
            await opened.wait()
        refused = await http.get(url, headers=headers | {"Accept": "text/event-stream"})
        seen.answers[f"stream {refused.status_code}"] += 1
        said = refused.json()["error"]["message"] if refused.status_code == 429 else refused.text
        seen.stream_refusal = f"{refused.status_code} {said[:200]}"
        await stop.wait()
        await asyncio.gather(*holders, return_exceptions=True)
        await http.post(
            f"{api_url}/jobs/{long_id}/commands",
            json={"type": "abort", "reason": "hostile run over"},
            headers=headers,
        )

    async def clock() -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        stop.set()

    # The first round of commands goes in before the flood (from the burst B's rate allows):
    # once six connections post without pause, a post of B's rarely finds a token.
    await post_long_job()
    await bomb_round()
    await asyncio.gather(
        clock(), streams(), bodies(), bombs(), *(flood() for _ in range(FLOOD_CLIENTS))
    )


async def start_tenant_b(api_url: str, token: str, duration_s: float) -> asyncio.Task[TenantB]:
    """Start B in a process of its own; once it is ready (its imports and client made), return
    the task that ends with what it saw, `duration_s` later."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.chaos.hostile_b",
        api_url,
        str(duration_s),
        cwd=ROOT,
        env=os.environ | {TOKEN_VARIABLE: token},
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    if (await process.stdout.readline()).decode().strip() != READY:
        raise RuntimeError(f"tenant B's process did not start (exit {await process.wait()})")
    return asyncio.create_task(_finished(process))


async def _finished(process: asyncio.subprocess.Process) -> TenantB:
    assert process.stdout is not None
    out = await process.stdout.read()
    if await process.wait() != 0:
        raise RuntimeError(f"tenant B's process exited {process.returncode}")
    seen = json.loads(out.decode().splitlines()[-1])
    return TenantB(
        Counter(seen["answers"]),
        seen["streams_held"],
        seen["stream_refusal"],
        seen["bomb_jobs"],
        seen["cpu_s"],
    )


async def _main(api_url: str, token: str, duration_s: float) -> TenantB:
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    seen = TenantB()
    async with httpx.AsyncClient(limits=limits) as http:
        print(READY, flush=True)
        await tenant_b(api_url, http, token, seen, duration_s)
    seen.cpu_s = time.process_time()
    return seen


if __name__ == "__main__":
    logging.getLogger("httpx").setLevel(logging.WARNING)
    url, seconds = sys.argv[1], float(sys.argv[2])
    seen = asyncio.run(_main(url, os.environ[TOKEN_VARIABLE], seconds))
    # Not `dataclasses.asdict`: it rebuilds a Counter from its items, counting the pairs.
    print(json.dumps({f.name: getattr(seen, f.name) for f in dataclasses.fields(seen)}))
