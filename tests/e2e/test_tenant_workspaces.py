"""Two organizations, real processes, the real sandbox: whatever ids organization B's jobs name,
they neither read nor write organization A's workspace (docs/design.md §9)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.sandbox import SandboxSettings, probe
from receipts.store import Store
from receipts.tenancy import organization_tag, scoped_id
from tests.e2e.roles_harness import RoleProcesses, wait_for
from tests.integration.api_support import AS_A, AS_B, TOKENS, free_port, wait_healthz

pytestmark = pytest.mark.e2e

MARKER = "a-secret-4d1f"


@pytest.fixture(autouse=True)
async def sandbox_available() -> None:
    ok, message = await probe(SandboxSettings.load(os.environ))
    if not ok:
        pytest.skip(f"SANDBOX TESTS NOT RUN: bubblewrap cannot create namespaces here: {message}")


def job_body(org: str, job_id: str, script: str, **payload: Any) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "payload": {
            "kind": "factory.task.run",
            "authContext": {"userId": "u-1", "organizationId": org},
            "task": {"command": ["sh", "-c", script]},
            **payload,
        },
    }


async def test_organization_b_cannot_reach_organization_as_workspace_through_any_id(
    e2e_store: tuple[Store, str], roles: Callable[..., RoleProcesses], workspace_root: Path
) -> None:
    store, _ = e2e_store
    port = free_port()
    procs = roles(RECEIPT_API_PORT=str(port), RECEIPT_API_TOKENS=TOKENS)
    for role in ("api", "driver", "worker-codex"):
        procs.start(role)
    url = f"http://127.0.0.1:{port}"
    mine = workspace_root / "orgs" / "org-a" / "objectives" / "shared"
    try:
        wait_healthz(url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as api:
            written = await api.post(
                "/agents/codex/jobs",
                headers=AS_A,
                json=job_body(
                    "org-a",
                    "a-writes",
                    f"echo {MARKER} > secret.txt; echo $PWD",
                    objectiveId="shared",
                ),
            )
            assert written.status_code == 202, written.text
            await wait_for(store, scoped_id("org-a", "a-writes"), ("completed",), 60)
            assert (mine / "secret.txt").read_text().strip() == MARKER

            # B names the same objective id, its own standalone job, and A's absolute path.
            probes = {
                "b-same-id": {"objectiveId": "shared"},
                "b-alone": {},
            }
            script = (
                f"cat secret.txt; cat {mine}/secret.txt; ls {workspace_root}/orgs; "
                f"ls {workspace_root}/orgs/org-a; echo b > b.txt; echo $PWD"
            )
            for job_id, extra in probes.items():
                posted = await api.post(
                    "/agents/codex/jobs",
                    headers=AS_B,
                    json=job_body("org-b", job_id, script, **extra),
                )
                assert posted.status_code == 202, posted.text
            # Ids that would leave B's tree are refused before anything is written.
            for objective_id in ("..", "../org-a", f"shared~{organization_tag('org-a')}"):
                refused = await api.post(
                    "/agents/codex/jobs",
                    headers=AS_B,
                    json=job_body("org-b", "b-bad", "true", objectiveId=objective_id),
                )
                assert refused.status_code == 422, refused.text
                assert refused.json()["error"]["field"] == "payload.objectiveId"
            # A working directory that climbs out of B's workspace is refused by the sandbox.
            climbing = job_body("org-b", "b-cwd", "echo b > escaped.txt", objectiveId="shared")
            climbing["payload"]["task"]["cwd"] = "../../../org-a/objectives/shared"
            escaping = await api.post("/agents/codex/jobs", headers=AS_B, json=climbing)
            assert escaping.status_code == 202, escaping.text
            # B sees its own objective id, never the runtime's tagged one.
            assert escaping.json()["job"]["payload"]["objectiveId"] == "shared"
            outputs = {}
            for job_id in probes:
                done = await wait_for(
                    store, scoped_id("org-b", job_id), ("completed", "failed"), 60
                )
                outputs[job_id] = done.result["outputTail"] if done.result else done.error
            climbed = await wait_for(
                store, scoped_id("org-b", "b-cwd"), ("completed", "failed"), 60
            )
    except BaseException:
        print(procs.logs())
        raise
    assert climbed.status == "failed" and climbed.error and "cwd" in climbed.error, climbed.error
    for job_id, output in outputs.items():
        assert MARKER not in output, (job_id, output)
        assert "No such file" in output or "Permission denied" in output, output
    theirs = workspace_root / "orgs" / "org-b"
    assert (theirs / "objectives" / "shared" / "b.txt").read_text() == "b\n"
    assert (theirs / "jobs" / "b-alone" / "b.txt").read_text() == "b\n"
    assert sorted(p.name for p in mine.iterdir()) == ["secret.txt"]
    assert (mine / "secret.txt").read_text().strip() == MARKER
