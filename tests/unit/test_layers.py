"""The layers as docs/design.md §2 draws them, read from the source: imports point one way, no
product module imports a layer beside it, the store knows nothing of the layers above it, and
only the receipts package runs a named statement."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("receipts", "receipt_worker", "activities", "workflows", "roles")
# What each top-level package may import of the others (docs/design.md §2).
ALLOWED = {
    "receipts": set(),
    "receipt_worker": {"receipts"},
    "activities": {"receipts", "receipt_worker"},
    "workflows": {"activities", "receipts"},
    "roles": {"workflows", "activities", "receipts", "receipt_worker"},
}
# The aggregates above the job queue; the core of the receipts package imports neither.
AGGREGATES = ("receipts.objectives", "receipts.agent_jobs")
# Above them: the assembly of every projection, and a schedule's firing, which enqueues a job of
# any kind as the API does (an objective's id scoped by its organization).
ABOVE_THE_AGGREGATES = {
    "receipts.assembly",
    "receipts.schedules.firing",
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, ast.Module]:
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module(path)] = ast.parse(path.read_text(), str(path))
    return found


def _imports(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name


@cache
def graph() -> dict[str, set[str]]:
    """Each product module and the product modules it imports (at any depth of its code)."""
    known = set(modules())
    edges: dict[str, set[str]] = {}
    for name, tree in modules().items():
        targets = set()
        for imported in _imports(tree):
            while imported and imported not in known:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph()[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph()):
        if v not in index:
            visit(v)
    return found


def test_imports_point_one_way_between_the_packages() -> None:
    wrong = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        for target in targets
        if (top := target.split(".")[0]) != (own := name.split(".")[0]) and top not in ALLOWED[own]
    ]
    assert wrong == []


def test_no_product_module_imports_itself_through_others() -> None:
    assert _cycles() == []


def test_the_core_of_the_receipts_package_knows_no_aggregate_above_it() -> None:
    wrong = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.startswith("receipts")
        and not name.startswith(AGGREGATES)
        and name not in ABOVE_THE_AGGREGATES
        for target in targets
        if target.startswith(AGGREGATES)
    ]
    assert wrong == []


def test_neither_aggregate_imports_the_other() -> None:
    objectives, agent_jobs = AGGREGATES
    wrong = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        for target in targets
        if (name.startswith(objectives) and target.startswith(agent_jobs))
        or (name.startswith(agent_jobs) and target.startswith(objectives))
    ]
    assert wrong == []


def test_only_the_receipts_package_runs_a_named_statement() -> None:
    """Roles and activities ask for named reads and writes (receipts/reads.py, the aggregates'
    stores); a statement's rule is written once, beside the statement's caller in receipts/."""
    wrong = []
    for name, tree in modules().items():
        if name.startswith("receipts"):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"fetch", "fetch_one", "execute", "execute_many"}
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                wrong.append(f"{name}:{node.lineno} {node.func.attr}({node.args[0].value!r})")
    assert wrong == []


def test_a_transaction_keeps_its_connection_to_itself() -> None:
    wrong = [
        f"{name}:{node.lineno}"
        for name, tree in modules().items()
        if name != "receipts.store"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in {"conn", "_conn"}
    ]
    assert wrong == []


def test_only_the_settings_layer_reads_the_environment() -> None:
    """A process reads its environment once, at start (roles/infra/settings.py `load`); the
    embedded server's library is handed its runtime directory there (roles/infra/embedded.py)."""
    allowed = {"roles.infra.settings", "roles.infra.embedded"}
    wrong = [
        f"{name}:{node.lineno}"
        for name, tree in modules().items()
        if name not in allowed
        for node in ast.walk(tree)
        if (isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "putenv"})
    ]
    assert wrong == []


METRICS_MODULES = {"receipts.metrics", "receipts.objectives.metrics", "receipts.agent_jobs.metrics"}


def test_every_metric_family_is_declared_in_the_metrics_modules() -> None:
    """One way to observe (docs/design.md §8): the families live in receipts/metrics.py and the
    two layers' metrics modules, and are counted where an outcome is known; no other module
    declares its own, and none keeps a list of callbacks for another to append to."""
    families = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
    wrong = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if (
                name not in METRICS_MODULES
                and isinstance(node, ast.ImportFrom)
                and node.module == "prometheus_client"
                and families & {alias.name for alias in node.names}
            ):
                wrong.append(f"{name}:{node.lineno} imports a metric family")
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id.startswith("on_")
                and isinstance(node.value, ast.List)
            ):
                wrong.append(f"{name}:{node.lineno} keeps callbacks in {node.target.id}")
    assert wrong == []
