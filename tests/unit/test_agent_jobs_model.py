"""The agent job's pure model: the transition table (every pair), the fold, claims, the
settlement decisions and budgets, and the turn protocol."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from receipts.agent_jobs import decisions, model, protocol
from receipts.agent_jobs.decisions import TurnReport
from receipts.agent_jobs.model import AgentJob
from receipts.agent_jobs.registry import AgentDefinition, RegistryError, parse_registry
from receipts.errors import InvariantError
from receipts.jobs import Receipt

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

ALLOWED = {
    ("queued", "running"),
    ("queued", "stopped"),
    ("running", "waiting_on_user"),
    ("running", "succeeded"),
    ("running", "failed"),
    ("running", "stopped"),
    ("running", "queued"),
    ("waiting_on_user", "running"),
    ("waiting_on_user", "stopped"),
    ("waiting_on_user", "failed"),
}


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(model.STATUSES, repeat=2)))
def test_transition_table_every_pair(src: str, dst: str) -> None:
    assert model.transition_allowed(src, dst) is ((src, dst) in ALLOWED)


def test_terminal_statuses_move_nowhere() -> None:
    for terminal in model.TERMINAL_STATUSES:
        assert not any(model.transition_allowed(terminal, to) for to in model.STATUSES)


def _receipt(seq: int, type_: str, data: dict[str, Any], at: datetime = T0) -> Receipt:
    return Receipt("agent-jobs/aj-1", seq, type_, data, at)


def created() -> AgentJob:
    job = model.apply(
        None,
        _receipt(
            1,
            model.CREATED,
            {
                "agentJobId": "aj-1",
                "agentId": "writer",
                "organizationId": "org-a",
                "ownerSessionId": "s-1",
                "sourceActorEventId": "ev-1",
                "sourceToolCallId": "tc-1",
                "replyRoute": {"binding": "slack", "channel": "c-1", "thread": "t-1"},
                "input": {"prompt": "do it"},
            },
        ),
    )
    assert job.status == "queued" and job.workspace_owner_job_id == "aj-1"
    return job


def _move(job: AgentJob, data: dict[str, Any], at: datetime = T0) -> AgentJob:
    return model.apply(job, _receipt(job.seq + 1, model.TRANSITIONED, data, at))


def running(job: AgentJob | None = None, at: datetime = T0) -> AgentJob:
    job = job or created()
    return _move(job, decisions.claim(job, at).data, at)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(model.STATUSES, repeat=2)))
def test_the_fold_refuses_every_transition_the_table_refuses(src: str, dst: str) -> None:
    job = created().model_copy(update={"status": src, "queue_job_id": "q"})
    data = {
        "from": src,
        "to": dst,
        "queueJobId": "q",
        "pendingToolCall": {"toolCallId": "x", "question": "?"},
    }
    if (src, dst) in ALLOWED:
        assert _move(job, data).status == dst
    else:
        with pytest.raises(InvariantError, match=f"transition {src} -> {dst} is not allowed"):
            _move(job, data)


def test_a_transition_from_a_status_the_job_is_not_in_is_refused() -> None:
    with pytest.raises(InvariantError, match="running -> succeeded"):
        _move(created(), {"from": "running", "to": "succeeded"})


def test_claims_number_queue_jobs_by_attempt_then_turn() -> None:
    job = running()
    assert (job.status, job.attempt, job.turn, job.queue_job_id) == (
        "running",
        1,
        1,
        "aj-1:attempt:1",
    )
    assert job.started_at == T0
    waiting = _move(
        job, decisions.decide_settlement(job, done_report("needs_input"), T0).transition
    )  # type: ignore[arg-type]
    assert waiting.latest_status()["errorCode"] == "request_user_input"
    assert not decisions.claimable(waiting, T0)
    answered = model.apply(
        waiting, _receipt(waiting.seq + 1, model.ANSWERED, {"toolCallId": "c", "answer": 42})
    )
    decision = decisions.claim(answered, T0)
    assert decision.continuation and decision.queue_job_id == "aj-1:attempt:1:turn:2"


def done_report(kind: str, **fields: Any) -> TurnReport:
    result = {"outcome": kind, **fields}
    if kind == "needs_input":
        result.update(question="which?", toolCallId="call-1")
    return TurnReport("completed", True, result, follow_ups=tuple(fields.get("followUps", ())))


def test_needs_input_waits_with_the_pending_tool_call() -> None:
    job = running()
    settled = decisions.decide_settlement(job, done_report("needs_input"), T0)
    waiting = _move(job, settled.transition)  # type: ignore[arg-type]
    assert waiting.status == "waiting_on_user"
    assert waiting.latest_status() == {
        "state": "interrupted",
        "errorCode": "request_user_input",
        "pendingToolCall": {"toolCallId": "call-1", "question": "which?"},
        "answered": False,
    }


def fail_until_decided(job: AgentJob, report: TurnReport) -> tuple[AgentJob, list[int]]:
    """Run failed turns until the job is terminal; return it and the retry delays."""
    delays: list[int] = []
    now = T0
    for _ in range(20):
        job = running(job, now) if job.status == "queued" else job
        decision = decisions.decide_settlement(job, report, now)
        assert decision.transition is not None
        job = _move(job, decision.transition, now)
        if job.status != "queued":
            return job, delays
        delays.append(decision.transition["retryDelayMs"])
        now = job.available_at or now
    raise AssertionError("never decided")


def test_no_sixth_attempt_and_delays_never_exceed_30_s() -> None:
    job, delays = fail_until_decided(
        created(), done_report("failed", error="boom", retryDelayMs=10**9)
    )
    assert job.status == "failed" and job.attempt == 5
    assert delays == [30_000] * 4
    with pytest.raises(InvariantError, match="5 attempts"):
        decisions.claim(job.model_copy(update={"status": "queued"}), T0)


def test_the_attempt_budget_alone_fails_the_fifth_attempt() -> None:
    """A needs_input between failures resets the consecutive count, so the fifth attempt's
    failure is the fourth consecutive one: the attempt budget, not the failure budget, ends
    the job (B10)."""
    failure = done_report("failed", error="boom")
    job = running()  # attempt 1
    job = _move(job, decisions.decide_settlement(job, failure, T0).transition)  # type: ignore[arg-type]
    job = running(job.model_copy(update={"available_at": None}))  # attempt 2
    asked = decisions.decide_settlement(job, done_report("needs_input"), T0)
    job = _move(job, asked.transition)  # type: ignore[arg-type]
    assert (job.status, job.consecutive_failures) == ("waiting_on_user", 0)
    job = job.model_copy(update={"answer": {"toolCallId": "call-1", "answer": "go"}})
    job = running(job)  # the continuation of attempt 2
    reasons = []
    while True:
        decided = decisions.decide_settlement(job, failure, T0)
        assert decided.transition is not None
        job = _move(job, decided.transition)
        reasons.append(decided.transition["reason"])
        if job.terminal:
            break
        job = running(job.model_copy(update={"available_at": None}))
    assert (job.status, job.attempt, job.consecutive_failures) == ("failed", 5, 4)
    assert reasons == ["retry", "retry", "retry", "5 attempts used"]


def test_default_backoff_doubles_and_is_capped() -> None:
    assert [decisions.retry_delay_ms(n) for n in (1, 2, 3, 5, 6, 9)] == [
        1000,
        2000,
        4000,
        16000,
        30000,
        30000,
    ]
    assert decisions.retry_delay_ms(1, -5) == 0


def test_five_consecutive_turn_failures_fail_the_job() -> None:
    # Continuation turns fail inside one attempt: the attempt budget is not what stops them.
    job = running().model_copy(update={"consecutive_failures": 4})
    decision = decisions.decide_settlement(
        job, TurnReport("failed", True, None, "lease expired"), T0
    )
    assert decision.transition is not None
    assert decision.transition["to"] == "failed"
    assert decision.transition["reason"] == "5 consecutive turn failures"


def test_a_successful_turn_resets_consecutive_failures() -> None:
    job = running().model_copy(update={"consecutive_failures": 3})
    decision = decisions.decide_settlement(job, done_report("needs_input"), T0)
    assert decision.transition is not None and decision.transition["consecutiveFailures"] == 0


def test_non_retryable_failure_fails_at_once() -> None:
    job = running()
    decision = decisions.decide_settlement(
        job, done_report("failed", error="x", retryable=False), T0
    )
    assert decision.transition is not None and decision.transition["to"] == "failed"


def test_quota_with_retry_at_refunds_and_waits_without_counting() -> None:
    job = running().model_copy(update={"consecutive_failures": 2})
    retry_at = T0 + timedelta(minutes=3)
    decision = decisions.decide_settlement(
        job, done_report("quota_exhausted", retryAt=retry_at.isoformat()), T0
    )
    queued = _move(job, decision.transition)  # type: ignore[arg-type]
    assert (queued.status, queued.attempt, queued.consecutive_failures) == ("queued", 0, 2)
    assert queued.available_at == retry_at
    assert not decisions.claimable(queued, T0) and decisions.claimable(queued, retry_at)
    again = decisions.claim(queued, retry_at)
    assert again.data["attempt"] == 1 and again.queue_job_id == "aj-1:attempt:1:turn:2"


def test_quota_without_retry_at_is_an_ordinary_failure() -> None:
    decision = decisions.decide_settlement(running(), done_report("quota_exhausted"), T0)
    assert decision.transition is not None
    assert (
        decision.transition["reason"] == "retry" and decision.transition["consecutiveFailures"] == 1
    )


def test_an_unstarted_attempt_is_refunded_and_started_at_cleared_on_the_first() -> None:
    job = running()
    decision = decisions.decide_settlement(job, TurnReport("canceled", False, None), T0)
    queued = _move(job, decision.transition)  # type: ignore[arg-type]
    assert (queued.status, queued.attempt, queued.started_at) == ("queued", 0, None)
    second = running(_move(running(queued), {"from": "running", "to": "queued", "attempt": 1}))
    decision = decisions.decide_settlement(second, TurnReport("canceled", False, None), T0)
    assert decision.transition is not None and decision.transition["attempt"] == 1
    assert not decision.transition["clearStartedAt"]


def test_cancel_requested_stops_whatever_the_turn_said() -> None:
    job = running()
    job = model.apply(job, _receipt(job.seq + 1, model.CANCEL_REQUESTED, {"reason": "op"}))
    decision = decisions.decide_settlement(job, done_report("done", result=1), T0)
    assert decision.transition is not None and decision.transition["to"] == "stopped"


def test_done_with_follow_ups_runs_the_next_turn() -> None:
    decision = decisions.decide_settlement(running(), done_report("done", followUps=["more"]), T0)
    assert (
        decision.transition is None and decision.next_turn == 2 and decision.next_prompt == ["more"]
    )


@pytest.mark.parametrize(
    ("kind", "fields", "to"),
    [
        ("needs_input", {}, "waiting_on_user"),
        ("failed", {"error": "flaky"}, "queued"),
        ("quota_exhausted", {"retryAt": "2026-01-01T00:05:00+00:00"}, "queued"),
        ("failed", {"error": "fatal", "retryable": False}, "failed"),
    ],
)
def test_follow_ups_reach_the_next_turn_whatever_the_outcome(
    kind: str, fields: dict[str, Any], to: str
) -> None:
    job = running()
    report = done_report(kind, followUps=["also this"], **fields)
    settled = decisions.decide_settlement(job, report, T0)
    assert settled.transition is not None and settled.transition["to"] == to
    after = _move(job, settled.transition)
    assert after.follow_up == ["also this"]
    if not after.terminal:
        agent = AgentDefinition(id=job.agent_id, command=["true"])
        request = protocol.turn_request(
            after, agent, attempt=1, turn=after.turn + 1, workspace="/w"
        )
        assert request["followUps"] == ["also this"]


def test_a_turn_that_ran_took_its_follow_ups_and_one_that_never_started_hands_them_on() -> None:
    job = running().model_copy(update={"follow_up": ["earlier"]})
    ran = decisions.decide_settlement(job, done_report("needs_input"), T0)
    assert ran.transition is not None and ran.transition["followUps"] == []
    assert _move(job, ran.transition).follow_up is None
    unstarted = TurnReport("canceled", False, None, follow_ups=("late",))
    refunded = decisions.decide_settlement(job, unstarted, T0)
    assert refunded.transition is not None
    assert _move(job, refunded.transition).follow_up == ["earlier", "late"]


@pytest.mark.parametrize(
    "report",
    [
        done_report("failed", error="flaky"),
        done_report("quota_exhausted", retryAt="2026-01-01T00:05:00+00:00"),
        TurnReport("failed", True, None, error="worker lost"),  # its worker died: no outcome
    ],
    ids=["failed", "quota", "died"],
)
def test_a_turn_that_did_not_end_its_work_hands_on_the_follow_ups_it_was_given(
    report: TurnReport,
) -> None:
    """The follow-ups a turn was given at its start (carried from a retry, a quota delay, an
    answer) were lost when that turn failed, met a quota or died: the next one never saw them."""
    job = running().model_copy(update={"follow_up": ["earlier"]})
    settled = decisions.decide_settlement(job, report, T0)
    assert settled.transition is not None and settled.transition["to"] == "queued"
    assert _move(job, settled.transition).follow_up == ["earlier"]


def test_a_refunded_turn_after_one_that_ran_keeps_the_jobs_start() -> None:
    """Turn 1 asked a question; the answer's turn met a quota delay: the attempt is refunded
    (a placement delay), but the job did start: startedAt stays (the spec clears it so that
    an attempt that never started looks fresh, which this job is not)."""
    job = running()
    quota = TurnReport(
        "completed",
        True,
        {"outcome": "quota_exhausted", "retryAt": "2026-01-01T00:05:00+00:00"},
        earlier_turn_ran=True,
    )
    settled = decisions.decide_settlement(job, quota, T0)
    assert settled.transition is not None and settled.transition["attempt"] == 0
    assert not settled.transition["clearStartedAt"]
    assert _move(job, settled.transition).started_at is not None
    unstarted = TurnReport("canceled", False, None, earlier_turn_ran=True)
    assert not decisions.decide_settlement(job, unstarted, T0).transition["clearStartedAt"]  # type: ignore[index]


def test_wakeup_source_ids_differ_per_status_attempt_and_turn() -> None:
    assert model.wakeup_source_id("a", "waiting_on_user", 1, 2) == "a:waiting_on_user:1:2"
    job = running()
    waiting = _move(
        job, decisions.decide_settlement(job, done_report("needs_input"), T0).transition
    )  # type: ignore[arg-type]
    data = model.wakeup_data(waiting)
    assert data["sourceId"] == "aj-1:waiting_on_user:1:1"
    assert data["replyRoute"] == {"binding": "slack", "channel": "c-1", "thread": "t-1"}


def test_queue_job_ids_map_back_to_their_agent_job() -> None:
    assert model.agent_job_id_of_queue_job("aj-1:attempt:2:turn:4") == "aj-1"
    assert model.agent_job_id_of_queue_job("plain-job") is None


# --- the turn protocol ------------------------------------------------------------------------


def test_the_last_outcome_line_wins() -> None:
    lines = ['{"outcome": "failed"}', "noise", '{"outcome": "done", "result": 7}', "trailing"]
    assert protocol.parse_outcome(lines, 0) == {"outcome": "done", "result": 7}


def test_no_outcome_line_is_a_retryable_failure() -> None:
    out = protocol.parse_outcome(["not json", "{broken"], 3)
    assert out["outcome"] == "failed" and out["retryable"] is True and "status 3" in out["error"]


def test_needs_input_without_a_tool_call_id_is_a_failure() -> None:
    assert (
        protocol.parse_outcome(['{"outcome": "needs_input", "question": "?"}'], 0)["outcome"]
        == "failed"
    )


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ({"outcome": "done", "result": {"text": "é" * 600_000}}, "result"),
        ({"outcome": "needs_input", "question": "é" * 600_000, "toolCallId": "c1"}, "question"),
    ],
)
def test_an_outcome_past_its_bytes_is_a_failure_not_retried(
    line: dict[str, Any], field: str
) -> None:
    """600 000 two-byte characters are under the line's 1 Mi characters but 1.2 MB of JSON: as a
    plug-in handler's result over 1 MiB, the turn fails, not retried (it would say it again);
    at the bound it stands."""
    out = protocol.parse_outcome([json.dumps(line, ensure_ascii=False)], 0)
    assert out["outcome"] == "failed" and out["retryable"] is False
    assert (
        f"turn's {field} is 1200" in out["error"]
        and str(protocol.MAX_OUTCOME_BYTES) in out["error"]
    )
    at_bound = {**line, field: {"text": "x" * (protocol.MAX_OUTCOME_BYTES - 12)}}
    if field == "question":
        at_bound[field] = "x" * (protocol.MAX_OUTCOME_BYTES - 2)
    assert protocol.parse_outcome([json.dumps(at_bound)], 0)["outcome"] == line["outcome"]


def test_quota_retry_at_must_be_an_aware_time() -> None:
    assert protocol.parse_outcome(['{"outcome": "quota_exhausted", "retryAt": "soon"}'], 0) == {
        "outcome": "quota_exhausted"
    }


def test_agents_md_is_template_then_context_then_job_guidance() -> None:
    job = created().model_copy(update={"workspace_template": "# Template\nproject rules"})
    agent = AgentDefinition(
        id="writer", command=["x"], soul="calm", mission="write docs", skills=["s1"]
    )
    text = protocol.compose_agents_md(job, agent, "/w/aj-1")
    template, soul, mission, facts, guidance = (
        text.index("# Template"),
        text.index("## Soul\n\ncalm"),
        text.index("## Mission\n\nwrite docs"),
        text.index("## Execution facts"),
        text.index("## Job Guidance"),
    )
    assert template < soul < mission < facts < guidance
    assert protocol.job_guidance().strip() in text
    assert "- Agent job: aj-1" in text


def test_a_job_has_no_account_field_nor_account_slot() -> None:
    """The spec: the AI gateway owns credential selection; the Job has no account field or
    account concurrency slot (its only slots are its agent's three)."""
    assert not [name for name in AgentJob.model_fields if "account" in name.lower()]


def test_job_guidance_teaches_the_turn_cost_model_and_the_wait_contract() -> None:
    """The spec: the Job Guidance template teaches the turn-cost model and the long-blocking-wait
    contract for subagent coordination."""
    guidance = protocol.job_guidance()
    assert "Each turn costs a worker slot (three per agent)" in guidance  # the turn-cost model
    assert "Do not block waiting on subagents or long external work" in guidance  # the contract
    assert "let the next turn pick it up" in guidance


def test_registry_parses_and_names_the_bad_entry(tmp_path: Path) -> None:
    registry = parse_registry(
        "agents:\n  - id: writer\n    command: [python3, a.py]\n    providerBinding: p1\n",
        tmp_path / "agents.yaml",
    )
    agent = registry.get("writer")
    assert agent is not None and agent.provider_binding == "p1"
    with pytest.raises(RegistryError, match=r"agents\[0\]\.command"):
        parse_registry("agents:\n  - id: w\n", tmp_path / "agents.yaml")


def test_a_command_argument_starting_with_dot_slash_is_beside_the_registry(tmp_path: Path) -> None:
    registry = parse_registry(
        "agents:\n  - id: demo\n    command: [python3, ./agents/demo.py, ./x, .hidden, a/./b]\n",
        tmp_path / "agents.yaml",
    )
    agent = registry.get("demo")
    assert agent is not None
    assert agent.command == [
        "python3",
        str(tmp_path / "agents" / "demo.py"),
        str(tmp_path / "x"),
        ".hidden",
        "a/./b",
    ]


def test_the_example_registry_parses_and_its_demo_agent_is_beside_it() -> None:
    from roles.cli.up import EXAMPLES

    demo = parse_registry((EXAMPLES / "agents.yaml").read_text(), EXAMPLES / "agents.yaml").get(
        "demo"
    )
    assert demo is not None and Path(demo.command[1]).is_file()


def test_the_demo_agent_reads_every_steer_however_its_lines_arrive(tmp_path: Path) -> None:
    """Steers written with the request line (as the turn's feed writes pending ones), or two in
    one write, were left in Python's stdin buffer where `select` never saw them: lost, though
    the runtime had marked them consumed."""
    import json
    import subprocess
    import sys

    from roles.cli.up import EXAMPLES

    request = {"turn": 1, "attempt": 1, "prompt": "p"}
    lines = [request, {"payload": {"n": 1}}, {"payload": {"n": 2}}]
    ran = subprocess.run(
        [sys.executable, str(EXAMPLES / "agents" / "demo_agent.py")],
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=30,
        check=True,
    )
    steered = [line for line in ran.stdout.splitlines() if line.startswith("steered:")]
    assert steered == ['steered: {"n": 1}', 'steered: {"n": 2}'], ran.stdout
    assert json.loads(ran.stdout.splitlines()[-1])["outcome"] == "needs_input"


# --- the queue's retry delay ------------------------------------------------------------------


def test_a_retryable_queue_failure_with_retry_delay_requeues_with_available_at() -> None:
    from receipts import jobs as jobmodel

    stream = "jobs/j-1"
    receipts = [
        Receipt(
            stream, 1, "job.enqueued", {"jobId": "j-1", "agentId": "codex", "maxAttempts": 3}, T0
        ),
        Receipt(
            stream,
            2,
            "job.leased",
            {"workerId": "w", "expiresAt": (T0 + timedelta(minutes=5)).isoformat()},
            T0,
        ),
    ]
    job = jobmodel.fold(receipts)
    assert job is not None
    later = T0 + timedelta(seconds=1)
    for delay, expected in ((2_500, timedelta(milliseconds=2_500)), (10**7, timedelta(seconds=30))):
        failed = jobmodel.apply(
            job,
            Receipt(
                stream,
                3,
                "job.failed",
                {"workerId": "w", "attempt": 1, "retryable": True, "retryDelayMs": delay},
                later,
            ),
        )
        assert failed is not None and failed.status == "queued"
        assert failed.available_at == later + expected


def test_empty_settings_mean_their_defaults() -> None:
    from receipts.agent_jobs.registry import AgentJobSettings

    settings = AgentJobSettings.load(
        {"RECEIPT_AGENT_JOB_INPUT_TIMEOUT_MS": "", "RECEIPT_AGENT_JOB_RETRY_BASE_MS": "250"}
    )
    assert (settings.input_timeout_ms, settings.retry_base_ms) == (None, 250)
