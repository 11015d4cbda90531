"""Role resolution, concurrency, loop and watchdog settings (pure)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from receipts import metrics
from receipts.objectives.watchdog import WatchdogSettings, watchdog_job_id
from roles.delivery.loops import Ticker
from roles.infra.settings import ProcessSettings
from roles.role import ROLES, resolve_role


@pytest.mark.parametrize("name", ROLES)
def test_the_five_roles_resolve_to_themselves(name: str) -> None:
    assert resolve_role(name) == (name, True)


@pytest.mark.parametrize("name", ["all", " all "])
def test_all_may_be_named(name: str) -> None:
    assert resolve_role(name) == ("all", True)


@pytest.mark.parametrize("name", ["workr-codex", "", None, "API", "worker"])
def test_anything_else_resolves_to_all_unrecognised(name: str | None) -> None:
    assert resolve_role(name) == ("all", False)


def test_concurrency_defaults_and_the_override() -> None:
    defaults = ProcessSettings.load({})
    assert defaults.concurrency("worker-chat") == 16
    assert defaults.concurrency("worker-codex") == 4
    assert defaults.concurrency("worker-control") == 8
    override = ProcessSettings.load({"RECEIPT_RESONATE_EXECUTE_CONCURRENCY": "3"})
    assert {override.concurrency(r) for r in ROLES} == {3}
    with pytest.raises(ValueError):
        ProcessSettings.load({"RECEIPT_RESONATE_EXECUTE_CONCURRENCY": "0"})


def test_watchdog_settings_defaults_floor_clamp_and_pause() -> None:
    assert WatchdogSettings.load({}) == WatchdogSettings(
        enabled=True, cron="* * * * *", timeout_ms=60_000, scan_limit=200
    )
    prefix = "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_"
    low = WatchdogSettings.load({prefix + "TIMEOUT_MS": "500", prefix + "SCAN_LIMIT": "0"})
    assert (low.timeout_ms, low.scan_limit) == (10_000, 1)
    high = WatchdogSettings.load({prefix + "SCAN_LIMIT": "99999"})
    assert high.scan_limit == 2_000
    assert WatchdogSettings.load({prefix + "ENABLED": "0"}).enabled is False
    assert WatchdogSettings.load({prefix + "CRON": "*/5 * * * *"}).cron == "*/5 * * * *"
    assert watchdog_job_id("2026-01-01T00:01:00+00:00") == "watchdog:2026-01-01T00:01:00+00:00"


async def test_a_ticker_outlives_a_failing_pass() -> None:
    calls = 0

    async def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyError("unexpected")

    def passes() -> float:
        return metrics.value("receipt_loop_pass_seconds_count", loop="t")

    def failed() -> float:
        return metrics.value("receipt_loop_failed_passes_total", loop="t")

    before, failed_before = passes(), failed()
    ticker = Ticker("t", flaky, interval_ms=10)
    task = asyncio.create_task(ticker.run())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls >= 3 and passes() - before >= 3
    assert failed() - failed_before == 1  # the one pass that raised, counted for the alert


def test_a_file_backed_dev_server_uses_wal_and_normal_sync(tmp_path: Path) -> None:
    from roles.infra.temporal import temporal_argv

    argv = temporal_argv(tmp_path / "t.sqlite", 7233, None)
    assert argv[argv.index("--db-filename") + 1] == str((tmp_path / "t.sqlite").resolve())
    pragmas = [argv[i + 1] for i, a in enumerate(argv) if a == "--sqlite-pragma"]
    assert pragmas == ["journal_mode=wal", "synchronous=normal"]
    assert "--headless" in argv and "history.transferProcessorMaxPollRPS=10000" in argv


def test_event_loop_by_role_and_the_override() -> None:
    from roles.role import event_loop_for

    unset = ProcessSettings.load({})
    assert event_loop_for("worker-codex", unset) == "asyncio"  # it spawns: vfork beats fork
    for role in ("api", "driver", "worker-chat", "worker-control", "all"):
        assert event_loop_for(role, unset) == "uvloop"
    chosen = ProcessSettings.load({"RECEIPT_EVENT_LOOP": " Asyncio "})
    assert event_loop_for("api", chosen) == "asyncio"
    chosen = ProcessSettings.load({"RECEIPT_EVENT_LOOP": "uvloop"})
    assert event_loop_for("worker-codex", chosen) == "uvloop"
