"""The model providers the AI gateway forwards to (`RECEIPT_PROVIDERS_FILE`): each a binding id,
its API style, base URL and pool of credentials; and each organization's daily token budget
(`RECEIPT_GATEWAY_ORG_DAILY_BUDGET`, kept by `activities/gateway_budget.py`). Parsed once by the
process's settings (`roles/infra/settings.py`), which hands over the environment a credential
may be read from."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from receipts.settings import ReceiptSettings

log = logging.getLogger("activities.gateway")

ApiStyle = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Budgets:
    """Tokens (in and out) an organization's model calls may spend per UTC day: `default` for
    every organization, `overrides` by organization id; 0 is no budget."""

    default: int = 0
    overrides: Mapping[str, int] = field(default_factory=dict)

    def of(self, organization_id: str | None) -> int:
        if organization_id is None:
            return 0
        return self.overrides.get(organization_id, self.default)

    @property
    def any(self) -> bool:
        return self.default > 0 or any(n > 0 for n in self.overrides.values())


def parse_budgets(text: str) -> Budgets:
    """`200000` (every organization), `acme=1000000` (one), or both comma-separated:
    `200000,acme=1000000,lab=0`. Raises ValueError naming the item that is neither, or the
    budget given twice (one would be dropped unseen)."""
    default: int | None = None
    overrides: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, number = (part.strip() for part in item.rpartition("="))
        twice = (name in overrides) if sep else (default is not None)
        if not (number.isascii() and number.isdigit()) or (sep and not name) or twice:
            raise ValueError(
                f"a whole number of tokens or organization=tokens, comma-separated, each once "
                f"(0: no budget; {item!r} is {'a second' if twice else 'neither'})"
            )
        if sep:
            overrides[name] = int(number)
        else:
            default = int(number)
    return Budgets(default or 0, overrides)


class GatewaySettings(ReceiptSettings):
    """The AI gateway's configuration: the providers file (unset: no binding has a provider,
    and a turn's model calls fail as a dead pool), and each organization's daily token budget
    (`activities/gateway_budget.py`; empty: none)."""

    providers_file: Path | None = Field(default=None, alias="RECEIPT_PROVIDERS_FILE")
    org_daily_budget: str = Field(default="", alias="RECEIPT_GATEWAY_ORG_DAILY_BUDGET")

    @field_validator("org_daily_budget")
    @classmethod
    def _parses(cls, value: str) -> str:
        parse_budgets(value)
        return value

    @property
    def budgets(self) -> Budgets:
        return parse_budgets(self.org_daily_budget)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CredentialEntry(_Strict):
    """One credential: its key from an environment variable or a file (never inline)."""

    id: str = Field(min_length=1, max_length=100)
    env: str | None = None
    file: Path | None = None
    max_concurrent: int = Field(default=8, ge=1, le=1000, alias="maxConcurrent")
    disabled: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> CredentialEntry:
        if (self.env is None) == (self.file is None):
            raise ValueError(f"credential {self.id!r}: give exactly one of env or file")
        return self


class ProviderEntry(_Strict):
    """One binding: the provider's API style and base URL (OpenAI's with `/v1`, Anthropic's
    without, as their SDKs take them) and its credentials."""

    id: str = Field(min_length=1, max_length=200)
    api: ApiStyle
    base_url: str = Field(alias="baseUrl", pattern=r"^https?://")
    disabled: bool = False
    network_tools: bool = Field(default=False, alias="networkTools")
    stream_usage: bool = Field(default=True, alias="streamUsage")
    credentials: list[CredentialEntry] = Field(default_factory=list, max_length=100)


class ProvidersFile(_Strict):
    providers: list[ProviderEntry] = Field(default_factory=list)


class Secret(str):
    """A credential's key: a string that never shows itself in a repr or a log."""

    def __repr__(self) -> str:
        return "Secret('***')"


@dataclass(frozen=True)
class Credential:
    """A usable credential of a pool (`file`: where its key is read from, to refresh it)."""

    id: str
    key: Secret
    max_concurrent: int
    file: Path | None = None

    def reread(self) -> Credential | None:
        """The credential with its key read again from its file, when that changed it."""
        if self.file is None:
            return None
        try:
            key = self.file.read_text(encoding="utf-8").strip()
        except OSError:
            return None
        if not key or key == self.key:
            return None
        return Credential(self.id, Secret(key), self.max_concurrent, self.file)


@dataclass(frozen=True)
class Provider:
    """A binding as the gateway uses it: an empty or disabled one is a dead pool."""

    id: str
    api: ApiStyle
    base_url: str
    credentials: tuple[Credential, ...]
    disabled: bool = False
    unusable: tuple[str, ...] = ()
    network_tools: bool = False
    """Whether a call may ask the provider for tools that reach the network from its side
    (remote MCP servers, web search and fetch): off, the gateway takes them out of the call,
    since a command whose sandbox has no network could send its workspace anywhere through
    them."""
    stream_usage: bool = True
    """Whether a streamed chat completion is sent asking for its usage
    (`stream_options.include_usage`, else OpenAI streams none and the call counts zero tokens):
    off for an OpenAI-compatible server that refuses the option."""

    @property
    def dead(self) -> str | None:
        """Why no call can go through it (no recovery time), or None."""
        if self.disabled:
            return f"provider {self.id!r} is disabled"
        if not self.credentials:
            return f"provider {self.id!r} has no usable credential"
        return None


def load_providers(path: Path | None, env: Mapping[str, str]) -> dict[str, Provider]:
    """The providers of `path` by binding id, each credential's key read from `env` or its file.
    A disabled credential is left out of its pool; one whose key is missing (its variable unset
    or empty, its file unreadable) too, named in `unusable` (the gateway warns). Raises
    ValueError naming the problem in the file."""
    if path is None:
        return {}
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        parsed = ProvidersFile.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']}") from exc
    found: dict[str, Provider] = {}
    for entry in parsed.providers:
        if entry.id in found:
            raise ValueError(f"{path}: provider {entry.id!r} is listed twice")
        usable, unusable = [], []
        for credential in entry.credentials:
            if credential.disabled:
                continue
            key = _key(credential, env)
            if not key:
                unusable.append(credential.id)
                continue
            usable.append(
                Credential(credential.id, Secret(key), credential.max_concurrent, credential.file)
            )
        found[entry.id] = Provider(
            entry.id,
            entry.api,
            entry.base_url.rstrip("/"),
            tuple(usable),
            entry.disabled,
            tuple(unusable),
            entry.network_tools,
            entry.stream_usage,
        )
    return found


def warn_unusable(providers: Mapping[str, Provider]) -> None:
    """Log the credentials each binding left out for a missing key (`gateway.credentials_unusable`,
    once, at the gateway's start): a binding left with none answers every call 503."""
    for binding, provider in providers.items():
        if provider.unusable:
            log.warning(
                "credentials left out of their pool: their key is missing",
                extra={"event": "gateway.credentials_unusable", "binding": binding,
                       "credentials": list(provider.unusable), "dead": provider.dead},
            )  # fmt: skip


def key_variables(path: Path | None) -> frozenset[str]:
    """The environment variables the providers of `path` read their keys from (none when it is
    unset or unreadable: `load_providers` says why): what only worker-codex may be given."""
    if path is None:
        return frozenset()
    try:
        parsed = ProvidersFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError):
        return frozenset()
    return frozenset(c.env for p in parsed.providers for c in p.credentials if c.env)


def _key(credential: CredentialEntry, env: Mapping[str, str]) -> str:
    if credential.env is not None:
        return env.get(credential.env, "").strip()
    assert credential.file is not None
    try:
        return credential.file.read_text(encoding="utf-8").strip()
    except OSError:
        return ""
