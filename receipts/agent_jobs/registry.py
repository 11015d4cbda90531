"""The agents registry: `RECEIPT_AGENTS_FILE`, YAML, read at every execution (never a snapshot)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from receipts.settings import ReceiptSettings

AGENTS_FILE_ENV = "RECEIPT_AGENTS_FILE"


class RegistryError(ValueError):
    """The registry file is missing, unreadable or invalid; the message names the file and entry."""


class AgentDefinition(BaseModel):
    """One agent: its command (argv), soul, mission, plugins, skills, default provider binding."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str = Field(min_length=1, max_length=200)
    command: list[str] = Field(min_length=1)
    soul: str = ""
    mission: str = ""
    plugins: list[str] = Field(default_factory=list)
    skills: list[str] = Field(default_factory=list)
    provider_binding: str | None = Field(default=None, alias="providerBinding")
    durable_context: str = Field(default="", alias="durableContext")
    env: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class Registry:
    """The agents of one read of the file, by id."""

    path: Path
    agents: Mapping[str, AgentDefinition] = field(default_factory=dict)

    def get(self, agent_id: str) -> AgentDefinition | None:
        """The agent with this id, or None."""
        return self.agents.get(agent_id)


def parse_registry(text: str, path: Path) -> Registry:
    """Parse the YAML document `{agents: [{id, command, …}]}` (a bare list is accepted too)."""
    try:
        document: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RegistryError(f"{path}: not YAML: {exc}") from exc
    entries = document.get("agents") if isinstance(document, Mapping) else document
    if not isinstance(entries, list):
        raise RegistryError(f"{path}: expected a list under 'agents'")
    agents: dict[str, AgentDefinition] = {}
    for index, entry in enumerate(entries):
        try:
            agent = AgentDefinition.model_validate(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise RegistryError(f"{path}: agents[{index}].{where}: {first['msg']}") from exc
        if agent.id in agents:
            raise RegistryError(f"{path}: agent id {agent.id!r} appears twice")
        agents[agent.id] = agent.model_copy(update={"command": _beside(agent.command, path)})
    return Registry(path, agents)


def _beside(command: list[str], path: Path) -> list[str]:
    """The command with each argument that starts with `./` taken from the registry file's
    directory (an agent kept beside its registry; the sandbox must be let to read it:
    `RECEIPT_SANDBOX_RO_BINDS`)."""
    here = path.absolute().parent
    return [str(here / part[2:]) if part.startswith("./") else part for part in command]


def load_registry(path: Path | None) -> Registry:
    """Read the registry at `path` now (every call reads the file again); `RegistryError` when
    none is configured (`RECEIPT_AGENTS_FILE`, `AgentJobSettings.agents_file`)."""
    if path is None:
        raise RegistryError(f"{AGENTS_FILE_ENV} is not set: no agents are registered")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read the agents registry: {exc}") from exc
    return parse_registry(text, path)


class AgentJobSettings(ReceiptSettings):
    """Settings of the agent-job layer (an empty value means the default, as the deployment's
    ConfigMap writes unset ones) and where the agents registry is."""

    agents_file: Path | None = Field(default=None, alias="RECEIPT_AGENTS_FILE")

    input_timeout_ms: int | None = Field(
        default=None, ge=1, alias="RECEIPT_AGENT_JOB_INPUT_TIMEOUT_MS"
    )
    retry_base_ms: int = Field(
        default=1_000, ge=0, le=30_000, alias="RECEIPT_AGENT_JOB_RETRY_BASE_MS"
    )
    redrive_interval_ms: int = Field(
        default=5_000, ge=100, alias="RECEIPT_AGENT_JOB_REDRIVE_INTERVAL_MS"
    )
