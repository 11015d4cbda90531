"""A flood of refused requests is counted in full but logged once per interval per caller."""

from __future__ import annotations

import pytest

from receipts.refusal_log import RefusalLog


def test_a_refusal_is_logged_once_per_interval_with_the_count_left_unlogged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("receipts.refusal_log.time.monotonic", lambda: now[0])
    refusals = RefusalLog(interval_s=10)
    assert refusals.due("rate", "org-b") == 0
    assert [refusals.due("rate", "org-b") for _ in range(500)] == [None] * 500
    assert refusals.due("rate", "org-a") == 0  # another caller is logged on its own
    assert refusals.due("streams_token", "org-b") == 0  # and another kind
    now[0] += 10
    assert refusals.due("rate", "org-b") == 500
    assert refusals.due("rate", "org-b") is None
