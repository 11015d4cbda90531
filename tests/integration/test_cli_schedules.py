"""`receipt schedules` as a real subprocess against a real `receipt api` process, and the typed
client's schedule methods against the same api."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from receipt_client import AsyncClient, Client, NotFound
from tests.integration.api_support import (
    TOKEN_A,
    TOKEN_B,
    RunningApi,
    enqueue_body,
    receipt_cli,
    running_api,
)


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(
        db_url, Path(tmp_path_factory.mktemp("api")), RECEIPT_SCHEDULE_MIN_INTERVAL_S="10"
    ) as api:
        yield api


def receipt(api: RunningApi, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return receipt_cli(api, token, "schedules", *args)


def test_create_list_get_pause_resume_delete(api: RunningApi) -> None:
    sid = f"nightly-{uuid.uuid4().hex[:6]}"
    job = json.dumps(enqueue_body("org-a", payload_extra={"task": {"command": ["true"]}}))
    made = receipt(
        api,
        TOKEN_A,
        "create",
        "--id",
        sid,
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Paris",
        "--agent",
        "codex",
        "--job",
        job,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"{sid}  active  cron 0 3 * * * (Europe/Paris)"), made.stdout
    assert "next: " in made.stdout
    listed = receipt(api, TOKEN_A, "ls")
    assert sid in listed.stdout
    assert sid not in receipt(api, TOKEN_B, "ls").stdout
    paused = receipt(api, TOKEN_A, "pause", sid, "--note", "freeze", "--json")
    assert json.loads(paused.stdout)["status"] == "paused"
    assert "note: freeze" in receipt(api, TOKEN_A, "get", sid).stdout
    assert json.loads(receipt(api, TOKEN_A, "resume", sid, "--json").stdout)["status"] == "active"
    bad = receipt(api, TOKEN_A, "create", "--cron", "0 3 * *", "--agent", "codex", "--job", job)
    assert bad.returncode != 0 and "has 4 fields" in bad.stderr, bad.stderr
    short = receipt(api, TOKEN_A, "create", "--interval", "5s", "--agent", "codex", "--job", job)
    assert short.returncode != 0 and "shortest interval allowed, 10 s" in short.stderr
    gone = receipt(api, TOKEN_A, "delete", sid)
    assert gone.returncode == 0 and f"schedule {sid} deleted" in gone.stdout
    assert receipt(api, TOKEN_A, "get", sid).returncode != 0


def test_ls_pages_through_every_schedule_with_its_cursor(api: RunningApi) -> None:
    job = json.dumps(enqueue_body("org-b", payload_extra={"task": {"command": ["true"]}}))
    made = {f"paged-{uuid.uuid4().hex[:6]}" for _ in range(3)}
    for sid in made:
        created = receipt(
            api,
            TOKEN_B,
            "create",
            "--id",
            sid,
            "--interval",
            "1h",
            "--agent",
            "codex",
            "--job",
            job,
        )
        assert created.returncode == 0, created.stderr
    seen: list[str] = []
    args = ["ls", "--limit", "2"]
    for _ in range(20):
        page = receipt(api, TOKEN_B, *args)
        assert page.returncode == 0, page.stderr
        seen += [line.split()[0] for line in page.stdout.splitlines()]
        more = [line for line in page.stderr.splitlines() if line.startswith("more: --cursor ")]
        if not more:
            break
        args = ["ls", "--limit", "2", "--cursor", more[0].removeprefix("more: --cursor ")]
    assert len(seen) == len(set(seen)), seen  # no schedule twice across pages
    assert made <= set(seen), (made, seen)


def test_the_client_manages_schedules(api: RunningApi) -> None:
    sid = f"hourly-{uuid.uuid4().hex[:6]}"
    job = enqueue_body("org-a", payload_extra={"task": {"command": ["true"]}})
    with Client(api.url, TOKEN_A) as client:
        made = client.create_schedule(
            {"scheduleId": sid, "interval": "1h", "agentId": "codex", "job": job}
        )
        assert made.schedule_id == sid and made.interval_s == 3600
        assert len(made.next_fire_times) == 5
        assert sid in [s.schedule_id for s in client.list_schedules(limit=200).schedules]
        assert client.pause_schedule(sid, note="quiet").status == "paused"
        assert client.resume_schedule(sid).status == "active"
        changed = client.update_schedule(sid, cron="15 * * * *")
        assert (changed.cron, changed.interval_s) == ("15 * * * *", None)
        client.delete_schedule(sid)
        with pytest.raises(NotFound):
            client.get_schedule(sid)


async def test_the_async_client_pauses_and_resumes(api: RunningApi) -> None:
    sid = f"async-{uuid.uuid4().hex[:6]}"
    job = enqueue_body("org-a", payload_extra={"task": {"command": ["true"]}})
    async with AsyncClient(api.url, TOKEN_A) as client:
        await client.create_schedule(
            {"scheduleId": sid, "cron": "@daily", "agentId": "codex", "job": job}
        )
        assert (await client.pause_schedule(sid)).status == "paused"
        assert (await client.resume_schedule(sid)).next_fire_times
        await client.delete_schedule(sid)
