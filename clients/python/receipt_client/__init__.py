"""A typed client of the Receipt API: `Client` (blocking) and `AsyncClient` (asyncio).

    from receipt_client import Client

    with Client() as receipt:  # RECEIPT_API_URL, RECEIPT_API_TOKEN
        accepted = receipt.enqueue("codex", payload, job_id="build-1")
        job = receipt.wait(accepted.job.job_id)

Answers are the pydantic models of `receipt_client.models`, generated from the API's OpenAPI
document; refusals raise the `ReceiptError` subclass of their status. `segment(id)` is an id
as one path segment, for `request()`'s own paths.
"""

from receipt_client import models
from receipt_client._calls import segment
from receipt_client.aio import AsyncClient
from receipt_client.errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    Forbidden,
    InvalidInput,
    NotFound,
    ObjectiveNotCreated,
    PayloadTooLarge,
    RateLimited,
    ReceiptError,
    ServerError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    WaitTimedOut,
)
from receipt_client.sync import Client

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "ObjectiveNotCreated",
    "PayloadTooLarge",
    "RateLimited",
    "ReceiptError",
    "ServerError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "WaitTimedOut",
    "models",
    "segment",
]
