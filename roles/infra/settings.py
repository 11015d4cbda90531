"""A process's settings: one object of every concern's settings, read from the environment
once, at start (the one place the product reads it), checked there (one clear error naming
every bad variable), and printed by `receipt config` (secrets masked).

The concerns and where each is declared: receipts/settings.py lists them. Here are the
process's own, `ProcessSettings` (role, concurrency, drain, metrics, event loop, log format, with
each role's defaults where it leaves one unset) and `LoopSettings` (the recovery loops' periods),
and `RuntimeSettings`, all of them together: a role carries it on its runtime and the API on
its state, and each part is handed to what it configures (`handlers` to every job's handler).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel, BeforeValidator, Field

from activities.gateway_providers import GatewaySettings, Provider, load_providers
from activities.handlers.context import HandlerSettings
from activities.sandbox_policy import SandboxSettings
from receipts.agent_jobs.registry import AgentJobSettings
from receipts.enqueue import OrgCaps
from receipts.objectives.watchdog import WatchdogSettings
from receipts.settings import (
    MASK,
    FactorySettings,
    ReceiptSettings,
    Settings,
    SettingsError,
    Whole,
    is_database_url,
    secret,
    variables,
)
from receipts.timing import TimingSettings
from receipts.webhooks import WebhookSettings
from roles.api.settings import ApiSettings
from roles.infra.temporal import TemporalTLSSettings


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


class ProcessSettings(ReceiptSettings):
    """How a role process runs: which role, how many attempts at once, the drain, metrics,
    event loop, log format and level."""

    accepts: ClassVar[dict[str, str]] = {
        "execute_concurrency": "a positive integer",
        "shutdown_grace_ms": "a whole number of milliseconds (0 or more)",
        "loop_stall_ms": "a whole number of milliseconds (0 or more; 0: no watch)",
        "metrics_port": "a port number (0..65535; 0 picks a free one)",
        "event_loop": "'uvloop' or 'asyncio'",
        "log_format": "'json' or 'human'",
        "log_level": "'debug', 'info', 'warning' or 'error'",
    }

    role: str | None = Field(default=None, alias="RECEIPT_PROCESS_ROLE")
    execute_concurrency: Whole | None = Field(
        default=None, gt=0, alias="RECEIPT_RESONATE_EXECUTE_CONCURRENCY"
    )
    shutdown_grace_ms: Whole = Field(default=30_000, ge=0, alias="RECEIPT_SHUTDOWN_GRACE_MS")
    # The event loop's watch (roles/infra/loopwatch.py): a loop held this long is logged
    # loop.stalled with what holds it; 0 watches nothing.
    loop_stall_ms: Whole = Field(default=1_000, ge=0, alias="RECEIPT_LOOP_STALL_MS")
    metrics_host: str = Field(default="127.0.0.1", alias="RECEIPT_METRICS_HOST")
    metrics_port: Whole | None = Field(default=None, ge=0, le=65535, alias="RECEIPT_METRICS_PORT")
    event_loop: Annotated[Literal["uvloop", "asyncio"] | None, BeforeValidator(_lower)] = Field(
        default=None, alias="RECEIPT_EVENT_LOOP"
    )
    log_format: Annotated[Literal["json", "human"] | None, BeforeValidator(_lower)] = Field(
        default=None, alias="RECEIPT_LOG_FORMAT"
    )
    log_level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = (
        Field(default="info", alias="RECEIPT_LOG_LEVEL")
    )
    # Spans are exported over OTLP when this is set (the exporter reads it and the other
    # OTEL_* variables itself); unset, none are recorded.
    otlp_endpoint: str | None = Field(default=None, alias="OTEL_EXPORTER_OTLP_ENDPOINT")

    def concurrency(self, role: str) -> int:
        """The role's concurrent attempts: RECEIPT_RESONATE_EXECUTE_CONCURRENCY, else its
        default."""
        if self.execute_concurrency is not None:
            return self.execute_concurrency
        return DEFAULT_CONCURRENCY.get(role, 8)

    @property
    def grace(self) -> timedelta:
        """Grace for running handlers at SIGTERM (RECEIPT_SHUTDOWN_GRACE_MS)."""
        return timedelta(milliseconds=self.shutdown_grace_ms)

    def metrics_port_of(self, role: str) -> int:
        """The role's /metrics port: RECEIPT_METRICS_PORT, else the role's default (0: any
        free one)."""
        if self.metrics_port is not None:
            return self.metrics_port
        return DEFAULT_METRICS_PORTS.get(role, 9470)


# A role's defaults, where the variables above are unset.
# How many attempts each worker role runs at once (RECEIPT_RESONATE_EXECUTE_CONCURRENCY overrides).
DEFAULT_CONCURRENCY = {"worker-chat": 16, "worker-codex": 4, "worker-control": 8}
DEFAULT_GRACE_MS: int = ProcessSettings.model_fields["shutdown_grace_ms"].default
# The roles that post callbacks, webhooks and wakeups to URLs outside (and recover lost ones):
# the only ones whose pods may reach public addresses (deploy/k8s NetworkPolicy
# receipt-driver-callbacks) and that hold the callback secrets.
CALLBACK_ROLES: tuple[str, ...] = ("driver", "all")
DEFAULT_METRICS_PORTS = {
    "all": 9470,
    "api": 9475,  # the API serves /metrics on its own port; this one is for the SDK's (+100)
    "driver": 9471,
    "worker-chat": 9472,
    "worker-codex": 9473,
    "worker-control": 9474,
}


class LoopSettings(ReceiptSettings):
    """The recovery loops: queued redrive, startup objective resume, objective-control outbox,
    retention, and how often the schedule sync checks that Temporal still holds every schedule."""

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
    schedule_check_interval_ms: Whole = Field(
        default=30_000, ge=1, alias="RECEIPT_SCHEDULE_CHECK_INTERVAL_MS"
    )


@dataclass(frozen=True)
class RuntimeSettings:
    """Every concern's settings of one process, read once (`load`)."""

    core: Settings = field(default_factory=Settings)
    api: ApiSettings = field(default_factory=ApiSettings)
    process: ProcessSettings = field(default_factory=ProcessSettings)
    timing: TimingSettings = field(default_factory=TimingSettings)
    loops: LoopSettings = field(default_factory=LoopSettings)
    watchdog: WatchdogSettings = field(default_factory=WatchdogSettings)
    factory: FactorySettings = field(default_factory=FactorySettings)
    agent_jobs: AgentJobSettings = field(default_factory=AgentJobSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    temporal_tls: TemporalTLSSettings = field(default_factory=TemporalTLSSettings)
    webhooks: WebhookSettings = field(default_factory=WebhookSettings)
    # The AI gateway's providers, read from the providers file and the environment.
    providers: Mapping[str, Provider] = field(default_factory=dict, compare=False, repr=False)
    # The variables it was read from (what `receipt config` marks as set).
    environment: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def handlers(self) -> HandlerSettings:
        """What every job's handler is handed."""
        return HandlerSettings(
            sandbox=self.sandbox,
            factory=self.factory,
            watchdog=self.watchdog,
            timing=self.timing,
            agent_jobs=self.agent_jobs,
            org_caps=OrgCaps(
                self.api.org_max_queued, self.api.org_max_active, self.api.max_timeout_ms
            ),
        )


# Each concern, titled, in the order `receipt config` prints them.
TITLES = {
    "core": "database, Temporal, callbacks",
    "api": "api",
    "process": "role process",
    "timing": "leases, timeouts, heartbeats",
    "loops": "recovery loops",
    "watchdog": "objective watchdog",
    "factory": "factory",
    "agent_jobs": "agent jobs",
    "sandbox": "command sandbox",
    "gateway": "AI gateway",
    "temporal_tls": "Temporal connection",
    "webhooks": "per-organization webhooks",
}


def concerns() -> list[tuple[str, type[ReceiptSettings]]]:
    """Every concern's name and model, in the order `receipt config` prints them."""
    return [(f.name, f.default_factory) for f in fields(RuntimeSettings) if f.name in TITLES]  # type: ignore[misc]


def load(env: Mapping[str, str] | None = None) -> RuntimeSettings:
    """Every concern from `env` (default: this process's environment, read here and nowhere
    else); one SettingsError naming every bad variable."""
    environment = dict(os.environ if env is None else env)
    loaded: dict[str, Any] = {}
    problems = []
    for name, model in concerns():
        try:
            loaded[name] = model.load(environment)
        except SettingsError as exc:
            problems.append(str(exc))
    providers: dict[str, Provider] = {}
    if "gateway" in loaded:
        try:
            providers = load_providers(loaded["gateway"].providers_file, environment)
        except ValueError as exc:
            problems.append(f"RECEIPT_PROVIDERS_FILE: {exc}")
    if problems:
        raise SettingsError("; ".join(problems))
    return RuntimeSettings(**loaded, providers=providers, environment=environment)


def load_or_exit(env: Mapping[str, str] | None = None) -> RuntimeSettings:
    """At a process's start: every concern, or on a bad value the error printed and exit 2."""
    try:
        return load(env)
    except SettingsError as exc:
        print(f"receipt: bad configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def shown(variable: str, value: Any) -> str:
    """A value as `receipt config` prints it: secrets masked, a database URL's password too,
    and the password of any other URL's user (a callback receiver's, the Temporal UI's)."""
    if value is None:
        return "(unset)"
    if secret(variable) and not is_database_url(variable):
        return MASK
    text = str(value)
    if is_database_url(variable):
        try:
            parts = conninfo_to_dict(text)
        except Exception:  # not a conninfo we can parse: show none of it
            return MASK
        if parts.get("password"):
            parts["password"] = MASK
            return make_conninfo("", **{k: v for k, v in parts.items() if v is not None})
    elif variable.endswith("_URL"):
        try:
            url = urlsplit(text)
        except ValueError:  # no URL (an IPv6 typo's unclosed [): all before an @ is masked
            return f"{MASK}@{text.rpartition('@')[2]}" if "@" in text else text
        if url.password:
            user, _, host = url.netloc.rpartition("@")
            return url._replace(netloc=f"{user.partition(':')[0]}:{MASK}@{host}").geturl()
    return text


def effective(settings: RuntimeSettings) -> Iterator[tuple[str, list[tuple[str, str, bool]]]]:
    """Per concern: `(variable, shown value, set in the environment)` of every field."""
    for name, model in concerns():
        values: BaseModel = getattr(settings, name)
        rows = []
        for attribute, variable in variables(model).items():
            value = getattr(values, attribute)
            rows.append(
                (variable, shown(variable, value), bool(settings.environment.get(variable, "")))
            )
        yield TITLES[name], rows
