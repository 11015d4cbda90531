"""Streams and their folded states: the stored receipt and its data's JSON, the frozen camelCase
model every folded state is made of, the state's common head (seq, times, terminal), and the
fold. Pure: no I/O.

A job (`receipts/jobs.py`), an objective (`receipts/objectives/model.py`) and an agent job
(`receipts/agent_jobs/model.py`) are each a `StreamState` folded by its own `apply`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Draft:
    """A receipt about to be appended: its type and data; the store assigns seq and time."""

    type: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Receipt:
    """One stored receipt. `seq` is 1-based and increases by one per append of a stream;
    retention may delete old receipts of a schedule's or an owner session's stream, never its
    head, so a seq is never used twice. `recorded_at` is database time."""

    stream: str
    seq: int
    type: str
    data: Mapping[str, Any]
    recorded_at: datetime
    position: int = 0

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Receipt:
        """The receipt of a row `(stream, seq, type, data, recorded_at, position)`."""
        stream, seq, type_, data, recorded_at, position = row
        return cls(stream, seq, type_, data, recorded_at, position)

    def to_json(self) -> dict[str, Any]:
        """Return the camelCase JSON form used by the API and the event stream."""
        return {
            "stream": self.stream,
            "seq": self.seq,
            "type": self.type,
            "data": dict(self.data),
            "recordedAt": self.recorded_at.isoformat(),
            "position": self.position,
        }


def dumps(value: Any) -> str:
    """Encode receipt data as JSON (datetimes as ISO 8601)."""
    return json.dumps(value, separators=(",", ":"), default=_default, ensure_ascii=False)


def json_bytes(value: Any) -> int:
    """The bytes of `value` as JSON text, as PostgreSQL's jsonb prints it (`: ` and `, `, UTF-8):
    how a follow-up and an agent turn's outcome are weighed against their bounds."""
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def same_json(stored: Any, given: Any) -> bool:
    """True when `given` (a request's JSON) is what `stored` (read back from `jsonb`) holds.
    `jsonb` keeps a number as its decimal value, so a float comes back in another form: 1.5e300
    as the integer 15 followed by 299 zeros, 1e23 as 10**23 (neither equal to the float in
    Python), -0.0 as 0.0. Numbers are compared by their decimal value, as `jsonb` compares
    them; `true` is not 1 (Python's `True == 1`)."""
    if isinstance(stored, bool) or isinstance(given, bool):
        return type(stored) is type(given) and stored == given
    if isinstance(stored, (int, float)) and isinstance(given, (int, float)):
        return _decimal(stored) == _decimal(given)
    if isinstance(stored, Mapping) and isinstance(given, Mapping):
        return stored.keys() == given.keys() and all(same_json(stored[k], given[k]) for k in stored)
    if isinstance(stored, (list, tuple)) and isinstance(given, (list, tuple)):
        return len(stored) == len(given) and all(map(same_json, stored, given))
    return type(stored) is type(given) and bool(stored == given)


def _decimal(number: float) -> Decimal:
    """A number as `jsonb` stores it: a float by the text `dumps` writes (its `repr`)."""
    return Decimal(repr(number)) if isinstance(number, float) else Decimal(number)


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


class CamelModel(BaseModel):
    """A frozen pydantic model whose JSON form is camelCase and that takes no unknown field."""

    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )


class StreamState(CamelModel):
    """The folded state of one stream `<STREAM_PREFIX><id>`: its head `seq` (the last receipt
    folded), when its first receipt was recorded, when a receipt last changed it and when it
    settled. A subclass names its stream prefix, the field holding the id (`ID_FIELD`), its
    `status` field and the statuses in which it is settled (`TERMINAL`)."""

    STREAM_PREFIX: ClassVar[str]
    ID_FIELD: ClassVar[str]
    TERMINAL: ClassVar[frozenset[str]]
    if TYPE_CHECKING:
        status: str

    seq: int = 0
    created_at: datetime
    updated_at: datetime
    settled_at: datetime | None = None

    @property
    def stream_id(self) -> str:
        """The id in the stream's name."""
        return str(getattr(self, self.ID_FIELD))

    @property
    def terminal(self) -> bool:
        """True once the status is terminal: nothing moves the state after that."""
        return self.status in self.TERMINAL

    def to_json(self) -> dict[str, Any]:
        """Return the camelCase JSON form (the projection row's `state` and the API's view)."""
        return self.model_dump(mode="json", by_alias=True)


def time_of(data: Mapping[str, Any], key: str) -> datetime | None:
    """The time under `key` in receipt data (a datetime, or ISO 8601 text), or None."""
    value = data.get(key)
    if value is None:
        return None
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


def fold(
    apply: Callable[[S | None, Receipt], S | None],
    receipts: Iterable[Receipt],
    state: S | None = None,
) -> S | None:
    """Fold receipts in order with `apply`, starting from `state` (None: the empty stream)."""
    for receipt in receipts:
        state = apply(state, receipt)
    return state
