"""The console's lists, page after page: each shows PAGE_SIZE rows, newest first, and links the
next older page by the keyset cursor the API's lists use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TypeVar
from urllib.parse import urlencode

from fastapi import Request

from receipts import reads
from receipts.errors import InvalidInput
from receipts.reads import Position
from roles.api.body import decode_cursor, encode_cursor

T = TypeVar("T")


def page_start(request: Request) -> Position | None:
    """Where a console list starts (`?cursor=`, from its "older" link); a cursor the console
    did not write starts at the newest page, as a link mangled on the way should."""
    try:
        return decode_cursor(request.query_params.get("cursor"))
    except InvalidInput:
        return None


def older_query(
    filters: Mapping[str, str],
    page: reads.Page[T],
    position: Callable[[T], tuple[datetime, str]],
) -> str | None:
    """The query of the page after `page` (the `position` of its last row: its creation time
    and id), with the list's `filters`; None when it is the last."""
    if not page.more or not page.items:
        return None
    return urlencode({**filters, "cursor": encode_cursor(*position(page.items[-1]))})
