"""A real Prometheus scrapes a real stack: the five role processes, Prometheus (Debian's server)
scraping each one's `/metrics` every second with deploy/prometheus/receipt-rules.yaml loaded,
and queries over its HTTP API that see every role up, a job's counters move, the Temporal SDK's
families on the roles' own endpoints, and an alert fire on a job that cannot start."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from receipts.kinds import QUEUE_DRIVER, WORKER_QUEUES
from receipts.store import Store
from roles.infra.ports import free_port
from roles.infra.sdk_metrics import SDK_FAMILIES
from tests.e2e.conftest import task
from tests.e2e.prometheus import Prometheus, by_label, prometheus_binary, rules_with, scalar
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.eventually import eventually
from tests.integration.api_support import enqueue_body

pytestmark = pytest.mark.e2e
ROLES = ("api", "driver", "worker-chat", "worker-codex", "worker-control")
# The shipped stuck-job alert with a threshold a test can wait for: 3 s queued instead of 15
# minutes, firing at once instead of after 2 minutes. The expression is otherwise the file's.
STUCK = {"ReceiptJobsStuckQueued": ("> 900", "> 3", "0s")}


async def test_prometheus_scrapes_every_role_sees_counters_move_and_fires_the_stuck_alert(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], tmp_path: Path
) -> None:
    prometheus_binary()  # skip (or fail in CI) before starting anything
    store, _ = e2e_store
    procs = roles(
        # One dispatch slot per organization and worker group: a second codex job of the
        # organization waits, queued and deliverable, while the first runs — the stuck job.
        RECEIPT_ORG_MAX_RUNNING_PER_GROUP="1",
        RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED="0",
    )
    # Each role is scraped on its RECEIPT_METRICS_PORT, the api too (as the PodMonitor does):
    # there /metrics needs no token, while the API's own port answers the requests.
    ports = {role: free_port() for role in ROLES}
    api_port = free_port()
    procs.env["RECEIPT_API_PORT"] = str(api_port)
    for role in ROLES:
        procs.env["RECEIPT_METRICS_PORT"] = str(ports[role])
        procs.start(role)
    prometheus = Prometheus(
        tmp_path / "prometheus",
        {f"receipt-{role}": f"127.0.0.1:{port}" for role, port in ports.items()},
        rules_with(STUCK),
    )
    await prometheus.start()
    api = f"http://127.0.0.1:{api_port}"
    try:
        # Every role up, then ready (the workers once Temporal lists their polls).
        await eventually(
            lambda: prometheus.query("up"),
            lambda r: by_label(r, "job") == {f"receipt-{role}": 1.0 for role in ROLES},
            timeout=45,
            every=0.5,
            what="every role up in Prometheus",
        )

        async def ready() -> list[dict[str, object]]:
            # The api's gauge is what its last /readyz answered: probe it as a kubelet would.
            # Its metrics port answers from the start; the API's own port once it serves.
            async with httpx.AsyncClient() as http:
                with contextlib.suppress(httpx.TransportError):
                    await http.get(f"{api}/readyz", timeout=5)
            return await prometheus.query("receipt_role_ready")

        await eventually(
            ready,
            lambda r: by_label(r, "job") == {f"receipt-{role}": 1.0 for role in ROLES},
            timeout=45,
            every=0.5,
            what="every role ready in Prometheus",
        )
        async with httpx.AsyncClient(base_url=api) as http:
            first = await http.post(
                "/agents/codex/jobs", json=enqueue_body(payload_extra=task("sleep", "30"))
            )
            assert first.status_code == 202, first.text
            await wait_for(store, first.json()["job"]["jobId"], ("running",), 60)
            second = await http.post(
                "/agents/codex/jobs", json=enqueue_body(payload_extra=task("true"))
            )
            assert second.status_code == 202, second.text
            held = second.json()["job"]["jobId"]
        # The api's counters moved, by route template.
        posted = await eventually(
            lambda: prometheus.query(
                'sum(receipt_api_requests_total{route="/agents/{agentId}/jobs",method="POST",'
                'status="202"})'
            ),
            lambda r: scalar(r) == 2.0,
            timeout=15,
            every=0.5,
            what="two posts counted",
        )
        assert scalar(posted) == 2.0
        enqueued = await prometheus.query(
            'sum by (agent, outcome) (receipt_jobs_enqueued_total{job="receipt-api"})'
        )
        assert [(r["metric"], r["value"][1]) for r in enqueued] == [
            ({"agent": "codex", "outcome": "created"}, "2")
        ]
        # Each target is scraped on its own clock: the api's scrape above says nothing of
        # worker-codex's, so wait for one that saw the first attempt start.
        started = await eventually(
            lambda: prometheus.query(
                'receipt_attempts_started_total{job="receipt-worker-codex",agent="codex"}'
            ),
            lambda r: scalar(r) is not None,
            timeout=15,
            every=0.5,
            what="worker-codex's attempts scraped",
        )
        assert scalar(started) == 1.0  # the second job is held back: no attempt yet
        # The stuck job: queued, deliverable, its organization's slot held. worker-control's
        # gauge ages, and the shipped expression fires for its lane and group.
        alert = await eventually(
            prometheus.alerts,
            lambda alerts: [
                a
                for a in alerts
                if a["labels"]["alertname"] == "ReceiptJobsStuckQueued" and a["state"] == "firing"
            ],
            timeout=30,
            every=0.5,
            what="ReceiptJobsStuckQueued firing",
        )
        assert alert[0]["labels"] | {"severity": "page"} == {
            "alertname": "ReceiptJobsStuckQueued",
            "lane": "collect",
            "group": "codex",
            "severity": "page",
        }
        age = by_label(
            await prometheus.query(
                'max by (group) (receipt_queue_oldest_age_seconds{lane="collect"})'
            ),
            "group",
        )
        assert age["codex"] > 3 and age["chat"] == 0.0 and age["control"] == 0.0
        assert (await store.get_job(held)).status == "queued"  # type: ignore[union-attr]
        # The Temporal SDK's families arrive on the roles' one endpoint, all of them known.
        sdk = await prometheus.query('count by (__name__, job) ({__name__=~"temporal_.+"})')
        families = {_family(r["metric"]["__name__"]) for r in sdk}
        assert {"temporal_long_request", "temporal_worker_task_slots_available"} <= families
        assert families <= set(SDK_FAMILIES), sorted(families - set(SDK_FAMILIES))
        # Their labels stay bounded: task queues are the roles' own (prefixed) queues.
        queues = await prometheus.query(
            'count by (task_queue) ({__name__=~"temporal_.+", task_queue!=""})'
        )
        prefix = procs.env["RECEIPT_TASK_QUEUE_PREFIX"]
        named = {r["metric"]["task_queue"] for r in queues}
        assert named and {q.removeprefix(prefix) for q in named} <= {QUEUE_DRIVER, *WORKER_QUEUES}
        assert {r["metric"]["job"] for r in sdk} >= {
            "receipt-driver",
            "receipt-worker-codex",
            "receipt-worker-chat",
            "receipt-worker-control",
        }
    except BaseException:
        print(prometheus.log())
        print(procs.logs())
        raise
    finally:
        prometheus.stop()


def _family(sample: str) -> str:
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and sample.removesuffix(suffix) in SDK_FAMILIES:
            return sample.removesuffix(suffix)
    return sample
