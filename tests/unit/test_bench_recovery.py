"""The bench's recovery figures (tools/bench/recovery.py), read from a job's chain: kill →
the redelivery's start-fence heartbeat, kill → the settle, and the target row they give.

Pure: the chain is written here; `make bench` measures a real SIGKILL.
"""

from __future__ import annotations

import pytest

from tools.bench.config import BenchError
from tools.bench.recovery import ChainEntry, Recovery, read_recovery
from tools.bench.report import recovery_lines
from tools.bench.results import summary, target_rows

KILLED_AT = 1000.0


def chain(*, takeover_at: float | None, settled_at: float | None) -> list[ChainEntry]:
    entries = [
        ChainEntry("job.enqueued", None, False, 990.0),
        ChainEntry("job.leased", "j:attempt:1/1", False, 990.1),
        ChainEntry("job.heartbeat", "j:attempt:1/1", True, 990.1),  # the first delivery's
    ]
    if takeover_at is not None:
        entries.append(ChainEntry("job.heartbeat", "j:attempt:1/2", True, takeover_at))
    if settled_at is not None:
        entries.append(ChainEntry("job.completed", "j:attempt:1/2", False, settled_at))
    return entries


def test_the_takeover_is_the_first_start_fence_after_the_kill_not_the_first_delivery() -> None:
    found = read_recovery(chain(takeover_at=1031.5, settled_at=1033.6), KILLED_AT, 2.0)
    assert found.takeover_s == pytest.approx(31.5)
    assert found.settled_s == pytest.approx(33.6)
    assert (found.status, found.settles, found.taken_over_by) == (
        "job.completed",
        1,
        "j:attempt:1/2",
    )
    assert found.goal_s == 32.5  # the worker-lost timeout, the takeover grace, the run


def test_a_chain_without_a_takeover_or_a_settle_is_an_error_not_a_figure() -> None:
    with pytest.raises(BenchError, match="no start-fence heartbeat after the kill"):
        read_recovery(chain(takeover_at=None, settled_at=1033.6), KILLED_AT, 2.0)
    with pytest.raises(BenchError, match="no settle"):
        read_recovery(chain(takeover_at=1031.5, settled_at=None), KILLED_AT, 2.0)


def test_a_second_settle_is_counted_so_the_table_shows_it() -> None:
    entries = chain(takeover_at=1031.5, settled_at=1033.6)
    entries.append(ChainEntry("job.failed", "j:attempt:1/1", False, 1034.0))
    assert read_recovery(entries, KILLED_AT, 2.0).settles == 2


def recovery(settled_s: float) -> Recovery:
    return Recovery(2.0, settled_s - 2.1, settled_s, "job.completed", 1, "j:attempt:1/2")


def test_the_target_row_is_kill_to_settled_against_the_worker_lost_timeout_plus_the_run() -> None:
    met, missed = (target_rows({}, [recovery(s)])[0] for s in (32.4, 33.0))
    assert (met["goal"], met["unit"], met["atLeast"], met["met"]) == (32.5, "s", False, True)
    assert (missed["value"], missed["met"]) == (33.0, False)
    assert target_rows({}, []) == []


def test_the_summary_and_the_table_carry_each_kill() -> None:
    found = summary({}, [recovery(33.6), recovery(31.0)])
    assert [r["settled_s"] for r in found["recovery"]] == [33.6, 31.0]
    assert found["targets"][0]["value"] == pytest.approx(32.3)  # the median of the two
    lines = recovery_lines(found["recovery"])
    assert "SIGKILLed 2× mid-command (`sleep 2`" in lines[1]
    assert "33.6 s" in lines[3] and "1 (job.completed)" in lines[3] and "1/2" in lines[3]
    assert recovery_lines([]) == []
