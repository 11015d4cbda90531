"""A job's folded state keeps references to its command receipts, not their payloads (issue
12): real API, real PostgreSQL, real Temporal, a real worker consuming the commands."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
from temporalio.client import Client

from activities.handlers.context import HandlerContext
from receipts.store import Store
from tests.integration.api_support import AS_A, api_client, enqueue_body, rid
from tests.integration.delivery.conftest import running_stack, wait_for_status

FOLLOW_UPS = 24
MAX_COMMAND_BYTES = 64 * 1024
# 24 references and the job's own fields; the payloads alone would be 24 × 64 KiB = 1.5 MiB.
SMALL = 16 * 1024


def follow_up(n: int) -> dict[str, Any]:
    """A follow-up of the largest size the API takes."""
    payload = {"n": n, "text": ""}
    room = MAX_COMMAND_BYTES - len(json.dumps(payload, separators=(",", ":")))
    return {"type": "follow_up", "payload": {**payload, "text": "x" * room}}


async def consume_every_follow_up(ctx: HandlerContext) -> dict[str, Any]:
    """Wait for the follow-ups, then take each one's payload, in order, consuming it."""
    pending = await ctx.pending_commands()
    for _ in range(600):
        if len(pending) == FOLLOW_UPS:
            break
        await asyncio.sleep(0.1)
        pending = await ctx.pending_commands()
    taken = []
    for command in pending:
        assert await ctx.consume(command.command_id)
        taken.append([command.type, command.payload["n"], len(command.payload["text"])])
    return {"taken": taken}


def stored_bytes(db_url: str, job_id: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT octet_length(state::text) FROM jobs WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_24_follow_ups_of_the_largest_size_leave_the_job_small_and_reach_the_handler(
    client: Client, fresh_store: Store, fresh_db: str
) -> None:
    async with (
        running_stack(
            client,
            fresh_store,
            fresh_db,
            queues=("receipt-codex",),
            handlers={"codex": consume_every_follow_up},
        ),
        api_client(fresh_db, max_command_bytes=MAX_COMMAND_BYTES) as api,
    ):
        posted = await api.post("/agents/codex/jobs", json=enqueue_body(), headers=AS_A)
        job_id = posted.json()["job"]["jobId"]
        for n in range(FOLLOW_UPS):
            sent = await api.post(f"/jobs/{job_id}/commands", json=follow_up(n), headers=AS_A)
            assert sent.status_code == 202, sent.text
        assert stored_bytes(fresh_db, rid(job_id)) < SMALL
        shown = await api.get(f"/jobs/{job_id}", headers=AS_A)
        assert len(shown.content) < SMALL
        seqs = [c["seq"] for c in shown.json()["commands"]]
        assert len(seqs) == FOLLOW_UPS and seqs == sorted(set(seqs))  # one receipt each
        done = await wait_for_status(fresh_store, rid(job_id), timeout=60)
    assert done.status == "completed", done.error
    sent_payloads = [follow_up(n)["payload"] for n in range(FOLLOW_UPS)]
    assert done.result["taken"] == [["follow_up", p["n"], len(p["text"])] for p in sent_payloads]
    assert done.pending_commands == ()
    assert stored_bytes(fresh_db, rid(job_id)) < SMALL
