"""The project's own exceptions; psycopg errors are translated into these at the store boundary."""

from __future__ import annotations

from collections.abc import Sequence


class ReceiptError(Exception):
    """Base of every error this package raises on purpose."""


class InvariantError(ReceiptError):
    """The reducer refused a receipt that can never apply (e.g. an event for a job that does not exist)."""


class InvalidInput(ReceiptError):
    """A request failed validation; nothing was written.

    `field` is the dotted path of the offending field, `allowed` the accepted values when the
    field is an enumeration.
    """

    def __init__(self, field: str, message: str, allowed: Sequence[str] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.allowed = list(allowed) if allowed is not None else None


class NotPermitted(InvalidInput):
    """The caller may not do this (it lacks the scope `message` names); nothing was written.
    Answered 403 by the API (an `InvalidInput` elsewhere)."""


class StorageError(ReceiptError):
    """The database refused or failed a statement."""


class TransientStorageError(StorageError):
    """A storage failure that may succeed when retried (lost connection, serialization, deadlock)."""


class UnansweredStorageError(TransientStorageError):
    """The connection was lost with a statement sent and its answer not come back: a write it
    made, or the commit of its transaction, may have been applied (the database committed and
    the answer was lost) or not. Retried as any transient error; a retry that may repeat the
    write must find the first one (a settlement id, an Idempotency-Key)."""


class ConflictError(StorageError):
    """A uniqueness or ownership conflict: retrying the same write will fail the same way."""


class NotFoundError(StorageError):
    """The addressed row or stream does not exist."""
