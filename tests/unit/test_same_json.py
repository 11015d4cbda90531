"""`same_json`: whether a keyed resend's JSON is what the first post stored (as `jsonb` gave it
back). The numbers `jsonb` rewrites are covered end to end (test_api_retried_posts.py); here, what
must still tell two bodies apart: a resend that differs only in a `true` for a `1`, a key more or
less, or an element more at the end of a list is another body (its post is a 409 or flagged an
idempotency mismatch), not the same one."""

from __future__ import annotations

from typing import Any

import pytest

from receipts.streams import same_json

STORED: dict[str, Any] = {
    "say": "use the other file",
    "flags": [True, False, None],
    "n": 1,
    "nested": {"big": 15 * 10**299, "round": 10**23, "zero": 0.0, "list": [1, 2, 3]},
}
# What the request held: the floats `jsonb` gave back in another form.
GIVEN: dict[str, Any] = {
    "say": "use the other file",
    "flags": [True, False, None],
    "n": 1,
    "nested": {"big": 1.5e300, "round": 1e23, "zero": -0.0, "list": [1, 2, 3]},
}


def test_the_same_body_with_its_numbers_in_another_form_is_the_same() -> None:
    assert same_json(STORED, GIVEN)
    assert same_json(GIVEN, STORED)


@pytest.mark.parametrize(
    ("stored", "given"),
    [
        (True, 1),  # Python's True == 1: JSON's true is not the number 1
        (1, True),
        (False, 0),
        (0.0, False),
        ({"ok": True}, {"ok": 1}),
        ([1, True], [1, 1]),
        ({"a": 1}, {"a": 1, "b": 2}),  # a key more
        ({"a": 1, "b": 2}, {"a": 1}),  # a key less
        ({"a": 1}, {"b": 1}),
        ([1, 2], [1, 2, 3]),  # an element more at the end
        ([1, 2, 3], [1, 2]),
        ([], [None]),
        ({"list": [1]}, {"list": [1, 1]}),
        (1.5e300, 1.4e300),
        (10**23, 1e23 + 2**24),
        ("1", 1),
        (None, 0),
        ([1], {"0": 1}),
    ],
)
def test_a_body_that_differs_is_not_the_same(stored: Any, given: Any) -> None:
    assert not same_json(stored, given)
    assert not same_json(given, stored)
