"""An enqueue request: the body `POST /agents/{agentId}/jobs` takes, validated into what
`receipts.enqueue.enqueue` needs (ids, lanes, singleton modes, attempts, delay, the kind's
objective scoping), with the reserved shapes of job ids refused."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from receipts.errors import InvalidInput
from receipts.executables import oversized_request
from receipts.jobs import (
    DEFAULT_LANE,
    DEFAULT_MAX_ATTEMPTS,
    LANES,
    MAX_ATTEMPTS,
    MIN_ATTEMPTS,
    SINGLETON_MODES,
)
from receipts.kinds import (
    CONTRACTS,
    MAX_ID_LENGTH,
    NON_BLANK,
    EnqueuePayload,
    invalid_input,
    scoped_payload,
)
from receipts.text import check_clean_text

MAX_DELAY_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A validated enqueue: everything `enqueue` needs, already checked."""

    agent_id: str
    payload: dict[str, Any]
    kind: str
    organization_id: str | None
    job_id: str | None = None
    lane: str = DEFAULT_LANE
    session_key: str | None = None
    singleton_mode: str = "allow"
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    delay_ms: int = 0
    trace_id: str | None = None
    traceparent: str | None = None
    retry_of: str | None = None
    max_commands: int | None = None
    """A steer singleton absorbed into a job holding this many commands is refused (the API's
    `RECEIPT_MAX_COMMANDS_PER_JOB`); None: no cap."""
    max_command_bytes: int | None = None
    """A steer singleton whose payload serialises to more is refused when it would be absorbed."""
    new_job_id: bool = False
    """`job_id` was made up for this request (a random uuid: the caller named no job), so no job
    or absorbed steer can hold it yet: `enqueue` skips the jobId lock and lookup."""
    may_steer_commands: bool = True
    """A steer singleton may be absorbed into a job that runs commands (the API's caller holds
    `commands:run`); False: such an absorption is refused (`NotPermitted`)."""
    objective_id_assigned: bool = False
    """`payload.objectiveId` was assigned here (a `factory.run` that named none): a re-post of
    the same body is the same request whatever id its job was given."""


# Temporal workflow ids are derived from job ids (`<jobId>:gen:<g>`, `<jobId>:attempt:<n>`), and
# stream names from `jobs/<jobId>`; a job id that looks like one of those is refused.
RESERVED_ID_PARTS: tuple[str, ...] = (":gen:", ":attempt:", ":redrive:", "/")
RESERVED_ID_PREFIX = "watchdog:"
# The jobs of an objective are named after it (`objective:<id>:…`, receipts/objectives/model.py)
# by the runtime alone: a caller who could choose such an id could be first to a job the
# runtime is about to create (a re-post is answered with the existing job).
OBJECTIVE_JOB_PREFIX = "objective:"


def _one_of(name: str, allowed: tuple[str, ...], required: bool = False) -> Any:
    """A before-validator: `value` is one of `allowed` (or None unless `required`), else 422
    naming them."""

    def check(value: Any) -> Any:
        if (value is not None or required) and (not isinstance(value, str) or value not in allowed):
            raise InvalidInput(
                name, f"{name} must be one of: {', '.join(allowed)} (got {value!r})", allowed
            )
        return value

    return BeforeValidator(check)


def choice_field(name: str, allowed: tuple[str, ...], *, required: bool = False) -> Any:
    """A string field holding one of `allowed` (422 naming them), documented as an enum."""
    return Annotated[
        str if required else str | None,
        _one_of(name, allowed, required),
        WithJsonSchema(
            {"type": "string", "enum": list(allowed)}
            if required
            else {"anyOf": [{"type": "string", "enum": list(allowed)}, {"type": "null"}]}
        ),
    ]


def _whole(value: Any) -> Any:
    """A JSON number with no fraction (`2.0`) is that integer: JSON does not tell them apart."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


if TYPE_CHECKING:
    LaneField = str | None
    SingletonModeField = str | None
else:
    LaneField = choice_field("lane", LANES)
    SingletonModeField = choice_field("singletonMode", SINGLETON_MODES)

JOB_ID_PATTERN = r"^[A-Za-z0-9._:@-]{1,200}$"
"""Job ids a caller may choose (a newline in an id made the job unreachable)."""


class EnqueueBody(BaseModel):
    """An enqueue request. Unknown top-level fields are refused (422).

    The same model validates the HTTP body and documents it (the API's OpenAPI schema).
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, extra="forbid", frozen=True
    )

    job_id: str | None = Field(
        default=None,
        pattern=JOB_ID_PATTERN,
        description="Idempotency key of the job, scoped to the caller's organization",
    )
    lane: LaneField = None
    session_key: str | None = Field(default=None, max_length=MAX_ID_LENGTH, pattern=NON_BLANK)
    singleton_mode: SingletonModeField = None
    max_attempts: Annotated[StrictInt | None, BeforeValidator(_whole)] = Field(
        default=None,
        description=f"clamped to {MIN_ATTEMPTS}..{MAX_ATTEMPTS}; default {DEFAULT_MAX_ATTEMPTS}",
    )
    delay_ms: Annotated[StrictInt | None, BeforeValidator(_whole)] = Field(
        default=None, ge=0, le=MAX_DELAY_MS
    )
    payload: EnqueuePayload


ENQUEUE_FIELDS: tuple[str, ...] = tuple(
    f.alias or name for name, f in EnqueueBody.model_fields.items()
)


def _check_job_id(job_id: str | None, kind: str, *, system: bool) -> None:
    if job_id is None:
        return
    for part in RESERVED_ID_PARTS:
        if part in job_id:
            raise InvalidInput(
                "jobId",
                f"jobId must not contain {part!r} (reserved for delivery ids and stream names)",
            )
    if job_id.startswith(RESERVED_ID_PREFIX) and not (
        system and kind == "factory.objective.watchdog"
    ):
        raise InvalidInput(
            "jobId", f"jobId prefix {RESERVED_ID_PREFIX!r} is reserved for the objective watchdog"
        )
    if job_id.startswith(OBJECTIVE_JOB_PREFIX):
        raise InvalidInput(
            "jobId",
            f"jobId prefix {OBJECTIVE_JOB_PREFIX!r} is reserved for the jobs of objectives",
        )


def clamp_attempts(value: int) -> int:
    """Clamp `maxAttempts` to the spec's range 1..8."""
    return max(MIN_ATTEMPTS, min(MAX_ATTEMPTS, value))


def parse_enqueue(
    agent_id: str,
    body: Mapping[str, Any],
    *,
    system: bool = False,
    text_checked: bool = False,
) -> EnqueueRequest:
    """Validate an enqueue body for `agent_id`; raise `InvalidInput` naming the field at fault.

    `system` is the runtime's own enqueue (the watchdog tick): its `watchdog:<time>` ids are
    the only ones outside `JOB_ID_PATTERN`. `text_checked` says the caller already refused NUL
    and lone surrogates in the whole body (the API does it once, when it reads the body).
    """
    if not isinstance(agent_id, str) or not agent_id.strip() or len(agent_id) > MAX_ID_LENGTH:
        raise InvalidInput(
            "agentId", f"agentId must be a non-empty string of at most {MAX_ID_LENGTH} characters"
        )
    if not isinstance(body, Mapping):
        raise InvalidInput("body", "the request body must be a JSON object")
    if not text_checked:
        check_clean_text(body, "")
    check_clean_text(agent_id, "agentId")
    job_id = body.get("jobId")
    if system and isinstance(job_id, str) and job_id.startswith(RESERVED_ID_PREFIX):
        body = {k: v for k, v in body.items() if k != "jobId"}
    else:
        job_id = None
    try:
        parsed = EnqueueBody.model_validate(body)
    except ValidationError as exc:
        error = invalid_input(exc)
        if error.message.startswith("unknown field") and "." not in error.field:
            error.allowed = list(ENQUEUE_FIELDS)
        if error.field == "jobId":
            error.message = "jobId must be 1 to 200 characters of letters, digits and . _ : @ -"
        raise error from None
    job_id = job_id if job_id is not None else parsed.job_id
    kind = parsed.payload.kind
    auth = parsed.payload.auth_context
    _check_job_id(job_id, kind, system=system)
    max_attempts = parsed.max_attempts
    # The contract's objective scoping: a kind that acts on an objective names it (422 without).
    payload = scoped_payload(kind, body["payload"], CONTRACTS[kind])
    assigned = "objectiveId" in payload and "objectiveId" not in body["payload"]
    request = EnqueueRequest(
        agent_id=agent_id,
        payload=payload,
        kind=kind,
        organization_id=auth.organization_id if auth is not None else None,
        job_id=job_id,
        lane=parsed.lane or DEFAULT_LANE,
        session_key=parsed.session_key,
        singleton_mode=parsed.singleton_mode or "allow",
        max_attempts=clamp_attempts(DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts),
        delay_ms=parsed.delay_ms or 0,
        objective_id_assigned=assigned,
    )
    oversized = oversized_request(request)
    if oversized is not None:
        raise InvalidInput(*oversized)
    return request


def cap_timeout(request: EnqueueRequest, max_timeout_ms: int) -> EnqueueRequest:
    """The request with `payload.timeoutMs` clamped to `max_timeout_ms` (the operator's
    `RECEIPT_MAX_TIMEOUT_MS`, applied by the api's enqueue and a schedule's firing alike)."""
    timeout = request.payload.get("timeoutMs")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        return request
    if timeout <= max_timeout_ms:
        return request
    return replace(request, payload={**request.payload, "timeoutMs": max_timeout_ms})


GATEWAY_FIELD = "payload.authContext.receiptConnectGatewayUrl"


def gateway_refused(request: EnqueueRequest, allowlist: Sequence[str]) -> str | None:
    """Why `payload.authContext.receiptConnectGatewayUrl` is refused: it is not, nor is it
    below, a URL of `allowlist` (the operator's `RECEIPT_GATEWAY_URL_ALLOWLIST`, checked by
    the api's enqueue and a schedule's firing alike); None when it is, or when there is none."""
    auth = request.payload.get("authContext")
    gateway = auth.get("receiptConnectGatewayUrl") if isinstance(auth, Mapping) else None
    if gateway is None or any(_under(str(gateway), prefix) for prefix in allowlist):
        return None
    return f"{GATEWAY_FIELD} is not on the operator's allow-list (RECEIPT_GATEWAY_URL_ALLOWLIST)"


def _under(url: str, prefix: str) -> bool:
    """True when `url` is `prefix` or below it: `https://gw.example` admits
    `https://gw.example/v1`, not `https://gw.example.evil.net`."""
    return url == prefix or (
        url.startswith(prefix) and (prefix.endswith("/") or url[len(prefix)] in "/?#")
    )
