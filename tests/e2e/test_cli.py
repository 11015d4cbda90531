"""The `receipt` CLI end to end: the commands in subprocesses against a real `receipt api` process.

No worker runs here: where a command waits for a job to end, the test settles the job itself
through `receipts.operations`, as a worker would.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from receipts import operations as ops
from receipts.store import Store
from roles.cli.main import main
from tests.integration.api_support import (
    ROOT,
    TOKEN_A,
    TOKEN_B,
    RunningApi,
    clean_env,
    rid,
    running_api,
)
from tests.integration.helpers import new_id, types

pytestmark = pytest.mark.e2e

LEASE_MS = 60_000
AUTH = {"userId": "u-1", "organizationId": "org-a"}


@pytest.fixture(scope="module")
def api(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(db_url, Path(tmp_path_factory.mktemp("api"))) as api:
        yield api


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> object:
        return json.loads(self.out)


async def start(api: RunningApi, *args: str, token: str = TOKEN_A) -> asyncio.subprocess.Process:
    env = clean_env({"RECEIPT_API_URL": api.url, "RECEIPT_API_TOKEN": token})
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roles.cli.main",
        *args,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finish(process: asyncio.subprocess.Process) -> Run:
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


async def receipt(api: RunningApi, *args: str, token: str = TOKEN_A) -> Run:
    return await finish(await start(api, *args, token=token))


async def test_enqueue_inspect_list_and_command_a_job(
    api: RunningApi, store: Store, tmp_path: Path
) -> None:
    job_id = new_id("cli")
    agent = new_id("agent")
    payload = tmp_path / "payload.json"
    payload.write_text(
        json.dumps({"authContext": AUTH, "objectiveId": "standalone", "prompt": "hello"})
    )
    run = await receipt(
        api,
        "enqueue",
        agent,
        "--kind",
        "factory.task.run",
        "--payload",
        f"@{payload}",
        "--job-id",
        job_id,
        "--lane",
        "chat",
        "--max-attempts",
        "3",
    )
    assert run.code == 0, run.err
    assert f"job {job_id} queued (created)" in run.out
    assert f"/jobs/{job_id}/events" in run.out

    again = await receipt(
        api, "enqueue", agent, "--payload", f"@{payload}", "--kind", "factory.task.run",
        "--job-id", job_id, "--json",
    )  # fmt: skip
    accepted = again.json()
    assert isinstance(accepted, dict) and accepted["outcome"] == "existing"
    assert accepted["async"]["stream"] == f"jobs/{job_id}"

    shown = await receipt(api, "jobs", "get", job_id)
    assert shown.code == 0
    assert "status    queued (attempt 0/3)" in shown.out
    assert f"agent     {agent} (no handler)" in shown.out
    assert "route     receipt-chat (contract: codex)" in shown.out
    as_json = (await receipt(api, "jobs", "get", job_id, "--json")).json()
    assert isinstance(as_json, dict) and as_json["payload"]["prompt"] == "hello"

    steer = await receipt(api, "jobs", "steer", job_id, "--payload", '{"say": "left"}')
    assert steer.code == 0 and steer.out.startswith("steer cmd-")
    follow_up = await receipt(api, "jobs", "follow-up", job_id, "--payload", '"then this"')
    assert follow_up.code == 0 and follow_up.out.startswith("follow_up cmd-")

    listed = await receipt(api, "jobs", "ls", "--agent-id", agent, "--json")
    rows = [json.loads(line) for line in listed.out.splitlines()]
    assert [row["jobId"] for row in rows] == [job_id]
    assert [c["type"] for c in rows[0]["pendingCommands"]] == ["steer", "follow_up"]
    table = await receipt(api, "jobs", "ls", "--agent-id", agent, "--status", "queued")
    assert table.out.splitlines()[0].startswith("JOB ID") and job_id in table.out
    assert (await receipt(api, "jobs", "ls", "--agent-id", agent, token=TOKEN_B)).out.count(
        "\n"
    ) == 1  # another organization sees only the header

    aborted = await receipt(api, "jobs", "abort", job_id, "--reason", "done here")
    assert aborted.code == 0 and "(status canceled)" in aborted.out
    refused = await receipt(api, "jobs", "abort", job_id)
    assert refused.code == 3
    assert "is canceled; it takes no more commands (409 terminal_state)" in refused.err

    events = await receipt(api, "jobs", "events", job_id, "--json")
    assert [json.loads(line)["type"] for line in events.out.splitlines()] == await types(
        store, rid(job_id)
    )
    # 4 the abort, 5 and 6 the steer and the follow-up settled unread, 7 the cancel.
    later = await receipt(api, "jobs", "events", job_id, "--after", "3")
    rows = [line.split() for line in later.out.splitlines()]
    assert [row[0] for row in rows] == ["4", "5", "6", "7"]
    assert [row[2] for row in rows] == [
        "queue.command",
        "queue.command.unconsumed",
        "queue.command.unconsumed",
        "job.canceled",
    ]


async def settle(store: Store, job_id: str, *, complete: bool) -> None:
    job_id = rid(job_id)  # the runtime's id of org-a's job (ids are scoped by organization)
    worker = f"{job_id}:attempt:1/1"
    assert (await ops.lease(store, job_id, attempt=1, worker_id=worker, lease_ms=LEASE_MS)).ok
    assert (await ops.heartbeat(store, job_id, worker_id=worker, attempt=1, lease_ms=LEASE_MS)).ok
    assert (await ops.progress(store, job_id, worker_id=worker, attempt=1, data={"p": 1})).ok
    if complete:
        outcome = await ops.complete(
            store, job_id, worker_id=worker, attempt=1, result={"answer": 42}
        )
    else:
        outcome = await ops.fail(
            store, job_id, worker_id=worker, attempt=1, error="handler broke", retryable=False
        )
    assert outcome.ok


@pytest.mark.parametrize(
    ("complete", "code", "status"), [(True, 0, "completed"), (False, 1, "failed")]
)
async def test_enqueue_wait_follows_the_job_and_exits_0_only_if_it_completed(
    api: RunningApi, store: Store, complete: bool, code: int, status: str
) -> None:
    job_id = new_id("wait")
    process = await start(
        api,
        "enqueue",
        "codex",
        "--kind",
        "factory.task.run",
        "--payload",
        json.dumps({"authContext": AUTH, "objectiveId": "standalone"}),
        "--job-id",
        job_id,
        "--wait",
    )
    assert process.stderr is not None
    first = await asyncio.wait_for(process.stderr.readline(), 60)  # a bound, not a speed test
    assert first.decode().startswith(f"job {job_id} created; waiting")
    await settle(store, job_id, complete=complete)
    run = await finish(process)
    assert run.code == code, run.err
    assert f"status    {status} (attempt 1/2)" in run.out
    if complete:
        assert 'result    {"answer":42}' in run.out
    else:
        assert "error     handler broke" in run.out
    # The live status line (one line per status change when stderr is not a terminal).
    assert f"{job_id}  {status}" in run.err


async def test_events_follow_prints_every_receipt_live_until_the_job_ends(
    api: RunningApi, store: Store
) -> None:
    job_id = new_id("follow")
    enqueued = await receipt(
        api, "enqueue", "codex", "--kind", "factory.run", "--payload",
        json.dumps({"authContext": AUTH, "objectiveId": "standalone"}), "--job-id", job_id,
    )  # fmt: skip
    assert enqueued.code == 0, enqueued.err
    process = await start(api, "jobs", "events", job_id, "--follow", "--json")
    await asyncio.sleep(0.5)
    await settle(store, job_id, complete=True)
    run = await finish(process)
    assert run.code == 0, run.err
    seqs = [json.loads(line)["seq"] for line in run.out.splitlines()]
    assert seqs == list(range(1, len(await types(store, rid(job_id))) + 1))
    assert json.loads(run.out.splitlines()[-1])["type"] == "job.completed"


async def test_refusals_exit_3_with_the_apis_message_and_no_answer_4(api: RunningApi) -> None:
    missing = await receipt(api, "jobs", "get", "no-such-job")
    assert missing.code == 3 and "no job 'no-such-job' (404 not_found" in missing.err
    bad_kind = await receipt(api, "enqueue", "codex", "--payload", '{"kind": "factory.nope"}')
    assert bad_kind.code == 3
    assert "422 invalid_input, field payload.kind" in bad_kind.err
    assert "factory.objective.watchdog" in bad_kind.err
    other_org = await receipt(
        api, "enqueue", "codex", "--kind", "factory.run", "--payload",
        json.dumps({"authContext": {"userId": "u", "organizationId": "org-b"}, "objectiveId": "standalone"}),
    )  # fmt: skip
    assert other_org.code == 3 and "403 forbidden" in other_org.err
    unknown_token = await receipt(api, "jobs", "ls", token="not-a-token")
    assert (
        unknown_token.code == 3 and "unknown bearer token (401 unauthorized)" in unknown_token.err
    )
    unreachable = await receipt(api, "jobs", "ls", "--api-url", "http://127.0.0.1:9")
    assert unreachable.code == 4 and "cannot reach the API at http://127.0.0.1:9" in unreachable.err


def test_usage_errors_exit_2() -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["enqueue", "codex", "--lane", "fast"]).exit_code == 2
    no_kind = runner.invoke(main, ["enqueue", "codex", "--payload", "{}"])
    assert no_kind.exit_code == 2 and "give --kind" in no_kind.output
    not_json = runner.invoke(main, ["enqueue", "codex", "--kind", "factory.run", "--payload", "{"])
    assert not_json.exit_code == 2 and "not valid JSON" in not_json.output
    clash = runner.invoke(
        main,
        ["enqueue", "codex", "--kind", "factory.run", "--payload", '{"kind": "factory.dispatch"}'],
    )
    assert clash.exit_code == 2


@pytest.mark.parametrize(
    ("command", "mentions"),
    [
        (["enqueue"], ["--wait", "--job-id", "--singleton-mode", "RECEIPT_API_URL", "Exit status"]),
        (["jobs"], ["ls", "get", "events", "steer", "follow-up", "abort"]),
        (["jobs", "ls"], ["--status", "--agent-id", "--cursor", "RECEIPT_API_TOKEN"]),
        (["jobs", "events"], ["--follow", "--after", "--json"]),
        (["jobs", "abort"], ["--reason"]),
        (["objectives", "ls"], ["--status", "--limit", "--cursor"]),
        (["schedules", "ls"], ["--limit", "--cursor"]),
        (["agent-jobs", "ls"], ["--session", "--agent-id", "--cursor"]),
        (["api"], ["RECEIPT_API_HOST", "RECEIPT_API_TOKENS_FILE", "RECEIPT_MAX_BODY_BYTES"]),
    ],
)
def test_help_is_there_for_every_command(command: list[str], mentions: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    for text in mentions:
        assert text in result.output


async def test_the_api_refuses_to_start_open_on_a_non_loopback_bind(db_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "roles.cli.main",
        "api",
        "--host",
        "0.0.0.0",
        cwd=ROOT,
        env=clean_env({"RECEIPT_DATABASE_URL": db_url}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 2  # a bad setting, as every one: one line, no traceback
    assert err.startswith(b"receipt: bad configuration: ")
    assert b"refusing to serve on 0.0.0.0 without API tokens" in err


async def test_jobs_retry_one_and_in_bulk(api: RunningApi, store: Store) -> None:
    agent = f"agent-{new_id()}"
    ids = []
    for _ in range(2):
        job_id = new_id()
        body = json.dumps(
            {"kind": "factory.task.run", "authContext": AUTH, "objectiveId": "standalone"}
        )
        run = await receipt(api, "enqueue", agent, "--payload", body, "--job-id", job_id)
        assert run.code == 0, run.err
        assert (await ops.fail_undeliverable(store, rid(job_id), error="flaky disk")).ok
        ids.append(job_id)
    one = await receipt(api, "jobs", "retry", ids[0])
    assert one.code == 0, one.err
    assert one.out.startswith(f"{ids[0]} retried as retry-")
    again = await receipt(api, "jobs", "retry", ids[0])
    assert "was already retried as" in again.out
    bulk = await receipt(api, "jobs", "retry", "--agent", agent, "--error", "flaky disk")
    assert bulk.code == 0, bulk.err
    assert bulk.out.splitlines()[-1] == "1 job(s) retried"
    assert ids[1] in bulk.out
    mixed = await receipt(api, "jobs", "retry", ids[0], "--agent", agent)
    assert mixed.code == 2 and "not both" in mixed.err
    active = new_id()
    body = json.dumps(
        {"kind": "factory.task.run", "authContext": AUTH, "objectiveId": "standalone"}
    )
    await receipt(api, "enqueue", agent, "--payload", body, "--job-id", active)
    refused = await receipt(api, "jobs", "retry", active)
    assert refused.code == 3 and "only failed or canceled jobs are retried" in refused.err
