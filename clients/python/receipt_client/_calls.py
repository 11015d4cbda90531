"""Each API operation as a request description (`Call`): built once here, sent by `Client` and
`AsyncClient` alike, so the two clients cannot drift apart."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import quote

from pydantic import BaseModel

from receipt_client import models

M = TypeVar("M", bound=BaseModel)

# The words a parameter takes from a fixed list (the OpenAPI document's enums; a test holds them
# to it): a typo is mypy's error, not the API's 422.
JobStatus = Literal["queued", "leased", "running", "completed", "failed", "canceled"]
Lane = Literal["chat", "collect", "steer", "follow_up"]
SingletonMode = Literal["allow", "cancel", "steer"]
CommandType = Literal["steer", "follow_up", "abort"]
ObjectiveStatus = Literal["active", "completed", "failed", "canceled"]
AgentJobStatus = Literal["queued", "running", "waiting_on_user", "succeeded", "failed", "stopped"]

NO_BODY: Any = object()
"""The request has no body (a body of JSON null is `None`)."""

JSON = {"Content-Type": "application/json"}


def request_options(method: str, body: Any, headers: Mapping[str, str] | None) -> dict[str, Any]:
    """httpx's `json` and `headers` of a request: a post without a body declares JSON all the
    same, as an API without tokens asks of every post (415 otherwise: README, "Open mode")."""
    if body is not NO_BODY:
        return {"json": body, "headers": headers}
    if method in ("POST", "PUT", "PATCH"):
        return {"headers": {**JSON, **(headers or {})}}
    return {"headers": headers}


@dataclass(frozen=True)
class Call(Generic[M]):
    """One request and the model its answer is read into."""

    method: str
    path: str
    model: type[M]
    params: Mapping[str, Any] | None = None
    body: Any = NO_BODY
    headers: Mapping[str, str] | None = None


def segment(value: str) -> str:
    """An id as one path segment (every reserved character escaped). A job or schedule id may be
    `.` or `..`: left as it is, httpx resolves it as a dot segment (`/jobs/..` is `/`), so it is
    escaped too (`%2E%2E`, which the API reads as `..`)."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


def job_path(job_id: str, suffix: str = "") -> str:
    return f"/jobs/{segment(job_id)}{suffix}"


def objective_path(objective_id: str, suffix: str = "") -> str:
    return f"/objectives/{segment(objective_id)}{suffix}"


def agent_job_path(agent_job_id: str, suffix: str = "") -> str:
    return f"/agent-jobs/{segment(agent_job_id)}{suffix}"


def schedule_path(schedule_id: str) -> str:
    return f"/schedules/{segment(schedule_id)}"


def session_path(session_id: str, suffix: str = "") -> str:
    return f"/sessions/{segment(session_id)}{suffix}"


def query(**values: Any) -> dict[str, Any]:
    """The query parameters given (not None), by their API names."""
    return {name: value for name, value in values.items() if value is not None}


Body = Mapping[str, Any] | BaseModel
"""A request body: a dict by the API's names, or its model (`models.ScheduleBody`, …)."""


def request_body(body: Body) -> dict[str, Any]:
    """`body` as the API reads it: a model by its API names, the fields not given left out (the
    API's defaults apply)."""
    if isinstance(body, BaseModel):
        return body.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")
    return dict(body)


def body_of(values: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


def enqueue(
    agent_id: str,
    payload: Mapping[str, Any],
    *,
    job_id: str | None,
    idempotency_key: str | None,
    session_key: str | None,
    lane: str | None,
    singleton_mode: str | None,
    max_attempts: int | None,
    delay_ms: int | None,
) -> Call[models.EnqueueAccepted]:
    body = body_of(
        {
            "jobId": job_id,
            "sessionKey": session_key,
            "lane": lane,
            "singletonMode": singleton_mode,
            "maxAttempts": max_attempts,
            "delayMs": delay_ms,
            "payload": dict(payload),
        }
    )
    return Call(
        "POST",
        f"/agents/{segment(agent_id)}/jobs",
        models.EnqueueAccepted,
        body=body,
        headers=keyed(idempotency_key),
    )


def keyed(idempotency_key: str | None) -> dict[str, str] | None:
    """The headers of a post that names what it makes by `idempotency_key` (sent again, it
    finds it)."""
    return {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None


def command(
    job_id: str, type: str, payload: Any, reason: str | None, idempotency_key: str | None = None
) -> Call[models.CommandAccepted]:
    body = body_of({"type": type, "payload": payload, "reason": reason})
    path = job_path(job_id, "/commands")
    return Call("POST", path, models.CommandAccepted, body=body, headers=keyed(idempotency_key))


def objective_body(spec: Body | str | os.PathLike[str]) -> dict[str, Any]:
    """An objective as a dict or its model, or read from a file: YAML (`.yaml`/`.yml`, with
    PyYAML: the `yaml` extra) or JSON, as `receipt objectives run` reads it."""
    if isinstance(spec, Mapping | BaseModel):
        return request_body(spec)
    path = Path(spec)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(
                f"{spec}: reading YAML needs PyYAML (pip install 'receipt-client[yaml]'); "
                "or pass the objective as a dict or a JSON file"
            ) from None
        loaded = yaml.safe_load(text)
    else:
        loaded = json.loads(text)
    if not isinstance(loaded, dict):
        raise ValueError(f"{spec}: an objective is one object (a mapping)")
    return loaded


def reason_body(reason: str | None) -> Any:
    return {"reason": reason} if reason is not None else NO_BODY


def webhook_path(webhook_id: str, suffix: str = "") -> str:
    return f"/webhooks/{segment(webhook_id)}{suffix}"
