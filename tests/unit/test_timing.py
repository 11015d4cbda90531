"""Table tests for receipts.timing against the spec's "Leases, timeouts and heartbeats" section."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from pydantic import ValidationError

from receipts.settings import SettingsError
from receipts.timing import (
    JobTiming,
    TimingSettings,
    derive,
    driver_timeout_ms,
    execution_timeout_ms,
    heartbeat_interval_ms,
    lease_ms,
)

DEFAULTS = TimingSettings()

OBJECTIVE_CONTROL = ("factory-control", {"kind": "factory.objective.control"})
COMPUTER_MONITOR = (
    "factory-monitor",
    {"kind": "factory.task.monitor", "executionPath": "computer"},
)
PLAIN = ("factory", {"kind": "factory.dispatch"})


def settings(**overrides: Any) -> TimingSettings:
    return TimingSettings(**overrides)


# --------------------------------------------------------------------------------------------
# Settings defaults and validation
# --------------------------------------------------------------------------------------------


def test_settings_defaults_are_the_spec_defaults() -> None:
    assert DEFAULTS.model_dump() == {
        "job_lease_ms": 300_000,
        "factory_control_job_lease_ms": 900_000,
        "codex_job_lease_ms": 900_000,
        "factory_control_job_execution_timeout_ms": None,
        "active_stale_ms": 600_000,
        "heartbeat_interval_ms": None,
    }


def test_load_takes_variable_names_only_and_blank_as_unset() -> None:
    assert TimingSettings.load({"job_lease_ms": "9"}) == DEFAULTS  # a field's name is no variable
    assert TimingSettings.load({"JOB_LEASE_MS": "  "}) == DEFAULTS
    with pytest.raises(SettingsError, match="JOB_LEASE_MS must be"):
        TimingSettings.load({"JOB_LEASE_MS": "1.5"})


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        DEFAULTS.job_lease_ms = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_lease_ms", 0),
        ("factory_control_job_lease_ms", -1),
        ("codex_job_lease_ms", True),
        ("active_stale_ms", None),
        ("factory_control_job_execution_timeout_ms", 0),
        ("heartbeat_interval_ms", -5),
    ],
)
def test_settings_reject_non_positive_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        TimingSettings(**{field: value})  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Lease table
# --------------------------------------------------------------------------------------------

LEASE_CASES = [
    # -- default row ------------------------------------------------------------------------
    pytest.param("factory", {"kind": "factory.dispatch"}, DEFAULTS, 300_000, id="default"),
    pytest.param("someone-else", {}, DEFAULTS, 300_000, id="default-unknown-agent"),
    pytest.param("factory", {}, settings(job_lease_ms=45_000), 45_000, id="default-configured"),
    # -- factory-control running factory.objective.control ----------------------------------
    pytest.param(*OBJECTIVE_CONTROL, DEFAULTS, 900_000, id="objective-control"),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_lease_ms=1_000_000, codex_job_lease_ms=800_000),
        1_000_000,
        id="objective-control-uses-factory-control-lease",
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_lease_ms=100_000),
        300_000,
        id="objective-control-never-below-default",
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(job_lease_ms=1_200_000),
        1_200_000,
        id="objective-control-larger-default-wins",
    ),
    pytest.param(
        "factory-control",
        {"kind": "factory.objective.audit"},
        DEFAULTS,
        300_000,
        id="factory-control-other-kind-is-default",
    ),
    pytest.param(
        "factory",
        {"kind": "factory.objective.control"},
        DEFAULTS,
        300_000,
        id="objective-control-kind-other-agent-is-default",
    ),
    # -- factory-monitor running factory.task.monitor on the computer path ------------------
    pytest.param(*COMPUTER_MONITOR, DEFAULTS, 900_000, id="computer-monitor"),
    pytest.param(
        *COMPUTER_MONITOR,
        settings(codex_job_lease_ms=1_000_000, factory_control_job_lease_ms=800_000),
        1_000_000,
        id="computer-monitor-uses-codex-lease",
    ),
    pytest.param(
        *COMPUTER_MONITOR,
        settings(codex_job_lease_ms=100_000),
        300_000,
        id="computer-monitor-never-below-default",
    ),
    pytest.param(
        *COMPUTER_MONITOR,
        settings(job_lease_ms=2_000_000),
        2_000_000,
        id="computer-monitor-larger-default-wins",
    ),
    pytest.param(
        "factory-monitor",
        {"kind": "factory.task.monitor", "executionPath": "local"},
        DEFAULTS,
        300_000,
        id="monitor-other-execution-path-is-default",
    ),
    pytest.param(
        "factory-monitor",
        {"kind": "factory.task.monitor"},
        DEFAULTS,
        300_000,
        id="monitor-no-execution-path-is-default",
    ),
    pytest.param(
        "factory-monitor",
        {"kind": "factory.task.run", "executionPath": "computer"},
        DEFAULTS,
        300_000,
        id="factory-monitor-other-kind-is-default",
    ),
    pytest.param(
        "factory-control",
        {"kind": "factory.task.monitor", "executionPath": "computer"},
        DEFAULTS,
        300_000,
        id="computer-monitor-kind-other-agent-is-default",
    ),
    # -- codex ------------------------------------------------------------------------------
    pytest.param("codex", {}, DEFAULTS, 900_000, id="codex-no-timeout"),
    pytest.param(
        "codex",
        {"kind": "factory.task.run"},
        settings(codex_job_lease_ms=100_000),
        100_000,
        id="codex-no-timeout-is-codex-lease-even-below-default",
    ),
    pytest.param(
        "codex",
        {},
        settings(job_lease_ms=2_000_000),
        900_000,
        id="codex-ignores-job-lease",
    ),
    pytest.param("codex", {"timeoutMs": 100_000}, DEFAULTS, 900_000, id="codex-small-timeout"),
    pytest.param(
        "codex",
        {"timeoutMs": 600_000},
        DEFAULTS,
        900_000,
        id="codex-timeout-plus-margin-equals-codex-lease",
    ),
    pytest.param(
        "codex", {"timeoutMs": 1_000_000}, DEFAULTS, 1_300_000, id="codex-timeout-plus-margin"
    ),
    pytest.param(
        "codex",
        {"timeoutMs": 100_000},
        settings(codex_job_lease_ms=50_000),
        400_000,
        id="codex-timeout-plus-margin-over-small-codex-lease",
    ),
    pytest.param("codex", {"timeoutMs": 3_300_000}, DEFAULTS, 3_600_000, id="codex-exactly-at-cap"),
    pytest.param("codex", {"timeoutMs": 3_300_001}, DEFAULTS, 3_600_000, id="codex-just-over-cap"),
    pytest.param("codex", {"timeoutMs": 50_000_000}, DEFAULTS, 3_600_000, id="codex-capped"),
    pytest.param(
        "codex",
        {"timeoutMs": 50_000_000},
        settings(codex_job_lease_ms=4_000_000),
        4_000_000,
        id="codex-cap-bounds-payload-term-only",
    ),
    pytest.param(
        "codex", {"timeoutMs": 1_000_000.25}, DEFAULTS, 1_300_001, id="codex-float-timeout-ceil"
    ),
]


@pytest.mark.parametrize(("agent_id", "payload", "config", "expected"), LEASE_CASES)
def test_lease_table(
    agent_id: str, payload: dict[str, object], config: TimingSettings, expected: int
) -> None:
    assert lease_ms(agent_id, payload, config) == expected


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"timeoutMs": "1000000"}, id="string"),
        pytest.param({"timeoutMs": True}, id="bool-true"),
        pytest.param({"timeoutMs": False}, id="bool-false"),
        pytest.param({"timeoutMs": 0}, id="zero"),
        pytest.param({"timeoutMs": -5}, id="negative"),
        pytest.param({"timeoutMs": -5.5}, id="negative-float"),
        pytest.param({"timeoutMs": None}, id="none"),
        pytest.param({"timeoutMs": math.nan}, id="nan"),
        pytest.param({"timeoutMs": math.inf}, id="inf"),
        pytest.param({"timeoutMs": [1_000_000]}, id="list"),
        pytest.param({"config": {"timeoutMs": 1_000_000}}, id="nested-not-top-level"),
        pytest.param({"timeout_ms": 1_000_000}, id="wrong-key"),
    ],
)
def test_codex_ignores_invalid_payload_timeout(payload: dict[str, object]) -> None:
    # A small codex lease makes any accepted timeout (even 1 ms -> 300 001) visible.
    config = settings(codex_job_lease_ms=100_000)
    assert lease_ms("codex", payload, config) == 100_000


def test_payload_timeout_only_matters_for_codex() -> None:
    payload: dict[str, object] = {"kind": "factory.task.run", "timeoutMs": 3_000_000}
    assert lease_ms("factory", payload, DEFAULTS) == 300_000
    assert lease_ms("codex", payload, DEFAULTS) == 3_300_000


# --------------------------------------------------------------------------------------------
# Execution timeout
# --------------------------------------------------------------------------------------------

EXECUTION_CASES = [
    pytest.param(*PLAIN, DEFAULTS, 299_000, id="default-lease-minus-1000"),
    pytest.param(*OBJECTIVE_CONTROL, DEFAULTS, 899_000, id="objective-control"),
    pytest.param(*COMPUTER_MONITOR, DEFAULTS, 899_000, id="computer-monitor"),
    pytest.param("codex", {"timeoutMs": 50_000_000}, DEFAULTS, 3_599_000, id="codex-capped"),
    # floor 5 000
    pytest.param(*PLAIN, settings(job_lease_ms=6_001), 5_001, id="just-above-floor"),
    pytest.param(*PLAIN, settings(job_lease_ms=6_000), 5_000, id="exactly-floor"),
    pytest.param(*PLAIN, settings(job_lease_ms=5_999), 5_000, id="floored"),
    pytest.param(*PLAIN, settings(job_lease_ms=1), 5_000, id="floored-tiny-lease"),
    # FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS: lowers, objective control only
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_execution_timeout_ms=60_000),
        60_000,
        id="override-lowers-objective-control",
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_execution_timeout_ms=2_000_000),
        899_000,
        id="override-never-raises",
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_execution_timeout_ms=899_000),
        899_000,
        id="override-equal-to-derived",
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_execution_timeout_ms=1_000),
        5_000,
        id="override-still-floored",
    ),
    pytest.param(
        *PLAIN,
        settings(factory_control_job_execution_timeout_ms=60_000),
        299_000,
        id="override-ignored-default-agent",
    ),
    pytest.param(
        "factory-control",
        {"kind": "factory.objective.audit"},
        settings(factory_control_job_execution_timeout_ms=60_000),
        299_000,
        id="override-ignored-factory-control-other-kind",
    ),
    pytest.param(
        "factory",
        {"kind": "factory.objective.control"},
        settings(factory_control_job_execution_timeout_ms=60_000),
        299_000,
        id="override-ignored-objective-control-kind-other-agent",
    ),
    pytest.param(
        *COMPUTER_MONITOR,
        settings(factory_control_job_execution_timeout_ms=60_000),
        899_000,
        id="override-ignored-computer-monitor",
    ),
    pytest.param(
        "codex",
        {},
        settings(factory_control_job_execution_timeout_ms=60_000),
        899_000,
        id="override-ignored-codex",
    ),
]


@pytest.mark.parametrize(("agent_id", "payload", "config", "expected"), EXECUTION_CASES)
def test_execution_timeout(
    agent_id: str, payload: dict[str, object], config: TimingSettings, expected: int
) -> None:
    assert execution_timeout_ms(agent_id, payload, config) == expected


# --------------------------------------------------------------------------------------------
# Heartbeat cadence
# --------------------------------------------------------------------------------------------

HEARTBEAT_CASES = [
    pytest.param(*PLAIN, DEFAULTS, 100_000, id="default-lease-over-3"),
    pytest.param(*OBJECTIVE_CONTROL, DEFAULTS, 200_000, id="stale-window-smaller-than-lease"),
    pytest.param(
        "codex", {"timeoutMs": 50_000_000}, DEFAULTS, 200_000, id="codex-capped-stale-bound"
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(active_stale_ms=2_000_000),
        300_000,
        id="lease-smaller-than-stale-window",
    ),
    pytest.param(*PLAIN, settings(active_stale_ms=30_000), 10_000, id="configured-stale-window"),
    pytest.param(*PLAIN, settings(job_lease_ms=100_000), 33_333, id="integer-floor-division"),
    pytest.param(*PLAIN, settings(job_lease_ms=100_002), 33_334, id="integer-division-exact"),
    # floor 1 000
    pytest.param(*PLAIN, settings(job_lease_ms=3_000), 1_000, id="exactly-floor"),
    pytest.param(*PLAIN, settings(job_lease_ms=3_003), 1_001, id="just-above-floor"),
    pytest.param(*PLAIN, settings(job_lease_ms=2_999), 1_000, id="floored"),
    pytest.param(*PLAIN, settings(active_stale_ms=600), 1_000, id="floored-by-stale-window"),
    # RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS: only lowers, any agent
    pytest.param(*PLAIN, settings(heartbeat_interval_ms=5_000), 5_000, id="override-lowers"),
    pytest.param(
        "codex", {}, settings(heartbeat_interval_ms=5_000), 5_000, id="override-lowers-codex"
    ),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(heartbeat_interval_ms=5_000),
        5_000,
        id="override-lowers-objective-control",
    ),
    pytest.param(
        *PLAIN, settings(heartbeat_interval_ms=500_000), 100_000, id="override-never-raises"
    ),
    pytest.param(
        *PLAIN, settings(heartbeat_interval_ms=100_000), 100_000, id="override-equal-to-derived"
    ),
    pytest.param(*PLAIN, settings(heartbeat_interval_ms=10), 1_000, id="override-still-floored"),
]


@pytest.mark.parametrize(("agent_id", "payload", "config", "expected"), HEARTBEAT_CASES)
def test_heartbeat_interval(
    agent_id: str, payload: dict[str, object], config: TimingSettings, expected: int
) -> None:
    assert heartbeat_interval_ms(agent_id, payload, config) == expected


# --------------------------------------------------------------------------------------------
# Driver invocation timeout
# --------------------------------------------------------------------------------------------

DRIVER_CASES = [
    pytest.param(*PLAIN, DEFAULTS, 360_000, id="default-lease-plus-60000"),
    pytest.param(*OBJECTIVE_CONTROL, DEFAULTS, 960_000, id="objective-control"),
    pytest.param("codex", {"timeoutMs": 50_000_000}, DEFAULTS, 3_660_000, id="codex-capped"),
    # floor 120 000
    pytest.param(*PLAIN, settings(job_lease_ms=60_001), 120_001, id="just-above-floor"),
    pytest.param(*PLAIN, settings(job_lease_ms=60_000), 120_000, id="exactly-floor"),
    pytest.param(*PLAIN, settings(job_lease_ms=30_000), 120_000, id="floored"),
]


@pytest.mark.parametrize(("agent_id", "payload", "config", "expected"), DRIVER_CASES)
def test_driver_timeout(
    agent_id: str, payload: dict[str, object], config: TimingSettings, expected: int
) -> None:
    assert driver_timeout_ms(agent_id, payload, config) == expected


# --------------------------------------------------------------------------------------------
# derive
# --------------------------------------------------------------------------------------------

DERIVE_CASES = [
    pytest.param(*PLAIN, DEFAULTS, JobTiming(300_000, 299_000, 100_000, 360_000), id="default"),
    pytest.param(
        *OBJECTIVE_CONTROL,
        settings(factory_control_job_execution_timeout_ms=60_000, heartbeat_interval_ms=7_000),
        JobTiming(900_000, 60_000, 7_000, 960_000),
        id="objective-control-with-overrides",
    ),
    pytest.param(
        "codex",
        {"timeoutMs": 1_000_000},
        DEFAULTS,
        JobTiming(1_300_000, 1_299_000, 200_000, 1_360_000),
        id="codex",
    ),
    pytest.param(
        *PLAIN,
        settings(job_lease_ms=1),
        JobTiming(1, 5_000, 1_000, 120_000),
        id="all-floors",
    ),
]


@pytest.mark.parametrize(("agent_id", "payload", "config", "expected"), DERIVE_CASES)
def test_derive(
    agent_id: str, payload: dict[str, object], config: TimingSettings, expected: JobTiming
) -> None:
    assert derive(agent_id, payload, config) == expected


def test_job_timing_is_frozen() -> None:
    timing = derive(*PLAIN, DEFAULTS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        timing.lease_ms = 1  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# load: the variables of a process's environment
# --------------------------------------------------------------------------------------------

ENV_FIELDS = [
    ("JOB_LEASE_MS", "job_lease_ms"),
    ("FACTORY_CONTROL_JOB_LEASE_MS", "factory_control_job_lease_ms"),
    ("CODEX_JOB_LEASE_MS", "codex_job_lease_ms"),
    ("FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS", "factory_control_job_execution_timeout_ms"),
    ("RECEIPT_RESONATE_ACTIVE_STALE_MS", "active_stale_ms"),
    ("RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS", "heartbeat_interval_ms"),
]
ENV_VARS = [var for var, _ in ENV_FIELDS]


def test_load_empty_is_defaults() -> None:
    assert TimingSettings.load({}) == DEFAULTS


def test_load_ignores_unrelated_variables() -> None:
    env = {"RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS": "1", "job_lease_ms": "7", "PATH": "x"}
    assert TimingSettings.load(env) == DEFAULTS


@pytest.mark.parametrize(("var", "field"), ENV_FIELDS)
def test_load_reads_each_variable_into_its_field(var: str, field: str) -> None:
    loaded = TimingSettings.load({var: "12345"})
    assert getattr(loaded, field) == 12_345
    assert loaded == settings(**{field: 12_345})


def test_load_reads_all_variables_together() -> None:
    env = {var: str(1_000 + i) for i, var in enumerate(ENV_VARS)}
    loaded = TimingSettings.load(env)
    assert loaded == TimingSettings(
        job_lease_ms=1_000,
        factory_control_job_lease_ms=1_001,
        codex_job_lease_ms=1_002,
        factory_control_job_execution_timeout_ms=1_003,
        active_stale_ms=1_004,
        heartbeat_interval_ms=1_005,
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("42", 42, id="plain"),
        pytest.param(" 42\n", 42, id="surrounding-whitespace"),
        pytest.param("+42", 42, id="explicit-plus"),
        pytest.param("007", 7, id="leading-zeros"),
    ],
)
def test_load_accepts_integers(raw: str, expected: int) -> None:
    assert TimingSettings.load({"JOB_LEASE_MS": raw}).job_lease_ms == expected


@pytest.mark.parametrize("raw", ["", "   "])
def test_load_blank_is_unset(raw: str) -> None:
    assert TimingSettings.load({var: raw for var in ENV_VARS}) == DEFAULTS


BAD_VALUES = ["abc", "1.5", "1e3", "1_000", "0x10", "12ms", "0", "-1", "-0", "٣"]


@pytest.mark.parametrize("var", ENV_VARS)
@pytest.mark.parametrize("raw", BAD_VALUES)
def test_load_rejects_bad_values_naming_variable_and_value(var: str, raw: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        TimingSettings.load({var: raw})
    message = str(excinfo.value)
    assert var in message
    assert repr(raw) in message
