"""The ids an organization is shown of its webhook deliveries.

`webhook_deliveries.delivery_id` is one sequence for every organization: shown as it is, the
gap between two of one organization's deliveries (two test posts, say) would count the
deliveries owed to every other organization's webhooks in between. The API shows instead a
keyed permutation of it (a four-round Feistel network over 62 bits, HMAC-SHA256 rounds), keyed
by the subscription's own random `delivery_key` (migration 0023), and maps a cursor's id back.
"""

from __future__ import annotations

import hashlib
import hmac

_HALF_BITS = 31
_HALF_MASK = (1 << _HALF_BITS) - 1
_ROUNDS = 4
LIMIT = 1 << (2 * _HALF_BITS)
"""Ids below it are permuted (a bigserial reaches it after 4.6e18 deliveries)."""


def _mix(key: bytes, round_number: int, half: int) -> int:
    message = bytes([round_number]) + half.to_bytes(4, "big")
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "big") & _HALF_MASK


def shown(key: str, delivery_id: int) -> int:
    """The id a caller is shown of the delivery `delivery_id` of the subscription keyed `key`."""
    if not 0 <= delivery_id < LIMIT:
        raise ValueError(f"delivery id {delivery_id} is outside the permuted range")
    secret = key.encode()
    left, right = delivery_id >> _HALF_BITS, delivery_id & _HALF_MASK
    for number in range(_ROUNDS):
        left, right = right, left ^ _mix(secret, number, right)
    return (left << _HALF_BITS) | right


def stored(key: str, shown_id: int) -> int:
    """The delivery id a caller names `shown_id` (the inverse of `shown`)."""
    if not 0 <= shown_id < LIMIT:
        raise ValueError(f"delivery id {shown_id} is outside the permuted range")
    secret = key.encode()
    left, right = shown_id >> _HALF_BITS, shown_id & _HALF_MASK
    for number in reversed(range(_ROUNDS)):
        left, right = right ^ _mix(secret, number, left), left
    return (left << _HALF_BITS) | right
