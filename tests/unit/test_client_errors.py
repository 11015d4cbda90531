"""receipt-client's reading of answers, over httpx's mock transport (the live api's answers are
in tests/integration/test_client.py): each status its exception, an error body that is not the
API's, and an objective whose run job failed."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi.encoders import jsonable_encoder

from receipt_client import AsyncClient, Client, ObjectiveNotCreated, ServerError, models
from receipt_client.errors import BY_STATUS, ReceiptError, error_of
from receipts.jobs import Job
from roles.api.schema import job_view

EVENT_STREAM = {"content-type": "text/event-stream"}


def refusal(status: int, **error: Any) -> httpx.Response:
    body = {"error": {"code": "c", "message": "m", **error}}
    return httpx.Response(status, json=body, headers={"Retry-After": "7"})


def completed_job() -> Job:
    """A completed codex job `j-1`, as the API's `GET /jobs/j-1` shows it."""
    now = datetime.now(UTC)
    return Job(
        job_id="j-1",
        agent_id="codex",
        lane="factory",
        kind="factory.task.run",
        payload={"kind": "factory.task.run"},
        status="completed",
        created_at=now,
        updated_at=now,
    )


@pytest.mark.parametrize("status", sorted(BY_STATUS))
def test_each_documented_status_is_its_own_exception(status: int) -> None:
    error = error_of(refusal(status, field="f"))
    assert type(error) is BY_STATUS[status]
    assert (error.status, error.code, error.field, error.retry_after) == (status, "c", "f", 7.0)


def test_other_answers_are_server_errors_or_plain_ones_and_keep_their_text() -> None:
    assert isinstance(error_of(httpx.Response(500, text="oops")), ServerError)
    teapot = error_of(httpx.Response(418, text="<html>teapot</html>"))
    assert type(teapot) is ReceiptError and str(teapot) == "HTTP 418: <html>teapot</html> (418)"


def test_the_message_names_status_code_field_and_the_choices_it_does_not_list() -> None:
    error = error_of(refusal(422, message="lane is not one", field="lane", allowed=["a", "b"]))
    assert str(error) == "lane is not one (422 c, field lane); allowed: a, b; retry after 7 s"
    listed = error_of(refusal(422, message="lane must be a or b", allowed=["a", "b"]))
    assert str(listed) == "lane must be a or b (422 c); retry after 7 s"
    later = error_of(httpx.Response(429, json={"error": {"code": "rate_limited", "message": "m"}}))
    assert str(later) == "m (429 rate_limited)"  # no Retry-After: no time named


def test_a_refusal_says_when_to_send_it_again() -> None:
    """A 429's or a 503's Retry-After is in its text (the one line `receipt` prints)."""
    error = error_of(refusal(429, code="rate_limited", message="too many requests"))
    assert str(error) == "too many requests (429 rate_limited); retry after 7 s"


def test_waiting_for_an_objective_whose_run_job_failed_says_it_was_not_created() -> None:
    now = datetime.now(UTC)
    run = Job(
        job_id="objective:o-1:run",
        agent_id="factory",
        lane="collect",
        kind="factory.run",
        payload={"kind": "factory.run"},
        status="failed",
        error="tasks[0].input must be exactly one of {command: [argv]} or {prompt}",
        created_at=now,
        updated_at=now,
    )
    view = jsonable_encoder(job_view(run))

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):  # the run job is already terminal
            return httpx.Response(
                200, text='event: end\ndata: {"status": "failed"}\n\n', headers=EVENT_STREAM
            )
        return httpx.Response(200, json=view)

    accepted = models.ObjectiveAccepted.model_validate(
        {
            "objectiveId": "o-1",
            "outcome": "created",
            "job": view,
            "objectiveUrl": "/objectives/o-1",
            "eventsUrl": "/objectives/o-1/events",
            "cancelUrl": "/objectives/o-1/cancel",
            "jobUrl": "/jobs/objective:o-1:run",
        }
    )
    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ObjectiveNotCreated) as refused:
            client.wait_objective(accepted)
    assert refused.value.code == "failed"
    assert refused.value.message == f"objective o-1 was not created: {run.error}"


def test_wait_reads_the_job_again_through_a_503_not_before_its_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the stream's `end`, `wait` reads the job; a 503 then (the database away) is read
    again not before the `Retry-After` the API named (it waited its own 0.5, 1 s before)."""
    from receipt_client import _sync_base as sync

    done = completed_job()
    reads: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(
                200, text='event: end\ndata: {"status": "completed"}\n\n', headers=EVENT_STREAM
            )
        reads.append(request.url.path)
        if len(reads) <= 2:
            return refusal(503)  # Retry-After: 7
        return httpx.Response(200, json=jsonable_encoder(job_view(done)))

    slept: list[float] = []
    monkeypatch.setattr(sync.time, "sleep", slept.append)
    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        assert client.wait("j-1").status == "completed"
    assert len(reads) == 3 and slept == [7.0, 7.0]


def test_a_request_model_is_sent_by_the_apis_names() -> None:
    """`create_schedule`, `create_objective` take their model as well as a dict: it is sent by
    the API's names, unset fields left out (a model was sent as `{'agent_id': ...,
    'interval': Interval(...)}`, which failed to encode)."""
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(500, text="stop here")

    schedule = models.ScheduleBody.model_validate(
        {"agentId": "codex", "interval": "5m", "job": {"payload": {"kind": "factory.task.run"}}}
    )
    objective = models.ObjectiveBody(title="t", goal="g")
    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        for create, body in (
            (client.create_schedule, schedule),
            (client.create_objective, objective),
        ):
            with pytest.raises(ServerError):
                create(body)  # type: ignore[operator]
    assert sent == [
        {"agentId": "codex", "interval": "5m", "job": {"payload": {"kind": "factory.task.run"}}},
        {"title": "t", "goal": "g"},
    ]


def test_a_bulk_retry_leaves_out_the_filters_given_as_none() -> None:
    """`retry_matching(status=None, limit=None)`, as a caller passes its own optional filters:
    the body's defaults, as when they are not given, not refused by the body's model (whose
    `status` and `limit` are not Optional: they have defaults)."""
    sent: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(500, text="stop here")

    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ServerError):
            client.retry_matching(status=None, limit=None, agent_id="invoice-bot")
    assert sent == [{"agentId": "invoice-bot", "limit": 100, "status": "failed"}]


def test_a_success_whose_body_is_not_json_is_a_server_error_naming_the_request() -> None:
    """Another service at the URL (a proxy's sign-in page) answers 200 with HTML: the client
    raises its `ServerError`, not a JSON decoding traceback (the CLI exits 3 on it)."""
    page = httpx.MockTransport(
        lambda _: httpx.Response(
            200, text="<html>sign in</html>", headers={"content-type": "text/html"}
        )
    )
    with Client("http://proxy.test", "t", transport=page) as client:
        with pytest.raises(ServerError) as refused:
            client.get_job("j-1")
    assert refused.value.status == 200
    assert "GET /jobs/j-1 with a body that is not JSON (text/html)" in str(refused.value)


def test_a_deadline_cuts_a_read_that_would_end_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream's read timeout ends by the deadline; a connection opened with a longer one is
    resumed once the deadline is nearer than it (by more than SLACK_S)."""
    from receipt_client import WaitTimedOut
    from receipt_client import deadline as deadlines

    now = [1000.0]
    monkeypatch.setattr(deadlines.time, "monotonic", lambda: now[0])
    assert deadlines.NEVER.read_timeout() == deadlines.STREAM_READ_TIMEOUT_S
    assert not deadlines.NEVER.cuts(60.0)
    deadlines.NEVER.allows(10**9)
    far = deadlines.Deadline.after(100, "job j")
    assert far.read_timeout() == deadlines.STREAM_READ_TIMEOUT_S and not far.cuts(60.0)
    now[0] += 45  # 55 s left: a read of 60 could end 5 s past it
    assert far.cuts(60.0) and far.read_timeout() == 55.0
    now[0] += 0.5  # within the slack of the read opened with 55
    assert not far.cuts(55.0)
    far.allows(54.0)
    with pytest.raises(WaitTimedOut, match="job j did not end in time") as timed_out:
        far.allows(55.0, cause=ConnectionError("down"))
    assert isinstance(timed_out.value, TimeoutError)
    assert isinstance(timed_out.value.__cause__, ConnectionError)
    now[0] += 60
    assert far.left() == 0.0 and far.read_timeout() == deadlines.SLACK_S


async def test_a_wait_s_last_read_ends_by_its_deadline_too() -> None:
    """The stream ended (its `end` event), then the job is read again: that read took the
    client's own 30 s timeout, so a wait could run 30 s past its deadline. It ends by it now.
    The API here is a loopback fake that answers the stream and never the read."""
    import asyncio

    from receipt_client import AsyncClient, WaitTimedOut

    handling: set[asyncio.Task[object]] = set()

    async def fake_api(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handling.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            request = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
            if b"/events" in request:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"connection: close\r\n\r\nevent: end\ndata: {}\n\n"
                )
                await writer.drain()
            else:
                await asyncio.sleep(60)  # the read is never answered
        finally:
            writer.close()

    server = await asyncio.start_server(fake_api, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with AsyncClient(url, "t", timeout=30) as client:
            with pytest.raises(WaitTimedOut):
                await asyncio.wait_for(client.wait("j-1", timeout=1.5), 10)
    finally:
        server.close()
        for task in handling:
            task.cancel()
        await asyncio.gather(*handling, return_exceptions=True)
        await server.wait_closed()


def test_following_a_url_that_answers_no_event_stream_fails_at_once() -> None:
    """A 200 that is not an event stream (a proxy's or a login page) reset the reconnect count
    at every try: `follow` reconnected every half second for ever (19 209 connections in 3 s
    with the sleeps stubbed). It is a `ServerError`, as a read of such an answer is."""
    tries: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        tries.append(request.url.path)
        return httpx.Response(
            200, text="<html>sign in</html>", headers={"content-type": "text/html"}
        )

    with Client("http://proxy.test", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ServerError, match="not an event stream"):
            list(client.follow("job-1"))
    assert len(tries) == 1


def test_a_post_with_no_answer_in_time_may_have_been_applied() -> None:
    """A read timeout after a POST was sent said 'cannot reach the API': it may have been
    applied, and only the same job id or Idempotency-Key can be sent again safely."""
    from receipt_client import ConnectionFailed

    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ConnectionFailed, match="may have been applied"):
            client.request("POST", "/agents/codex/jobs", json={})
        with pytest.raises(ConnectionFailed, match="no answer from the API") as read:
            client.request("GET", "/jobs/j-1")
    assert "may have been applied" not in str(read.value)


def test_a_lost_answer_says_whether_sending_it_again_is_safe() -> None:
    """`enqueue()` naming no job id, its answer lost, said 'send it again with the same job id or
    Idempotency-Key to find out': it had neither, and sent again it made a second job (a
    newcomer's invoice job ran twice). The message says it carried no key; a keyed post's names
    its key, to send again."""
    from receipt_client import ConnectionFailed

    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    payload = {"kind": "factory.task.run"}
    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ConnectionFailed) as unkeyed:
            client.enqueue("invoice-bot", payload)
        with pytest.raises(ConnectionFailed) as keyed:
            client.enqueue("invoice-bot", payload, idempotency_key="inv-7")
    assert "no Idempotency-Key" in str(unkeyed.value)
    assert "may be applied twice" in str(unkeyed.value)
    assert "Idempotency-Key inv-7" in str(keyed.value)


def unanswered(monkeypatch: pytest.MonkeyPatch, *commands: Any) -> list[httpx.Request]:
    """Make the CLI modules `commands` post to an API whose answer never comes (a read
    timeout); returns the requests sent, in order."""
    from roles.cli import client as cli_client

    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        raise httpx.ReadTimeout("timed out", request=request)

    class Offline(cli_client.ApiClient):
        def __init__(self, url: str, token: str | None) -> None:
            Client.__init__(self, url, token or "", transport=httpx.MockTransport(answer))

    for module in commands:
        monkeypatch.setattr(module, "ApiClient", Offline)
    return sent


def test_the_cli_posts_an_id_less_job_with_a_key_it_names_when_no_answer_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`receipt enqueue` without --job-id posted no Idempotency-Key: after a timeout a second run
    made a second job. It sends a key, and names it when the API does not answer in time."""
    from click.testing import CliRunner

    from roles.cli import jobs as cli_jobs

    sent = unanswered(monkeypatch, cli_jobs)
    ran = CliRunner().invoke(
        cli_jobs.enqueue_command, ["codex", "--kind", "factory.task.run", "--api-url", "http://a"]
    )
    assert ran.exit_code == 4, ran.output  # no answer: the same command may do later
    key = sent[0].headers["Idempotency-Key"]
    assert key and f"repeat it with --idempotency-key {key}" in ran.output
    again = CliRunner().invoke(
        cli_jobs.enqueue_command,
        ["codex", "--kind", "factory.task.run", "--api-url", "http://a", "--idempotency-key", key],
    )
    assert again.exit_code == 4 and sent[1].headers["Idempotency-Key"] == key


def test_the_cli_refuses_an_organization_filter_without_console() -> None:
    """`agent-jobs ls --session S --organization-id O` sent organizationId to a route that takes
    none: a 422 reported as the API's refusal (exit 3) for a usage mistake (exit 2)."""
    from click.testing import CliRunner

    from roles.cli.agent_jobs import ls_command

    ran = CliRunner().invoke(ls_command, ["--session", "s-1", "--organization-id", "org-a"])
    assert ran.exit_code == 2 and "--organization-id goes with --console" in ran.output


def test_agent_job_events_says_what_is_missing_or_doubled() -> None:
    """With neither an agent job ID nor --session, the usage error said "not both"."""
    from click.testing import CliRunner

    from roles.cli.agent_jobs import events_command

    neither = CliRunner().invoke(events_command, [])
    assert neither.exit_code == 2 and "or --session with an owner session id" in neither.output
    both = CliRunner().invoke(events_command, ["aj-1", "--session", "s-1"])
    assert both.exit_code == 2 and "not both" in both.output


def test_stream_reconnects_wait_longer_each_time_and_at_most_five_seconds() -> None:
    from receipt_client.sse import RECONNECT_ATTEMPTS, reconnect_delay

    delays = [reconnect_delay(n) for n in range(1, RECONNECT_ATTEMPTS + 1)]
    assert delays == sorted(delays) and delays[0] == 0.5 and max(delays) == 5.0


@pytest.mark.parametrize(
    "lost",
    [
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadError("[Errno 104] Connection reset by peer"),
    ],
)
def test_a_post_whose_answer_was_lost_may_have_been_applied(lost: httpx.TransportError) -> None:
    """A connection reset after a POST was sent (the api restarted, a proxy dropped it) said
    'cannot reach the API', as if nothing was sent: the enqueue may have been made, and the CLI
    named its Idempotency-Key only after a timeout. Only a failure to connect sent nothing."""
    from receipt_client import ConnectionFailed

    def answer(request: httpx.Request) -> httpx.Response:
        raise type(lost)(str(lost), request=request)

    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ConnectionFailed, match="may have been applied"):
            client.request("POST", "/agents/codex/jobs", json={})

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    with Client("http://api", "t", transport=httpx.MockTransport(refused)) as client:
        with pytest.raises(ConnectionFailed, match="cannot reach the API") as unsent:
            client.request("POST", "/agents/codex/jobs", json={})
    assert "may have been applied" not in str(unsent.value)


@pytest.mark.parametrize("status", [502, 504])
def test_a_proxy_s_bad_gateway_is_ridden_out_by_a_wait_and_a_stream(
    status: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind an ingress, a restart or a rolling update of the api answers 502 or 504 (no api
    answered): `wait` and `follow` failed at once with a ServerError; they resume as after a
    503, the stream from its last receipt."""
    from receipt_client import _sync_base as sync

    done = completed_job()
    first = {"seq": 1, "type": "job.enqueued"}
    bad = httpx.Response(status, text="<html>bad gateway</html>")
    queued = done.model_copy(update={"status": "queued"})
    reads = iter([bad, httpx.Response(200, json=jsonable_encoder(job_view(queued)))])
    last_read = iter([bad, httpx.Response(200, json=jsonable_encoder(job_view(done)))])
    stream = iter(
        [
            httpx.Response(200, text=f"id: 1\ndata: {json.dumps(first)}\n\n", headers=EVENT_STREAM),
            bad,
            httpx.Response(
                200, text='event: end\ndata: {"status": "completed"}\n\n', headers=EVENT_STREAM
            ),
        ]
    )
    resumed: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            resumed.append(request.headers.get("Last-Event-ID"))
            return next(stream)
        return next(reads, None) or next(last_read)

    monkeypatch.setattr(sync.time, "sleep", lambda _: None)
    with Client("http://api", "t", transport=httpx.MockTransport(answer)) as client:
        assert client.wait("j-1").status == "completed"
    assert resumed == ["0", "1", "1"]  # resumed after its last receipt


@pytest.mark.parametrize("make", [Client, AsyncClient], ids=["sync", "async"])
async def test_a_password_in_the_api_url_is_never_printed(make: Any) -> None:
    """`--api-url http://user:password@host` (a proxy's basic auth): every message naming the
    URL wrote the password out (`receipt`'s error line lands in CI logs); it is `***`."""

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    url = "http://ops:pr0xyPassw0rd@api.internal:8000"
    client = make(url, transport=(httpx.MockTransport(refused)))
    with pytest.raises(ReceiptError) as refusal:
        answer = client.get_job("j-1")
        if hasattr(answer, "__await__"):
            await answer
    assert "pr0xyPassw0rd" not in str(refusal.value), refusal.value
    assert "http://ops:***@api.internal:8000" in str(refusal.value), refusal.value
    assert client.url == url  # the requests still carry it


@pytest.mark.parametrize("command", ["objectives", "schedules"])
def test_the_cli_posts_an_id_less_objective_or_schedule_with_a_key_it_names(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """`receipt objectives run` of a file naming no objectiveId and `receipt schedules create`
    without --id posted no Idempotency-Key: after a timeout a second run made a second
    objective (every task run twice) or schedule (every firing doubled). They send one, name it
    when no answer comes, and send it again with --idempotency-key."""
    from click.testing import CliRunner

    from roles.cli import objectives as cli_objectives
    from roles.cli import schedules as cli_schedules

    sent = unanswered(monkeypatch, cli_objectives, cli_schedules)
    objective = tmp_path / "objective.yaml"
    objective.write_text('tasks:\n  - id: a\n    input: {command: ["true"]}\n')
    if command == "objectives":
        run, args = cli_objectives.objectives_run, [str(objective)]
    else:
        run, args = cli_schedules.schedules_create, ["--interval", "1h", "--agent", "codex"]
        args += ["--job", '{"payload": {"kind": "factory.task.run"}}']
    ran = CliRunner().invoke(run, [*args, "--api-url", "http://a"])
    assert ran.exit_code == 4, ran.output  # no answer: the same command may do later
    key = sent[0].headers["Idempotency-Key"]
    assert key and f"repeat it with --idempotency-key {key}" in ran.output, ran.output
    again = CliRunner().invoke(run, [*args, "--api-url", "http://a", "--idempotency-key", key])
    assert again.exit_code == 4 and sent[1].headers["Idempotency-Key"] == key


@pytest.mark.parametrize("command", ["steer", "follow-up", "abort"])
def test_the_cli_sends_a_command_with_a_key_it_names(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`receipt jobs steer`, `follow-up` and `abort` posted no Idempotency-Key: after a timeout
    (the error says to send it again with one) a second run appended a second steer, or was told
    409 terminal_state by the cancel its first abort made, exit 3. They send one, name it when
    no answer comes, and send it again with --idempotency-key, as `receipt enqueue` does."""
    from click.testing import CliRunner

    from roles.cli import jobs as cli_jobs

    sent = unanswered(monkeypatch, cli_jobs)
    args = ["jobs", command, "j-1", "--api-url", "http://a"]
    if command != "abort":
        args += ["--payload", '{"say": "x"}']
    group = cli_jobs.jobs_group
    ran = CliRunner().invoke(group, args[1:])
    assert ran.exit_code == 4, ran.output  # no answer: the same command may do later
    key = sent[0].headers.get("Idempotency-Key")
    assert key and f"repeat it with --idempotency-key {key}" in ran.output, ran.output
    again = CliRunner().invoke(group, [*args[1:], "--idempotency-key", key])
    assert again.exit_code == 4 and sent[1].headers["Idempotency-Key"] == key
