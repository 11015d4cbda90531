"""Shared by the API tests: tokens of two organizations and an admin, the app in-process, and a
real `receipt api` process."""

from __future__ import annotations

import functools
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from jsonschema import Draft202012Validator

from receipt_client.sse import SseEvent, parse_sse
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.kinds import CONTRACTS
from receipts.settings import Settings
from receipts.store import Store
from receipts.tenancy import scoped_id
from receipts.webhooks import WebhookSettings
from roles.api.app import create_app
from roles.api.settings import ApiSettings
from roles.infra.ports import free_port
from roles.infra.settings import RuntimeSettings
from roles.infra.supervisor import Supervised
from tests.integration.helpers import adhoc_objective_id

ROOT = Path(__file__).resolve().parents[2]

TOKEN_A = "token-org-a-0123456789abcdef"
TOKEN_B = "token-org-b-0123456789abcdef"
TOKEN_ADMIN = "token-admin-0123456789abcdef"
TOKENS = f"{TOKEN_A} org-a\n{TOKEN_B} org-b\n{TOKEN_ADMIN} *"
AS_A = {"Authorization": f"Bearer {TOKEN_A}"}
AS_B = {"Authorization": f"Bearer {TOKEN_B}"}
AS_ADMIN = {"Authorization": f"Bearer {TOKEN_ADMIN}"}


# The session's database collects every module's jobs of org-a: the API tests run without the
# per-organization caps unless a test sets them (test_api_security.py does), and a refusal over
# the rate is answered at once unless a test holds it (the hold only delays the same 429).
UNLIMITED: dict[str, Any] = {
    "org_max_queued": 10**9,
    "org_max_active": 10**9,
    "org_enqueue_rate": 1e9,
    "org_enqueue_burst": 10**9,
    "rate_refusal_hold_ms": 0,
    "org_requests_in_flight": 10**9,
}
UNLIMITED_ENV = {
    "RECEIPT_ORG_MAX_QUEUED": str(10**9),
    "RECEIPT_ORG_MAX_ACTIVE": str(10**9),
    "RECEIPT_ORG_ENQUEUE_RATE": "1e9",
    "RECEIPT_ORG_ENQUEUE_BURST": str(10**9),
    "RECEIPT_RATE_REFUSAL_HOLD_MS": "0",
    "RECEIPT_ORG_REQUESTS_IN_FLIGHT": str(10**9),
}


def rid(job_id: str, org: str = "org-a") -> str:
    """The runtime's id of the job `org` names `job_id` (job ids are scoped by organization)."""
    return scoped_id(org, job_id)


def enqueue_body(
    org: str = "org-a", kind: str = "factory.task.run", **extra: Any
) -> dict[str, Any]:
    """A valid enqueue body for `org`; `payload_extra` adds payload fields."""
    payload: dict[str, Any] = {
        "kind": kind,
        "authContext": {"userId": "u-1", "organizationId": org},
    }
    if kind in CONTRACTS and CONTRACTS[kind].objective_required:
        payload["objectiveId"] = adhoc_objective_id(extra.get("jobId"))
    payload.update(extra.pop("payload_extra", {}))
    return {"payload": payload, **extra}


@asynccontextmanager
async def api_client(
    db_url: str,
    *,
    store: Store | None = None,
    base_url: str = "http://api.test",
    agent_jobs: AgentJobSettings | None = None,
    webhooks: WebhookSettings | None = None,
    core: Settings | None = None,
    overrides: Mapping[Callable[..., Any], Callable[..., Any]] | None = None,
    **settings: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process (lifespan running) behind an httpx client; app exceptions propagate.
    `overrides` replace FastAPI dependencies (`app.dependency_overrides`)."""
    values: dict[str, Any] = {"tokens": TOKENS, **UNLIMITED, **settings}
    runtime = RuntimeSettings(
        core=core or Settings(),
        api=ApiSettings(**values),
        agent_jobs=agent_jobs or AgentJobSettings(),
        webhooks=webhooks or WebhookSettings(),
    )
    app = create_app(runtime, database_url=db_url, store=store)
    app.dependency_overrides.update(overrides or {})
    transport = httpx.ASGITransport(app=app)
    document = app.openapi()

    async def documented(response: httpx.Response) -> None:
        # Every JSON answer the API tests receive matches the published document.
        await conforms_to(document, response)

    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url=base_url, event_hooks={"response": [documented]}
        ) as client,
    ):
        yield client


async def events(response: httpx.Response) -> AsyncIterator[SseEvent]:
    """The server-sent events of a streamed response (asserted to be a 200 event stream)."""
    assert response.status_code == 200, await response.aread()
    assert response.headers["content-type"].startswith("text/event-stream")
    block: list[str] = []
    async for line in response.aiter_lines():
        block.append(line)
        if line == "":
            for event in parse_sse(block):
                yield event
            block = []


def clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The test process's environment without RECEIPT_* settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECEIPT_", "PYTEST"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class RunningApi:
    """A `receipt api` process: its base URL and log file."""

    url: str
    log: Path
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def running_api(db_url: str, log_dir: Path, **env: str) -> Iterator[RunningApi]:
    """Start `python -m roles.cli.main api` on a free port; wait until /healthz answers; stop it.

    The port is free when it is picked, not when the api binds it: another test process may take
    it in between (CI met it: "address already in use", a module's fixture failed). Such a start
    is tried again on another port, up to three times."""
    for tries_left in reversed(range(3)):
        port = free_port()
        log = log_dir / f"api-{port}.log"
        settings = {
            "RECEIPT_DATABASE_URL": db_url,
            "RECEIPT_API_HOST": "127.0.0.1",
            "RECEIPT_API_PORT": str(port),
            "RECEIPT_API_TOKENS": TOKENS,
            **UNLIMITED_ENV,
            **env,
        }
        supervised = Supervised(
            "api",
            [sys.executable, "-m", "roles.cli.main", "api"],
            clean_env(settings),
            log_file=log,
            cwd=ROOT,
        )
        process = supervised.start()
        api = RunningApi(f"http://127.0.0.1:{port}", log, process)
        try:
            # 60 s: with four pytest workers' end-to-end stacks on 2 cores, an api once took
            # over 20 s to import and answer (CI of 2026-12-07: its event loop stalled in import).
            wait_healthz(api.url, 60.0, process, api.log_text)
        except RuntimeError:
            supervised.stop(15)
            if tries_left and "address already in use" in api.log_text():
                continue
            raise
        break
    try:
        yield api
    finally:
        supervised.stop(15)


def receipt_cli(api: RunningApi, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`receipt <args>` as a real subprocess against `api`, as `token`."""
    return subprocess.run(
        [sys.executable, "-m", "roles.cli.main", *args],
        cwd=ROOT,
        env=clean_env({"RECEIPT_API_URL": api.url, "RECEIPT_API_TOKEN": token}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_healthz(
    url: str,
    timeout_s: float = 30.0,
    process: subprocess.Popen[bytes] | None = None,
    log: Callable[[], str] | None = None,
) -> None:
    """Wait until the api at `url` answers `/healthz`; raise (with its log) if `process` exits
    first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"receipt api exited {process.returncode}:\n{log() if log else ''}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the api at {url} did not start:\n{log() if log else ''}")
        time.sleep(0.1)


class HealthProbe:
    """Polls `/healthz` from a thread of its own; records each answer's latency."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    status = http.get(f"{self.url}/healthz").status_code
                except httpx.RemoteProtocolError:
                    # The server closed the kept-alive connection as the probe reused it (its
                    # keep-alive timer and the request crossed): asked again on a new one, the
                    # time of both counted. A server gone fails the next try, and the test.
                    self.reconnects += 1
                    status = http.get(f"{self.url}/healthz").status_code
                self.latencies.append(time.perf_counter() - started)
                if status != 200:
                    self.failures.append(str(status))
                time.sleep(0.01)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    @property
    def worst(self) -> float:
        return max(self.latencies)

    def summary(self) -> str:
        ms = sorted(t * 1000 for t in self.latencies)
        return (
            f"/healthz over {len(ms)} probes: median {statistics.median(ms):.1f} ms, "
            f"p95 {ms[int(len(ms) * 0.95)]:.1f} ms, worst {ms[-1]:.1f} ms, "
            f"{self.reconnects} reconnected"
        )


def _validate(document: dict[str, Any], schema: dict[str, Any], body: Any) -> list[str]:
    validator = Draft202012Validator(
        {**schema, "components": document["components"]},
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(body)]


@functools.cache
def published() -> dict[str, Any]:
    """The OpenAPI document the api publishes (its routes do not depend on the settings)."""
    return create_app(RuntimeSettings(api=ApiSettings(tokens="t *"))).openapi()


def conforms(response: httpx.Response, path: str, method: str) -> None:
    """The response's body matches the named schema the OpenAPI document gives its status at
    `path` (the document's template) for `method`."""
    document = published()
    documented = document["paths"][path][method]["responses"][str(response.status_code)]
    schema = documented["content"]["application/json"]["schema"]
    assert "$ref" in schema, f"{method} {path} {response.status_code} names no schema"
    errors = _validate(document, schema, response.json())
    assert errors == [], (method, path, errors)


def _template(document: dict[str, Any], path: str) -> str | None:
    """The document's path template that `path` fills in (a job id may hold slashes), the one
    with the most literal text when several do."""
    found = []
    for template in document["paths"]:
        pattern = re.sub(
            r"\\\{(\w+)\\\}",
            lambda m: "(.+)" if m[1] == "jobId" else "([^/]+)",
            re.escape(template),
        )
        if re.fullmatch(pattern, path):
            found.append((len(re.sub(r"\{\w+\}", "", template)), template))
    return max(found)[1] if found else None


async def conforms_to(document: dict[str, Any], response: httpx.Response) -> None:
    """A JSON answer of a documented route: its status is documented there, and its body
    matches the schema documented for it (when there is one)."""
    if not response.headers.get("content-type", "").startswith("application/json"):
        return
    method = response.request.method
    template = _template(document, response.request.url.path)
    if template is None or method.lower() not in document["paths"][template]:
        return
    answers = document["paths"][template][method.lower()]["responses"]
    assert str(response.status_code) in answers, (method, template, response.status_code)
    content = answers[str(response.status_code)].get("content", {})
    schema = content.get("application/json", {}).get("schema")
    if not schema:
        return
    await response.aread()
    errors = _validate(document, schema, response.json())
    assert errors == [], (method, template, response.status_code, errors)
