"""Objectives, pure: graph validation, the reducer, the control plan and the watchdog reasons."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from receipts.errors import InvalidInput
from receipts.jobs import Job, Lease, Receipt
from receipts.objectives import audit, control
from receipts.objectives import watchdog as rules
from receipts.objectives.graph import GraphError, find_cycle, parse_objective, parse_tasks
from receipts.objectives.model import ObjectiveState, fold, step_job_id

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def cmd(task_id: str, *deps: str, **extra: Any) -> dict[str, Any]:
    return {"taskId": task_id, "dependsOn": list(deps), "input": {"command": ["true"]}, **extra}


def test_a_phase_holds_at_most_200_tasks_and_a_task_at_most_8_tries() -> None:
    """docs/factory.md: at most 200 tasks a phase (the 201st refused, not the 202nd); a task's
    `maxAttempts` is in 1..8, as a job's is."""
    assert len(parse_tasks([cmd(f"t{n}") for n in range(200)])) == 200
    with pytest.raises(InvalidInput, match="at most 200 tasks"):
        parse_tasks([cmd(f"t{n}") for n in range(201)])
    assert parse_tasks([cmd("a", maxAttempts=8)])[0].max_attempts == 8
    with pytest.raises(InvalidInput, match=r"maxAttempts must be an integer in 1\.\.8"):
        parse_tasks([cmd("a", maxAttempts=9)])


def test_a_cycle_is_refused_naming_its_task_ids() -> None:
    with pytest.raises(GraphError, match=r"dependency cycle: a -> c -> b -> a"):
        parse_tasks([cmd("a", "c"), cmd("b", "a"), cmd("c", "b"), cmd("d")])


def test_an_unknown_dependency_and_a_duplicate_id_are_named() -> None:
    with pytest.raises(GraphError, match="task 'a' depends on unknown task 'zz'"):
        parse_tasks([cmd("a", "zz")])
    with pytest.raises(GraphError, match="duplicate task id 'a'") as caught:
        parse_tasks([cmd("a"), cmd("a")])
    assert caught.value.field == "tasks[1].taskId"


def test_a_task_id_of_an_earlier_phase_is_refused() -> None:
    with pytest.raises(GraphError, match="already used by phase 1"):
        parse_tasks([cmd("a")], taken={"a": 1})


def test_an_objective_holds_at_most_a_thousand_tasks_over_its_phases() -> None:
    """Each list is at most 200 tasks, but phases kept adding lists without a bound: 8 001
    tasks, a 34.5 MB state rewritten at every receipt."""
    earlier = {f"t{n}": 1 + n // 200 for n in range(900)}
    assert len(parse_tasks([cmd(f"u{n}") for n in range(100)], "payload.tasks", earlier)) == 100
    with pytest.raises(InvalidInput, match="at most 1000 tasks over all its phases") as caught:
        parse_tasks([cmd(f"u{n}") for n in range(101)], "payload.tasks", earlier)
    assert caught.value.field == "payload.tasks"


def test_find_cycle_finds_none_in_a_diamond() -> None:
    assert find_cycle({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}) is None
    assert find_cycle({"a": ["a"]}) == ["a", "a"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"title": "t", "goal": "g", "tasks": []}, "objective.tasks"),
        ({"goal": "g"}, "objective.title"),
        ({"title": "t", "goal": "g", "extra": 1}, "objective.extra"),
        ({"title": "t", "goal": "g", "objectiveId": "a/b"}, "objective.objectiveId"),
        (
            {"title": "t", "goal": "g", "tasks": [{"taskId": "a", "input": {}}]},
            "objective.tasks[0].input",
        ),
        (
            {"title": "t", "goal": "g", "tasks": [cmd("a", executionPath="moon")]},
            "objective.tasks[0].executionPath",
        ),
        # A falsy dependsOn that is no list (false, "", 0) was read as none: the task ran
        # beside the tasks it names, not after them.
        *(
            (
                {"title": "t", "goal": "g", "tasks": [cmd("a"), cmd("b", dependsOn=none)]},
                "objective.tasks[1].dependsOn",
            )
            for none in (False, "", 0, -0.0, {})
        ),
    ],
)
def test_bad_objectives_name_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_objective(raw)
    assert caught.value.field == field


def receipt(seq: int, type_: str, at: datetime = T0, **data: Any) -> Receipt:
    return Receipt("objectives/o", seq, type_, data, at)


def created(tasks: list[dict[str, Any]], **extra: Any) -> Receipt:
    return receipt(
        1,
        "objective.created",
        objectiveId="o",
        organizationId="org",
        authContext={},
        title="t",
        goal="g",
        tasks=parse_json(tasks),
        **extra,
    )


def parse_json(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t.to_json() for t in parse_tasks(tasks)]


def job(job_id: str, status: str, at: datetime = T0, **extra: Any) -> Job:
    data: dict[str, Any] = {
        "jobId": job_id,
        "agentId": "codex",
        "lane": "collect",
        "kind": "factory.task.run",
        "payload": {},
        "status": status,
        "createdAt": at,
        "updatedAt": at,
    }
    data.update(extra)
    return Job.model_validate(data)


def test_the_plan_dispatches_ready_tasks_then_records_then_steps_then_settles() -> None:
    state = fold([created([cmd("a"), cmd("b", "a")], validate={"command": ["true"]})])
    assert state is not None
    first = control.plan(state, {})
    assert [t.task_id for t in first.dispatch] == ["a"]
    state = fold(
        [receipt(3, "objective.task.dispatched", taskId="a", jobId="ja", **{"try": 1})], state
    )
    assert state is not None and control.plan(state, {"ja": job("ja", "running")}).empty
    recorded = control.plan(state, {"ja": job("ja", "completed")})
    assert [d.type for d in recorded.records] == ["objective.task.settled"]
    state = fold([receipt(4, recorded.records[0].type, **recorded.records[0].data)], state)
    assert state is not None
    assert [t.task_id for t in control.plan(state, {}).dispatch] == ["b"]
    state = fold(
        [
            receipt(5, "objective.task.dispatched", taskId="b", jobId="jb", **{"try": 1}),
            receipt(6, "objective.task.settled", taskId="b", jobId="jb", status="completed",
                    **{"try": 1}),
        ],
        state,
    )  # fmt: skip
    assert state is not None and control.plan(state, {}).step == "validate"
    state = fold(
        [
            receipt(7, "objective.step.dispatched", step="validate", jobId="jv"),
            receipt(8, "objective.step.settled", step="validate", jobId="jv", status="completed"),
        ],
        state,
    )
    assert state is not None and control.plan(state, {}).settle == {"status": "completed"}


def _validated_then(*later: Receipt) -> ObjectiveState:
    """Task `a` completed, validate dispatched for phase 1, then `later`."""
    state = fold(
        [
            created([cmd("a")], validate={"command": ["v"]}, publish={"command": ["p"]}),
            receipt(2, "objective.task.dispatched", taskId="a", jobId="ja", **{"try": 1}),
            receipt(3, "objective.task.settled", taskId="a", jobId="ja", status="completed",
                    **{"try": 1}),
            receipt(4, "objective.step.dispatched", step="validate", jobId="jv", phase=1),
            *later,
        ]
    )  # fmt: skip
    assert state is not None
    return state


PHASE_2 = {"phase": 2, "tasks": parse_json([cmd("b")])}


def test_validate_and_publish_run_again_after_a_phase_added_once_they_ran() -> None:
    """Validate and publish are last: after a phase is added, one that completed covered the
    earlier tasks only (validate completed, then phase 2: only publish ran, validate never
    covered task b; publish completed, then phase 3: settled with nothing checked after it)."""
    done = receipt(5, "objective.step.settled", step="validate", jobId="jv", status="completed")
    state = _validated_then(done, receipt(6, "objective.phase_added", **PHASE_2))
    validate = state.step("validate")
    assert validate is not None and (validate.status, validate.job_id) == ("pending", None)
    assert [t.task_id for t in control.plan(state, {}).dispatch] == ["b"]
    state = fold(
        [
            receipt(7, "objective.task.dispatched", taskId="b", jobId="jb", **{"try": 1}),
            receipt(8, "objective.task.settled", taskId="b", jobId="jb", status="completed",
                    **{"try": 1}),
        ],
        state,
    )  # fmt: skip
    assert state is not None and control.plan(state, {}).step == "validate"
    assert step_job_id("o", "validate", state.phase) == "objective:o:validate:phase:2"
    assert step_job_id("o", "validate") == "objective:o:validate"  # phase 1: as it always was


def test_a_phase_added_while_validate_runs_waits_for_it_then_validates_again() -> None:
    """A new phase's tasks ran in the workspace while validate ran there; now they wait for it,
    and validate, which covered the earlier phase only, is due again after them."""
    state = _validated_then(receipt(5, "objective.phase_added", **PHASE_2))
    assert control.plan(state, {}).empty  # validate still runs: nothing dispatched beside it
    done = receipt(6, "objective.step.settled", step="validate", jobId="jv", status="completed")
    state = fold([done], state)  # type: ignore[assignment]
    validate = state.step("validate")
    assert validate is not None and validate.status == "pending"
    assert [t.task_id for t in control.plan(state, {}).dispatch] == ["b"]


def test_a_validate_that_fails_after_a_phase_was_added_runs_again_after_it() -> None:
    """The usual fix phase: validate failed on phase 1's code while `factory.dispatch` added a
    phase to fix it. Its failure covered phase 1 only: the objective does not fail; the new
    phase runs, then validate again. Control's record says so (`again`); a chain recorded
    before that folds as it did."""
    state = _validated_then(receipt(5, "objective.phase_added", **PHASE_2))
    drafts = control.plan(state, {"jv": job("jv", "failed", error="tests failed")}).records
    assert [(d.type, d.data.get("again")) for d in drafts] == [("objective.step.settled", True)]
    failed = receipt(6, "objective.step.settled", **drafts[0].data)
    state = fold([failed], state)  # type: ignore[assignment]
    validate = state.step("validate")
    assert validate is not None and validate.status == "pending"
    decided = control.plan(state, {})
    assert decided.settle is None and [t.task_id for t in decided.dispatch] == ["b"]
    # Recorded before 2026-12-06 (no `again`): it failed the objective then, and still folds so.
    old = receipt(6, "objective.step.settled", step="validate", jobId="jv", status="failed")
    older = fold([old], _validated_then(receipt(5, "objective.phase_added", **PHASE_2)))
    assert older is not None and older.step("validate").status == "failed"  # type: ignore[union-attr]
    # In the phase it ran for, a failed validate fails the objective, as it always did.
    same_phase = control.plan(_validated_then(), {"jv": job("jv", "failed", error="x")})
    assert "again" not in same_phase.records[0].data


def test_a_validate_whose_failure_was_recorded_before_a_fix_phase_runs_again_after_it() -> None:
    """The same fix phase, its receipt landing just after validate's failure was recorded (the
    objective not yet settled): the outcome is the one of the other order, not a failed
    objective with the fix never run. A phase recorded before `failedStepsAgain` folds as it
    did."""
    failed = receipt(5, "objective.step.settled", step="validate", jobId="jv", status="failed")
    state = _validated_then(failed, receipt(6, "objective.phase_added", **PHASE_2,
                                            failedStepsAgain=True))  # fmt: skip
    validate = state.step("validate")
    assert validate is not None and (validate.status, validate.job_id) == ("pending", None)
    decided = control.plan(state, {})
    assert decided.settle is None and [t.task_id for t in decided.dispatch] == ["b"]
    older = _validated_then(failed, receipt(6, "objective.phase_added", **PHASE_2))
    assert older.step("validate").status == "failed"  # type: ignore[union-attr]
    assert control.plan(older, {}).settle is not None


def test_the_audit_lists_every_run_of_a_step_one_per_phase() -> None:
    """Validate completed for phase 1, then a phase was added: the fold keeps the step's next
    run only, and the audit left the first out (a publish of phase 1 did its work all the
    same). Each run's job id names its phase: the audit reads them all."""
    done = receipt(5, "objective.step.settled", step="validate", jobId="jv", status="completed")
    state = _validated_then(done, receipt(6, "objective.phase_added", **PHASE_2))
    first, second = step_job_id("o", "validate", 1), step_job_id("o", "validate", 2)
    assert first in audit.jobs_to_read(state) and second in audit.jobs_to_read(state)
    assert audit.job_ids(state) == ["ja"]  # what the objective dispatched, as its fold names it
    jobs = {first: job(first, "completed"), "ja": job("ja", "completed")}
    (validate, _) = audit.summary(state, jobs)["steps"]
    assert validate["status"] == "pending"
    assert [(r["phase"], r["jobId"], r["jobStatus"]) for r in validate["runs"]] == [
        (1, first, "completed")
    ]


def test_a_failed_try_within_budget_goes_back_to_pending() -> None:
    state = fold(
        [
            created([cmd("a", maxAttempts=2)]),
            receipt(2, "objective.task.dispatched", taskId="a", jobId="j1", **{"try": 1}),
            receipt(
                3, "objective.task.settled", taskId="a", jobId="j1", status="failed", **{"try": 1}
            ),
        ]
    )
    assert state is not None and state.task("a").status == "pending"  # type: ignore[union-attr]
    state = fold(
        [
            receipt(4, "objective.task.dispatched", taskId="a", jobId="j2", **{"try": 2}),
            receipt(
                5, "objective.task.settled", taskId="a", jobId="j2", status="failed", **{"try": 2}
            ),
        ],
        state,
    )
    assert state is not None and state.task("a").status == "failed"  # type: ignore[union-attr]
    settle = control.plan(state, {}).settle
    assert settle is not None and settle["failedTask"] == "a"


def test_a_failed_task_aborts_its_siblings_and_settles_once_none_runs() -> None:
    """The objective settles when all its tasks are terminal: a task out of budget aborts the
    running ones and the objective settles `failed` once they have ended (and been recorded)."""
    state = fold(
        [
            created([cmd("a"), cmd("b")]),
            receipt(2, "objective.task.dispatched", taskId="a", jobId="ja", **{"try": 1}),
            receipt(3, "objective.task.dispatched", taskId="b", jobId="jb", **{"try": 1}),
            receipt(4, "objective.task.settled", taskId="a", jobId="ja", status="failed",
                    error="exit 4", **{"try": 1}),
        ]
    )  # fmt: skip
    assert state is not None
    waiting = control.plan(state, {"jb": job("jb", "running")})
    assert waiting.aborts == (("jb", "task a failed"),) and waiting.settle is None
    asked = job("jb", "running", abortRequested=True)
    assert control.plan(state, {"jb": asked}).empty  # the abort is out: wait for the job
    ended = control.plan(state, {"jb": job("jb", "canceled")})
    assert [d.type for d in ended.records] == ["objective.task.settled"]
    state = fold([receipt(5, ended.records[0].type, **ended.records[0].data)], state)
    assert state is not None
    settle = control.plan(state, {}).settle
    assert settle is not None and settle["failedTask"] == "a"
    assert settle["error"] == "task 'a' failed after 1 try: exit 4"


def test_the_task_that_failed_is_named_not_a_sibling_its_failure_aborted() -> None:
    state = fold(
        [
            created([cmd("a"), cmd("b")]),
            receipt(2, "objective.task.dispatched", taskId="a", jobId="ja", **{"try": 1}),
            receipt(3, "objective.task.dispatched", taskId="b", jobId="jb", **{"try": 1}),
            receipt(4, "objective.task.settled", taskId="b", jobId="jb", status="failed",
                    error="exit 4", **{"try": 1}),
            receipt(5, "objective.task.settled", taskId="a", jobId="ja", status="canceled",
                    error="task b failed", **{"try": 1}),
        ]
    )  # fmt: skip
    assert state is not None
    settle = control.plan(state, {}).settle
    assert settle is not None and settle["failedTask"] == "b"


def test_a_try_whose_job_was_canceled_records_the_cancel_reason_as_its_error() -> None:
    """A canceled job carries no `error`, only its cancel's reason: the settlement control
    records takes it, so the objective's error names the cancel ("was canceled: stop it")."""
    state = dispatched([cmd("a")])
    canceled = job("ja", "canceled").model_copy(update={"canceled_reason": "stop it"})
    records = control.plan(state, {"ja": canceled}).records
    assert [(d.type, d.data["status"], d.data["error"]) for d in records] == [
        ("objective.task.settled", "canceled", "stop it")
    ]


def test_a_task_whose_job_was_canceled_from_outside_fails_the_objective() -> None:
    """An abort posted to a task's job cancels it: the objective cannot complete, and settles
    `failed` naming the task instead of waiting for ever (the watchdog asking again each minute)."""
    state = fold(
        [
            created([cmd("a"), cmd("b", "a")]),
            receipt(2, "objective.task.dispatched", taskId="a", jobId="ja", **{"try": 1}),
            receipt(3, "objective.task.settled", taskId="a", jobId="ja", status="canceled",
                    error="stop it", **{"try": 1}),
        ]
    )  # fmt: skip
    assert state is not None and state.task("a").status == "canceled"  # type: ignore[union-attr]
    settle = control.plan(state, {}).settle
    assert settle == {
        "status": "failed",
        "error": "task 'a' was canceled: stop it",
        "failedTask": "a",
    }


def test_a_superseded_task_that_fails_within_its_budget_is_not_retried() -> None:
    state = fold(
        [
            created([cmd("x", maxAttempts=2)]),
            receipt(2, "objective.task.dispatched", taskId="x", jobId="jx", **{"try": 1}),
            receipt(3, "objective.phase_added", phase=2, tasks=parse_json([cmd("z")])),
            receipt(4, "objective.task.settled", taskId="x", jobId="jx", status="failed",
                    **{"try": 1}),
        ]
    )  # fmt: skip
    assert state is not None and state.task("x").status == "failed"  # type: ignore[union-attr]
    assert [t.task_id for t in control.plan(state, {}).dispatch] == ["z"]


def test_receipts_of_an_earlier_try_change_nothing_of_the_current_one() -> None:
    """A task retried within its budget is on try 2: a late (or repeated) dispatch, start or
    progress of try 1 folds to nothing, so no try is dispatched twice and the current one shows
    its own state and output; a late `reconciled` never lowers what was covered."""
    state = fold(
        [
            created([cmd("x", maxAttempts=2)]),
            receipt(2, "objective.task.dispatched", taskId="x", jobId="jx1", **{"try": 1}),
            receipt(3, "objective.task.settled", taskId="x", jobId="jx1", status="failed",
                    **{"try": 1}),
            receipt(4, "objective.task.dispatched", taskId="x", jobId="jx2", **{"try": 2}),
            receipt(5, "objective.reconciled", throughSeq=4),
        ]
    )  # fmt: skip
    assert state is not None
    late = fold(
        [
            receipt(6, "objective.task.started", taskId="x", jobId="jx1", **{"try": 1}),
            receipt(7, "objective.task.progress", taskId="x", **{"try": 1}, lastLine="old"),
            receipt(8, "objective.reconciled", throughSeq=2),
        ],
        state,
    )
    assert late is not None
    task = late.task("x")
    assert task is not None and task.status == "dispatched" and task.last_output is None
    assert [t.job_id for t in task.tries] == ["jx1", "jx2"]
    assert late.reconciled_seq == 4
    retried = fold(
        [
            created([cmd("x", maxAttempts=2)]),
            receipt(2, "objective.task.dispatched", taskId="x", jobId="jx1", **{"try": 1}),
            receipt(3, "objective.task.settled", taskId="x", jobId="jx1", status="failed",
                    **{"try": 1}),
            receipt(4, "objective.task.dispatched", taskId="x", jobId="jx1", **{"try": 1}),
        ]
    )  # fmt: skip
    assert retried is not None
    task = retried.task("x")
    assert task is not None and task.status == "pending" and len(task.tries) == 1


def test_the_audit_totals_count_every_try_and_each_status() -> None:
    """The audit's totals: tries over all tasks (a retried task's two count two), and the
    completed, failed and canceled tasks (a pending task a new phase superseded is canceled)."""
    state = fold(
        [
            created([cmd("x", maxAttempts=2), cmd("y", "x")]),
            receipt(2, "objective.task.dispatched", taskId="x", jobId="jx1", **{"try": 1}),
            receipt(3, "objective.task.settled", taskId="x", jobId="jx1", status="failed",
                    **{"try": 1}),
            receipt(4, "objective.task.dispatched", taskId="x", jobId="jx2", **{"try": 2}),
            receipt(5, "objective.task.settled", taskId="x", jobId="jx2", status="completed",
                    **{"try": 2}),
            receipt(6, "objective.phase_added", phase=2, tasks=parse_json([cmd("z")])),
        ]
    )  # fmt: skip
    assert state is not None
    totals = audit.summary(state, {})["totals"]
    assert totals["tasks"] == 3 and totals["tries"] == 2
    assert (totals["completed"], totals["failed"], totals["canceled"]) == (1, 0, 1)


def running(job_id: str, at: datetime, status: str = "running") -> Job:
    lease = Lease(worker_id="w", attempt=1, expires_at=at + timedelta(hours=1), leased_at=at)
    return job(
        job_id, status, at, lease=lease.model_dump(by_alias=True), attempt=1, lastHeartbeatAt=at
    )


def dispatched(tasks: list[dict[str, Any]], at: datetime = T0) -> ObjectiveState:
    state = fold(
        [
            created(tasks),
            receipt(2, "objective.task.dispatched", at, taskId="a", jobId="ja", **{"try": 1}),
        ]
    )
    assert state is not None
    return state


NOW = T0 + timedelta(hours=2)
LIMITS = rules.Thresholds(active_stale_ms=600_000)


def test_no_active_work_fires_only_past_the_grace_with_no_job_and_no_control() -> None:
    state = dispatched([cmd("a")])
    done = {"ja": job("ja", "completed")}
    assert rules.reason(state, done, False, NOW, LIMITS) == rules.NO_ACTIVE_WORK
    assert rules.reason(state, done, True, NOW, LIMITS) is None  # a control job is on it
    assert rules.reason(state, done, False, T0 + timedelta(seconds=5), LIMITS) is None


def test_stalled_fires_after_the_stale_threshold_and_after_15_minutes_on_computer() -> None:
    local = dispatched([cmd("a")])
    quiet_since = NOW - timedelta(minutes=11)
    jobs = {"ja": running("ja", quiet_since)}
    local = local.model_copy(update={"updated_at": quiet_since})
    assert rules.reason(local, jobs, False, NOW, LIMITS) == rules.STALLED
    fresh = {"ja": running("ja", NOW - timedelta(minutes=1))}
    assert rules.reason(local, fresh, False, NOW, LIMITS) is None
    computer = dispatched([cmd("a", executionPath="computer")]).model_copy(
        update={"updated_at": quiet_since}
    )
    assert rules.reason(computer, jobs, False, NOW, LIMITS) is None  # 11 < 15 minutes
    older = {"ja": running("ja", NOW - timedelta(minutes=16))}
    computer = computer.model_copy(update={"updated_at": NOW - timedelta(minutes=16)})
    assert rules.reason(computer, older, False, NOW, LIMITS) == rules.STALLED


def test_a_computer_task_that_ended_does_not_lend_its_15_minutes_to_a_local_one() -> None:
    """Only an *active* computer task stretches the stale threshold to 15 minutes: once it
    ended, a local task quiet for 11 minutes is stalled at the local threshold (10)."""
    quiet_since = NOW - timedelta(minutes=11)
    state = fold(
        [
            created([cmd("c", executionPath="computer"), cmd("a")]),
            receipt(2, "objective.task.dispatched", taskId="c", jobId="jc", **{"try": 1}),
            receipt(3, "objective.task.settled", taskId="c", jobId="jc", status="completed",
                    **{"try": 1}),
            receipt(4, "objective.task.dispatched", quiet_since, taskId="a", jobId="ja",
                    **{"try": 1}),
        ]
    )  # fmt: skip
    assert state is not None and state.task("c").status == "completed"  # type: ignore[union-attr]
    state = state.model_copy(update={"updated_at": quiet_since})
    jobs = {"jc": job("jc", "completed", T0), "ja": running("ja", quiet_since)}
    assert rules.reason(state, jobs, False, NOW, LIMITS) == rules.STALLED


def test_a_superseded_phase_with_an_unstarted_or_stale_job_fires() -> None:
    state = dispatched([cmd("a")])
    state = fold(
        [receipt(3, "objective.phase_added", NOW, phase=2, tasks=parse_json([cmd("n")]))], state
    )
    assert state is not None
    queued = {"ja": job("ja", "queued", NOW)}
    assert rules.reason(state, queued, True, NOW, LIMITS) == rules.SUPERSEDED_STALE
    healthy = {"ja": running("ja", NOW - timedelta(seconds=10))}
    assert rules.reason(state, healthy, True, NOW, LIMITS) is None
    stale = {"ja": running("ja", NOW - timedelta(minutes=20))}
    assert rules.reason(state, stale, True, NOW, LIMITS) == rules.SUPERSEDED_STALE


def test_a_superseded_queued_try_already_aborted_is_not_aborted_again() -> None:
    """A pass aborts a superseded try's queued job once: planned again while the abort is on
    its way, it has nothing left to do (were it to abort again, no pass would ever be the
    quiet one that ends the control job's passes)."""
    state = dispatched([cmd("a")])
    state = fold(
        [
            receipt(3, "objective.phase_added", NOW, phase=2, tasks=parse_json([cmd("n")])),
            receipt(4, "objective.task.dispatched", NOW, taskId="n", jobId="jn", **{"try": 1}),
        ],
        state,
    )
    assert state is not None
    jn = running("jn", NOW)
    queued = job("ja", "queued", NOW)
    assert control.plan(state, {"ja": queued, "jn": jn}).aborts == (
        ("ja", "superseded by a new phase"),
    )
    aborted = queued.model_copy(update={"abort_requested": True})
    assert control.plan(state, {"ja": aborted, "jn": jn}).empty


def test_a_superseded_computer_try_is_stale_only_after_15_minutes() -> None:
    """The spec: sandboxed execution is stale only after 15 minutes — a superseded try's too
    (it fired at the local threshold, 10 minutes)."""
    state = dispatched([cmd("a", executionPath="computer")])
    state = fold(
        [receipt(3, "objective.phase_added", NOW, phase=2, tasks=parse_json([cmd("n")]))], state
    )
    assert state is not None
    quiet = {"ja": running("ja", NOW - timedelta(minutes=11))}
    assert rules.reason(state, quiet, True, NOW, LIMITS) is None  # 11 < 15 minutes
    stale = {"ja": running("ja", NOW - timedelta(minutes=16))}
    assert rules.reason(state, stale, True, NOW, LIMITS) == rules.SUPERSEDED_STALE


def test_the_audit_requested_in_the_settling_transaction_is_kept_on_the_settled_objective() -> None:
    """`_settle` appends `objective.settled`, then `objective.audit_requested`: the request
    must fold onto the settled state, or readers (the CLI's --wait, the event stream's end)
    take "no audit requested" for "nothing to wait for" and stop before the audit lands."""
    tasks = [{"taskId": "a", "input": {"command": ["true"]}}]
    settled = fold(
        [
            created(tasks),
            receipt(2, "objective.settled", status="completed"),
            receipt(3, "objective.audit_requested", auditJobId="objective:o:audit"),
        ],
        None,
    )
    assert settled is not None and settled.terminal
    assert settled.audit_job_id == "objective:o:audit"
    assert settled.audit is None  # requested, not yet done: a reader keeps waiting
    audited = fold([receipt(4, "objective.audited", summary={"totals": {"tasks": 1}})], settled)
    assert audited is not None and audited.audit == {"totals": {"tasks": 1}}


def test_a_step_s_output_mirrored_after_it_and_the_objective_settled_is_kept() -> None:
    # A loaded worker's step monitor may mirror the publish step's last line after control
    # recorded the step's and the objective's settlement (seen in a CI run): kept, as a task's.
    state = fold(
        [
            created([cmd("t")], publish={"command": ["sh", "-c", "echo out"]}),
            receipt(2, "objective.step.dispatched", step="publish", jobId="pub-1"),
            receipt(3, "objective.step.settled", step="publish", jobId="pub-1", status="completed"),
            receipt(4, "objective.settled", status="completed"),
            receipt(5, "objective.step.progress", step="publish", jobId="pub-1", lastLine="out"),
            receipt(6, "objective.step.progress", step="publish", jobId="other", lastLine="no"),
        ]
    )
    assert state is not None and state.status == "completed"
    assert state.publish_step is not None
    assert state.publish_step.status == "completed"
    assert state.publish_step.last_output == "out"
