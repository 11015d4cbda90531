"""The bounds a handler's result and progress are held to before they are serialized
(activities/handlers/sdk.py `_check_shape`): what is within them is taken, to the last level and
the last byte, and what is past them is refused without being copied, wherever the weight is (a
value, a key, the count of an object's entries)."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from activities.handlers.sdk import MAX_JSON_DEPTH, MAX_RESULT_BYTES, _check_json


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def nested_objects(levels: int) -> Any:
    value: Any = {}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize("make", [nested, nested_objects])
def test_a_value_nested_to_the_bound_is_taken_and_one_level_more_is_refused(make: Any) -> None:
    _check_json(make(MAX_JSON_DEPTH), "the result", MAX_RESULT_BYTES)
    with pytest.raises(TypeError, match=f"nests more than {MAX_JSON_DEPTH} levels"):
        _check_json(make(MAX_JSON_DEPTH + 1), "the result", MAX_RESULT_BYTES)


@pytest.mark.parametrize(
    "value",
    [
        "x" * 98,
        ["x" * 94],
        {"k": "x" * 91},
        {"k" * 91: "x"},
        list(range(10)) + [1] * 35,
        {str(i): i for i in range(10)},
    ],
)
def test_a_value_of_json_at_the_bound_is_taken(value: Any) -> None:
    limit = len(json.dumps(value).encode())
    _check_json(value, "the result", limit)
    with pytest.raises(TypeError, match="at most"):
        _check_json(value, "the result", limit - 1)


def _refused_without_copying(value: Any) -> str:
    tracemalloc.start()
    try:
        with pytest.raises(TypeError) as refused:
            _check_json(value, "the result", MAX_RESULT_BYTES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"{peak} bytes allocated to refuse it"
    return str(refused.value)


@pytest.mark.parametrize("key", ["k" * 20_000_000, b"k" * 20_000_000])
def test_a_huge_key_is_refused_before_it_is_serialized(key: str | bytes) -> None:
    """The weight of an object is its keys' too: a key of 20 MB was serialized whole (and
    more than once: sanitized, dumped) to be refused."""
    assert f"over {MAX_RESULT_BYTES} bytes" in _refused_without_copying({"rows": [{key: 1}]})


def test_an_object_of_more_entries_than_the_bound_is_refused_before_it_is_serialized() -> None:
    many = dict.fromkeys(range(MAX_RESULT_BYTES + 1))
    assert f"over {MAX_RESULT_BYTES} bytes" in _refused_without_copying({"index": many})
