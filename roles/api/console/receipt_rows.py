"""A stream's receipts as the console's pages show them: the timeline's rows (the data as the
API shows it to the viewer), each attempt's deliveries and ending, the live output's lines."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from receipts.jobs import Receipt
from roles.api.auth import Principal
from roles.api.schema import shown_receipt


def _fence(data: Any) -> str:
    if not isinstance(data, dict):
        return ""
    worker, attempt = data.get("workerId"), data.get("attempt")
    if worker is None and attempt is None:
        return ""
    return f"{worker or '—'} · attempt {attempt}"


def timeline(receipts: list[Receipt], viewer: Principal) -> list[dict[str, Any]]:
    """The job page's rows: type, time, milliseconds since the previous receipt, the fence; the
    data as the API shows it to `viewer` (`task.env` values redacted, an organization's tag
    dropped from its ids)."""
    rows: list[dict[str, Any]] = []
    previous: datetime | None = None
    organization_id = None if viewer.admin else viewer.organization_id
    for receipt in receipts:
        data = shown_receipt({"data": receipt.data}, organization_id=organization_id)["data"]
        delta = (receipt.recorded_at - previous).total_seconds() * 1000 if previous else None
        previous = receipt.recorded_at
        rows.append(
            {
                "seq": receipt.seq,
                "type": receipt.type,
                "at": receipt.recorded_at.isoformat(timespec="milliseconds"),
                "delta": f"+{delta:,.0f} ms" if delta is not None else "",
                "fence": _fence(data),
                "data": json.dumps(data, ensure_ascii=False)[:400],
            }
        )
    return rows


def attempts(receipts: list[Receipt]) -> list[dict[str, Any]]:
    """Each attempt: the deliveries (worker ids) that held it, their process, and how it ended."""
    by_attempt: dict[int, dict[str, Any]] = {}
    for receipt in receipts:
        data = receipt.data
        attempt = data.get("attempt") if isinstance(data, dict) else None
        if not isinstance(attempt, int) or attempt < 1:
            continue
        entry = by_attempt.setdefault(
            attempt, {"attempt": attempt, "workers": [], "outcome": "", "started": ""}
        )
        worker = data.get("workerId")
        leases = receipt.type == "job.leased" or data.get("startFence")
        if leases and worker and worker not in entry["workers"]:
            entry["workers"].append(worker)
            process = data.get("process") or {}
            if process:
                where = " ".join(str(process.get(k, "")) for k in ("role", "host", "pid"))
                entry["workers"][-1] = f"{worker} ({where.strip()})"
        if receipt.type == "job.leased":
            entry["started"] = receipt.recorded_at.isoformat(timespec="seconds")
        if receipt.type in ("job.completed", "job.failed", "job.canceled", "job.lease_expired"):
            entry["outcome"] = receipt.type.removeprefix("job.") + (
                f": {data.get('error')}" if data.get("error") else ""
            )
    return [by_attempt[k] for k in sorted(by_attempt)]


def progress_lines(receipts: list[Receipt]) -> list[str]:
    """The live output a page opens with: the last 500 lines of the progress receipts."""
    lines: list[str] = []
    for receipt in receipts:
        if receipt.type == "job.progress":
            lines.extend(progress_text(receipt.data.get("data")))
    return lines[-500:]


def progress_text(data: Any) -> list[str]:
    """The lines a `job.progress` receipt shows in the live output."""
    if isinstance(data, dict) and isinstance(data.get("lines"), list):
        return [str(line) for line in data["lines"]]
    if isinstance(data, dict) and isinstance(data.get("line"), str):
        return [data["line"]]
    return [json.dumps(data, ensure_ascii=False)]
