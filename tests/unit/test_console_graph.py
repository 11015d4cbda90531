"""The console's objective graph layout (pure): columns follow dependencies, steps come last."""

from __future__ import annotations

from datetime import UTC, datetime

from receipts.objectives.model import ObjectiveState, StepState, TaskState
from roles.api.console.objective_pages import GAP_X, MARGIN, NODE_W, graph_state, layout

AT = datetime(2026, 1, 1, tzinfo=UTC)


def task(task_id: str, *deps: str, status: str = "pending") -> TaskState:
    return TaskState(
        task_id=task_id,
        title=task_id.upper(),
        agent_id="codex",
        input={"command": ["true"]},
        depends_on=deps,
        status=status,  # type: ignore[arg-type]
    )


def diamond() -> ObjectiveState:
    return ObjectiveState(
        objective_id="o1",
        organization_id="org-a",
        auth_context={},
        title="t",
        goal="g",
        tasks=(
            task("a", status="completed"),
            task("b", "a", status="running"),
            task("c", "a"),
            task("d", "b", "c"),
        ),
        validate_step=StepState(name="validate", command=("true",)),
        publish_step=StepState(name="publish", command=("true",)),
        created_at=AT,
        updated_at=AT,
    )


def column(x: int) -> int:
    return (x - MARGIN) // (NODE_W + GAP_X)


def test_a_diamond_is_drawn_in_dependency_columns_then_validate_and_publish() -> None:
    nodes, edges, width, height = layout(diamond())
    at = {n.key: column(n.x) for n in nodes}
    assert at == {"a": 0, "b": 1, "c": 1, "d": 2, "step:validate": 3, "step:publish": 4}
    pairs = {(src.key, dst.key) for src, dst in edges}
    assert pairs == {
        ("a", "b"),
        ("a", "c"),
        ("b", "d"),
        ("c", "d"),
        ("d", "step:validate"),
        ("step:validate", "step:publish"),
    }
    b, c = (next(n for n in nodes if n.key == k) for k in "bc")
    assert b.y != c.y  # siblings of one column do not overlap
    assert width >= 5 * NODE_W and height > 0


def test_the_live_state_carries_each_nodes_status() -> None:
    state = graph_state(diamond())
    assert state["status"] == "active" and state["audited"] is False
    assert state["nodes"]["a"]["status"] == "completed"
    assert state["nodes"]["b"]["status"] == "running"
    assert state["nodes"]["step:publish"]["status"] == "pending"
