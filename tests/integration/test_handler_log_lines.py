"""A handler's error, and what a handler logs itself, make log lines of a bounded size: a log
shipper splits or drops a line of megabytes (Docker's json-file at 16 KiB, Loki refuses one
over 256 KiB), and the error line a team looks for is the one that is lost."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from receipt_worker import JobContext, handler
from receipts.store import Store
from roles.infra.logs import MAX_LINE_CHARS, HumanFormatter, JsonFormatter
from tests.integration.test_handler_endings import delivered

FORMATTERS = [JsonFormatter("worker-chat"), HumanFormatter("worker-chat")]


async def test_a_handler_s_huge_error_and_its_own_huge_lines_log_bounded_lines(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    mine = logging.getLogger("release_bot")

    @handler("audit-loud")
    async def loud(job: JobContext) -> Any:
        mine.warning("the registry said: %s", "r" * 3_000_000)
        mine.warning("state", extra={"state": {"rows": ["s" * 1000] * 3000}, "note": "n" * 10**6})
        many = {f"field{i}": "v" * 1000 for i in range(1000)}  # each under a field's cut
        mine.warning("many fields", extra=many)
        raise ValueError("x" * 5_000_000)

    caplog.set_level(logging.INFO)
    job_id, result = await delivered(store, loud)
    assert result.job_status == "queued"
    records = [
        r
        for r in caplog.records
        if r.name == "release_bot" or getattr(r, "event", None) == "attempt.handler_error"
    ]
    assert [r.getMessage()[:14] for r in records][-1] == "handler raised"
    for formatter in FORMATTERS:
        lines = [formatter.format(r) for r in records]
        assert max(len(line) for line in lines) <= MAX_LINE_CHARS, [len(x) for x in lines]
        assert "ValueError: xxxx" in lines[-1] and "characters cut" in lines[-1]
        assert "the registry said: rrrr" in lines[0]
    parsed = [json.loads(FORMATTERS[0].format(r)) for r in records]
    assert parsed[-1]["event"] == "attempt.handler_error" and parsed[-1]["jobId"] == job_id
    assert parsed[1]["msg"] == "state" and "characters cut" in parsed[1]["note"]
    assert parsed[2]["msg"] == "many fields" and "fieldsCut" in parsed[2]
