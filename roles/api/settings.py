"""Settings of the api role: bind, tokens, and the limits that bound the work of one request."""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Any

from pydantic import Field, field_validator

from receipts.executables import parse_allow_lists
from receipts.settings import ReceiptSettings

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
SSE_KEEPALIVE_S = 15.0
# What the requests in flight get once the api closes its port (after its drain delay).
GRACEFUL_SHUTDOWN_S = 10


class ApiSettings(ReceiptSettings):
    """Settings of the api role; each field reads the environment variable in its alias.

    The limits are documented in the README's Security section.
    """

    host: str = Field(default="127.0.0.1", alias="RECEIPT_API_HOST")
    port: int = Field(default=8000, ge=0, le=65535, alias="RECEIPT_API_PORT")
    # How long the api goes on serving, /readyz 503, after SIGTERM before it closes its port:
    # Kubernetes takes a terminating pod out of the Service's endpoints while it sends SIGTERM,
    # and proxies keep sending new connections for a moment (deploy/k8s sets 5 s).
    drain_delay_ms: int = Field(default=0, ge=0, le=60_000, alias="RECEIPT_API_DRAIN_DELAY_MS")
    max_body_bytes: int = Field(
        default=DEFAULT_MAX_BODY_BYTES, ge=1, alias="RECEIPT_MAX_BODY_BYTES"
    )
    # A request's URL and headers are whole this long after its connection opens (or after its
    # first byte, on a kept-alive connection), or the connection is closed (slowloris).
    head_timeout_ms: int = Field(
        default=10_000, ge=100, le=300_000, alias="RECEIPT_API_HEAD_TIMEOUT_MS"
    )
    tokens_file: FilePath | None = Field(default=None, alias="RECEIPT_API_TOKENS_FILE")
    tokens: str | None = Field(default=None, alias="RECEIPT_API_TOKENS")
    strict_agent_ids: bool = Field(default=False, alias="RECEIPT_STRICT_AGENT_IDS")
    sse_keepalive_ms: int = Field(
        default=int(SSE_KEEPALIVE_S * 1000), ge=100, alias="RECEIPT_SSE_KEEPALIVE_MS"
    )
    # --- bounded work per request ---
    max_json_nodes: int = Field(default=50_000, ge=1, alias="RECEIPT_MAX_JSON_NODES")
    max_json_key_chars: int = Field(default=256, ge=1, alias="RECEIPT_MAX_JSON_KEY_CHARS")
    max_json_depth: int = Field(default=64, ge=1, alias="RECEIPT_MAX_JSON_DEPTH")
    max_response_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, alias="RECEIPT_MAX_RESPONSE_BYTES"
    )
    # --- event streams ---
    sse_max_streams: int = Field(default=1000, ge=1, alias="RECEIPT_SSE_MAX_STREAMS")
    sse_max_streams_per_token: int = Field(
        default=50, ge=1, alias="RECEIPT_SSE_MAX_STREAMS_PER_CALLER"
    )
    sse_max_lifetime_s: float = Field(default=3600.0, gt=0, alias="RECEIPT_SSE_MAX_LIFETIME_S")
    # --- bounded job state ---
    max_commands_per_job: int = Field(default=100, ge=1, alias="RECEIPT_MAX_COMMANDS_PER_JOB")
    max_command_bytes: int = Field(default=64 * 1024, ge=1, alias="RECEIPT_MAX_COMMAND_BYTES")
    # The follow-ups an agent job holds for its next turn (carried, and sent to its running turn).
    agent_job_max_follow_up_bytes: int = Field(
        default=1024 * 1024, ge=1, alias="RECEIPT_AGENT_JOB_MAX_FOLLOW_UP_BYTES"
    )
    # --- per-organization limits ---
    org_enqueue_rate: float = Field(default=50.0, gt=0, alias="RECEIPT_ORG_ENQUEUE_RATE")
    org_enqueue_burst: int = Field(default=200, ge=1, alias="RECEIPT_ORG_ENQUEUE_BURST")
    rate_refusal_hold_ms: int = Field(
        default=1000, ge=0, le=60_000, alias="RECEIPT_RATE_REFUSAL_HOLD_MS"
    )
    rate_refusals_held_max: int = Field(default=1000, ge=0, alias="RECEIPT_RATE_REFUSALS_HELD_MAX")
    # The bytes of one organization's request bodies being read at once, per api process.
    org_body_bytes_in_flight: int = Field(
        default=16 * DEFAULT_MAX_BODY_BYTES, ge=1, alias="RECEIPT_ORG_BODY_BYTES_IN_FLIGHT"
    )
    # The requests of one organization the api works on at once, per api process (the enqueues
    # its gate answers aside): its share of the event loop and of the database pool.
    org_requests_in_flight: int = Field(default=8, ge=1, alias="RECEIPT_ORG_REQUESTS_IN_FLIGHT")
    org_max_queued: int = Field(default=1000, ge=1, alias="RECEIPT_ORG_MAX_QUEUED")
    org_max_active: int = Field(default=2000, ge=1, alias="RECEIPT_ORG_MAX_ACTIVE")
    max_timeout_ms: int = Field(default=3_600_000, ge=1, alias="RECEIPT_MAX_TIMEOUT_MS")
    org_max_schedules: int = Field(default=100, ge=1, alias="RECEIPT_ORG_MAX_SCHEDULES")
    schedule_min_interval_s: int = Field(default=60, ge=1, alias="RECEIPT_SCHEDULE_MIN_INTERVAL_S")
    org_executables: dict[str, list[str]] = Field(
        default_factory=dict, alias="RECEIPT_ORG_EXECUTABLES"
    )
    gateway_url_allowlist: list[str] = Field(
        default_factory=list, alias="RECEIPT_GATEWAY_URL_ALLOWLIST"
    )
    # --- console sessions (README, "Operator console") ---
    console_session_ttl_s: float = Field(
        default=12 * 3600.0, gt=0, alias="RECEIPT_CONSOLE_SESSION_TTL_S"
    )
    console_session_idle_s: float = Field(
        default=30 * 60.0, gt=0, alias="RECEIPT_CONSOLE_SESSION_IDLE_S"
    )

    @field_validator("org_executables", mode="before")
    @classmethod
    def _executables(cls, value: Any) -> Any:
        return parse_allow_lists(value)

    @field_validator("gateway_url_allowlist", mode="before")
    @classmethod
    def _gateways(cls, value: Any) -> Any:
        # Comma-separated URL prefixes (`https://gw.example.com/`).
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
