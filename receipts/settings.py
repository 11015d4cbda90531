"""Process settings read from the environment: one pydantic-settings model per concern, each
field reading the variable named in its alias (the specification's names and defaults).

A bad value is one `SettingsError` naming the variable, what it accepts and what it got; roles
check every concern at start (`roles/infra/settings.py`) so a typo stops the process at once
instead of deep in a loop. `receipt config` prints the effective values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Self

from pydantic import BeforeValidator, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from receipts.kinds import GROUP_QUEUES
from receipts.timing import TimingSettings
from receipts.watchdog import (
    DEFAULT_CRON,
    SCAN_LIMIT_DEFAULT,
    SCAN_LIMIT_MAX,
    SCAN_LIMIT_MIN,
    TIMEOUT_DEFAULT_MS,
    TIMEOUT_FLOOR_MS,
    WatchdogSettings,
)


class SettingsError(ValueError):
    """A setting's value is not one it accepts: `VARIABLE must be …, got 'value'`."""


_WHOLE = re.compile(r"[+-]?[0-9]+")


def whole_number(value: Any) -> Any:
    """A base-10 integer written in ASCII digits (surrounding whitespace allowed): `12`, `+12`,
    `007`. `1.5`, `1e3`, `1_000`, `0x10` and other digits are refused (ValueError)."""
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.fullmatch(text) is None:
            raise ValueError("not a whole number")
        return int(text)
    return value


def switch(value: Any) -> Any:
    """`0`, `false`, `no`, `off` (any case) are off; any other text is on."""
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return value


Whole = Annotated[int, BeforeValidator(whole_number)]
Switch = Annotated[bool, BeforeValidator(switch)]

# Set while `EnvSettings.load` builds a model from a given mapping instead of the environment.
_GIVEN_ONLY: ContextVar[bool] = ContextVar("receipt_settings_given_only", default=False)


class _VariablesOnly(PydanticBaseSettingsSource):
    """The environment, read only through each field's variable (its alias): pydantic-settings
    would also read a field by its Python name, so a machine's `HOST`, `PORT` or `ROLE` would
    set `host`, `port` or `role`."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.env.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        if _GIVEN_ONLY.get():  # `EnvSettings.load(env)`: the given mapping, not the environment
            return {}
        named = {n for n, f in self.settings_cls.model_fields.items() if f.alias not in (None, n)}
        return {key: value for key, value in self.env().items() if key not in named}


class ReceiptSettings(BaseSettings):
    """The base of every settings model: values come from the constructor, then from the
    environment by variable name only (no `.env` file, no secrets directory)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _VariablesOnly(settings_cls, env_settings))


class EnvSettings(ReceiptSettings):
    """A concern's settings. `load(env)` reads `env` (default: the process environment); an
    empty or blank variable counts as unset."""

    model_config = SettingsConfigDict(
        extra="ignore", populate_by_name=True, env_ignore_empty=True, frozen=True
    )
    # What a value must be, as the error message says it: per field, else for every field.
    accepts: ClassVar[dict[str, str]] = {}
    accepts_any: ClassVar[str] = ""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None) -> Self:
        """The settings from `env` (default: the environment); SettingsError on a bad value.

        From the environment, the model last built is reused while every one of its variables
        holds the same value: a handler reads its settings per job (the sandbox's, per command),
        and pydantic-settings' sources cost about a millisecond a read. Models are frozen, so
        sharing one is safe; a bad value is never kept, so it raises at every read."""
        if env is None:
            key = _environment_key(cls)
            kept = _FROM_ENVIRONMENT.get(cls)
            if kept is not None and kept[0] == key:
                return kept[1]  # type: ignore[return-value]
            loaded = cls._build(None)
            if _environment_key(cls) == key:  # kept only if nothing changed during the build
                _FROM_ENVIRONMENT[cls] = (key, loaded)
            return loaded
        return cls._build(env)

    @classmethod
    def _build(cls, env: Mapping[str, str] | None) -> Self:
        source = os.environ if env is None else env
        with _given_only(env is not None):
            given = {}
            if env is not None:
                wanted = set(variables(cls).values())
                given = {k: v for k, v in env.items() if k in wanted and v.strip()}
            try:
                return cls(**given)
            except ValidationError as exc:
                accepts = (
                    dict.fromkeys(cls.model_fields, cls.accepts_any) if cls.accepts_any else {}
                )
                raise settings_error(cls, exc, source, accepts | cls.accepts) from None


# Per model, the settings last built from the process environment and the key they were built
# under (`EnvSettings.load`).
_FROM_ENVIRONMENT: dict[type[EnvSettings], tuple[tuple[tuple[str, str], ...], EnvSettings]] = {}


@cache
def _variable_names(model: type[BaseSettings]) -> frozenset[str]:
    return frozenset(v.lower() for v in variables(model).values())


def _environment_key(model: type[BaseSettings]) -> tuple[tuple[str, str], ...]:
    """The process environment's variables a model reads, as written and in the environment's
    order: pydantic-settings matches a name in any case (lowered) and the last of two spellings
    wins. A model reads its variables by alias only (`_VariablesOnly`; no prefix, no validation
    alias): a field read any other way would have to be part of this key."""
    names = _variable_names(model)
    return tuple((k, v) for k, v in os.environ.items() if k.lower() in names)


def variables(model: type[BaseSettings]) -> dict[str, str]:
    """`{field: variable}` of a settings model (the alias, else the field's name)."""
    return {name: f.alias or name for name, f in model.model_fields.items()}


def settings_error(
    model: type[BaseSettings],
    exc: ValidationError,
    source: Mapping[str, str] | None = None,
    accepts: Mapping[str, str] | None = None,
) -> SettingsError:
    """One message naming each bad variable, what it accepts and the value as written."""
    source = os.environ if source is None else source
    named = variables(model)
    lines = []
    for error in exc.errors():
        key = str(error["loc"][0]) if error["loc"] else ""
        name = next((n for n, v in named.items() if key in (n, v)), key)
        variable = named.get(name, key)
        allowed = (accepts or {}).get(name) or _accepts(error)
        raw = source.get(variable, error.get("input"))
        lines.append(f"{variable} must be {allowed}, got {raw!r}")
    return SettingsError("; ".join(lines))


def _accepts(error: Any) -> str:
    """pydantic's message as what a value must be: `Input should be a valid integer` → `a
    valid integer`."""
    message = str(error["msg"])
    for prefix in ("Input should be ", "Value error, "):
        message = message.removeprefix(prefix)
    return message[0].lower() + message[1:] if message else "valid"


@contextmanager
def _given_only(on: bool) -> Iterator[None]:
    token = _GIVEN_ONLY.set(on)
    try:
        yield
    finally:
        _GIVEN_ONLY.reset(token)


# Three quarters of one worker's default slots per group (roles/role.py: chat 16, codex 4,
# control 8): with the default deployment another organization always finds one free.
DEFAULT_ORG_RUNNING_CAPS = "chat=12,codex=3,control=6"


@cache
def group_caps(text: str) -> Mapping[str, int]:
    """`RECEIPT_ORG_MAX_RUNNING_PER_GROUP` as `{worker queue: cap}`: one whole number for every
    group (`4`), or `group=n` pairs (`codex=2,chat=8`; a group not named keeps its default); 0
    is no cap; blank is the default. ValueError naming what it accepts otherwise."""
    accepts = (
        "a whole number (0: no cap) or comma-separated group=number pairs, the groups being "
        + ", ".join(GROUP_QUEUES)
    )
    text = text.strip() or DEFAULT_ORG_RUNNING_CAPS  # blank: unset
    if _WHOLE.fullmatch(text) and int(text) >= 0:
        return MappingProxyType(dict.fromkeys(GROUP_QUEUES.values(), int(text)))
    caps: dict[str, int] = {}
    if text != DEFAULT_ORG_RUNNING_CAPS:  # groups not named keep their default
        caps.update(group_caps(DEFAULT_ORG_RUNNING_CAPS))
    for pair in text.split(","):
        group, _, number = pair.partition("=")
        queue = GROUP_QUEUES.get(group.strip())
        if queue is None or not _WHOLE.fullmatch(number.strip()) or int(number) < 0:
            raise ValueError(accepts)
        caps[queue] = int(number)
    return MappingProxyType(caps)


class Settings(ReceiptSettings):
    """Settings shared by every role; each field reads the environment variable in its alias."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    database_url: str | None = Field(default=None, alias="RECEIPT_DATABASE_URL")
    data_dir: Path = Field(default=Path(".receipt"), alias="RECEIPT_DATA_DIR")
    pool_min_size: int = Field(default=1, ge=1, alias="RECEIPT_DB_POOL_MIN")
    pool_max_size: int = Field(default=10, ge=1, alias="RECEIPT_DB_POOL_MAX")
    # The api's statements end after this (0: no limit); a cancelled one answers 503.
    api_statement_timeout_ms: int = Field(
        default=5_000, ge=0, alias="RECEIPT_API_STATEMENT_TIMEOUT_MS"
    )
    # Terminal jobs older than this are pruned with all their rows by worker-control ("30d",
    # "12h"; "0" keeps everything). See receipts/retention.py.
    retention: str = Field(default="0", alias="RECEIPT_RETENTION")

    @field_validator("retention")
    @classmethod
    def _retention_is_a_duration(cls, value: str) -> str:
        from receipts.errors import InvalidInput
        from receipts.retention import parse_duration

        try:
            parse_duration(value, name="RECEIPT_RETENTION")
        except InvalidInput as exc:
            raise ValueError(exc.message) from None
        return value

    temporal_address: str | None = Field(default=None, alias="RECEIPT_TEMPORAL_ADDRESS")
    temporal_namespace: str = Field(default="default", alias="RECEIPT_TEMPORAL_NAMESPACE")
    temporal_ui_url: str = Field(default="http://localhost:8233", alias="RECEIPT_TEMPORAL_UI_URL")
    task_queue_prefix: str = Field(default="", alias="RECEIPT_TASK_QUEUE_PREFIX")
    deliveries_per_attempt: int = Field(
        default=2, ge=1, le=10, alias="RECEIPT_DELIVERIES_PER_ATTEMPT"
    )
    # How long Temporal waits for a heartbeat from a running attempt before it redelivers the
    # attempt to another worker (the attempt activity's heartbeat timeout).
    worker_lost_timeout_ms: int = Field(
        default=30_000, ge=1_000, le=3_600_000, alias="RECEIPT_WORKER_LOST_TIMEOUT_MS"
    )

    # Fair dispatch (receipts/plan.py): the dispatch slots one organization may hold on each
    # worker queue; its other deliverable jobs wait queued until one is given back.
    org_max_running_per_group: str = Field(
        default=DEFAULT_ORG_RUNNING_CAPS, alias="RECEIPT_ORG_MAX_RUNNING_PER_GROUP"
    )

    @field_validator("org_max_running_per_group")
    @classmethod
    def _group_caps(cls, value: str) -> str:
        group_caps(value)
        return value

    def org_running_cap(self, queue: str) -> int:
        """The dispatch slots one organization may hold on worker queue `queue` (unprefixed,
        as `route` names it); 0: no cap."""
        return group_caps(self.org_max_running_per_group).get(queue, 0)

    resonate_callback_url: str | None = Field(default=None, alias="RECEIPT_RESONATE_CALLBACK_URL")
    event_callback_url: str | None = Field(default=None, alias="RECEIPT_EVENT_CALLBACK_URL")
    callback_token: str | None = Field(default=None, alias="RECEIPT_CALLBACK_TOKEN")
    callback_signing_secret: str | None = Field(
        default=None, alias="RECEIPT_CALLBACK_SIGNING_SECRET"
    )

    def queue(self, name: str) -> str:
        """Return a task queue's name in this deployment (`RECEIPT_TASK_QUEUE_PREFIX` + name)."""
        return self.task_queue_prefix + name

    @property
    def callback_urls(self) -> list[str]:
        """The distinct configured callback URLs, in configuration order."""
        urls = [u for u in (self.resonate_callback_url, self.event_callback_url) if u]
        return list(dict.fromkeys(urls))


class TimingEnv(EnvSettings):
    """Leases, timeouts and heartbeats (receipts/timing.py derives every job's values)."""

    accepts_any: ClassVar[str] = "a positive integer (milliseconds)"

    job_lease_ms: Whole = Field(default=300_000, gt=0, alias="JOB_LEASE_MS")
    factory_control_job_lease_ms: Whole = Field(
        default=900_000, gt=0, alias="FACTORY_CONTROL_JOB_LEASE_MS"
    )
    codex_job_lease_ms: Whole = Field(default=900_000, gt=0, alias="CODEX_JOB_LEASE_MS")
    factory_control_job_execution_timeout_ms: Whole | None = Field(
        default=None, gt=0, alias="FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS"
    )
    active_stale_ms: Whole = Field(default=600_000, gt=0, alias="RECEIPT_RESONATE_ACTIVE_STALE_MS")
    heartbeat_interval_ms: Whole | None = Field(
        default=None, gt=0, alias="RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS"
    )

    def timing(self) -> TimingSettings:
        return TimingSettings(**self.model_dump())


class WatchdogEnv(EnvSettings):
    """The Factory objective watchdog's schedule and scan."""

    accepts: ClassVar[dict[str, str]] = {
        "timeout_ms": "an integer (milliseconds)",
        "scan_limit": "an integer",
    }

    enabled: Switch = Field(default=True, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED")
    cron: str = Field(default=DEFAULT_CRON, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON")
    timeout_ms: Whole = Field(
        default=TIMEOUT_DEFAULT_MS, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TIMEOUT_MS"
    )
    scan_limit: Whole = Field(
        default=SCAN_LIMIT_DEFAULT, alias="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT"
    )

    def watchdog(self) -> WatchdogSettings:
        """Timeout floored at 10 000, scan limit clamped to 1..2000."""
        return WatchdogSettings(
            enabled=self.enabled,
            cron=self.cron.strip() or DEFAULT_CRON,
            timeout_ms=max(TIMEOUT_FLOOR_MS, self.timeout_ms),
            scan_limit=max(SCAN_LIMIT_MIN, min(SCAN_LIMIT_MAX, self.scan_limit)),
        )


class FactoryEnv(EnvSettings):
    """The Factory's commands: the planner of objectives without tasks, and the coding-agent CLI
    a `prompt` task runs (docs/factory.md). Unset: none configured."""

    accepts: ClassVar[dict[str, str]] = {"planner_timeout_ms": "a positive integer (milliseconds)"}

    planner_command: str = Field(default="", alias="RECEIPT_FACTORY_PLANNER_COMMAND")
    planner_timeout_ms: Whole = Field(
        default=120_000, gt=0, alias="RECEIPT_FACTORY_PLANNER_TIMEOUT_MS"
    )
    codex_command: str = Field(default="", alias="RECEIPT_CODEX_COMMAND")
