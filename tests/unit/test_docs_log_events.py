"""The docs name every log event an operator can meet: each log call of the product names its
`event` in `extra`, and docs/operations.md lists it (its "Log events" tables) with the level it
is logged at. The inventory is read from the source (an AST scan, as test_docs_metrics.py reads
the metric families), so a new event fails here until it is described."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("receipts", "roles", "activities", "workflows", "receipt_worker")
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}

# An event named by an expression: every name it takes (read from the code beside it).
SPELLED = {
    "f\"schedule.{outcome.removeprefix('skipped_')}_refused\"": {
        "schedule.executables_refused",
        "schedule.gateway_refused",
        "schedule.commands_refused",
    },
    "f'schedule.{action}'": {"schedule.changed", "schedule.deleted"},
    "f'console.schedule_{action}'": {"console.schedule_pause", "console.schedule_resume"},
    "f'webhook.{action}'": {
        "webhook.created",
        "webhook.deleted",
        "webhook.secret_rotated",
        "webhook.tested",
    },
    "f'schedule.sync_{action}'": {
        "schedule.sync_created",
        "schedule.sync_updated",
        "schedule.sync_deleted",
    },
    "'watchdog.schedule_' + action": {"watchdog.schedule_created", "watchdog.schedule_updated"},
    "f'webhook.{outcome}'": {"webhook.delivered", "webhook.retried", "webhook.failed"},
    "'callback.' + status": {"callback.posted", "callback.failed"},
}


@dataclass(frozen=True)
class Emitted:
    event: str
    level: str
    where: str


def _level(node: ast.expr) -> set[str]:
    """The level names a `log.log` level argument takes (`logging.INFO if … else …`)."""
    if isinstance(node, ast.IfExp):
        return _level(node.body) | _level(node.orelse)
    if isinstance(node, ast.Attribute):
        return {node.attr.lower()}
    return {"?" + ast.unparse(node)}


def _pattern(node: ast.expr) -> str:
    """A regular expression of the names an event expression takes, its variables named."""
    if isinstance(node, ast.Constant):
        return re.escape(str(node.value))
    if isinstance(node, ast.Name):
        return rf"(?P<{node.id}>\w+)"
    if isinstance(node, ast.FormattedValue):
        return _pattern(node.value) if isinstance(node.value, ast.Name) else r"\w+"
    if isinstance(node, ast.JoinedStr):
        return "".join(_pattern(part) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pattern(node.left) + _pattern(node.right)
    return r"\w+"


def _levels_of(level: ast.expr, event: ast.expr, name: str) -> set[str]:
    """The levels `name` is logged at: a level chosen by the variable the event's name is made
    of (`logging.INFO if outcome == "delivered" else …`) is read for that name alone."""
    test = level.test if isinstance(level, ast.IfExp) else None
    if (
        isinstance(level, ast.IfExp)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
    ):
        found = re.fullmatch(_pattern(event), name)
        if found is not None and test.left.id in found.groupdict():
            chosen = found[test.left.id] == test.comparators[0].value
            return _level(level.body if chosen else level.orelse)
    return _level(level)


def _names(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _names(node.body) | _names(node.orelse)
    spelled = ast.unparse(node)
    assert spelled in SPELLED, f"an event named by {spelled}: list what it takes in SPELLED"
    return SPELLED[spelled]


def _event(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "extra" and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "event":
                    return value
    return None


def _argument(call: ast.Call, function: ast.FunctionDef, name: str) -> ast.expr:
    """The argument `call` passes for `function`'s parameter `name`."""
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return call.args[[a.arg for a in function.args.args].index(name)]


def _is_log_call(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    owner = ast.unparse(node.func.value)
    return node.func.attr in LEVELS | {"log"} and (owner == "log" or owner.endswith(".logger"))


def inventory() -> tuple[list[Emitted], list[str]]:
    """Every (event, level, module) the product logs, and the log calls that name no event."""
    found: list[Emitted] = []
    unnamed: list[str] = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ast.parse(path.read_text(encoding="utf-8"))
            where = str(path.relative_to(ROOT))
            functions = {f.name: f for f in ast.walk(module) if isinstance(f, ast.FunctionDef)}
            parents = {
                child: f
                for f in functions.values()
                for child in ast.walk(f)
                if isinstance(child, ast.Call)
            }
            for call in ast.walk(module):
                if not _is_log_call(call):
                    continue
                assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                event = _event(call)
                if event is None:
                    unnamed.append(f"{where}:{call.lineno}")
                    continue
                level = call.args[0] if call.func.attr == "log" else None
                # A helper that logs the event its caller names (`_log(level, message, event…)`):
                # the names and levels are its callers'.
                helper = parents.get(call)
                params = {a.arg for a in helper.args.args} if helper else set()
                if isinstance(event, ast.Name) and event.id in params:
                    assert helper is not None
                    for use in ast.walk(module):
                        if (
                            isinstance(use, ast.Call)
                            and ast.unparse(use.func).split(".")[-1] == helper.name
                        ):
                            named = _names(_argument(use, helper, event.id))
                            if isinstance(level, ast.Name) and level.id in params:
                                levels = _level(_argument(use, helper, level.id))
                            else:
                                levels = _level(level) if level else {call.func.attr}
                            found += [Emitted(n, lv, where) for n in named for lv in levels]
                    continue
                for name in _names(event):
                    levels = {call.func.attr} if level is None else _levels_of(level, event, name)
                    found += [Emitted(name, lv, where) for lv in levels]
    return found, unnamed


def documented() -> dict[str, str]:
    """The events the "Log events" tables of docs/operations.md list, with their level cell."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Log events\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            for name in re.findall(r"`([\w.]+)`", cells[0]):
                rows[name] = cells[1].lower()
    return rows


def test_the_scan_sees_every_log_call_and_each_names_its_event() -> None:
    found, unnamed = inventory()
    assert len({e.event for e in found}) > 150  # the scan sees the product's events
    assert unnamed == []


def test_every_log_event_is_listed_in_the_operations_page_at_its_level() -> None:
    found, _ = inventory()
    rows = documented()
    missing = sorted({f"{e.event} ({e.where})" for e in found if e.event not in rows})
    assert missing == []
    # `exception` logs at ERROR, with the traceback.
    wrong = sorted(
        f"{e.event}: {e.level} ({e.where})"
        for e in found
        if e.level.replace("exception", "error") not in rows[e.event]
    )
    assert wrong == []
    stale = sorted(set(rows) - {e.event for e in found})
    assert stale == []
