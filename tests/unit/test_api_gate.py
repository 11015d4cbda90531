"""The enqueue gate's reading of a post: which ones it answers itself and which it leaves to the
route (roles/api/gate.py). The answers themselves are tested against real PostgreSQL in
tests/integration/test_api.py."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from roles.api.gate import EnqueueGate, well_formed


def post_scope(
    path: str = "/agents/codex/jobs",
    *,
    query: bytes = b"",
    key: str | None = None,
    root_path: str = "",
) -> Scope:
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": query,
        "root_path": root_path,
        "headers": headers,
    }


def read(scope: Scope) -> tuple[str, str | None] | None:
    return well_formed(scope, Headers(scope=scope))


def test_a_post_the_route_would_take_as_it_is_is_answered_by_the_gate() -> None:
    assert read(post_scope()) == ("codex", None)
    assert read(post_scope(key="retry-1:a@b.c")) == ("codex", "retry-1:a@b.c")
    assert read(post_scope("/agents/" + "a" * 200 + "/jobs")) == ("a" * 200, None)


@pytest.mark.parametrize(
    "scope",
    [
        post_scope(query=b"x=1"),  # the route refuses every query parameter
        post_scope("/agents/" + "a" * 201 + "/jobs"),  # over MAX_ID_LENGTH
        post_scope("/agents/ /jobs"),  # blank
        post_scope("/agents/a\x00b/jobs"),  # NUL cannot reach PostgreSQL
        post_scope(key="a b"),
        post_scope(key=""),
        post_scope(key="k\n"),  # `$` matches before a final newline; pydantic's pattern does not
        post_scope(key="k" * 201),
    ],
)
def test_a_post_the_route_would_refuse_on_its_parameters_is_left_to_it(scope: Scope) -> None:
    assert read(scope) is None


async def test_an_app_under_a_root_path_leaves_every_post_to_the_router() -> None:
    passed: list[Scope] = []

    async def router(scope: Scope, receive: Receive, send: Send) -> None:
        passed.append(scope)

    async def serve(*_: Any) -> Any:
        raise AssertionError("the gate answered a post under a root path")

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        raise AssertionError(f"the gate answered: {message}")

    gate = EnqueueGate(router, serve)
    scope = post_scope("/agents/codex/jobs", root_path="/agents/codex")
    await gate(scope, receive, send)
    assert passed == [scope]
