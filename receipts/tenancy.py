"""Ids scoped by organization: what an organization calls a job or an objective, and the id
the runtime uses for it (docs/design.md §4, §9).

Two organizations' `build-1` are two jobs, and their objective `release` two objectives: the
runtime names them `build-1~<tag of a>` and `build-1~<tag of b>`, so an id neither collides with
nor probes another organization's. Ids a caller chooses hold no `~` (their patterns leave it
out), so the caller's id is everything before it. Ids the runtime derives from a scoped id
(an objective's task jobs, say) keep the tag at the end: `objective:release:task:a:try:1~<tag>`
is the task job organization a knows as `objective:release:task:a:try:1`.
"""

from __future__ import annotations

import hashlib
from typing import Any

TENANT_SEPARATOR = "~"
"""Joins a caller's id and its organization's tag in the id the runtime uses."""


HIDDEN_POSITION = 0
"""The `position` a receipt shows an organization. The runtime's is global (docs/design.md §3):
it counts every organization's receipts, so the gap between two of one organization's own would
say how many the others wrote in between."""


def without_position(receipt: dict[str, Any]) -> dict[str, Any]:
    """A receipt's JSON as an organization sees it: its global position hidden."""
    return {**receipt, "position": HIDDEN_POSITION}


def organization_tag(organization_id: str) -> str:
    """A short, fixed-length tag of an organization id (no characters an id may not hold)."""
    return hashlib.sha256(organization_id.encode("utf-8")).hexdigest()[:16]


def scoped_id(organization_id: str | None, caller_id: str) -> str:
    """The runtime's id for `caller_id` as `organization_id` names it. Ids without an
    organization (the watchdog's jobs) are kept as they are."""
    if organization_id is None:
        return caller_id
    return f"{caller_id}{TENANT_SEPARATOR}{organization_tag(organization_id)}"


def caller_id(runtime_id: str) -> str:
    """The id an organization knows a runtime id by (the runtime's id without its tag)."""
    return runtime_id.split(TENANT_SEPARATOR, 1)[0]


def is_scoped_for(runtime_id: str, organization_id: str | None) -> bool:
    """True when `runtime_id` carries `organization_id`'s tag (or, without an organization,
    carries none)."""
    head, sep, tag = runtime_id.partition(TENANT_SEPARATOR)
    if organization_id is None:
        return not sep
    return bool(sep) and tag == organization_tag(organization_id) and bool(head)


def derived_id(runtime_id: str, prefix: str, suffix: str) -> str:
    """`<prefix><caller id><suffix>` with `runtime_id`'s tag kept at the end, so the derived id is
    scoped to the same organization and its caller form is `<prefix><caller id><suffix>`."""
    head, sep, tag = runtime_id.partition(TENANT_SEPARATOR)
    return f"{prefix}{head}{suffix}{sep}{tag}"


def untagged(value: Any, organization_id: str) -> Any:
    """A JSON value as `organization_id` sees it: its tag removed from every string carrying it
    (the runtime ids of its objectives, of the jobs named after them, of its session keys)."""
    tag = TENANT_SEPARATOR + organization_tag(organization_id)

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return item.replace(tag, "") if tag in item else item
        if isinstance(item, dict):
            return {key: walk(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    return walk(value)
