"""The handler SDK's declarations and how a worker loads installed handlers (entry points)."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from activities.handlers.sdk import HandlerConflict, load_installed
from receipt_worker import AgentHandler, JobContext, handler
from receipts.kinds import (
    HANDLERS_ENTRY_POINTS,
    QUEUE_CHAT,
    QUEUE_CODEX,
    installed_handlers,
    route,
)


@handler("unit-bot", kinds=["factory.task.run", "factory.task.run"])
async def unit_bot(job: JobContext) -> None:
    """A handler for the loader to find."""


@handler("unit-runner", sandbox=True, group="codex")
async def unit_runner(job: JobContext) -> None:
    """A handler that names its worker group."""


def point(name: str, value: str, group: str = HANDLERS_ENTRY_POINTS) -> EntryPoint:
    return EntryPoint(name, value, group)


def test_a_declaration_names_its_agent_kinds_and_sandbox() -> None:
    assert isinstance(unit_bot, AgentHandler)
    assert (unit_bot.agent_id, unit_bot.kinds, unit_bot.sandbox) == (
        "unit-bot",
        ("factory.task.run",),
        False,
    )
    assert unit_bot.name == f"{__name__}:unit_bot"


@pytest.mark.parametrize(
    ("agent", "kinds", "message"),
    [
        ("", ["factory.task.run"], "agent id ''"),
        ("has space", ["factory.task.run"], "agent id 'has space'"),
        ("bot", ["factory.nope"], "got factory.nope"),
        ("bot", [], "got none"),
    ],
)
def test_a_bad_declaration_is_refused_naming_what_is_allowed(
    agent: str, kinds: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        handler(agent, kinds=kinds)


def test_installed_handlers_are_loaded_by_their_entry_point_name() -> None:
    installed = load_installed([point("unit-bot", f"{__name__}:unit_bot")])
    assert list(installed.handlers) == ["unit-bot"]
    assert installed.loaded == {"unit-bot": f"{__name__}:unit_bot (kinds factory.task.run)"}
    assert installed.failures == ()


def test_a_handler_that_fails_to_load_is_a_failure_naming_it() -> None:
    installed = load_installed(
        [
            point("missing", "no_such_module_anywhere:run"),
            point("wrong-name", f"{__name__}:unit_bot"),
            point("not-a-handler", f"{__name__}:point"),
        ]
    )
    assert installed.handlers == {}
    failures = "\n".join(installed.failures)
    assert "missing = no_such_module_anywhere:run: ModuleNotFoundError" in failures
    assert "wrong-name" in failures and "a handler of agent 'unit-bot'" in failures
    assert "not-a-handler" in failures and "not a @handler" in failures


def test_an_agent_id_built_in_and_installed_is_a_conflict_naming_both() -> None:
    with pytest.raises(HandlerConflict, match=r"'codex' is both built in .* codex = pkg:run"):
        load_installed([point("codex", "pkg:run")])
    with pytest.raises(HandlerConflict, match="installed twice"):
        load_installed([point("twice", "a:run"), point("twice", "b:run")])


def test_a_group_is_one_of_the_three_and_is_installed_as_such() -> None:
    with pytest.raises(ValueError, match="must be one of chat, codex, control; got 'gpu'"):
        handler("bot", group="gpu")
    codex = f"{HANDLERS_ENTRY_POINTS}.codex"
    installed = load_installed([point("unit-runner", f"{__name__}:unit_runner", codex)])
    assert installed.loaded == {
        "unit-runner": f"{__name__}:unit_runner (kinds factory.task.run, sandboxed, group codex)"
    }
    misplaced = load_installed([point("unit-runner", f"{__name__}:unit_runner")])
    assert misplaced.handlers == {}
    assert "install it in the entry-point group receipt.handlers.codex" in misplaced.failures[0]
    unnamed = load_installed([point("unit-bot", f"{__name__}:unit_bot", codex)])
    assert "names the worker group (routed)" in unnamed.failures[0]


def test_an_installed_handler_that_names_its_group_is_routed_there() -> None:
    """The example package (examples/release-bot, installed by `make install`): release-check
    names codex, release-bot leaves routing to the spec's rules."""
    assert installed_handlers()["release-check"] == "codex"
    assert route("release-check", "factory.task.run") == QUEUE_CODEX
    assert route("release-bot", "factory.task.run") == QUEUE_CHAT
    assert route("codex", "factory.task.run") == QUEUE_CODEX  # built-in ids keep their route


async def test_a_failure_to_write_kept_progress_never_replaces_the_handlers_outcome() -> None:
    """The kept-back progress is written when the handler ends; when that write fails (the
    database gone, say) the job still ends as the handler said — here its `Fail`, not retryable
    — and the failure is counted (it replaced the `Fail` with a retried error before)."""
    from types import SimpleNamespace
    from typing import Any

    from activities.handlers.context import HandlerError
    from activities.handlers.sdk import as_handler
    from receipt_worker import Fail
    from receipts import metrics

    written: list[Any] = []

    async def progress(data: Any) -> bool:
        if written:
            raise ConnectionError("the database is gone")
        written.append(data)
        return True

    job = SimpleNamespace(
        job_id="unit-job",
        agent_id="unit-writer",
        kind="factory.task.run",
        max_attempts=3,
        organization_id="org-a",
        session_key=None,
    )
    ctx = SimpleNamespace(job=job, attempt=1, progress=progress)

    @handler("unit-writer")
    async def writer(job: JobContext) -> None:
        await job.progress("first")
        await job.progress("kept")  # within the rate limit: written when the handler ends
        raise Fail("payload.version is required")

    unwritten = metrics.HANDLER_PROGRESS_UNWRITTEN.labels(metrics.agent_label("unit-writer"))
    before = unwritten._value.get()
    with pytest.raises(HandlerError) as failed:
        await as_handler(writer)(ctx)  # type: ignore[arg-type]
    assert (str(failed.value), failed.value.retryable) == ("payload.version is required", False)
    assert written == ["first"] and unwritten._value.get() == before + 1


def test_a_declaration_it_cannot_run_is_refused_where_it_is_made() -> None:
    """A plain function (it ran its side effects, then awaiting its result failed, retried), a
    string of kinds (refused letter by letter), a sandboxed handler off worker-codex (it ran
    commands where no sandbox is, with no `commands:run` needed to enqueue it)."""

    def plain(job: JobContext) -> dict[str, str]:
        return {}

    with pytest.raises(TypeError, match=r"async def.*asyncio.to_thread"):
        handler("unit-plain")(plain)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a list of payload kinds, not a string"):
        handler("unit-kinds", kinds="factory.task.run")
    with pytest.raises(ValueError, match="add group='codex'"):
        handler("unit-sandboxed", sandbox=True)
    with pytest.raises(ValueError, match="add group='codex'"):
        handler("unit-sandboxed", sandbox=True, group="chat")

    class Callable:
        async def __call__(self, job: JobContext) -> None:
            """An object whose call is a coroutine function is a handler too."""

    assert handler("unit-callable")(Callable()).agent_id == "unit-callable"


def test_an_installed_handler_s_commands_are_held_to_the_list_where_it_runs_them() -> None:
    """Under an organization's allow-list, an enqueue of an installed sandboxed handler was
    checked on `payload.task.command`, which the handler need not read: refused for lacking it,
    or admitted by a decoy while the argv the handler reads ran unchecked. The handler's argv is
    checked when it runs it (tests/integration/test_handler_sdk.py), not at the enqueue."""
    from receipts.enqueue_request import parse_enqueue
    from receipts.executables import refused_request

    lists = {"org-a": ["pytest"]}
    auth = {"userId": "u-1", "organizationId": "org-a"}
    check = {"kind": "factory.task.run", "authContext": auth, "check": ["pytest", "-q"]}
    assert installed_handlers()["release-check"] == "codex"
    assert (
        refused_request(lists, "release-check", parse_enqueue("release-check", {"payload": check}))
        is None
    )
    codex = {"kind": "factory.task.run", "authContext": auth, "task": {"command": ["curl"]}}
    refused = refused_request(lists, "codex", parse_enqueue("codex", {"payload": codex}))
    assert refused is not None and refused[0] == "payload.task.command"


def _checked_within(value: object, seconds: float = 10.0) -> str:
    """What `_check_json` refuses `value` with, run in a thread given `seconds` (a walk that
    never ends fails the test instead of hanging it)."""
    import threading

    from activities.handlers.sdk import _check_json

    refused: list[str] = []

    def check() -> None:
        try:
            _check_json(value, "the result", 1024 * 1024)
        except TypeError as exc:
            refused.append(str(exc))

    checking = threading.Thread(target=check, daemon=True)
    checking.start()
    checking.join(seconds)
    assert not checking.is_alive(), "the check of a handler's value never ended"
    assert refused, "the value was taken as JSON"
    return refused[0]


def test_a_value_that_holds_itself_or_one_list_many_times_over_is_refused_at_once() -> None:
    """A result or progress that refers to itself was walked for ever by the depth check, on
    the worker's event loop: every attempt and heartbeat of that worker stopped, and Temporal's
    redelivery froze the next worker the same way. One list held twice at each of 40 levels is
    2**40 values (json.dumps would take as long): refused by its count, as JSON of over a MiB."""
    itself: list[object] = []
    itself.append(itself)
    looped: dict[str, object] = {"step": 1}
    looped["parent"] = {"child": looped}
    assert "levels deep" in _checked_within(itself)
    assert "levels deep" in _checked_within(looped)
    shared: list[object] = []
    for _ in range(40):
        shared = [shared, shared]
    assert "values" in _checked_within(shared)
    # A Fail's result is checked where it is made: a TypeError naming it, not a RecursionError.
    from receipt_worker import Fail

    with pytest.raises(TypeError, match="must be JSON"):
        Fail("bad", result={"me": looped})


def test_time_left_is_a_number_a_handler_computes_with() -> None:
    """`job.time_left()` was `float | None`, though every attempt has an execution timeout: a
    handler's `min(10.0, job.time_left())` did not type-check (mypy --strict) without a check
    for a None the worker never gives. An unknown deadline (a context built without one) is
    `math.inf`."""
    from typing import get_type_hints

    from activities.handlers.sdk import FencedJobContext

    assert get_type_hints(JobContext.time_left)["return"] is float
    assert get_type_hints(FencedJobContext.time_left)["return"] is float


@pytest.mark.parametrize("text", ["é" * 20_000_000, b"\xff" * 20_000_000])
def test_a_huge_result_is_refused_before_it_is_serialized(text: str | bytes) -> None:
    """A handler's result (or progress) was serialized whole before its size was checked, on
    the worker's event loop: a 100 MB string returned held the loop (every attempt's heartbeat
    with it) 4 s and took 1.2 GB more (6 bytes of JSON a character) to be refused, enough to
    have the worker killed for its memory with every job it ran. Its length alone refuses it."""
    import tracemalloc

    from activities.handlers.sdk import MAX_RESULT_BYTES, _check_json

    tracemalloc.start()
    try:
        with pytest.raises(TypeError, match="at most 1048576"):
            _check_json({"log": [text]}, "the result", MAX_RESULT_BYTES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"{peak} bytes allocated to refuse it"
