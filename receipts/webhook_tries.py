"""Recording one try of a webhook delivery under its claim, and what a record whose answer was
lost (`UnansweredStorageError`: the connection dropped with it in flight) comes to: read back,
it was made (counted and logged as what it recorded, not as a lapsed try), or it was not (made
now, so the delivery is not posted a second time for a try the receiver answered)."""

from __future__ import annotations

from datetime import datetime

from receipts.errors import UnansweredStorageError
from receipts.store import Store
from receipts.webhooks import MAX_ERROR_CHARS, Claimed


async def record_try(
    store: Store,
    delivery: Claimed,
    *,
    status: str,
    status_code: int | None,
    error: str | None,
    duration_ms: int,
    retry_ms: int = 0,
) -> datetime | None:
    """Record one try: `delivered`, `failed` (given up) or `pending` (again in `retry_ms`); the
    delivery's next try time. None when it was not recorded: its claim lapsed and another
    deliverer took the delivery (finished it, or holds it now), or it is gone with its
    subscription. A record whose answer was lost is found (`_made`)."""
    if error is not None and len(error) > MAX_ERROR_CHARS:
        error = error[: MAX_ERROR_CHARS - 1] + "…"
    params = {
        "delivery_id": delivery.delivery_id,
        "claimed_until": delivery.claimed_until,
        "status": status,
        "status_code": status_code,
        "error": error,
        "duration_ms": duration_ms,
        "retry_ms": retry_ms,
    }
    try:
        row = await store.fetch_one("webhook_delivery_record", params)
    except UnansweredStorageError:
        made, next_try = await _made(store, delivery)
        if made is not None:
            return next_try if made else None
        row = await store.fetch_one("webhook_delivery_record", params)  # not made: now
    return row[0] if row else None


async def _made(store: Store, delivery: Claimed) -> tuple[bool | None, datetime | None]:
    """Whether the record of `delivery`'s try whose answer was lost was made: True (and its
    next try time) when the delivery moved on while its claim still held: only that record
    moves it then (a claim takes only a due delivery, and this claim made it due at its end);
    None when it still stands claimed by this try (not made); False when the claim lapsed
    meanwhile or the delivery is gone (another deliverer's record may stand: not this one's)."""
    row = await store.fetch_one("webhook_delivery_tried", {"delivery_id": delivery.delivery_id})
    if row is None:
        return False, None
    status, claimed_until, next_try, now = row
    if status == "pending" and claimed_until == delivery.claimed_until:
        return None, None
    return (True, next_try) if now <= delivery.claimed_until else (False, None)
