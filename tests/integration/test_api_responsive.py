"""The hostile load of the README's Security section against a real `receipt api` at its
production limits: each request gets its answer and `/healthz` stays under 50 ms (the median of a
probe that polls it throughout).

The median is what the test holds to 50 ms: on a shared 2-core machine a single probe may wait
for the scheduler (once 2.1 s, while other tests restarted PostgreSQL and Temporal beside it), so
the worst one is held to 3 s — the blocking found took 6.6 s — and every figure is printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.api_support import (
    TOKENS,
    HealthProbe,
    RunningApi,
    enqueue_body,
    running_api,
)

STREAM_TOKENS = [f"token-streamer-{n:02d}-0123456789abcdef" for n in range(20)]
ORG_TOKEN = "token-org-hog-0123456789abcdef"
AS_HOG = {"Authorization": f"Bearer {ORG_TOKEN}"}
AS_NEIGHBOUR = {"Authorization": "Bearer token-org-b-0123456789abcdef"}
HEALTHZ_MEDIAN_S = 0.050
HEALTHZ_WORST_S = 3.0


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    tokens = "\n".join(
        [
            TOKENS,
            f"{ORG_TOKEN} org-hog",
            *(f"{t} org-streams-{n}" for n, t in enumerate(STREAM_TOKENS)),
        ]
    )
    with running_api(
        db_url,
        Path(tmp_path_factory.mktemp("api-responsive")),
        RECEIPT_API_TOKENS=tokens,
        # The production defaults (api_support lifts the organization caps for other tests).
        RECEIPT_ORG_MAX_QUEUED="1000",
        RECEIPT_ORG_ENQUEUE_RATE="50",
        RECEIPT_ORG_ENQUEUE_BURST="200",
        RECEIPT_RATE_REFUSAL_HOLD_MS="1000",
        RECEIPT_SSE_MAX_STREAMS="1000",
        RECEIPT_SSE_MAX_STREAMS_PER_CALLER="50",
    ) as api:
        yield api


async def test_healthz_stays_under_50_ms_while_the_hostile_requests_run(api: RunningApi) -> None:
    limits = httpx.Limits(max_connections=1200, max_keepalive_connections=1200)
    async with httpx.AsyncClient(base_url=api.url, timeout=60, limits=limits) as http:
        target = await http.post(
            "/agents/codex/jobs", json=enqueue_body(org="org-b"), headers=AS_NEIGHBOUR
        )
        assert target.status_code == 202, target.text
        job_id = target.json()["job"]["jobId"]

        with HealthProbe(api.url) as probe:
            # Freezing bodies: a 520 KB key and a 260k-element list; refused, 422.
            huge = {"payload": {"kind": "factory.task.run", "k" * 520_000: [0] * 260_000}}
            content = json.dumps(huge, separators=(",", ":")).encode()
            frozen = await http.post(
                "/agents/codex/jobs",
                content=content,
                headers={**AS_NEIGHBOUR, "Content-Type": "application/json"},
            )
            assert frozen.status_code == 422

            # 24 follow-ups of 500 KB: each refused, 422 naming the payload.
            big = {"type": "follow_up", "payload": {"text": "x" * 500_000}}
            follow_ups = [
                await http.post(f"/jobs/{job_id}/commands", json=big, headers=AS_NEIGHBOUR)
                for _ in range(24)
            ]
            assert {r.status_code for r in follow_ups} == {422}

            # 2 000 hour-long jobs from one organization: the burst is taken, then 429.
            long_job = enqueue_body(
                org="org-hog",
                payload_extra={"task": {"command": ["sleep", "3600"]}, "timeoutMs": 3_600_000},
            )
            statuses: list[int] = []

            async def hog(n: int) -> None:
                for _ in range(n):
                    response = await http.post("/agents/codex/jobs", json=long_job, headers=AS_HOG)
                    statuses.append(response.status_code)

            await asyncio.gather(*(hog(250) for _ in range(8)))
            assert len(statuses) == 2000 and set(statuses) == {202, 429}
            # The burst and what the rate refills while the flood runs, never past the queue
            # cap by more than the 8 enqueues in flight at once (the cap reads the
            # organization's counters without a lock; README, Security).
            assert 200 <= statuses.count(202) <= 1000 + 8

            # 1 000 idle event streams (20 organizations × 50, each of its own job): all open,
            # the next one 429; enqueues go on beside them.
            async with contextlib.AsyncExitStack() as streams:
                opening = []
                for n, token in enumerate(STREAM_TOKENS):
                    own = await http.post(
                        "/agents/codex/jobs",
                        json=enqueue_body(org=f"org-streams-{n}"),
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
                    path = f"/jobs/{own.json()['job']['jobId']}/events"
                    opening += [
                        streams.enter_async_context(http.stream("GET", path, headers=headers))
                        for _ in range(50)
                    ]
                opened = await asyncio.gather(*opening)
                assert [r.status_code for r in opened] == [200] * 1000
                refused = await http.get(
                    f"/jobs/{job_id}/events",
                    headers={**AS_NEIGHBOUR, "Accept": "text/event-stream"},
                )
                assert refused.status_code == 429
                enqueues = []
                for _ in range(20):
                    started = time.perf_counter()
                    response = await http.post(
                        "/agents/codex/jobs", json=enqueue_body(org="org-b"), headers=AS_NEIGHBOUR
                    )
                    enqueues.append(time.perf_counter() - started)
                    assert response.status_code == 202
                print(
                    f"enqueue beside 1 000 open streams: median "
                    f"{statistics.median(enqueues) * 1000:.1f} ms"
                )

        print(probe.summary())
        assert not probe.failures
        assert len(probe.latencies) >= 20
        assert statistics.median(probe.latencies) < HEALTHZ_MEDIAN_S, probe.summary()
        assert max(probe.latencies) < HEALTHZ_WORST_S, probe.summary()
