"""The settings layer: how a concern's settings are declared, read and checked.

Each concern declares one frozen model on `ReceiptSettings`, next to the code it configures,
each field naming its environment variable in its alias (the specification's names and
defaults): `Settings` here (database, Temporal, callbacks, fair dispatch) and `FactorySettings`,
`TimingSettings` (receipts/timing.py), `WatchdogSettings` (receipts/objectives/watchdog.py),
`AgentJobSettings` (receipts/agent_jobs/registry.py), `SandboxSettings`
(activities/sandbox_policy.py), `ApiSettings` (roles/api/settings.py), `TemporalTLSSettings`
(roles/infra/temporal.py), `ProcessSettings` and `LoopSettings` (roles/infra/settings.py).

A model is built from a mapping of variables (`Model.load(env)`), never from the process
environment itself: a process reads its environment once, at start, into one object of all its
concerns (roles/infra/settings.py `RuntimeSettings`), checked there (one `SettingsError` naming
every bad variable, what it accepts and what it got) and handed to what each concern
configures. Building a model with no variables gives its defaults.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Self

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from receipts.durations import parse_duration
from receipts.errors import InvalidInput
from receipts.executables import parse_allow_lists
from receipts.kinds import GROUP_QUEUES


class SettingsError(ValueError):
    """A setting's value is not one it accepts: `VARIABLE must be …, got 'value'` (a secret's
    value, `secret`, as `***`)."""


SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY")
MASK = "***"


def secret(variable: str) -> bool:
    """Whether `variable`'s value is never printed whole: a token, a secret, a password, an
    API key, or a database URL (its password: `RECEIPT_DATABASE_URL`,
    `RECEIPT_DATABASE_DIRECT_URL`)."""
    return any(word in variable for word in SECRET_WORDS) or is_database_url(variable)


DATABASE_URLS = ("RECEIPT_DATABASE_URL", "RECEIPT_DATABASE_DIRECT_URL")


def is_database_url(variable: str) -> bool:
    """Whether `variable` holds a database URL: libpq's, its password masked when shown."""
    return variable in DATABASE_URLS or variable.endswith("DATABASE_URL")


_WHOLE = re.compile(r"[+-]?[0-9]+")


def whole_number(value: Any) -> Any:
    """A base-10 integer written in ASCII digits (surrounding whitespace allowed): `12`, `+12`,
    `007`. `1.5`, `1e3`, `1_000`, `0x10` and other digits are refused (ValueError), and in code
    anything but an int (a bool, a float)."""
    if isinstance(value, bool) or isinstance(value, float):
        raise ValueError("not a whole number")
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


class ReceiptSettings(BaseModel):
    """The base of every concern's settings: frozen, each field read from the variable in its
    alias (or given by its Python name in code and tests)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)
    # What a value must be, as the error message says it: per field, else for every field.
    accepts: ClassVar[dict[str, str]] = {}
    accepts_any: ClassVar[str] = ""

    @classmethod
    def load(cls, env: Mapping[str, str]) -> Self:
        """The settings the variables in `env` give (by their exact names; an empty or blank
        value counts as unset); `SettingsError` naming each bad variable."""
        wanted = set(variables(cls).values())
        given = {key: value for key, value in env.items() if key in wanted and value.strip()}
        try:
            return cls(**given)
        except ValidationError as exc:
            accepts = dict.fromkeys(cls.model_fields, cls.accepts_any) if cls.accepts_any else {}
            raise settings_error(cls, exc, given, accepts | cls.accepts) from None


@cache
def variables(model: type[BaseModel]) -> dict[str, str]:
    """`{field: variable}` of a settings model (the alias, else the field's name)."""
    return {name: f.alias or name for name, f in model.model_fields.items()}


def settings_error(
    model: type[BaseModel],
    exc: ValidationError,
    given: Mapping[str, str],
    accepts: Mapping[str, str] | None = None,
) -> SettingsError:
    """One message naming each bad variable, what it accepts and the value as written."""
    named = variables(model)
    lines = []
    for error in exc.errors():
        if not error["loc"]:  # a rule across several variables: its own message names them
            lines.append(str(error["msg"]).removeprefix("Value error, "))
            continue
        key = str(error["loc"][0])
        name = next((n for n, v in named.items() if key in (n, v)), key)
        variable = named.get(name, key)
        allowed = (accepts or {}).get(name) or _accepts(error)
        raw = MASK if secret(variable) else given.get(variable, error.get("input"))
        lines.append(f"{variable} must be {allowed}, got {raw!r}")
    return SettingsError("; ".join(lines))


def _accepts(error: Any) -> str:
    """pydantic's message as what a value must be: `Input should be a valid integer` → `a
    valid integer`."""
    message = str(error["msg"])
    for prefix in ("Input should be ", "Value error, "):
        message = message.removeprefix(prefix)
    return message[0].lower() + message[1:] if message else "valid"


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
    """Settings shared by every role: the database, Temporal, callbacks, fair dispatch."""

    database_url: str | None = Field(default=None, alias="RECEIPT_DATABASE_URL")
    # Set when RECEIPT_DATABASE_URL goes through a transaction-mode pooler (PgBouncer
    # pool_mode=transaction, Supavisor's transaction port, RDS Proxy): the same database without
    # one (the primary, or a session-mode pooler), for the LISTEN connection and the migrations;
    # the pool then prepares no statement and sets no session setting (roles/infra/db.py).
    database_direct_url: str | None = Field(default=None, alias="RECEIPT_DATABASE_DIRECT_URL")
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

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _database_url_parses(cls, value: str | None) -> str | None:
        # Checked here, where its error names no value: libpq's own quotes the whole URL,
        # password included (a role's traceback, `receipt migrate`'s message).
        if value is not None:
            try:
                conninfo_to_dict(value)
            except ProgrammingError:
                raise ValueError(
                    "a PostgreSQL connection URL (postgresql://user:password@host:port/db) "
                    "or key=value string"
                ) from None
        return value

    @model_validator(mode="after")
    def _direct_beside_a_pooler(self) -> Self:
        if self.database_direct_url is not None and self.database_url is None:
            raise ValueError(
                "RECEIPT_DATABASE_DIRECT_URL is set without RECEIPT_DATABASE_URL: it is the "
                "direct route beside a transaction pooler's URL; set RECEIPT_DATABASE_URL too"
            )
        return self

    @field_validator("retention")
    @classmethod
    def _retention_is_a_duration(cls, value: str) -> str:
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


class FactorySettings(ReceiptSettings):
    """The Factory's commands: the planner of objectives without tasks, and the coding-agent CLI
    a `prompt` task runs (docs/factory.md). Unset: none configured."""

    accepts: ClassVar[dict[str, str]] = {"planner_timeout_ms": "a positive integer (milliseconds)"}

    planner_command: str = Field(default="", alias="RECEIPT_FACTORY_PLANNER_COMMAND")
    planner_timeout_ms: Whole = Field(
        default=120_000, gt=0, alias="RECEIPT_FACTORY_PLANNER_TIMEOUT_MS"
    )
    codex_command: str = Field(default="", alias="RECEIPT_CODEX_COMMAND")
    # The organizations' allow-lists of executables, as the api reads them: the tasks a planner
    # writes are held to them too (receipts/executables.py).
    org_executables: dict[str, list[str]] = Field(
        default_factory=dict, alias="RECEIPT_ORG_EXECUTABLES"
    )

    @field_validator("org_executables", mode="before")
    @classmethod
    def _executables(cls, value: Any) -> Any:
        return parse_allow_lists(value)
