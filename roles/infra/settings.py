"""The settings of a role process, one pydantic-settings model per concern, and the two things
done with all of them: check them at start (one clear error naming the variable) and print
the effective values (`receipt config`, secrets masked).

The concerns: `Settings` (database, Temporal, callbacks) and the timing and watchdog models in
`receipts/settings.py`, `ApiSettings` (roles/api), `SandboxEnv` (activities/sandbox_policy.py),
and here `ProcessSettings` (role, concurrency, drain, metrics, event loop, log format), with each
role's defaults where it leaves one unset, and `LoopSettings` (the recovery loops' periods). Each
reads the environment by its variables only.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated, Any, ClassVar, Literal

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings

from receipts.settings import (
    EnvSettings,
    FactoryEnv,
    Settings,
    SettingsError,
    TimingEnv,
    WatchdogEnv,
    Whole,
    settings_error,
    variables,
)


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


class ProcessSettings(EnvSettings):
    """How a role process runs: which role, how many attempts at once, the drain, metrics,
    event loop and log format."""

    accepts: ClassVar[dict[str, str]] = {
        "execute_concurrency": "a positive integer",
        "shutdown_grace_ms": "a whole number of milliseconds (0 or more)",
        "metrics_port": "a port number (0..65535; 0 picks a free one)",
        "event_loop": "'uvloop' or 'asyncio'",
        "log_format": "'json' or 'human'",
    }

    role: str | None = Field(default=None, alias="RECEIPT_PROCESS_ROLE")
    execute_concurrency: Whole | None = Field(
        default=None, gt=0, alias="RECEIPT_RESONATE_EXECUTE_CONCURRENCY"
    )
    shutdown_grace_ms: Whole = Field(default=30_000, ge=0, alias="RECEIPT_SHUTDOWN_GRACE_MS")
    metrics_host: str = Field(default="127.0.0.1", alias="RECEIPT_METRICS_HOST")
    metrics_port: Whole | None = Field(default=None, ge=0, le=65535, alias="RECEIPT_METRICS_PORT")
    event_loop: Annotated[Literal["uvloop", "asyncio"] | None, BeforeValidator(_lower)] = Field(
        default=None, alias="RECEIPT_EVENT_LOOP"
    )
    log_format: Annotated[Literal["json", "human"] | None, BeforeValidator(_lower)] = Field(
        default=None, alias="RECEIPT_LOG_FORMAT"
    )


# A role's defaults, where the variables above are unset.
# How many attempts each worker role runs at once (RECEIPT_RESONATE_EXECUTE_CONCURRENCY overrides).
DEFAULT_CONCURRENCY = {"worker-chat": 16, "worker-codex": 4, "worker-control": 8}
DEFAULT_GRACE_MS: int = ProcessSettings.model_fields["shutdown_grace_ms"].default
DEFAULT_METRICS_PORTS = {
    "all": 9470,
    "api": 9475,  # the API serves /metrics on its own port; this one is for the SDK's (+100)
    "driver": 9471,
    "worker-chat": 9472,
    "worker-codex": 9473,
    "worker-control": 9474,
}


def execute_concurrency(role: str, env: dict[str, str] | None = None) -> int:
    """The role's concurrent attempts: its default, or RECEIPT_RESONATE_EXECUTE_CONCURRENCY."""
    override = ProcessSettings.load(env).execute_concurrency
    return override if override is not None else DEFAULT_CONCURRENCY.get(role, 8)


def shutdown_grace() -> timedelta:
    """Grace for running handlers at SIGTERM (RECEIPT_SHUTDOWN_GRACE_MS, default 30 000)."""
    return timedelta(milliseconds=ProcessSettings.load().shutdown_grace_ms)


def metrics_port(role: str, env: dict[str, str] | None = None) -> int:
    """The role's /metrics port: RECEIPT_METRICS_PORT, else the role's default (0 = any free)."""
    port = ProcessSettings.load(env).metrics_port
    return port if port is not None else DEFAULT_METRICS_PORTS.get(role, 9470)


def metrics_host() -> str:
    """The address the /metrics endpoints bind (RECEIPT_METRICS_HOST, default 127.0.0.1)."""
    return ProcessSettings.load().metrics_host


class LoopSettings(EnvSettings):
    """The recovery loops: queued redrive, startup objective resume, objective-control outbox,
    retention."""

    accepts_any: ClassVar[str] = "a whole number of milliseconds (0 or more)"

    redrive_interval_ms: Whole = Field(
        default=15_000, ge=0, alias="RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS"
    )
    redrive_min_age_ms: Whole = Field(
        default=30_000, ge=0, alias="RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS"
    )
    redrive_cooldown_ms: Whole = Field(
        default=15_000, ge=0, alias="RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS"
    )
    startup_settle_ms: Whole = Field(default=1_000, ge=0, alias="RESONATE_STARTUP_SETTLE_MS")
    outbox_interval_ms: Whole = Field(
        default=5_000, ge=0, alias="RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS"
    )
    outbox_timeout_ms: Whole = Field(
        default=15_000, ge=0, alias="RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS"
    )
    retention_interval_ms: Whole = Field(
        default=60_000, ge=1, alias="RECEIPT_RETENTION_INTERVAL_MS"
    )


def concerns() -> list[tuple[str, type[BaseSettings]]]:
    """Every settings model, titled, in the order `receipt config` prints them."""
    from activities.sandbox_policy import SandboxEnv
    from receipts.agent_jobs.registry import AgentJobSettings
    from roles.api.app import ApiSettings

    return [
        ("database, Temporal, callbacks", Settings),
        ("api", ApiSettings),
        ("role process", ProcessSettings),
        ("leases, timeouts, heartbeats", TimingEnv),
        ("recovery loops", LoopSettings),
        ("objective watchdog", WatchdogEnv),
        ("factory", FactoryEnv),
        ("agent jobs", AgentJobSettings),
        ("command sandbox", SandboxEnv),
    ]


def load(model: type[BaseSettings]) -> BaseSettings:
    """One concern from the environment; SettingsError (naming the variable) on a bad value."""
    if issubclass(model, EnvSettings):
        return model.load()
    try:
        return model()
    except ValidationError as exc:
        raise settings_error(model, exc) from None


def check(*, api: bool = True) -> None:
    """Load every concern (the api's only with `api`); raise one SettingsError listing every
    bad variable."""
    problems = []
    for _, model in concerns():
        if not api and model.__name__ == "ApiSettings":
            continue
        try:
            load(model)
        except SettingsError as exc:
            problems.append(str(exc))
    if problems:
        raise SettingsError("; ".join(problems))


def exit_on_bad_settings(*, api: bool = True) -> None:
    """At a process's start: check every concern; on a bad value print it and exit 2."""
    try:
        check(api=api)
    except SettingsError as exc:
        print(f"receipt: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD")
MASK = "***"


def shown(variable: str, value: Any) -> str:
    """A value as `receipt config` prints it: secrets masked, a database URL's password too."""
    if value is None:
        return "(unset)"
    if any(word in variable for word in SECRET_WORDS):
        return MASK
    text = str(value)
    if variable.endswith("DATABASE_URL"):
        try:
            parts = conninfo_to_dict(text)
        except Exception:  # not a conninfo we can parse: show none of it
            return MASK
        if parts.get("password"):
            parts["password"] = MASK
            return make_conninfo("", **{k: v for k, v in parts.items() if v is not None})
    return text


def effective() -> Iterator[tuple[str, list[tuple[str, str, bool]]]]:
    """Per concern: `(variable, shown value, set in the environment)` of every field."""
    import os

    for title, model in concerns():
        values = load(model)
        rows = []
        for name, variable in variables(model).items():
            value = getattr(values, name)
            rows.append((variable, shown(variable, value), bool(os.environ.get(variable, ""))))
        yield title, rows
