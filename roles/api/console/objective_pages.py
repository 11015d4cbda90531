"""Console pages of Factory objectives: a list, and an objective drawn as its task graph (an SVG
node per task coloured by status, an edge per dependency, refreshed live), with each task's job,
the audit, and cancel."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from receipts import reads
from receipts.objectives import store as objectives
from receipts.objectives.model import STATUSES, ObjectiveState, objective_stream
from roles.api.auth import JOBS_WRITE
from roles.api.body import path_segment
from roles.api.console.pages import PAGE_SIZE, render, store_of
from roles.api.console.paging import older_query, page_start
from roles.api.console.receipt_rows import timeline
from roles.api.console.session import form_of, notice_of, notice_query, session_of, visible

log = logging.getLogger("roles.api.console")

router = APIRouter(prefix="/console/objectives", include_in_schema=False)

NODE_W, NODE_H, GAP_X, GAP_Y, MARGIN = 170, 54, 70, 26, 16


@dataclass(frozen=True, slots=True)
class Node:
    """One box of the graph: a task (or the validate / publish step) and where it is drawn."""

    key: str
    label: str
    status: str
    job_id: str | None
    x: int
    y: int


def layout(objective: ObjectiveState) -> tuple[list[Node], list[tuple[Node, Node]], int, int]:
    """Layered layout: a task's column is one past its deepest dependency; validate and publish
    follow the last column. Returns the nodes, the edges (dependency → task), width, height."""
    depth: dict[str, int] = {}
    by_id = {t.task_id: t for t in objective.tasks}

    def column(task_id: str, seen: frozenset[str] = frozenset()) -> int:
        if task_id not in depth:
            deps = [d for d in by_id[task_id].depends_on if d in by_id and d not in seen]
            depth[task_id] = 1 + max((column(d, seen | {task_id}) for d in deps), default=-1)
        return depth[task_id]

    columns: dict[int, list[str]] = {}
    for task in objective.tasks:
        columns.setdefault(column(task.task_id), []).append(task.task_id)
    nodes: dict[str, Node] = {}
    for col, ids in sorted(columns.items()):
        for row, task_id in enumerate(ids):
            task = by_id[task_id]
            job_id = task.tries[-1].job_id if task.tries else None
            nodes[task_id] = Node(
                task_id,
                task.title or task_id,
                task.status,
                job_id,
                MARGIN + col * (NODE_W + GAP_X),
                MARGIN + row * (NODE_H + GAP_Y),
            )
    edges = [
        (nodes[dep], nodes[task.task_id])
        for task in objective.tasks
        for dep in task.depends_on
        if dep in nodes
    ]
    last = max(columns, default=-1)
    sinks = [n for n in nodes.values() if not any(n.key in t.depends_on for t in objective.tasks)]
    previous = sinks
    for step in (objective.validate_step, objective.publish_step):
        if step is None:
            continue
        last += 1
        node = Node(
            f"step:{step.name}",
            step.name,
            step.status,
            step.job_id,
            MARGIN + last * (NODE_W + GAP_X),
            MARGIN,
        )
        nodes[node.key] = node
        edges.extend((p, node) for p in previous)
        previous = [node]
    rows = max((len(ids) for ids in columns.values()), default=1)
    width = MARGIN * 2 + (last + 1) * NODE_W + max(last, 0) * GAP_X
    height = MARGIN * 2 + rows * NODE_H + (rows - 1) * GAP_Y
    return list(nodes.values()), edges, max(width, NODE_W + 2 * MARGIN), height


def drawing(objective: ObjectiveState) -> dict[str, Any]:
    """What the page draws the graph from: the layout and the size of a node."""
    nodes, edges, width, height = layout(objective)
    return dict(nodes=nodes, edges=edges, width=width, height=height, node_w=NODE_W, node_h=NODE_H)


def graph_state(objective: ObjectiveState) -> dict[str, Any]:
    """What the page's script refreshes: the objective's status and each node's status."""
    nodes, _, _, _ = layout(objective)
    return {
        "status": objective.status,
        "nodes": {n.key: {"status": n.status, "jobId": n.job_id} for n in nodes},
        "audited": objective.audit is not None,
    }


@router.get("")
async def objectives_page(request: Request) -> HTMLResponse:
    session = await session_of(request)
    status = request.query_params.get("status") or None
    status = status if status in STATUSES else None
    page = await objectives.objectives_page(
        store_of(request),
        session.principal,
        status=status,
        after=page_start(request),
        limit=PAGE_SIZE,
    )
    found = page.items
    return render(
        "objectives.html",
        session=session,
        objectives=found,
        statuses=STATUSES,
        status_filter=status or "",
        next_query=older_query(
            {"status": status} if status else {}, page, lambda o: (o.created_at, o.objective_id)
        ),
    )


@router.get("/{objectiveId}/state")
async def objective_state(request: Request, objectiveId: str) -> Response:
    """The graph's live state, polled by the page (the console's session authenticates it; a
    poll restarts no idle clock: a tab left open on an objective still idles out)."""
    session = await session_of(request, touch=False)
    objective = session.sees(await objectives.get(store_of(request), objectiveId))
    if objective is None:
        return JSONResponse({"error": "not found"}, status_code=404)
    return JSONResponse(graph_state(objective), headers={"Cache-Control": "no-store"})


@router.get("/{objectiveId}")
async def objective_page(request: Request, objectiveId: str) -> HTMLResponse:
    session = await session_of(request)
    store = store_of(request)
    objective = visible(
        session, await objectives.get(store, objectiveId), f"objective {objectiveId}"
    )
    # The newest: a long-running task's mirrored progress would push its settlement, cancel
    # and audit past the oldest 2 000.
    receipts = await reads.stream_tail(store, objective_stream(objectiveId), 2_000)
    return render(
        "objective.html",
        session=session,
        objective=objective,
        **drawing(objective),
        audit=json.dumps(objective.audit, indent=2, ensure_ascii=False) if objective.audit else "",
        timeline=timeline(receipts, session.principal),
        notice=notice_of(request, session),
    )


@router.post("/{objectiveId}/cancel")
async def objective_cancel(request: Request, objectiveId: str) -> Response:
    session, fields = await form_of(request, JOBS_WRITE)
    reason = (fields.get("reason") or "canceled from the console")[:1000]
    store = store_of(request)
    visible(session, await objectives.get(store, objectiveId), f"objective {objectiveId}")
    try:
        async with store.transaction() as tx:
            await objectives.request_cancel(tx, objectiveId, reason)
        notice = "cancel requested: control aborts the running tasks"
    except objectives.ObjectiveTerminal as exc:
        notice = f"not canceled: {exc}"
    log.info(
        "console objective cancel",
        extra={"event": "console.objective_cancel", "objectiveId": objectiveId},
    )
    return RedirectResponse(
        f"/console/objectives/{path_segment(objectiveId)}?{notice_query(session, notice)}", 303
    )
