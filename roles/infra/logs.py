"""Logging: one JSON object per line (or readable lines on a terminal), with the role on each."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def trace_fields() -> dict[str, str]:
    """`trace_id` and `span_id` of the current span (hex, as W3C writes them), or none outside
    a trace: a job's log lines name its trace, recorded or not (roles/infra/tracing.py)."""
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return {}
    return {"trace_id": f"{span.trace_id:032x}", "span_id": f"{span.span_id:016x}"}


class JsonFormatter(logging.Formatter):
    """Format a record as JSON: time, level, logger, message, role, every `extra` field, and the
    current span's `trace_id` and `span_id`."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "role": self.role,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                body[key] = value
        body.update(trace_fields())
        if record.exc_info:
            body["exc"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str, ensure_ascii=False)


_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def escape(text: str) -> str:
    """`text` with control characters (CR, LF, …) escaped, so a value a caller chose (a job id,
    an agent id) cannot start a forged log line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class HumanFormatter(logging.Formatter):
    """`time level role logger message key=value…` for a person at a terminal.

    Message and extras are escaped (`escape`); only a traceback spans several lines.
    """

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={escape(str(v))}"
            for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")
        )
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        message = escape(record.getMessage())
        line = f"{when} {record.levelname:<7} [{self.role}] {record.name}: {message}"
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(role: str, log_format: str | None, *, level: int = logging.INFO) -> None:
    """Send logs to stderr: JSON unless stderr is a terminal, or as `log_format` says (`json`
    or `human`: RECEIPT_LOG_FORMAT; `receipt up` asks its role processes for human lines when
    it is itself attached to a terminal)."""
    use_json = not sys.stderr.isatty() if log_format is None else log_format == "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role) if use_json else HumanFormatter(role))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "temporalio.activity", "temporalio.workflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
