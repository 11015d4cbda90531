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


# A log line's size. A field (the message, a traceback, one `extra` value) is cut past
# `MAX_FIELD_CHARS`, keeping its start and its end; a line still past `MAX_LINE_CHARS` (a call
# with many fields) keeps its standard fields and the extras that fit, `fieldsCut` saying how
# many did not. A handler's error of megabytes made a line of megabytes, which a log shipper
# splits (Docker's json-file at 16 KiB) or drops (Loki past 256 KiB): the line lost was the
# one that said why the job failed.
MAX_FIELD_CHARS = 16_000
MAX_LINE_CHARS = 64_000


def cut(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """`text`, at most `limit` characters: its start and its end, saying how much was cut."""
    if len(text) <= limit:
        return text
    keep = limit - 40  # room for the note
    head, tail = keep * 3 // 4, keep // 4
    return f"{text[:head]}… [{len(text) - head - tail} characters cut] …{text[-tail:]}"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _fitted(extras: list[str], room: int) -> tuple[list[str], int]:
    """The `extras` (formatted) that fit in `room` characters, in order, and how many did not."""
    kept: list[str] = []
    for field in extras:
        if len(field) + 2 > room:
            break
        kept.append(field)
        room -= len(field) + 2
    return kept, len(extras) - len(kept)


class JsonFormatter(logging.Formatter):
    """Format a record as JSON: time, level, logger, message, role, every `extra` field, and the
    current span's `trace_id` and `span_id`; each field and the line bounded (`cut`)."""

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
        extras = _extras(record)
        after = trace_fields()
        if record.exc_info:
            after["exc"] = self.formatException(record.exc_info)
        # As `dict.update` in this order: an extra named as a standard field replaces it.
        first = [_field(k, v) for k, v in body.items() if k not in extras]
        more = [_field(k, v) for k, v in extras.items() if k not in after]
        last = [_field(k, v) for k, v in after.items()]
        room = MAX_LINE_CHARS - sum(len(f) + 2 for f in first + last) - 20
        kept, dropped = _fitted(more, room)
        cut_note = [f'"fieldsCut": {dropped}'] if dropped else []
        return "{" + ", ".join(first + kept + cut_note + last) + "}"


def _field(key: str, value: Any) -> str:
    """`"key": value` as JSON, its value cut (`cut`): a string's text, another's JSON."""
    if isinstance(value, str):
        text = json.dumps(cut(value), ensure_ascii=False)
    else:
        text = json.dumps(value, default=str, ensure_ascii=False)
        if len(text) > MAX_FIELD_CHARS:
            text = json.dumps(cut(text), ensure_ascii=False)
    return f"{json.dumps(key, ensure_ascii=False)}: {text}"


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
        when = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        message = escape(cut(record.getMessage()))
        line = f"{when} {record.levelname:<7} [{self.role}] {record.name}: {message}"
        trace = "\n" + cut(self.formatException(record.exc_info)) if record.exc_info else ""
        room = MAX_LINE_CHARS - len(line) - len(trace) - 20
        extras = [f"{k}={escape(cut(str(v)))}" for k, v in _extras(record).items()]
        kept, dropped = _fitted(extras, room)
        kept += [f"fieldsCut={dropped}"] if dropped else []
        if kept:
            line += "  " + " ".join(kept)
        return line + trace


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
